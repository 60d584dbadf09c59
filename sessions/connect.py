"""Connect verification: the decision behind ingress-nginx's ``auth-url`` for every session request.

ingress-nginx (``nginx.ingress.kubernetes.io/auth-url``) sends a subrequest to
``/internal/connect/verify`` for each request to ``https://<session_domain>/s/<session id>/...``,
with ``X-Original-URL`` (the full original URL) and ``X-Original-Method``; a 2xx lets the request
through (``X-Auth-Request-User`` is copied to the pod by ``auth-response-headers``), 401/403 refuses it.

Where the connect token is read, in order:

1. ``Authorization: Bearer <token>`` (API clients);
2. the ``token`` query parameter of ``X-Original-URL`` (the link from ``POST .../connect``);
3. the ``gshare_connect`` cookie, set on the first visit by the verify answer's ``Set-Cookie``,
   which ingress-nginx passes to the browser when the Ingress has
   ``nginx.ingress.kubernetes.io/auth-always-set-cookie: "true"`` (its ``auth_request_set
   $auth_cookie $upstream_http_set_cookie; add_header Set-Cookie $auth_cookie``).

The cookie holds a longer-lived connect token (``GSHARE_CONNECT_COOKIE_TTL``) scoped to the
session's path, so the link's token (a few minutes) is not needed after the first visit.

Per request: at most one cached lookup of the session's facts. Both caches below are per process
(``cachetools.TTLCache``, thread-safe behind a lock):

* verified tokens, until the token expires (at most ``TOKEN_CACHE_SECONDS``): a browser sends the
  same cookie on every request, so the RS256 check runs once per token and process;
* session facts, for ``FACTS_CACHE_SECONDS`` (1 s), in front of the Django cache on Redis (filled
  from the database on a miss and invalidated by the session services on every phase change). A
  stopped session is therefore refused everywhere at most 1 s after the stop.

The path is judged as nginx routes it (``sessions.connect_path``): the session id comes from the
normalised path, and a path that could be read two ways (``..``, ``%2e``, ``%2f``, ``%5c``, ``//``, a
second ``/s/``) is refused.

Every dependency is bounded: Redis calls by ``CACHE_TIMEOUT_SECONDS`` (a client of the same Redis,
keys and prefix as the default cache, with socket timeouts), database reads by a
``statement_timeout`` of ``DATABASE_TIMEOUT_MS``. When one fails or is too slow the verify cannot
decide and raises :class:`VerifyUnavailable` (503 ``verify_unavailable`` with ``Retry-After``), never
an error page and never a 2xx.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import jwt
import redis
from cachetools import TTLCache
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.redis import RedisCache
from django.db import DatabaseError, InterfaceError, connection, transaction

from gshare.auth.internal_jwt import ALGORITHM, CONNECT_AUDIENCE, InvalidInternalToken, sign_internal_jwt, token_kid
from gshare.auth.keys import signing_keys_published
from gshare.exceptions import ApplicationError
from sessions.connect_path import PathRefused, session_in_request_uri
from sessions.manifests import session_path
from sessions.models import Session
from sessions.services import connect_cache_key

logger = logging.getLogger(__name__)

COOKIE_NAME = "gshare_connect"
_MISSING = "-"
_NO_ENTRY = object()
_KEY_TTL = 60.0
TOKEN_CACHE_SECONDS = 60.0
FACTS_CACHE_SECONDS = 1.0
#: Bound on each Redis call of a verify (connect and read), seconds.
CACHE_TIMEOUT_SECONDS = 0.25
#: Bound on each database statement of a verify (PostgreSQL ``statement_timeout``, lock waits included), ms.
DATABASE_TIMEOUT_MS = 500
#: ``Retry-After`` of a 503, seconds.
RETRY_AFTER_SECONDS = 1
_lock = threading.Lock()
_tokens: TTLCache = TTLCache(maxsize=20000, ttl=TOKEN_CACHE_SECONDS)
_facts: TTLCache = TTLCache(maxsize=20000, ttl=FACTS_CACHE_SECONDS)
# Bounded, so tokens with made-up kids cannot grow it without limit.
_keys: TTLCache = TTLCache(maxsize=1000, ttl=_KEY_TTL)
# One client for every thread: redis-py clients and their connection pools are thread-safe.
_bounded_cache: tuple[dict, BaseCache] | None = None
# What "the dependency failed" looks like from here: the database (refused, timed out, canceled), Redis, sockets.
_UNAVAILABLE = (DatabaseError, InterfaceError, redis.exceptions.RedisError, OSError)


class VerifyUnavailable(ApplicationError):
    """503: the verify cannot decide now (database or Redis unreachable or too slow); retry shortly."""

    code = "verify_unavailable"
    status = 503
    retry_after = RETRY_AFTER_SECONDS


def clear_local_caches() -> None:
    """Forget every per-process cached token, session fact and public key (tests; key retirement)."""
    with _lock:
        _tokens.clear()
        _facts.clear()
        _keys.clear()


@contextmanager
def _dependency(what: str) -> Iterator[None]:
    """Turn a failure of ``what`` (``database``/``cache``) into :class:`VerifyUnavailable`."""
    try:
        yield
    except _UNAVAILABLE as exc:
        raise VerifyUnavailable(
            f"Connect verification cannot reach its {what} now ({type(exc).__name__}); retry in {RETRY_AFTER_SECONDS} s. "
            "If this persists, check the control plane's PostgreSQL and Redis."
        ) from exc


def _cache() -> BaseCache:
    """The default cache, but with every Redis call bounded by ``CACHE_TIMEOUT_SECONDS``.

    Same location, key prefix and version as ``caches["default"]`` (so the session services'
    invalidations reach these keys); rebuilt when ``settings.CACHES`` changes. Another backend is used as is.
    """
    global _bounded_cache
    conf = settings.CACHES["default"]
    built = _bounded_cache
    if built is not None and built[0] == conf:
        return built[1]
    if conf.get("BACKEND") != "django.core.cache.backends.redis.RedisCache":
        return caches["default"]
    params = {k: v for k, v in conf.items() if k not in ("BACKEND", "LOCATION")}
    params["OPTIONS"] = {
        **conf.get("OPTIONS", {}),
        "socket_connect_timeout": CACHE_TIMEOUT_SECONDS,
        "socket_timeout": CACHE_TIMEOUT_SECONDS,
    }
    bounded = RedisCache(conf["LOCATION"], params)
    _bounded_cache = (dict(conf), bounded)
    return bounded


@contextmanager
def _database() -> Iterator[None]:
    """Run the block's reads in a transaction whose statements stop after ``DATABASE_TIMEOUT_MS``.

    Raises:
        VerifyUnavailable: the database is unreachable, or a statement ran out of time.
    """
    with _dependency("database"):
        nested = connection.in_atomic_block
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, true)", [str(DATABASE_TIMEOUT_MS)]
                )
                previous = cursor.fetchone()[0]
            yield
            if nested:  # inside a caller's transaction (tests): leave its timeout as it was
                with connection.cursor() as cursor:
                    cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])


@dataclass(frozen=True)
class Verdict:
    """The answer to ingress-nginx.

    Attributes:
        status: 200 or 401.
        user: username for ``X-Auth-Request-User`` when allowed.
        set_cookie: ``(name, value, path, max_age seconds)`` to set on the browser, or None.
        reason: why it was refused (logged, never sent: it would tell a prober which check failed).
        code: the error code of a refusal (``token_missing``, ``token_invalid`` or ``connect_refused``).
    """

    status: int
    user: str = ""
    set_cookie: tuple[str, str, str, int] | None = None
    reason: str = ""
    code: str = ""


#: The ``detail`` sentence of each refusal code (the body of a 401; nginx shows the browser its own page).
REFUSAL_DETAILS = {
    "token_missing": "No connect token: open the session from its link (`POST /api/v1/sessions/{id}/connect` or the console).",
    "token_invalid": "The connect token is malformed, expired or not signed by this control plane: get a new link "
    "(`POST /api/v1/sessions/{id}/connect`).",
    "connect_refused": "This request may not reach this session (another session's token, a session that is not running, "
    "another host, or a path that is not plainly under /s/<session id>/): open the session from its own link.",
}


def _refused(code: str, reason: str) -> Verdict:
    return Verdict(401, reason=reason, code=code)


def _public_key(kid: str):
    with _lock:
        cached = _keys.get(kid, _NO_ENTRY)
    if cached is not _NO_ENTRY:
        return cached
    # The same rule as every other verifier: a key verifies until it is retired or past its retire_after.
    with _database():
        row = signing_keys_published().filter(kid=kid).values_list("public_key_pem", flat=True).first()
    key = load_pem_public_key(row.encode()) if row else None
    with _lock:
        _keys[kid] = key
    return key


def _session_facts(session_id: str) -> dict | None:
    with _lock:
        local = _facts.get(session_id)
    if local is not None:
        return None if local == _MISSING else local
    key = connect_cache_key(session_id)
    cache = _cache()
    with _dependency("cache"):
        facts = cache.get(key)
    if facts is None:
        with _database():
            row = (
                Session.objects.filter(public_id=session_id)
                .values("phase", "cluster__session_domain", "owner_id")
                .first()
            )
        facts = _MISSING if row is None else {"phase": row["phase"], "host": row["cluster__session_domain"], "owner": row["owner_id"]}
        try:
            cache.set(key, facts, settings.GSHARE_CONNECT_CACHE_SECONDS)
        except _UNAVAILABLE as exc:  # the facts just read from the database still decide this request
            logger.warning("connect verify could not cache the facts of %s: %s", session_id, type(exc).__name__)
    with _lock:
        _facts[session_id] = facts
    return None if facts == _MISSING else facts


def _decode(token: str) -> dict | None:
    now = time.time()
    with _lock:
        cached = _tokens.get(token)
    if cached is not None:
        return cached if cached["exp"] > now else None
    claims = _verify_signature(token)
    if claims is not None:
        with _lock:
            _tokens[token] = claims
    return claims


def _verify_signature(token: str) -> dict | None:
    try:
        kid = token_kid(token)  # a malformed header (a NUL in kid, ...) is refused before any lookup
    except InvalidInternalToken:
        return None
    key = _public_key(kid)
    if key is None:
        return None
    try:
        return jwt.decode(
            token, key, algorithms=[ALGORITHM], audience=CONNECT_AUDIENCE, issuer=settings.GSHARE_JWT_ISSUER,
            leeway=settings.GSHARE_JWT_LEEWAY, options={"require": ["exp", "sub", "aud", "iss"]},
        )
    except (jwt.PyJWTError, ValueError, TypeError):
        return None


def _split_original_url(original_url: str) -> tuple[str, str]:
    """``X-Original-URL`` (``https://<Host header><raw request URI>``) -> ``(lowercase hostname, request URI)``.

    Raises:
        PathRefused: not ``http(s)://<host><path>``, or a host with userinfo or odd characters.
    """
    scheme, sep, rest = original_url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise PathRefused("not an http(s) URL")
    netloc, slash, path = rest.partition("/")
    if not slash or not netloc or any(c in netloc for c in "@?#\\ \t"):
        raise PathRefused("not a session path")
    try:
        host = (urlsplit(f"//{netloc}").hostname or "").lower()
    except ValueError:
        raise PathRefused("unparsable host") from None
    return host, "/" + path


def verify(*, original_url: str, authorization: str = "", cookie: str = "") -> Verdict:
    """Decide whether a request to a session may pass.

    Args:
        original_url: ``X-Original-URL`` (``https://<host>/s/<session id>/...?...``, the raw request URI).
        authorization: the ``Authorization`` header, if any.
        cookie: the ``gshare_connect`` cookie, if any.

    Returns:
        200 when the path is plainly under one session as nginx routes it (``sessions.connect_path``),
        the token is valid and names that session, the session is Running and the original host is the
        session's cluster ``session_domain``; 401 otherwise (``token_missing``, ``token_invalid``,
        ``connect_refused``).

    Raises:
        VerifyUnavailable: the database or Redis is unreachable or too slow to decide (503).
    """
    try:
        host, request_uri = _split_original_url(original_url or "")
        session_id = session_in_request_uri(request_uri)
    except PathRefused as exc:
        return _refused("connect_refused", f"path refused: {exc}")
    query = request_uri.split("#", 1)[0].partition("?")[2]
    from_query = parse_qs(query).get("token", [""])[0]
    scheme, _, bearer = authorization.partition(" ")
    candidates = [bearer.strip() if scheme.lower() == "bearer" else "", from_query, cookie]
    claims, source = None, ""
    for token, where in zip(candidates, ("bearer", "query", "cookie"), strict=True):
        if token:
            claims = _decode(token)
            if claims is not None:
                source = where
                break
    if claims is None:
        return _refused("token_invalid" if any(candidates) else "token_missing", "no valid connect token")
    if claims.get("sid") != session_id:
        return _refused("connect_refused", "token for another session")
    facts = _session_facts(session_id)
    if facts is None or facts["phase"] != Session.Phase.RUNNING:
        return _refused("connect_refused", "session not running")
    if not host or host != (facts["host"] or "").lower() or claims.get("host", host) != host:
        return _refused("connect_refused", "wrong host")
    set_cookie = None
    if source == "query":
        ttl = settings.GSHARE_CONNECT_COOKIE_TTL
        with _database():  # the active signing key
            cookie_token = sign_internal_jwt(
                claims["sub"], ttl, audience=CONNECT_AUDIENCE,
                claims={"sid": session_id, "name": claims.get("name", ""), "host": host},
            )
        set_cookie = (COOKIE_NAME, cookie_token, session_path(session_id), ttl)
    return Verdict(200, user=claims.get("name", ""), set_cookie=set_cookie)
