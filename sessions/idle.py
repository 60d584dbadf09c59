"""The idle policy: a Running session whose GPUs ran no kernel for the policy's ``idle_timeout_minutes`` is warned, then
stopped with reason ``idle`` (docs/idle.md).

The signals are the session's own, never the whole GPU's: HAMi's vGPU monitor measures each container's slice of a
shared GPU (``sessions.activity``), and connect verify notes who was let in. ``idle_judge`` decides, and
``idle_status`` applies it to a session: the stop task (``idle_enforce``), the API and the console all ask it.

* GPU activity is **known** when a fresh ``ok`` reading lists every GPU of the session. Then only a kernel resets the
  clock, which starts at the latest of: the session's start, the last kernel on any of its GPUs, the end of a staff
  exemption. A connection (an open JupyterLab tab polls all the time) is no sign of GPU use: one let in during the
  warning postpones the stop once, by one warning period, and never again for that idle stretch (the stretch starts
  at ``idle_since``; ``last_connected_at`` never moves back, so the postponement, once earned, stays and cannot grow).
* GPU activity reported for only some of the session's GPUs leaves the others unknown: connections then count as
  activity too (the clock starts at the latest connection as well).
* GPU activity that is unknown (no reading yet, the monitor could not be read, or the reading is older than
  ``GSHARE_ACTIVITY_STALE_SECONDS``) never makes a session idle: its clock does not run.
* ``idle_warning_minutes`` before the stop the session shows ``idle_since`` and ``stops_at``;
* at ``stops_at`` it is stopped (``sessions.lifecycle.session_stop``, ``stop_reason`` ``idle``, its message naming the
  policy and the last activity), and the ledger gets its ``end`` entry with the credits burned while idle
  (``billing.services.ledger_session_end``).

A policy minute lasts ``GSHARE_IDLE_POLICY_MINUTE_SECONDS`` (60; the demo shortens it). ``idle_enforce`` runs from beat
(``sessions.enforce_idle``, every 30 s) and after each activity report of a cluster (``idle_enforce_soon``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit.services import Action, audit_record
from billing import admission
from billing.services import ledger_session_end
from core.exceptions import ApplicationError, Conflict, Forbidden
from sessions import activity, lifecycle
from sessions.errors import IDLE_EXEMPTION_FORBIDDEN, INVALID_EXEMPTION, SESSION_NOT_LIVE
from sessions.models import Session, SessionActivity
from sessions.permissions import may_open_any_session

logger = logging.getLogger(__name__)

#: The longest a staff exemption may last.
MAX_EXEMPTION = timedelta(days=365)


@dataclass(frozen=True)
class IdleJudgement:
    """Where the idle policy stands for one session at one moment (``idle_judge``).

    Attributes:
        idle_since: when its idle clock started, once the warning runs (else None).
        stops_at: when it is stopped, once the warning runs (else None).
        due: True when it is to be stopped now.
        unknown: why GPU activity does not count, or "" (then the clock does not run).
        last_activity: when the clock started: the latest of start, last kernel, exemption end and, only while
            connections count, last connection.
        connections_count: connections reset the clock (GPU activity of some of its GPUs is not reported).
        partial: why connections count ("" when the reading covers every GPU of the session).
        postponed: a connection during the warning moved ``stops_at`` by one warning period (at most once a stretch).
    """

    idle_since: datetime | None = None
    stops_at: datetime | None = None
    due: bool = False
    unknown: str = ""
    last_activity: datetime | None = None
    connections_count: bool = False
    partial: str = ""
    postponed: bool = False


def minute() -> timedelta:
    """How long one minute of a policy lasts (``GSHARE_IDLE_POLICY_MINUTE_SECONDS``)."""
    return timedelta(seconds=settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS)


def activity_unknown(*, state: str, reason: str, sampled_at: datetime | None, now: datetime) -> str:
    """Why a session's GPU activity does not count now, or "" when it does.

    Args:
        state: ``SessionActivity.state`` ("" before any reading).
        reason: the operator's reason for an ``unknown`` reading.
        sampled_at: when the last reading was taken.
        now: the moment judged.
    """
    if not state or sampled_at is None:
        return "no reading of HAMi's vGPU monitor yet"
    if state == SessionActivity.State.UNKNOWN:
        return reason or "the operator could not read HAMi's vGPU monitor"
    stale = timedelta(seconds=settings.GSHARE_ACTIVITY_STALE_SECONDS)
    if now - sampled_at > stale:
        return f"the last reading of HAMi's vGPU monitor is {int((now - sampled_at).total_seconds())} s old"
    return ""


def gpus_unreported(*, gpus: list, devices: list, count: int) -> str:
    """Why a reading does not cover every GPU of a session, or "" when it does.

    Args:
        gpus: the reading's ``SessionActivity.gpus`` (dicts with ``device_uuid``; anything else is ignored).
        devices: the session's GPU UUIDs (``Session.devices``; empty before the operator reported them).
        count: how many GPUs the session asked for (``Session.gpus``).

    Returns:
        "" when every GPU of ``devices`` (or, before they are known, at least ``count`` GPUs) is listed; a GPU listed
        with no figures counts as reported (HAMi lists no series where CUDA never started: no kernel ran there).
    """
    reported = {g.get("device_uuid") for g in gpus or [] if isinstance(g, dict) and g.get("device_uuid")}
    wanted = {d for d in devices or [] if isinstance(d, str) and d}
    missing = len(wanted - reported) if wanted else max(count - len(reported), 0)
    if not missing:
        return ""
    total = len(wanted) or count
    return f"HAMi's vGPU monitor reported {total - missing} of the session's {total} GPUs"


def idle_judge(
    *,
    now: datetime,
    started_at: datetime,
    last_kernel_at: datetime | None,
    last_connected_at: datetime | None,
    exempt_until: datetime | None,
    unknown: str,
    partial: str,
    timeout: timedelta,
    warning: timedelta,
) -> IdleJudgement:
    """Judge one Running session (pure: no query). The one rule the stop task, the API and the console apply.

    Args:
        now: the moment judged (aware UTC).
        started_at: when it started running.
        last_kernel_at: newest kernel on any of its GPUs, or None (none seen).
        last_connected_at: newest connection let through, or None.
        exempt_until: end of a staff exemption, or None.
        unknown: ``activity_unknown``'s answer ("" when GPU activity counts).
        partial: ``gpus_unreported``'s answer ("" when the reading covers every GPU: connections then only postpone).
        timeout: the policy's idle timeout (zero: never idle).
        warning: how long before the stop the warning starts (clipped to the timeout); also how long a connection
            during the warning postpones the stop, once.

    Returns:
        The judgement: nothing while the timeout is zero, an exemption runs or GPU activity is unknown. With every GPU
        reported the stop comes at most ``timeout + warning`` after the last kernel, however often someone connects.
    """
    counts = bool(partial or unknown)
    signals = (started_at, last_kernel_at, exempt_until) + ((last_connected_at,) if counts else ())
    last = max(t for t in signals if t is not None)
    quiet = IdleJudgement(last_activity=last, connections_count=counts, partial=partial)
    if timeout <= timedelta(0) or (exempt_until is not None and exempt_until > now):
        return quiet
    if unknown:
        return IdleJudgement(unknown=unknown, last_activity=last, connections_count=True, partial=partial)
    warning = min(warning, timeout)
    stops_at = last + timeout
    warned_from = stops_at - warning
    if now < warned_from:
        return quiet
    # last_connected_at only moves forward, so once a connection falls in this stretch's warning the postponement
    # stays granted on every later judgement, and no later connection can move the stop again.
    postponed = not counts and warning > timedelta(0) and last_connected_at is not None and last_connected_at >= warned_from
    if postponed:
        stops_at += warning
    return IdleJudgement(idle_since=last, stops_at=stops_at, due=now >= stops_at, last_activity=last,
                         connections_count=counts, partial=partial, postponed=postponed)


def _policy_text(policy: admission.EffectivePolicy) -> str:
    whose = {"user": "your own policy", "default": "the default policy"}.get(policy.source, "the default policy (settings)")
    span = minute()
    if span == timedelta(minutes=1):
        length = f"{policy.idle_timeout_minutes} min"
    else:
        length = f"{policy.idle_timeout_minutes} policy minutes of {int(span.total_seconds())} s"
    return f"{whose}: {length} without a GPU kernel"


def _moment(value: datetime | None, never: str) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else never


def stop_message(*, policy: admission.EffectivePolicy, last_kernel_at: datetime | None, last_connected_at: datetime | None,
                 judgement: IdleJudgement | None = None) -> str:
    """The message of a session stopped by the idle policy: the policy, its timeout, the last kernel and connection,
    and whether connections counted (``judgement``: the one that found it due; None says nothing of connections)."""
    text = (f"Stopped by the idle policy ({_policy_text(policy)}). Last GPU kernel: {_moment(last_kernel_at, 'none seen')}; "
            f"last connection: {_moment(last_connected_at, 'none')}.")
    if judgement is None:
        return text
    if judgement.connections_count:
        return f"{text} Connections counted as activity: {judgement.partial}."
    postponed = " (a connection during the warning postponed the stop once)" if judgement.postponed else ""
    return f"{text} Connections do not keep a session whose GPUs HAMi's vGPU monitor reports{postponed}."


_MARK = """
INSERT INTO gpu_sessions_sessionactivity AS a
    (session_id, state, reason, sampled_at, gpus, last_kernel_at, last_connected_at, idle_since, stops_at, exempt_until,
     exempt_reason, exempt_by)
