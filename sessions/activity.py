"""What a session's GPUs and users did last: the operator's readings of HAMi's vGPU monitor and the connections
``/internal/connect/verify`` let through (docs/idle.md).

* ``activity_report_apply`` stores ``POST /internal/v1/activity`` (``contract.ACTIVITY_PATH``) in
  ``SessionActivity``, in a constant number of queries whatever the number of sessions.
* Connections are noted without a database write on verify's hot path: ``connection_note`` remembers, per process,
  the sessions it noted in the last policy minute (``GSHARE_IDLE_POLICY_MINUTE_SECONDS``) and otherwise writes one
  Redis hash field (``<prefix>:connected``, session id -> Unix time); ``connections_flush`` (beat, every minute)
  moves the hash into ``SessionActivity.last_connected_at``, so a session costs the database at most one write a
  minute. ``connections_pending`` reads what is not flushed yet (the idle policy counts it).
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta

import redis
from cachetools import TTLCache
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

import contract
from contract import rfc3339
from core.api.base import unstorable_text_path
from core.exceptions import ApplicationError, Forbidden
from sessions import connect
from sessions.errors import INVALID_ACTIVITY
from sessions.models import Session

logger = logging.getLogger(__name__)

#: A sampled_at this far ahead of the control plane's clock counts as now (a skewed node must not look busy forever).
CLOCK_SKEW = timedelta(seconds=60)
_noted_lock = threading.Lock()
_noted: TTLCache | None = None


class InvalidActivity(ApplicationError):
    """400: the activity report is malformed."""

    code = INVALID_ACTIVITY
    status = 400


def _time(value: str, where: str) -> datetime:
    parsed = rfc3339.parse(value)
    if parsed is None:
        raise InvalidActivity(f"{where} must be an RFC 3339 time with a zone, e.g. 2026-11-29T16:00:00Z; got {value!r}.")
    return parsed


def _last_kernel_at(entry: dict, sampled_at: datetime) -> datetime | None:
    """The newest instant one of the entry's GPUs ran a kernel (``sampled_at`` minus the smallest elapsed seconds);
    None when none did, or when that instant would fall before year 1 (the schema allows 1e12 s: no kernel seen)."""
    ages = [gpu["last_kernel_seconds"] for gpu in entry["gpus"] if gpu["last_kernel_seconds"] is not None]
    if entry["state"] != contract.ACTIVITY_STATE_OK or not ages:
        return None
    try:
        return sampled_at - timedelta(seconds=float(min(ages)))
    except OverflowError:
        return None


def _parse(entries: list[dict]) -> list[dict]:
    bad_text = unstorable_text_path(entries, "sessions")
    if bad_text:
        raise InvalidActivity(f"{bad_text} contains a NUL character or a lone surrogate, which cannot be stored: send plain UTF-8 text.")
    seen: set[str] = set()
    latest = timezone.now() + CLOCK_SKEW
    parsed = []
    for i, entry in enumerate(entries):
        if entry["session"] in seen:
            raise InvalidActivity(f"sessions[{i}] repeats session {entry['session']}: list each session once.")
        seen.add(entry["session"])
        if len({gpu["device_uuid"] for gpu in entry["gpus"]}) != len(entry["gpus"]):
            raise InvalidActivity(f"sessions[{i}].gpus lists a GPU twice: list each GPU of the session once.")
        if entry["state"] == contract.ACTIVITY_STATE_UNKNOWN and entry["gpus"]:
            raise InvalidActivity(f"sessions[{i}] is unknown but lists GPU readings: an unknown entry has no gpus.")
        sampled_at = min(_time(entry["sampled_at"], f"sessions[{i}].sampled_at"), latest)
        gpus = [{**gpu, "sampled_at": min(_time(gpu["sampled_at"], f"sessions[{i}].gpus[{j}].sampled_at"), latest).isoformat()}
                for j, gpu in enumerate(entry["gpus"])]
        parsed.append({**entry, "sampled_at": sampled_at, "gpus": gpus, "last_kernel_at": _last_kernel_at(entry, sampled_at)})
    return parsed


# Every multi-row upsert of SessionActivity (this one, _FLUSH, sessions.idle._MARK) locks its rows in session id
# order: two of them crossing over the same sessions in different orders would deadlock.
_UPSERT = """
INSERT INTO gpu_sessions_sessionactivity AS a
    (session_id, state, reason, sampled_at, gpus, last_kernel_at, last_connected_at, idle_since, stops_at, exempt_until,
     exempt_reason, exempt_by)
