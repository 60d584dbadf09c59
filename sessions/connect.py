"""Connect verification: the decision behind ingress-nginx's ``auth-url`` for every session request.

ingress-nginx (``nginx.ingress.kubernetes.io/auth-url``) sends a subrequest to
``/internal/connect/verify`` for each request to ``https://<session_domain>/s/<session id>/...``,
with ``X-Original-URL`` (the full original URL) and ``X-Original-Method``; a 2xx lets the request
through (``X-Auth-Request-User`` is copied to the pod by ``auth-response-headers``), 401/403 refuses it.
On a ``gateway-api`` cluster Envoy's ext_authz check asks the same question in its own shape
(``/internal/connect/ext-authz/<original path>``); ``sessions.ext_authz`` rebuilds the original URL from it and calls
:func:`verify`.

Connect tokens are RS256 JWTs (audience ``gshare-connect``) of two uses, claim ``use``:

* ``link``: minted by :func:`link_token_sign` for ``POST /api/v1/sessions/{id}/connect``, valid
  ``GSHARE_CONNECT_TOKEN_TTL`` (minutes);
* ``cookie``: minted here from a link token only, valid until ``auth_time`` (the link's ``iat``) plus
  ``GSHARE_CONNECT_COOKIE_TTL``. It is never renewed: only a new link (an API call by an active user)
  gives a new cookie.

Where a token is read, in this order; the first one that is valid *for its place* decides, the others
are ignored:

1. ``Authorization: Bearer <token>``: a link token (API clients);
2. the ``token`` query parameter of ``X-Original-URL``: a link token; the answer sets the cookie;
3. the ``gshare_connect`` cookie: a cookie token. The verify answer's ``Set-Cookie`` reaches the
   browser through ``nginx.ingress.kubernetes.io/auth-always-set-cookie: "true"`` (its
   ``auth_request_set $auth_cookie $upstream_http_set_cookie; add_header Set-Cookie $auth_cookie``).

A cookie token as ``?token=`` or Bearer, a link token as the cookie, or a token without ``use``
counts as no token there.

Per request: at most one cached lookup of the session's facts and one of the token user's facts.
Both caches below are per process (``cachetools.TTLCache``, thread-safe behind a lock):

* verified tokens, until the token expires (at most ``TOKEN_CACHE_SECONDS``): a browser sends the
  same cookie on every request, so the RS256 check runs once per token and process;
* facts (a session's phase, host and owner; a user's ``is_active`` and whether they may open anyone's session,
  ``sessions.permissions.may_open_any_session``: superuser, or staff with ``gpu_sessions.change_session``), for
  ``FACTS_CACHE_SECONDS`` (1 s), in front of the Django cache on Redis (filled from the database on a
  miss, kept ``GSHARE_CONNECT_CACHE_SECONDS``). The session services drop a session's facts on every
  phase change, and a user's save or a change of their groups or permissions drops the user's
  (:func:`user_changed`, :func:`permissions_changed`; :func:`facts_forget`, which leaves a short-lived
  tombstone so that a verify that read the database before the change cannot put the old facts
  back). A stopped session or a deactivated user is therefore refused everywhere at most 1 s after
  the change commits; a change that bypasses ``save()`` (``QuerySet.update``, SQL), or one made while
  Redis is unreachable, within ``GSHARE_CONNECT_CACHE_SECONDS`` + 1 s.

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
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs

import jwt
import redis
from cachetools import TTLCache
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.cache import cache as default_cache
from django.core.cache import caches
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.redis import RedisCache
from django.db import DatabaseError, InterfaceError, connection, transaction

from contract import TOKEN_INVALID
from core.exceptions import ApplicationError
from identity.errors import TOKEN_MISSING
from identity.internal_jwt import ALGORITHM, CONNECT_AUDIENCE, InvalidInternalToken, sign_internal_jwt, token_kid
from identity.keys import signing_keys_published
from sessions.connect_path import PathRefused, host_of_authority, session_in_request_uri
from sessions.errors import CONNECT_FORBIDDEN, CONNECT_REFUSED, VERIFY_UNAVAILABLE
from sessions.manifests import session_path
from sessions.models import Session
from sessions.permissions import may_open_any_session

logger = logging.getLogger(__name__)

COOKIE_NAME = "gshare_connect"
#: ``use`` claim of the token in a connect link (``?token=``, or Bearer).
USE_LINK = "link"
#: ``use`` claim of the token in the ``gshare_connect`` cookie.
USE_COOKIE = "cookie"
#: Which token use each place accepts.
_ACCEPTS = {"bearer": USE_LINK, "query": USE_LINK, "cookie": USE_COOKIE}
_MISSING = "-"
#: What :func:`facts_forget` leaves in Redis: "read the database, and do not cache what you read".
_TOMBSTONE = "~"
_USER_SUBJECT = re.compile(r"user:([0-9]{1,18})")
#: Lifetime of a tombstone, seconds: far longer than a verify's read-then-cache window (a statement of at most
#: ``DATABASE_TIMEOUT_MS`` and a Redis call of at most ``CACHE_TIMEOUT_SECONDS``).
TOMBSTONE_SECONDS = 10
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

    code = VERIFY_UNAVAILABLE
    status = 503
    retry_after = RETRY_AFTER_SECONDS


def clear_local_caches() -> None:
    """Forget every per-process cached token, session and user fact and public key (tests; key retirement)."""
    with _lock:
        _tokens.clear()
        _facts.clear()
        _keys.clear()


def connect_cache_key(session_id: str) -> str:
    """Cache key of the connect-verify facts of a session (``ses_...``)."""
    return f"gshare:connect:{session_id}"


def user_cache_key(user_pk: int) -> str:
    """Cache key of the connect-verify facts of a user (its primary key)."""
    return f"gshare:connect:user:{user_pk}"


def facts_forget(key: str) -> None:
    """Drop cached connect facts (call it after the commit of the change).

    Leaves a tombstone for ``TOMBSTONE_SECONDS`` instead of deleting the key: a verify that read the
    database just before the commit caches with ``add`` (only into an empty key), so it cannot put the
    old facts back for ``GSHARE_CONNECT_CACHE_SECONDS``. A Redis that is down (or silent past
    ``GSHARE_REDIS_TIMEOUT``) is logged, never raised: the change is committed, and the cached facts
    expire on their own within ``GSHARE_CONNECT_CACHE_SECONDS``.

    Args:
        key: :func:`connect_cache_key` or :func:`user_cache_key`.
    """
    try:
        default_cache.set(key, _TOMBSTONE, TOMBSTONE_SECONDS)
    except redis.RedisError as exc:
        logger.warning("cache: could not drop %s (%s); it expires within %s s", key, exc, settings.GSHARE_CONNECT_CACHE_SECONDS)


def user_changed(sender, instance, using: str = "default", **kwargs) -> None:
    """``post_save``/``post_delete`` receiver of the user model: drop the user's connect facts once the change commits.

    A cache invalidation, not a rule: it is what makes a deactivation (or a loss of superuser or staff) refuse that
    user's connect cookies within ``FACTS_CACHE_SECONDS`` rather than ``GSHARE_CONNECT_CACHE_SECONDS``.
    Connected in ``sessions.apps``.
    """
    key = user_cache_key(instance.pk)
    transaction.on_commit(lambda: facts_forget(key), using=using)


def _users_whose_permissions_changed(instance, action: str, model, pk_set) -> set[int]:
    """The users whose permissions an ``m2m_changed`` of users' groups, users' or groups' permissions may change."""
    user_model = get_user_model()
    users = set(pk_set or ()) if model is user_model else set()
    if isinstance(instance, user_model):
        users.add(instance.pk)
    elif isinstance(instance, Group):  # its members (still there at pre_clear; a removed member is in pk_set)
        users.update(user_model.objects.filter(groups=instance).values_list("pk", flat=True))
    elif isinstance(instance, Permission):
        holders = user_model.objects.filter(user_permissions=instance) | user_model.objects.filter(groups__permissions=instance)
        users.update(holders.values_list("pk", flat=True))
        if model is Group and pk_set:
            users.update(user_model.objects.filter(groups__in=pk_set).values_list("pk", flat=True))
    return users


