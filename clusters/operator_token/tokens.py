"""Minting operator tokens: RS256 internal JWTs whose subject is ``operator:<cluster_id>``.

Every token carries the cluster's credential generation (claim ``gen``); ``OperatorTokenAuthentication``
refuses a token of another generation (401 ``token_revoked``). Issuing a token records its expiry on the
cluster (``Cluster.operator_token_expires_at``: the latest expiry issued for the current generation).

The operator's self-refresh (``POST /internal/v1/token``, :func:`operator_token_exchange`) is bounded: a
token is exchanged only inside its refresh window (the last quarter of its life, as the operator's
``TokenRefresher`` does it), at most ``GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT`` times a minute per cluster,
and every exchange, mint and throttled minute is an audit row (ids only, never a token).
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from dataclasses import dataclass, field

import jwt
from django.conf import settings
from django.core.cache import cache
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Greatest

from audit.services import Action, audit_record
from clusters.errors import CLUSTER_NOT_FOUND, INVALID_TTL, TOKEN_REFRESH_THROTTLED, TOKEN_REFRESH_TOO_EARLY
from clusters.models import Cluster
from contract import CLUSTER_DEREGISTERED, OPERATOR_TOKEN_GENERATION_CLAIM, OPERATOR_TOKEN_SUBJECT_PREFIX
from contract import OPERATOR_TOKEN_REFRESH_FRACTION as REFRESH_FRACTION
from core.exceptions import ApplicationError, Conflict, NotFound
from identity.internal_jwt import OPERATOR_AUDIENCE, InvalidInternalToken, sign_internal_jwt

logger = logging.getLogger(__name__)

MAX_TTL = 30 * 24 * 3600

#: Share of a token's life (``exp - iat``) left below which it may be exchanged: the operator's own
#: threshold (``operator_agent.token.REFRESH_FRACTION``, 1/4; its jitter only lowers it, to 1/5).
EXCHANGE_WINDOW_FRACTION = REFRESH_FRACTION
#: The window is widened by the clock-skew allowance (``GSHARE_JWT_LEEWAY``, at least 1 s) for an operator whose
#: clock runs ahead, but never by more than this share of the token's life.
EXCHANGE_SKEW_MAX_SHARE = 0.05
#: Default of ``GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT``: exchanges per cluster per ``EXCHANGE_PERIOD`` (0: unlimited).
DEFAULT_EXCHANGE_LIMIT = 10
#: Length of one throttle window, seconds.
EXCHANGE_PERIOD = 60


class TokenRefreshTooEarly(Conflict):
    """409: the presented operator token is not in its refresh window yet (``refresh_after`` says when it is)."""

    code = TOKEN_REFRESH_TOO_EARLY


class TokenRefreshThrottled(ApplicationError):
    """429: too many exchanges for this cluster in the current minute; ``retry_after`` seconds to wait."""

    code = TOKEN_REFRESH_THROTTLED
    status = 429

    def __init__(self, detail: str, *, retry_after: int):
        super().__init__(detail, extra={"retry_after": retry_after})
        self.retry_after = retry_after


@dataclass(frozen=True)
class IssuedToken:
    """A freshly signed operator token.

    Attributes:
        token: the compact JWS (a secret: never logged; left out of ``repr``).
        expires_at: its ``exp`` as an aware UTC datetime.
        generation: the credential generation it carries (claim ``gen``).
        jti: its ``jti`` claim (safe to log: it identifies the token without granting anything).
    """

    token: str = field(repr=False)
    expires_at: datetime.datetime
    generation: int
    jti: str = ""


def _check_ttl(ttl: int | None) -> int:
    ttl = settings.GSHARE_OPERATOR_TOKEN_TTL if ttl is None else ttl
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 < ttl <= MAX_TTL:
        raise ApplicationError(f"--ttl must be between 1 and {MAX_TTL} seconds (30 days); got {ttl}.", code=INVALID_TTL)
    return ttl


def operator_token_issue(*, cluster: Cluster, ttl: int | None = None) -> IssuedToken:
    """Sign a token for ``cluster``'s operator, of the cluster's current generation. Records nothing.

    Callers record the expiry once the token is delivered (:func:`operator_token_expiry_record`), so a token
    that never reached its cluster does not count.

    Args:
        cluster: a cluster that is not deregistered (its ``credential_generation`` as loaded is used).
        ttl: lifetime in seconds (default ``GSHARE_OPERATOR_TOKEN_TTL`` = 604800, at most 30 days).

    Returns:
        An :class:`IssuedToken`.

    Raises:
        ApplicationError: ``invalid_ttl`` outside 1 s .. 30 days.
        Conflict: ``cluster_deregistered``.
    """
    ttl = _check_ttl(ttl)
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict(f"Cluster {cluster.name} ({cluster.public_id}) is deregistered: register it again first.", code=CLUSTER_DEREGISTERED)
    generation = cluster.credential_generation
    token = sign_internal_jwt(
        f"{OPERATOR_TOKEN_SUBJECT_PREFIX}{cluster.public_id}", ttl, audience=OPERATOR_AUDIENCE,
        claims={OPERATOR_TOKEN_GENERATION_CLAIM: generation},
    )
    claims = jwt.decode(token, options={"verify_signature": False})
    return IssuedToken(
        token=token, expires_at=datetime.datetime.fromtimestamp(claims["exp"], tz=datetime.UTC), generation=generation,
        jti=claims.get("jti", ""),
    )


def operator_token_expiry_record(*, cluster: Cluster, issued: IssuedToken, **fields) -> bool:
    """Record ``issued``'s expiry on the cluster (keeping a later one already recorded), plus ``fields``.

    One ``UPDATE``, applied only while the cluster is still at ``issued.generation`` (a token revoked
    meanwhile is not recorded).

    Args:
        cluster: the cluster the token was issued for.
        issued: the token.
        **fields: more columns to set in the same statement (e.g. ``operator_token_rotated_at``).

    Returns:
        True when the row was updated, False when the cluster's generation changed meanwhile.
    """
    expiry = Value(issued.expires_at, output_field=DateTimeField())
    updated = Cluster.objects.filter(pk=cluster.pk, credential_generation=issued.generation).update(
        # PostgreSQL's GREATEST ignores NULL: the first expiry recorded is taken as is.
        operator_token_expires_at=Greatest(F("operator_token_expires_at"), expiry), **fields
    )
    return bool(updated)


def operator_token_mint(*, cluster_id: str, ttl: int | None = None) -> str:
    """Mint a token for the operator of ``cluster_id`` and record its expiry on the cluster.

    Args:
        cluster_id: public id (``clu_...``) of a cluster that is not deregistered.
        ttl: lifetime in seconds (default ``GSHARE_OPERATOR_TOKEN_TTL`` = 604800, at most 30 days).

    Returns:
        The compact JWS (audience ``gshare-internal``, claim ``gen`` = the cluster's credential generation).

    Raises:
        NotFound: ``cluster_not_found``. Conflict: ``cluster_deregistered``.
        ApplicationError: ``invalid_ttl`` outside 1 s .. 30 days.
    """
    ttl = _check_ttl(ttl)
    cluster = Cluster.objects.filter(public_id=cluster_id).first()
    if cluster is None:
        raise NotFound(f"No cluster has the id {cluster_id!r}: list them with `GET /api/v1/clusters`.", code=CLUSTER_NOT_FOUND)
    issued = operator_token_issue(cluster=cluster, ttl=ttl)
    operator_token_expiry_record(cluster=cluster, issued=issued)
    audit_record(action=Action.OPERATOR_TOKEN_MINT, object_type="operator_token", object_id=issued.jti, cluster=cluster,
                 details={"generation": issued.generation, "expires_at": issued.expires_at, "ttl": ttl})
    return issued.token


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC).replace(microsecond=0)


def operator_token_refresh_after(claims: dict) -> float:
    """Epoch seconds from which the token with these verified ``claims`` may be exchanged.

    ``exp - window`` with ``window = (exp - iat) / 4 + skew`` and ``skew = min(max(GSHARE_JWT_LEEWAY, 1),
    (exp - iat) / 20)``. The operator asks once ``exp - now`` is between 1/5 and 1/4 of the life
    (``operator_agent.token.TokenRefresher``), so its requests always fall inside; the skew allowance covers an
    operator clock that runs ahead of this one.

    Raises:
        InvalidInternalToken: ``iat``/``exp`` are not numbers, or ``exp <= iat``.
    """
    iat, exp = claims.get("iat"), claims.get("exp")
    if any(isinstance(value, bool) or not isinstance(value, int | float) for value in (iat, exp)) or exp <= iat:
        raise InvalidInternalToken("This operator token's `iat`/`exp` claims are malformed: mint a new one with `manage.py mint_operator_token`.")
    life = exp - iat
    skew = min(max(settings.GSHARE_JWT_LEEWAY, 1), life * EXCHANGE_SKEW_MAX_SHARE)
    return exp - (life * EXCHANGE_WINDOW_FRACTION + skew)


def _exchange_throttle(*, cluster: Cluster, now: float) -> None:
    """Count one exchange attempt of ``cluster`` in the current minute (Django cache); refuse above the limit.

    A cache outage is logged and lets the exchange through (the refresh window still bounds it): an operator is
    never locked out because Redis blinked.

    Raises:
        TokenRefreshThrottled: more than ``GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT`` attempts this minute.
    """
    limit = getattr(settings, "GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT", DEFAULT_EXCHANGE_LIMIT)
    if not limit or limit < 0:
        return
    window = int(now // EXCHANGE_PERIOD)
    key = f"operator-token-exchange:{cluster.public_id}:{window}"
    try:
        cache.add(key, 0, timeout=EXCHANGE_PERIOD + 5)
        try:
            count = cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=EXCHANGE_PERIOD + 5)
            count = 1
    except Exception as exc:  # any cache backend failure (Redis down, ...)
        logger.warning("operator token exchange throttle skipped for %s: the cache failed (%s)", cluster.public_id, type(exc).__name__)
        return
    if count <= limit:
        return
    retry_after = max(1, math.ceil((window + 1) * EXCHANGE_PERIOD - now))
    if count == limit + 1:  # one row per cluster and minute, however hard it is hammered
        audit_record(action=Action.OPERATOR_TOKEN_EXCHANGE_THROTTLED, obj=cluster, actor=f"operator:{cluster.public_id}",
                     details={"limit": limit}, level=logging.WARNING)
    raise TokenRefreshThrottled(
        f"Cluster {cluster.name} ({cluster.public_id}) asked for more than {limit} operator tokens within a minute: "
        f"retry in {retry_after} s. A healthy operator exchanges its token once per token lifetime; more means several "
        "processes share the token, or it leaked (revoke with `manage.py revoke_operator_tokens`).",
        retry_after=retry_after,
    )


def operator_token_exchange(*, cluster: Cluster, claims: dict, now: float | None = None) -> IssuedToken:
    """``POST /internal/v1/token``: a fresh token for the authenticated operator of ``cluster``.

    The caller's token has already been verified (signature, expiry, generation, cluster not deregistered).
    It is exchanged only inside its refresh window (:func:`operator_token_refresh_after`: less than a quarter
    of its life left, plus the clock-skew allowance), and at most ``GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT``
    times a minute per cluster (every attempt counts). The new token has the cluster's current generation and
    ``GSHARE_OPERATOR_TOKEN_TTL`` seconds of life (never more); its expiry is recorded on the cluster. Every
    exchange writes one audit row (cluster, old and new ``jti``, generation; never a token).

    Args:
        cluster: the caller's cluster.
        claims: the verified claims of the presented token (``iat``, ``exp``, ``jti``).
        now: epoch seconds (default: now).

    Returns:
        An :class:`IssuedToken` (its ``token`` goes to that operator only).

    Raises:
        TokenRefreshThrottled: ``token_refresh_throttled`` (429, ``retry_after``).
        TokenRefreshTooEarly: ``token_refresh_too_early`` (409, ``refresh_after``).
        Conflict: ``cluster_deregistered`` if the cluster was deregistered meanwhile.
        ApplicationError: ``invalid_ttl`` when ``GSHARE_OPERATOR_TOKEN_TTL`` is outside 1 s .. 30 days.
    """
    now = time.time() if now is None else now
    _exchange_throttle(cluster=cluster, now=now)
    refresh_after = operator_token_refresh_after(claims)
    if now < refresh_after:
        exp, allowed = claims["exp"], _utc(math.ceil(refresh_after)).isoformat()
        raise TokenRefreshTooEarly(
            f"This operator token is not due for refresh: it expires at {_utc(exp).isoformat()} and can be exchanged from "
            f"{allowed} (once less than a quarter of its life is left). Keep using it; the operator "
            "refreshes it on its own when it is due, and `manage.py rotate_operator_tokens --cluster "
            f"{cluster.public_id}` pushes a new one at any time.",
            extra={"refresh_after": allowed, "expires_at": _utc(exp).isoformat()},
        )
    issued = operator_token_issue(cluster=cluster)
    recorded = operator_token_expiry_record(cluster=cluster, issued=issued)
    audit_record(action=Action.OPERATOR_TOKEN_EXCHANGE, object_type="operator_token", object_id=issued.jti, cluster=cluster,
                 actor=f"operator:{cluster.public_id}", details={
                     "old_jti": claims.get("jti", ""), "new_jti": issued.jti, "generation": issued.generation,
                     "expires_at": issued.expires_at, "old_expires_at": _utc(claims["exp"]), "recorded": recorded,
                 })
    return issued