SELECT r.session_id, r.state, r.reason, r.sampled_at, r.gpus, r.last_kernel_at, NULL, NULL, NULL, NULL, '', ''
FROM jsonb_to_recordset(%s::jsonb) AS r(session_id bigint, state text, reason text, sampled_at timestamptz, gpus jsonb,
                                        last_kernel_at timestamptz)
ORDER BY r.session_id
ON CONFLICT (session_id) DO UPDATE SET
    state = EXCLUDED.state, reason = EXCLUDED.reason, sampled_at = EXCLUDED.sampled_at, gpus = EXCLUDED.gpus,
    last_kernel_at = GREATEST(a.last_kernel_at, EXCLUDED.last_kernel_at)
WHERE a.sampled_at IS NULL OR a.sampled_at <= EXCLUDED.sampled_at
"""


@transaction.atomic
def activity_report_apply(*, cluster, entries: list[dict]) -> dict:
    """Store an operator's activity report (``ACTIVITY_SCHEMA``-valid) for the Running sessions of ``cluster``.

    Two queries whatever the number of entries: the sessions, then one upsert. A reading older than the stored one is
    ignored (reports may cross); ``last_kernel_at`` only moves forward; an unknown reading keeps it.

    Args:
        cluster: the cluster of the operator token.
        entries: the report's ``sessions``.

    Returns:
        ``{"accepted": n, "ignored": m}`` (ignored: sessions no longer, or not yet, Running).

    Raises:
        InvalidActivity: 400 ``invalid_activity``: a session or GPU listed twice, a bad time, an unknown entry with GPUs,
            text (a reason, a device UUID) with a NUL character or a lone surrogate.
        Forbidden: 403 ``forbidden_cluster_scope``: an entry names a session of another cluster, or none the control plane
            knows; nothing is stored.
    """
    parsed = _parse(entries)
    ids = [entry["session"] for entry in parsed]
    found = {public_id: (pk, cluster_id, phase)
             for pk, public_id, cluster_id, phase in Session.objects.filter(public_id__in=ids).values_list("pk", "public_id", "cluster_id", "phase")}
    foreign = sorted(sid for sid in ids if sid not in found or found[sid][1] != cluster.pk)
    if foreign:
        raise Forbidden(
            f"Session(s) {', '.join(foreign[:5])} are not sessions of this cluster; an operator may only report its own "
            "cluster's sessions. Nothing was stored.",
            code=contract.FORBIDDEN_CLUSTER_SCOPE,
        )
    rows = [{"session_id": found[e["session"]][0], "state": e["state"], "reason": e["reason"][:1000], "sampled_at": e["sampled_at"].isoformat(),
             "gpus": e["gpus"], "last_kernel_at": e["last_kernel_at"].isoformat() if e["last_kernel_at"] else None}
            for e in parsed if found[e["session"]][2] == Session.Phase.RUNNING]
    if rows:
        with connection.cursor() as cursor:
            cursor.execute(_UPSERT, [json.dumps(rows)])
    return {"accepted": len(rows), "ignored": len(parsed) - len(rows)}


def _hash_key() -> str:
    return f"{settings.CACHES['default'].get('KEY_PREFIX', '')}:connected"


def _redis():
    """A Redis client of the default cache's server, bounded like connect verify's (``connect.CACHE_TIMEOUT_SECONDS``)."""
    return connect.redis_client()


def connection_note(session_id: str, *, now: datetime | None = None) -> None:
    """Note that someone was let into ``session_id`` (``ses_...``) now: at most one Redis write per session, process
    and policy minute, none to the database. Never raises (a Redis failure is logged: the session then just looks
    unconnected for a minute)."""
    global _noted
    with _noted_lock:
        if _noted is None:
            _noted = TTLCache(maxsize=100_000, ttl=settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS)
        if session_id in _noted:
            return
        _noted[session_id] = True
    moment = now or timezone.now()
    try:
        _redis().hset(_hash_key(), session_id, str(int(moment.timestamp())))
    except (redis.RedisError, OSError) as exc:
        logger.warning("connect: could not note a connection to %s (%s)", session_id, exc)
        with _noted_lock:
            _noted.pop(session_id, None)


def forget_noted() -> None:
    """Forget this process's noted sessions (tests; a changed ``GSHARE_IDLE_POLICY_MINUTE_SECONDS``)."""
    global _noted
    with _noted_lock:
        _noted = None