def permissions_changed(sender, instance, action: str, model=None, pk_set=None, using: str = "default", **kwargs) -> None:
    """``m2m_changed`` receiver of ``User.groups``, ``User.user_permissions`` and ``Group.permissions``: drop the
    connect facts of every user concerned once the change commits.

    The facts hold whether a user may open anyone's session (``sessions.permissions.may_open_any_session``), so a
    permission or group taken away refuses their connect cookies within ``FACTS_CACHE_SECONDS``. A change these
    signals do not see (a ``Permission`` deleted, SQL) is bounded by ``GSHARE_CONNECT_CACHE_SECONDS`` + 1 s.
    Connected in ``sessions.apps``.
    """
    if action in ("pre_clear", "post_add", "post_remove"):
        _forget_users(_users_whose_permissions_changed(instance, action, model, pk_set), using)


def group_deleted(sender, instance, using: str = "default", **kwargs) -> None:
    """``pre_delete`` receiver of ``Group``: its memberships go without an ``m2m_changed``; drop its members' facts."""
    _forget_users(set(get_user_model().objects.filter(groups=instance).values_list("pk", flat=True)), using)


def _forget_users(users: set[int], using: str) -> None:
    keys = [user_cache_key(pk) for pk in sorted(users)]
    transaction.on_commit(lambda: [facts_forget(key) for key in keys], using=using)


