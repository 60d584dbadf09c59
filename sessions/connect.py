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
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import jwt
from cachetools import TTLCache
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from django.conf import settings
from django.core.cache import cache

from gshare.auth.internal_jwt import ALGORITHM, CONNECT_AUDIENCE, sign_internal_jwt
from gshare.auth.keys import signing_keys_published
from sessions.manifests import session_path
from sessions.models import Session
from sessions.services import connect_cache_key

COOKIE_NAME = "gshare_connect"
_MISSING = "-"
_KEYS: dict[str, tuple[float, object]] = {}
_KEY_TTL = 60.0
TOKEN_CACHE_SECONDS = 60.0
FACTS_CACHE_SECONDS = 1.0
_lock = threading.Lock()
_tokens: TTLCache = TTLCache(maxsize=20000, ttl=TOKEN_CACHE_SECONDS)
_facts: TTLCache = TTLCache(maxsize=20000, ttl=FACTS_CACHE_SECONDS)


def clear_local_caches() -> None:
    """Forget every per-process cached token and session fact (tests; key retirement)."""
    with _lock:
        _tokens.clear()
        _facts.clear()


@dataclass(frozen=True)
class Verdict:
    """The answer to ingress-nginx.

    Attributes:
        status: 200, 401 or 403.
        user: username for ``X-Auth-Request-User`` when allowed.
        set_cookie: ``(name, value, path, max_age seconds)`` to set on the browser, or None.
        reason: why it was refused (logged, never sent to the browser).
    """

    status: int
    user: str = ""
    set_cookie: tuple[str, str, str, int] | None = None
    reason: str = ""


def _public_key(kid: str):
    now = time.monotonic()
    cached = _KEYS.get(kid)
    if cached is not None and now - cached[0] < _KEY_TTL:
        return cached[1]
    # The same rule as every other verifier: a key verifies until it is retired or past its retire_after.
    row = signing_keys_published().filter(kid=kid).values_list("public_key_pem", flat=True).first()
    key = load_pem_public_key(row.encode()) if row else None
    _KEYS[kid] = (now, key)
    return key


def _session_facts(session_id: str) -> dict | None:
    with _lock:
        local = _facts.get(session_id)
    if local is not None:
        return None if local == _MISSING else local
    key = connect_cache_key(session_id)
    facts = cache.get(key)
    if facts is None:
        row = (
            Session.objects.filter(public_id=session_id)
            .values("phase", "cluster__session_domain", "owner_id")
            .first()
        )
        facts = _MISSING if row is None else {"phase": row["phase"], "host": row["cluster__session_domain"], "owner": row["owner_id"]}
        cache.set(key, facts, settings.GSHARE_CONNECT_CACHE_SECONDS)
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
        header = jwt.get_unverified_header(token)
        if header.get("alg") != ALGORITHM or not isinstance(header.get("kid"), str):
            return None
        key = _public_key(header["kid"])
        if key is None:
            return None
        return jwt.decode(
            token, key, algorithms=[ALGORITHM], audience=CONNECT_AUDIENCE, issuer=settings.GSHARE_JWT_ISSUER,
            leeway=settings.GSHARE_JWT_LEEWAY, options={"require": ["exp", "sub", "aud", "iss"]},
        )
    except jwt.PyJWTError:
        return None


def verify(*, original_url: str, authorization: str = "", cookie: str = "") -> Verdict:
    """Decide whether a request to a session may pass.

    Args:
        original_url: ``X-Original-URL`` (``https://<host>/s/<session id>/...?...``).
        authorization: the ``Authorization`` header, if any.
        cookie: the ``gshare_connect`` cookie, if any.

    Returns:
        200 when the token is valid, names this session, the session is Running and the original host
        is the session's cluster ``session_domain``; 401 otherwise.
    """
    parts = urlsplit(original_url or "")
    host = (parts.hostname or "").lower()
    segments = parts.path.split("/")
    if len(segments) < 3 or segments[1] != "s" or not segments[2]:
        return Verdict(401, reason="not a session path")
    session_id = segments[2]
    from_query = parse_qs(parts.query).get("token", [""])[0]
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
        return Verdict(401, reason="no valid connect token")
    if claims.get("sid") != session_id:
        return Verdict(401, reason="token for another session")
    facts = _session_facts(session_id)
    if facts is None or facts["phase"] != Session.Phase.RUNNING:
        return Verdict(401, reason="session not running")
    if not host or host != (facts["host"] or "").lower() or claims.get("host", host) != host:
        return Verdict(401, reason="wrong host")
    set_cookie = None
    if source == "query":
        ttl = settings.GSHARE_CONNECT_COOKIE_TTL
        cookie_token = sign_internal_jwt(
            claims["sub"], ttl, audience=CONNECT_AUDIENCE,
            claims={"sid": session_id, "name": claims.get("name", ""), "host": host},
        )
        set_cookie = (COOKIE_NAME, cookie_token, session_path(session_id), ttl)
    return Verdict(200, user=claims.get("name", ""), set_cookie=set_cookie)
