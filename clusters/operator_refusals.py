"""Refused operator callbacks, recorded on their cluster so the console can warn with the fix.

``OperatorTokenAuthentication`` calls :func:`operator_refusal_record` when it refuses a token that names a cluster
and whose signature verified (expired, revoked by credential generation, another audience, deregistered cluster,
...): only a validly signed token can be trusted to name its cluster, so a forged one records nothing. The cluster
keeps when the refusals began (``operator_refused_since``), the latest one on record (``operator_refused_at``) and
its reason code (``operator_refused_reason``); never the token. An accepted callback clears them
(:func:`operator_refusal_clear`, no query unless they are set).

An operator retrying in a loop must not turn into a database write per request: a Redis key per cluster
(``cache.add``, 60 s) lets at most one refusal a minute through to the ``UPDATE``, and the ``UPDATE`` itself only
matches a row whose latest refusal is a minute old or more, so the bound holds when Redis is down or flushed.
A clear reopens the gate (the next refusal is recorded at once) at most once a minute, so callbacks that are
accepted and refused in turn (an old operator still running beside the new one) write a handful of rows a minute,
not one per callback.
"""

from __future__ import annotations

import datetime
import logging

from django.core.cache import cache
from django.db import DatabaseError
from django.db.models import DateTimeField, F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from clusters.models import Cluster
from core import instruments

logger = logging.getLogger(__name__)

#: At most one recorded refusal per cluster within this many seconds.
REFUSAL_RECORD_PERIOD = 60


class RefusalReason:
    """Reason codes of ``Cluster.operator_refused_reason`` (those of ``identity.internal_jwt.CLAIM_REFUSALS`` too)."""

    TOKEN_EXPIRED = "token_expired"
    TOKEN_NOT_YET_VALID = "token_not_yet_valid"
    TOKEN_WRONG_AUDIENCE = "token_wrong_audience"
    TOKEN_WRONG_ISSUER = "token_wrong_issuer"
    TOKEN_MALFORMED = "token_malformed"
    TOKEN_REVOKED = "token_revoked"
    CLUSTER_DEREGISTERED = "cluster_deregistered"


#: What each reason means, for the console's warning.
REFUSAL_MEANINGS = {
    RefusalReason.TOKEN_EXPIRED: "its token has expired",
    RefusalReason.TOKEN_NOT_YET_VALID: "its token is not valid yet: the operator's clock or this one is wrong",
    RefusalReason.TOKEN_WRONG_AUDIENCE: "its token was minted for another endpoint",
    RefusalReason.TOKEN_WRONG_ISSUER: "its token names another issuer (GSHARE_JWT_ISSUER changed since it was minted)",
    RefusalReason.TOKEN_MALFORMED: "its token lacks a required claim",
    RefusalReason.TOKEN_REVOKED: "its token was revoked (an older credential generation)",
    RefusalReason.CLUSTER_DEREGISTERED: "the cluster is deregistered",
}


def _gate_key(public_id: str) -> str:
    return f"operator-refused:{public_id}"


def _reopen_key(public_id: str) -> str:
    return f"operator-refused-reopened:{public_id}"


def operator_refusal_record(*, reason: str, cluster: Cluster | None = None, cluster_id: str = "",
                            now: datetime.datetime | None = None) -> bool:
    """Record that a validly signed operator token of a cluster was refused, at most once a minute per cluster.

    Call it only for a token whose signature verified: its subject is then known to be that cluster's.

    Args:
        reason: a :class:`RefusalReason` code (never the token or any part of it).
        cluster: the cluster when already loaded; else ``cluster_id``.
        cluster_id: public id (``clu_...``) from the token's verified subject; an unknown id records nothing.
        now: the time of the refusal (default: now).

    Returns:
        True when a row was written; False when a refusal of this cluster was recorded less than
        ``REFUSAL_RECORD_PERIOD`` seconds ago, the cluster is unknown, or the database refused the write (logged:
        the caller's 401 stands either way).
    """
    public_id = cluster.public_id if cluster is not None else cluster_id
    if not public_id:
        return False
    instruments.OPERATOR_REFUSALS.labels(cluster_id=public_id, reason=reason).inc()
    try:
        if not cache.add(_gate_key(public_id), 1, timeout=REFUSAL_RECORD_PERIOD):
            return False
    except Exception as exc:  # any cache backend failure: the conditional UPDATE below still bounds the writes
        logger.warning("operator refusal gate skipped for %s: the cache failed (%s)", public_id, type(exc).__name__)
    now = now or timezone.now()
    rows = Cluster.objects.filter(pk=cluster.pk) if cluster is not None else Cluster.objects.filter(public_id=public_id)
    recent = now - datetime.timedelta(seconds=REFUSAL_RECORD_PERIOD)
    try:
        updated = rows.filter(Q(operator_refused_at__isnull=True) | Q(operator_refused_at__lte=recent)).update(
            operator_refused_since=Coalesce(F("operator_refused_since"), Value(now, output_field=DateTimeField())),
            operator_refused_at=now,
            operator_refused_reason=reason,
        )
    except DatabaseError as exc:
        logger.warning("operator refusal of %s not recorded: the database failed (%s)", public_id, type(exc).__name__)
        return False
    if updated:
        logger.warning("operator callbacks refused: cluster %s: %s", public_id, reason)
    return bool(updated)


def operator_refusal_clear(cluster: Cluster) -> bool:
    """Clear ``cluster``'s recorded refusals after an accepted callback. No query unless some are recorded.

    Args:
        cluster: the caller's cluster as loaded (its fields are cleared in place too).

    Returns:
        True when a recorded refusal was cleared.
    """
    if cluster.operator_refused_since is None and cluster.operator_refused_at is None:
        return False
    updated = Cluster.objects.filter(pk=cluster.pk).filter(
        Q(operator_refused_since__isnull=False) | Q(operator_refused_at__isnull=False)
    ).update(operator_refused_since=None, operator_refused_at=None, operator_refused_reason="")
    try:
        # A refusal right after this is recorded at once, but only once a minute: an old and a new operator calling
        # in turn would otherwise turn every callback into a write.
        if cache.add(_reopen_key(cluster.public_id), 1, timeout=REFUSAL_RECORD_PERIOD):
            cache.delete(_gate_key(cluster.public_id))
    except Exception as exc:  # the gate then expires on its own within a minute
        logger.warning("operator refusal gate of %s not reset: the cache failed (%s)", cluster.public_id, type(exc).__name__)
    since = cluster.operator_refused_since
    cluster.operator_refused_since = cluster.operator_refused_at = None
    cluster.operator_refused_reason = ""
    if updated:
        logger.info("operator callbacks accepted again: cluster %s (refused since %s)", cluster.public_id, since.isoformat() if since else "?")
    return bool(updated)