def link_token_sign(*, user, session_id: str, host: str) -> str:
    """Sign the token of a connect link (``use: "link"``, ``GSHARE_CONNECT_TOKEN_TTL`` seconds).

    Args:
        user: who connects (``sub`` = ``user:<pk>``, ``name`` = the username).
        session_id: the session (``sid``, ``ses_...``).
        host: the session's ``session_domain`` (``host``).

    Returns:
        The compact JWS.
    """
    return sign_internal_jwt(
        f"user:{user.pk}", settings.GSHARE_CONNECT_TOKEN_TTL, audience=CONNECT_AUDIENCE,
        claims={"sid": session_id, "name": user.get_username(), "host": host, "use": USE_LINK},
    )


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


def redis_client() -> redis.Redis:
    """A raw client of the default cache's Redis with every call bounded by ``CACHE_TIMEOUT_SECONDS`` (no key prefix:
    callers name their keys with ``settings.CACHES["default"]["KEY_PREFIX"]``).

    Raises:
        redis.RedisError: the default cache is not on Redis.
    """
    cache = _cache()
    if not isinstance(cache, RedisCache):
        raise redis.RedisError("the default cache is not Redis")
    return cache._cache.get_client(write=True)


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


#: :func:`_database` for the other reads of the hot path (``sessions.ext_authz``: the registered session domains).
bounded_database = _database


@dataclass(frozen=True)
class Verdict:
    """The answer to ingress-nginx.

    Attributes:
        status: 200, 401 or 403.
        user: username for ``X-Auth-Request-User`` when allowed.
        set_cookie: ``(name, value, path, max_age seconds)`` to set on the browser, or None.
        reason: why it was refused (logged, never sent: it would tell a prober which check failed).
        code: the error code of a refusal (401 ``token_missing``, ``token_invalid`` or ``connect_refused``;
            403 ``connect_forbidden``).
        session: the session let in (``ses_...``), when allowed.
    """

    status: int
    user: str = ""
    set_cookie: tuple[str, str, str, int] | None = None
    reason: str = ""
    code: str = ""
    session: str = ""


#: The ``detail`` sentence of each refusal code (the body of a 401; nginx shows the browser its own page).
REFUSAL_DETAILS = {
    TOKEN_MISSING: "No connect token: open the session from its link (`POST /api/v1/sessions/{id}/connect` or the console).",
    TOKEN_INVALID: "The connect token is malformed, expired, not signed by this control plane, or not one for where it "
    "was sent (a cookie token as ?token= or Bearer, a link token as the cookie): get a new link (`POST /api/v1/sessions/{id}/connect`).",
    CONNECT_REFUSED: "This request may not reach this session (another session's token, a session that is not running, "
    "another host, or a path that is not plainly under /s/<session id>/): open the session from its own link.",
    CONNECT_FORBIDDEN: "The user of this connect token is deactivated, or no longer the session's owner or allowed to "
    "open any session (staff with the permission to change sessions): "
    "ask an administrator to reactivate the account, then open the session from a new link.",
}