SELECT r.session_id, '', '', NULL, '[]'::jsonb, NULL, NULL, r.idle_since, r.stops_at, NULL, '', ''
FROM jsonb_to_recordset(%s::jsonb) AS r(session_id bigint, idle_since timestamptz, stops_at timestamptz)
ORDER BY r.session_id
ON CONFLICT (session_id) DO UPDATE SET idle_since = EXCLUDED.idle_since, stops_at = EXCLUDED.stops_at
"""


def idle_status(*, session: Session, row: SessionActivity | None, policy: admission.EffectivePolicy,
                connected: datetime | None, now: datetime) -> IdleJudgement:
    """``idle_judge`` applied to one session: what the stop task acts on and what the API and the console show.

    Args:
        session: the session (its ``started_at``/``created_at``, ``devices``, ``gpus`` and ``phase`` are read).
        row: its ``SessionActivity`` (None: no reading and no connection yet).
        policy: its owner's effective policy (``billing.admission.policy_for``).
        connected: its newest connection (``activity.last_connection``: the row's and the one not flushed yet).
        now: the moment judged (aware UTC).

    Returns:
        An ``IdleJudgement``; an empty one (no warning, not due) for a session that is not Running.
    """
    if session.phase != Session.Phase.RUNNING:
        return IdleJudgement()
    return idle_judge(
        now=now, started_at=session.started_at or session.created_at, last_kernel_at=row.last_kernel_at if row else None,
        last_connected_at=connected, exempt_until=row.exempt_until if row else None,
        unknown=activity_unknown(state=row.state if row else "", reason=row.reason if row else "",
                                 sampled_at=row.sampled_at if row else None, now=now),
        partial=gpus_unreported(gpus=row.gpus if row else [], devices=session.devices, count=session.gpus),
        timeout=policy.idle_timeout_minutes * minute(), warning=policy.idle_warning_minutes * minute(),
    )


def idle_enforce(*, cluster=None, now: datetime | None = None) -> dict[str, int]:
    """Judge every Running session (of ``cluster``, or of the fleet), show or clear the warnings, stop the due ones.

    Queries: three whatever the number of sessions (the sessions with their activity, the policies, one upsert of
    the warnings that changed), one Redis call (the connections not flushed yet), plus per due session its locks,
    one Redis call and what ``session_stop`` and the ledger's end entry cost. While Redis fails nobody is stopped
    (recent connections are unknown); the warnings are still shown.

    Returns:
        ``{"checked": n, "warned": sessions in their warning, "stopped": n}``.
    """
    now = now or timezone.now()
    sessions = Session.objects.filter(phase=Session.Phase.RUNNING).select_related("activity")
    if cluster is not None:
        sessions = sessions.filter(cluster=cluster)
    sessions = list(sessions.only("pk", "public_id", "owner_id", "started_at", "created_at", "phase", "cluster_id", "devices", "gpus",
                                  "activity__state", "activity__reason", "activity__sampled_at", "activity__gpus", "activity__last_kernel_at",
                                  "activity__last_connected_at", "activity__idle_since", "activity__stops_at", "activity__exempt_until"))
    if not sessions:
        return {"checked": 0, "warned": 0, "stopped": 0}
    policies = admission.policies_for(user_ids=[s.owner_id for s in sessions])
    pending = activity.connections_pending([s.public_id for s in sessions])
    if pending is None:  # Redis is down: verify notes no connection either, so nobody may look unconnected
        logger.warning("idle: the recent connections are unknown (Redis); no session is stopped this run")
    changed, due, warned = [], [], 0
    for session in sessions:
        row = getattr(session, "activity", None)
        policy = policies[session.owner_id]
        judgement = idle_status(session=session, row=row, policy=policy,
                                connected=activity.last_connection(row, pending, session.public_id), now=now)
        warned += judgement.idle_since is not None
        if (row.idle_since if row else None, row.stops_at if row else None) != (judgement.idle_since, judgement.stops_at):
            changed.append({"session_id": session.pk, "idle_since": judgement.idle_since.isoformat() if judgement.idle_since else None,
                            "stops_at": judgement.stops_at.isoformat() if judgement.stops_at else None})
        if judgement.due and pending is not None:
            due.append((session, policy))
    if changed:
        with connection.cursor() as cursor:
            cursor.execute(_MARK, [json.dumps(changed)])
    stopped = sum(_stop_idle(session=s, policy=p, now=now) for s, p in due)
    return {"checked": len(sessions), "warned": warned, "stopped": stopped}


@transaction.atomic
def _stop_idle(*, session: Session, policy, now: datetime) -> bool:
    """Stop one session judged due, and write its end entry, if it is still due when judged again under its locks.

    Between the fleet-wide judgement and this stop an activity report, a connection (noted or flushed) or an
    exemption may have come: the session's row and its activity row are locked (in the order ``session_idle_exempt``
    takes them), its pending connection read again from Redis (no stop when Redis fails), and it is judged afresh, so
    a kernel that just ran, a staff exemption or a connection that earns the postponement is never overruled by a
    stale judgement.
    """
    locked = Session.objects.select_for_update().select_related("owner").get(pk=session.pk)
    row = SessionActivity.objects.select_for_update().filter(session_id=session.pk).first()
    if locked.phase != Session.Phase.RUNNING or row is None:
        return False
    pending = activity.connections_pending([locked.public_id])
    if pending is None:
        return False
    connected = activity.last_connection(row, pending, locked.public_id)
    judgement = idle_status(session=locked, row=row, policy=policy, connected=connected, now=now)
    if not judgement.due:
        return False
    message = stop_message(policy=policy, last_kernel_at=row.last_kernel_at, last_connected_at=connected, judgement=judgement)
    lifecycle.session_stop(session=locked, reason=message, stop_reason=Session.StopReason.IDLE)
    ledger_session_end(session=locked, idle_since=judgement.idle_since, until=now, reason=message, created_by="idle-policy")
    logger.info("session %s stopped by the idle policy (idle since %s)", locked.public_id, _moment(judgement.idle_since, "?"))
    return True


#: The Celery task that runs the policy (``sessions.tasks``, which is built on this module, defines it; it is published by
#: name, as ``sessions.lifecycle.outbox`` publishes its own).
ENFORCE_TASK = "sessions.enforce_idle"


def idle_enforce_soon(*, cluster) -> None:
    """Have ``sessions.enforce_idle`` judge ``cluster``'s sessions once the current transaction commits (never raises:
    beat runs it for the whole fleet anyway)."""

    def publish():
        try:
            current_app.tasks[ENFORCE_TASK].apply_async(kwargs={"cluster_pk": cluster.pk}, expires=30)
        except Exception as exc:  # the broker is down: beat's run covers it
            logger.warning("idle: could not publish the policy run for %s (%s)", cluster.name, exc)

    transaction.on_commit(publish)


class InvalidExemption(ApplicationError):
    """400: an exemption's end or reason is out of range."""

    code = INVALID_EXEMPTION
    status = 400


