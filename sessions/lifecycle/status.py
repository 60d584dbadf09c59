"""The operator's phase reports (``POST /internal/v1/status``) applied to its cluster's sessions."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

import contract
from clusters.models import Cluster
from core.exceptions import Conflict, Forbidden
from sessions.lifecycle.end import allocations_release, facts_forget_after_commit
from sessions.models import Session

#: Operator phases (``contract``) -> control-plane phases.
_REPORTED = {
    contract.PHASE_PENDING: Session.Phase.STARTING,
    contract.PHASE_RUNNING: Session.Phase.RUNNING,
    contract.PHASE_SUCCEEDED: Session.Phase.TERMINATED,
    contract.PHASE_TERMINATED: Session.Phase.TERMINATED,
    contract.PHASE_FAILED: Session.Phase.FAILED,
}


class ReportFromFuture(Conflict):
    """409 ``report_from_future``: a status report observed further ahead of the control plane's clock than
    ``GSHARE_CLOCK_SKEW_TOLERANCE``; the body adds ``server_time`` and ``ahead_seconds``."""

    code = contract.REPORT_FROM_FUTURE


_TICK = timedelta(microseconds=1)


def _clock_behind(cluster: Cluster, tolerance: timedelta) -> timedelta:
    """How far the operator's clock is behind the control plane's, as its latest inventory reported
    (``Cluster.clock_offset_seconds``), when that is beyond ``tolerance``; else zero.

    A report stamped by a clock behind would otherwise date a session's end in the past (before its creation when the
    clock is further behind than the session lived), and billing would lose that held time (``billing.held``). Within
    the tolerance the offset is the estimate's noise and reports keep their own times (they are never reordered by it).
    """
    offset = cluster.clock_offset_seconds
    if offset is None or timedelta(seconds=offset) <= tolerance:
        return timedelta(0)
    return timedelta(seconds=offset)


@transaction.atomic
def session_status_apply(*, cluster: Cluster, reports: list[dict], received_at: datetime | None = None) -> dict:
    """Apply a batch of the operator's phase reports for sessions of ``cluster``.

    Idempotent and order-tolerant: a report whose ``observed_at`` is not newer than the last one applied is ignored,
    and a session that ended (Terminated, Failed) never goes back. The operator's clock may be wrong, so the time a
    report is ordered by (and recorded as ``last_status_at``, ``started_at``, ``ended_at``) is its ``observed_at`` but
    never later than ``received_at``: a report from a clock slightly ahead counts as observed when it arrived, and the
    honest reports after it (observed later than that) are applied, so no session freezes until real time catches up.
    A report from further ahead than the tolerance refuses the whole batch: its times cannot be trusted at all. A
    report from a clock behind is applied at its own time; it orders correctly against the same operator's other
    reports (each session's ``observed_at`` strictly increases, ``operator_agent.reporters.status.next_observed_at``). When
    the cluster's latest inventory said its clock is behind beyond the tolerance, that offset is added first
    (``_clock_behind``): a session's end is billed up to ``ended_at``, which must not fall into the past.

    Args:
        cluster: the cluster named in the operator token.
        reports: validated reports ``{"session", "phase", "node", "devices", "message", "observed_at": datetime}``.
        received_at: the control plane's time when the batch arrived (default: now).

    Returns:
        ``{"applied": n, "ignored": m}``.

    Raises:
        Forbidden: 403 ``forbidden_cluster_scope`` when a report names a session that is not on
            ``cluster`` (unknown sessions count as foreign); nothing is applied.
        ReportFromFuture: 409 ``report_from_future`` when a report's ``observed_at`` is more than
            ``GSHARE_CLOCK_SKEW_TOLERANCE`` seconds after ``received_at``; nothing is applied.
    """
    received_at = received_at or timezone.now()
    ids = sorted({report["session"] for report in reports})
    sessions = {s.public_id: s for s in Session.objects.select_for_update().filter(public_id__in=ids).order_by("pk")}
    foreign = [sid for sid in ids if sid not in sessions or sessions[sid].cluster_id != cluster.pk]
    if foreign:
        raise Forbidden(
            f"Session(s) {', '.join(foreign[:5])} are not sessions of this cluster; an operator may only report its own "
            "cluster's sessions. Nothing was applied.",
            code=contract.FORBIDDEN_CLUSTER_SCOPE,
        )
    ahead = max(report["observed_at"] - received_at for report in reports) if reports else timedelta(0)
    tolerance = timedelta(seconds=settings.GSHARE_CLOCK_SKEW_TOLERANCE)
    if ahead > tolerance:
        seconds = round(ahead.total_seconds(), 3)
        raise ReportFromFuture(
            f"A report was observed {seconds:g} s after the control plane's time {received_at.isoformat()}, beyond the "
            f"{tolerance.total_seconds():g} s tolerance: the operator's clock is ahead. Nothing was applied. Enable NTP "
            "(chrony or systemd-timesyncd) on the node that runs the operator; the operator sends these reports again "
            "stamped with the control plane's time.",
            extra={"server_time": received_at.isoformat(), "ahead_seconds": seconds},
        )
    applied, ignored, changed, ended = 0, 0, {}, []
    behind = _clock_behind(cluster, tolerance)
    batch_raw: dict[int, datetime] = {}  # per session, the observed_at of the report of this batch applied last
    for report in sorted(reports, key=lambda r: r["observed_at"]):
        session = sessions[report["session"]]
        raw: datetime = report["observed_at"]
        observed = min(raw + behind, received_at)
        if session.pk in batch_raw and raw > batch_raw[session.pk]:
            # Two reports of one session in one batch, both ahead of received_at: the later one still comes after.
            observed = max(observed, session.last_status_at + _TICK)
        if not session.is_live or (session.last_status_at is not None and observed <= session.last_status_at):
            ignored += 1
            continue
        batch_raw[session.pk] = raw
        phase = _REPORTED[report["phase"]]
        stopping = session.phase == Session.Phase.STOPPING
        if stopping and phase in (Session.Phase.STARTING, Session.Phase.RUNNING):
            phase = Session.Phase.STOPPING  # a late Running never revives a session being stopped
        session.phase = phase
        session.last_status_at = observed
        if report.get("node"):
            session.node = report["node"]
        if report.get("devices"):
            session.devices = list(report["devices"])
        if report.get("message") is not None and not (stopping and session.message):
            session.message = report["message"][:2000]  # a Stopping session keeps why it was stopped
        if phase == Session.Phase.RUNNING and session.started_at is None:
            session.started_at = observed
        if phase in Session.TERMINAL_PHASES:
            session.ended_at = observed
            ended.append(session.pk)
        changed[session.pk] = session
        applied += 1
    if changed:
        Session.objects.bulk_update(
            list(changed.values()), ["phase", "last_status_at", "node", "devices", "message", "started_at", "ended_at"]
        )
        for session in changed.values():
            facts_forget_after_commit(session)
    if ended:
        allocations_release(cluster_id=cluster.pk, session_ids=ended)
    return {"applied": applied, "ignored": ignored}