def _refused(code: str, reason: str) -> Verdict:
    return Verdict(403 if code == CONNECT_FORBIDDEN else 401, reason=reason, code=code)


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


def _cached_facts(local_key, key: str, load) -> dict | None:
    """Facts from the process cache, else Redis, else ``load()`` (the database); None when there is no such row.

    What is read from the database goes into Redis with ``add``, so it never replaces a tombstone
    (:func:`facts_forget`) written after the read; under a tombstone it is not cached in Redis at all.
    """
    with _lock:
        local = _facts.get(local_key)
    if local is not None:
        return None if local == _MISSING else local
    cache = _cache()
    with _dependency("cache"):
        facts = cache.get(key)
    if facts is None or facts == _TOMBSTONE:
        forgotten = facts == _TOMBSTONE
        with _database():
            facts = load()
        if not forgotten:
            try:
                cache.add(key, facts, settings.GSHARE_CONNECT_CACHE_SECONDS)
            except _UNAVAILABLE as exc:  # the facts just read from the database still decide this request
                logger.warning("connect verify could not cache the facts of %s: %s", key, type(exc).__name__)
    with _lock:
        _facts[local_key] = facts
    return None if facts == _MISSING else facts


def _session_facts(session_id: str) -> dict | None:
    """``{"phase", "host", "owner"}`` of a session, or None."""

    def load():
        row = Session.objects.filter(public_id=session_id).values("phase", "cluster__session_domain", "owner_id").first()
        return _MISSING if row is None else {"phase": row["phase"], "host": row["cluster__session_domain"], "owner": row["owner_id"]}

    return _cached_facts(session_id, connect_cache_key(session_id), load)