@transaction.atomic
def session_idle_exempt(*, session: Session, user, until: datetime | None, reason: str = "") -> SessionActivity:
    """Exempt ``session`` from the idle policy until ``until`` (None: end the exemption now), audited.

    Only a user who may open any session (``sessions.permissions.may_open_any_session``: staff holding
    ``gpu_sessions.change_session``, or a superuser) may: a session's owner cannot switch the policy off for themselves.

    Args:
        session: a live session.
        user: who asks.
        until: aware time in the future, at most ``MAX_EXEMPTION`` ahead; None to end the exemption now (``exempt_until``
            then keeps when it ended, now or earlier: the idle clock starts there).
        reason: why (1 to 500 characters; required to exempt).

    Returns:
        The session's activity row (made if missing).

    Raises:
        Forbidden: 403 ``idle_exemption_forbidden``.
        InvalidExemption: 400 ``invalid_exemption``.
        Conflict: 409 ``session_not_live`` (it ended).
    """
    if not may_open_any_session(user):
        raise Forbidden("Only staff who may manage everyone's sessions can exempt a session from the idle policy.",
                        code=IDLE_EXEMPTION_FORBIDDEN)
    now = timezone.now()
    reason = (reason or "").strip()
    if until is not None:
        if timezone.is_naive(until):
            raise InvalidExemption("until must be a time with a zone, e.g. 2026-12-02T18:00:00Z.")
        if until <= now or until > now + MAX_EXEMPTION:
            raise InvalidExemption(f"until must be in the future and at most {MAX_EXEMPTION.days} days ahead.")
        if not reason or len(reason) > 500:
            raise InvalidExemption("reason must say why, in 1 to 500 characters.")
    locked = Session.objects.select_for_update().get(pk=session.pk)
    if not locked.is_live:
        raise Conflict(f"Session {locked.public_id} has ended; there is nothing to exempt.", code=SESSION_NOT_LIVE)
    row, _ = SessionActivity.objects.select_for_update().get_or_create(session=locked)
    before = (row.exempt_until, row.exempt_reason)
    if until is None and row.exempt_until is not None and row.exempt_until > now:
        until_kept = now  # an exemption ended early ends now: the idle clock starts from here, as when it runs out
    else:
        until_kept = until if until is not None else row.exempt_until
    row.exempt_until, row.exempt_reason = until_kept, reason if until else ""
    row.exempt_by = user.get_username() if until else ""
    if until is not None:
        row.idle_since = row.stops_at = None
    row.save(update_fields=["exempt_until", "exempt_reason", "exempt_by", "idle_since", "stops_at"])
    audit_record(action=Action.SESSION_IDLE_EXEMPT, obj=locked,
                 changes={"exempt_until": (before[0], row.exempt_until), "exempt_reason": (before[1], row.exempt_reason)},
                 details={"owner": locked.owner.get_username()})
    return row