def _moments(raw: dict) -> dict[str, datetime]:
    moments = {}
    for key, value in raw.items():
        key = key.decode() if isinstance(key, bytes) else key
        try:
            moments[key] = datetime.fromtimestamp(int(value), UTC)
        except (TypeError, ValueError, OverflowError, OSError):
            continue
    return moments


def connections_pending(session_ids: list[str]) -> dict[str, datetime] | None:
    """The connections noted in Redis and not flushed yet, for ``session_ids`` (one call).

    Returns:
        ``{session id: noted at}``; None when Redis failed (then who connected lately is unknown: while Redis is
        down verify cannot note connections either).
    """
    if not session_ids:
        return {}
    try:
        values = _redis().hmget(_hash_key(), session_ids)
    except (redis.RedisError, OSError) as exc:
        logger.warning("idle: could not read the pending connections (%s)", exc)
        return None
    return _moments({sid: value for sid, value in zip(session_ids, values, strict=True) if value is not None})


def last_connection(row, pending: dict[str, datetime] | None, session_id: str) -> datetime | None:
    """The newest connection to ``session_id``: its ``SessionActivity.last_connected_at`` (``row`` may be None) or the
    one noted in Redis and not flushed yet (``connections_pending``'s answer; None or ``{}`` when unread)."""
    return max((t for t in (row.last_connected_at if row else None, (pending or {}).get(session_id)) if t), default=None)


_FLUSH = """
INSERT INTO gpu_sessions_sessionactivity AS a
    (session_id, state, reason, sampled_at, gpus, last_kernel_at, last_connected_at, idle_since, stops_at, exempt_until,
     exempt_reason, exempt_by)
SELECT s.id, '', '', NULL, '[]'::jsonb, NULL, r.at, NULL, NULL, NULL, '', ''
FROM jsonb_to_recordset(%s::jsonb) AS r(session text, at timestamptz) JOIN gpu_sessions_session s ON s.public_id = r.session
ORDER BY s.id
ON CONFLICT (session_id) DO UPDATE SET last_connected_at = GREATEST(a.last_connected_at, EXCLUDED.last_connected_at)
"""


def connections_flush() -> int:
    """Move the connections noted in Redis into ``SessionActivity.last_connected_at`` (one Redis transaction, one
    statement). What the database write fails on is put back into Redis (unless a newer note arrived meanwhile).

    Returns:
        How many sessions were written.
    """
    client = _redis()
    key = _hash_key()
    with client.pipeline(transaction=True) as pipe:
        pipe.hgetall(key)
        pipe.delete(key)
        raw, _ = pipe.execute()
    moments = _moments(raw)
    if not moments:
        return 0
    rows = [{"session": sid, "at": at.isoformat()} for sid, at in moments.items()]
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_FLUSH, [json.dumps(rows)])
            written = cursor.rowcount
    except Exception:
        for sid, at in moments.items():
            client.hsetnx(key, sid, str(int(at.timestamp())))
        raise
    return written