def _user_facts(user_pk: int) -> dict | None:
    """``{"active", "open_any"}`` of a user (``open_any``: ``sessions.permissions.may_open_any_session``), or None."""

    def load():
        user = get_user_model().objects.filter(pk=user_pk).first()
        return _MISSING if user is None else {"active": user.is_active, "open_any": may_open_any_session(user)}

    return _cached_facts(("user", user_pk), user_cache_key(user_pk), load)


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
        PathRefused: not ``http(s)://<host><path>``, or an authority that is not a valid host[:port]
            (``sessions.connect_path.host_of_authority``: userinfo, ``? # \\ %``, spaces, a bad port).
    """
    scheme, sep, rest = original_url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise PathRefused("not an http(s) URL")
    netloc, slash, path = rest.partition("/")
    if not slash:
        raise PathRefused("not a session path")
    host = host_of_authority(netloc)
    if host is None:  # userinfo, a query or fragment before the path, odd characters: not what nginx routed on
        raise PathRefused("not a valid host[:port]")
    return host, "/" + path


def _misfit(claims: dict, where: str) -> str:
    """Why a verified connect token may not be used ``where`` (``bearer``, ``query``, ``cookie``), or ``""``.

    A link token needs its ``iat`` (the cookie's ``auth_time``); a cookie token an ``auth_time`` not in the
    future and no older than ``GSHARE_CONNECT_COOKIE_TTL`` (whatever its ``exp``: it cannot outlive its link's
    bound, not even with a lowered setting); both a subject ``user:<pk>``.
    """
    use = claims.get("use")
    if use != _ACCEPTS[where]:
        return f"{use if use in (USE_LINK, USE_COOKIE) else 'unmarked'} token as {where}"
    if not isinstance(claims.get("sub"), str) or not _USER_SUBJECT.fullmatch(claims["sub"]):
        return "subject is not a user"
    stamp = claims.get("iat" if use == USE_LINK else "auth_time")
    if not isinstance(stamp, int) or isinstance(stamp, bool):
        return "no iat" if use == USE_LINK else "no auth_time"
    if use == USE_COOKIE:
        now = time.time()
        if stamp > now + settings.GSHARE_JWT_LEEWAY:
            return "auth_time in the future"
        if stamp + settings.GSHARE_CONNECT_COOKIE_TTL <= now:
            return "cookie past its lifetime"
    return ""


def _cookie(claims: dict, session_id: str, host: str) -> tuple[str, str, str, int] | None:
    """The cookie for a link token's first visits: ``(name, token, path, max_age)``, or None past the link's bound.

    Its token ends ``GSHARE_CONNECT_COOKIE_TTL`` after the link was minted (``auth_time`` = the link's
    ``iat``), however late or often the link is opened.
    """
    auth_time = claims["iat"]
    ttl = auth_time + settings.GSHARE_CONNECT_COOKIE_TTL - int(time.time())
    if ttl <= 0:
        return None
    with _database():  # the active signing key
        token = sign_internal_jwt(
            claims["sub"], ttl, audience=CONNECT_AUDIENCE,
            claims={"sid": session_id, "name": claims.get("name", ""), "host": host, "use": USE_COOKIE, "auth_time": auth_time},
        )
    return COOKIE_NAME, token, session_path(session_id), ttl


def verify(*, original_url: str, authorization: str = "", cookie: str = "") -> Verdict:
    """Decide whether a request to a session may pass.

    Args:
        original_url: ``X-Original-URL`` (``https://<host>/s/<session id>/...?...``, the raw request URI).
        authorization: the ``Authorization`` header, if any.
        cookie: the ``gshare_connect`` cookie, if any.

    Returns:
        200 when the path is plainly under one session as nginx routes it (``sessions.connect_path``),
        a token valid for where it was sent (a link token as Bearer or ``?token=``, a cookie token as the
        cookie; the first such in that order decides) names that session, the session is Running, the
        original host is the session's cluster ``session_domain`` and the token's user is active and the
        session's owner or may open any session (``sessions.permissions``); a link token in ``?token=`` also sets the cookie. 401 ``token_missing``,
        ``token_invalid`` or ``connect_refused``, or 403 ``connect_forbidden`` (the user) otherwise.

    Raises:
        VerifyUnavailable: the database or Redis is unreachable or too slow to decide (503).
    """
    try:
        host, request_uri = _split_original_url(original_url or "")
        session_id = session_in_request_uri(request_uri)
    except PathRefused as exc:
        return _refused(CONNECT_REFUSED, f"path refused: {exc}")
    query = request_uri.split("#", 1)[0].partition("?")[2]
    from_query = parse_qs(query).get("token", [""])[0]
    scheme, _, bearer = authorization.partition(" ")
    candidates = [bearer.strip() if scheme.lower() == "bearer" else "", from_query, cookie]
    claims, source, misfits = None, "", []
    for token, where in zip(candidates, ("bearer", "query", "cookie"), strict=True):
        if not token:
            continue
        decoded = _decode(token)
        if decoded is None:
            continue
        misfit = _misfit(decoded, where)
        if misfit:
            misfits.append(misfit)
            continue
        claims, source = decoded, where
        break
    if claims is None:
        reason = "no valid connect token" + (f" ({'; '.join(misfits)})" if misfits else "")
        return _refused(TOKEN_INVALID if any(candidates) else TOKEN_MISSING, reason)
    if claims.get("sid") != session_id:
        return _refused(CONNECT_REFUSED, "token for another session")
    facts = _session_facts(session_id)
    if facts is None or facts["phase"] != Session.Phase.RUNNING:
        return _refused(CONNECT_REFUSED, "session not running")
    if not host or host != (facts["host"] or "").lower() or claims.get("host", host) != host:
        return _refused(CONNECT_REFUSED, "wrong host")
    user_pk = int(_USER_SUBJECT.fullmatch(claims["sub"]).group(1))
    user = _user_facts(user_pk)
    if user is None or not user["active"]:
        return _refused(CONNECT_FORBIDDEN, "user deactivated or gone")
    if user_pk != facts["owner"] and not user.get("open_any"):  # .get: facts cached before this key refuse
        return _refused(CONNECT_FORBIDDEN, "user neither the owner nor allowed to open any session")
    set_cookie = _cookie(claims, session_id, host) if source == "query" else None
    return Verdict(200, user=claims.get("name", ""), set_cookie=set_cookie, session=session_id)
