"""Session services after creation: apply to the cluster, stop, status reports, release, connect.

With ``sessions.create`` (creation with placement) these are the only functions that change sessions and their GPU
reservations; the API, the console, the Celery tasks and the operator-facing views call them.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Prefetch, Q
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

import contract
from audit.services import Action, audit_record
from billing import held
from clusters.models import Cluster
from clusters.routing import routing_key
from core.errors import FORBIDDEN
from core.exceptions import Conflict, Forbidden
from kube import KubeGateway, KubeRefused, KubeUnavailable
from kube.gateway import GSHARE_SESSIONS
from sessions import connect, placement, reapply
from sessions.errors import SESSION_NOT_RUNNING
from sessions.manifests import gshare_session_manifest, session_url
from sessions.models import Session
from sessions.permissions import may_open_session
from storage.models import Volume

logger = logging.getLogger(__name__)

#: Operator phases (``contract``) -> control-plane phases.
_REPORTED = {
    contract.PHASE_PENDING: Session.Phase.STARTING,
    contract.PHASE_RUNNING: Session.Phase.RUNNING,
    contract.PHASE_SUCCEEDED: Session.Phase.TERMINATED,
    contract.PHASE_TERMINATED: Session.Phase.TERMINATED,
    contract.PHASE_FAILED: Session.Phase.FAILED,
}


def _forget(session: Session) -> None:
    # After the commit (connect.facts_forget never raises: the change is committed whatever Redis does).
    transaction.on_commit(lambda: connect.facts_forget(connect.connect_cache_key(session.public_id)))


def _enqueue(task_name: str, session_pk: int) -> bool:
    """Publish ``sessions.apply``, ``sessions.delete`` or ``sessions.reapply`` for a session (called after the commit).

    The publish is bounded (``GSHARE_REDIS_TIMEOUT``, gshare/settings/celery.py). When the broker is down or does
    not answer, the failure is logged, not raised: the row is committed, its phase says the work is still due,
    and ``sessions_reconcile`` publishes it again.

    Returns:
        True when the task was published (or, in eager mode, ran).
    """
    from sessions import tasks  # tasks import this module

    task = {"sessions.apply": tasks.session_apply_task, "sessions.delete": tasks.session_delete_task,
            "sessions.reapply": tasks.session_reapply_task}[task_name]
    try:
        task.delay(session_pk)
    except BrokerError as exc:
        logger.warning("session #%s: could not publish %s (%s); sessions.reconcile publishes it again", session_pk, task_name, exc)
        return False
    return True


def _release(session: Session) -> None:
    _release_allocations(cluster_id=session.cluster_id, session_ids=[session.pk])


def _release_allocations(*, cluster_id: int | None, session_ids: list[int]) -> None:
    """Delete the GPU reservations of sessions of one cluster, keep them as held time for billing
    (``billing.held.RECORD_RELEASED``: call it once the sessions' ``ended_at`` is written) and recount the GPUs they
    were on.

    The cluster's row is locked first (``FOR NO KEY UPDATE``: it waits for a placement or an
    inventory on that cluster, and they wait for it), so every change of a cluster's allocations
    and its recount happen one at a time and the counters match the allocations (see
    ``placement.usage_recompute``). Locking before deleting also keeps the order placement and
    inventory use (cluster row, then allocation rows), so they cannot deadlock with a release.
    """
    if cluster_id is not None:
        list(Cluster.objects.select_for_update(no_key=True).filter(pk=cluster_id).values_list("pk", flat=True))
    with connection.cursor() as cursor:
        # The same statement keeps what was released for billing (every second a GPU was held is billed: billing.held).
        cursor.execute(
            "WITH released AS (DELETE FROM gpu_sessions_allocation a USING clusters_gpudevice d WHERE d.id = a.device_id "
            "AND a.session_id = ANY(%s) RETURNING a.session_id, a.device_id, d.node_id), "
            f"held AS ({held.RECORD_RELEASED.format(released='released')}) "
            "SELECT DISTINCT node_id FROM released",
            [list(session_ids)],
        )
        nodes = {row[0] for row in cursor.fetchall()}
    placement.usage_recompute(node_ids=nodes)


def session_fail(*, session: Session, message: str) -> Session:
    """Mark a session Failed (unless it already ended), release its GPUs, record why."""
    return _end(session=session, phase=Session.Phase.FAILED, message=message[:2000], keep_message=False)


def _terminate(*, session: Session, message: str) -> Session:
    """Mark a live session Terminated (keeping a message already recorded), release its GPUs."""
    return _end(session=session, phase=Session.Phase.TERMINATED, message=message, keep_message=True)


@transaction.atomic
def _end(*, session: Session, phase: str, message: str, keep_message: bool) -> Session:
    """Move a live session to a terminal ``phase`` now, release its GPUs and drop its cached facts.

    ``keep_message`` keeps a message already recorded (e.g. the operator's) instead of ``message``.
    Does nothing for a session that already ended.
    """
    session = Session.objects.select_for_update().get(pk=session.pk)
    if not session.is_live:
        return session
    session.phase = phase
    session.ended_at = timezone.now()
    session.message = (session.message if keep_message else "") or message
    session.save(update_fields=["phase", "ended_at", "message"])
    _release(session)
    _forget(session)
    return session


def _gateway(cluster: Cluster) -> KubeGateway:
    """A gateway to ``cluster``'s apiserver, each call bounded by ``GSHARE_PROBE_TIMEOUT`` (raises ``KubeconfigError``)."""
    return KubeGateway.for_cluster(cluster, call_timeout=settings.GSHARE_PROBE_TIMEOUT)


def session_for_apply(pk: int) -> Session:
    """The session ``pk`` with what its GShareSession is built from (cluster, owner, volumes and their pools)."""
    return (
        Session.objects.select_related("cluster", "owner")
        .prefetch_related(Prefetch("volumes", queryset=Volume.objects.select_related("pool")))
        .get(pk=pk)
    )


def apply_gshare_session(session: Session) -> tuple[str, str, str]:
    """Server-side apply ``session``'s GShareSession (``sessions.manifests``) to its cluster, with no row lock held.

    Returns:
        The ``clusters.routing.routing_key`` the manifest was built from, for ``reapply.routing_changed_since``.

    Raises:
        KubeUnavailable: the apiserver did not answer, or answered 5xx/429. KubeRefused: it refused the object.
        KubeconfigError: the cluster's stored kubeconfig is unusable.
    """
    applied = routing_key(session.cluster)
    manifest = gshare_session_manifest(session)
    with _gateway(session.cluster) as kube:
        kube.apply(manifest)
    return applied


def session_apply(*, session: Session) -> Session:
    """Apply the session's GShareSession to its cluster (server-side apply) and mark it Starting.

    Transient failures (apiserver unreachable, 5xx, 429) raise ``TransientApplyError`` so the Celery
    task retries with backoff; anything else fails the session with a message naming the cause.
    Does nothing for a session that is no longer Scheduled. A session stopped while the PATCH was in flight
    (Stopping, Terminated or Failed after it) gets its GShareSession deleted again at once, since the stop's
    delete may have come first and found nothing; if that delete fails, ``sessions_reconcile`` re-issues it. When the
    cluster's routing changed while the apply was in flight, the session is marked for a re-apply
    (``sessions.reapply``), also when the operator reported it Starting or Running before this function could.
    """
    session = session_for_apply(session.pk)
    if session.phase != Session.Phase.SCHEDULED:
        return session
    try:
        applied = apply_gshare_session(session)
    except KubeUnavailable as exc:
        if exc.status:
            raise TransientApplyError(f"the apiserver of {session.cluster.name} answered {exc.status} ({exc.reason})") from None
        raise TransientApplyError(f"the apiserver of {session.cluster.name} did not answer ({exc.cause_name})") from None
    except KubeRefused as exc:
        hint = {
            404: f"the GShareSession CRD or the namespace {settings.GSHARE_SESSION_NAMESPACE} is missing: install charts/gshare-operator",
            403: "the control plane's ServiceAccount may not apply GShareSessions: grant it the ClusterRole in docs/attach-a-cluster.md",
            401: "the cluster refused the control plane's credentials: register a fresh kubeconfig",
        }.get(exc.status, f"the apiserver refused the GShareSession ({exc.status} {exc.reason})")
        return session_fail(session=session, message=f"Could not apply the session to {session.cluster.name}: {hint}.")
    updated = Session.objects.filter(pk=session.pk, phase=Session.Phase.SCHEDULED).update(phase=Session.Phase.STARTING)
    if updated:
        session.phase = Session.Phase.STARTING
        # The cluster's routing changed while the apply was in flight (its re-apply found the session still Scheduled).
        reapply.routing_changed_since(session, applied)
        return session
    session.phase = Session.objects.filter(pk=session.pk).values_list("phase", flat=True).get()
    if session.phase not in _ENDED:
        # The operator reported it (Starting, Running) before this update: the routing check is still this apply's,
        # since a re-apply marked meanwhile found the session Scheduled and only cleared its mark.
        reapply.routing_changed_since(session, applied)
        return session
    # Stopped while the PATCH was in flight: the stop's delete may have found nothing (404) and counted it done, and
    # the object exists now. Delete it again; if the apiserver does not answer, sessions_reconcile re-issues it.
    try:
        _delete_object(session)
    except TransientApplyError as exc:
        logger.warning("session %s ended during its apply; its GShareSession is deleted later by sessions.reconcile: %s",
                       session.public_id, exc)
    return session


#: Phases of a session whose GShareSession must not stay on its cluster.
_ENDED = (Session.Phase.STOPPING, Session.Phase.TERMINATED, Session.Phase.FAILED)

#: How long after its end a session stopped before it ran keeps getting its GShareSession deleted again by
#: ``sessions_reconcile`` (an apply in flight at the stop lands within its retry chain, ``sessions.tasks.RETRY``).
REDELETE_WINDOW = timedelta(minutes=10)


class TransientApplyError(Exception):
    """The cluster's apiserver could not be reached or was overloaded; the task retries."""


@transaction.atomic
def session_apply_gave_up(*, session: Session, reason: str) -> Session:
    """Fail a session whose apply kept failing after the bounded retries, if it is still Scheduled.

    The last attempt can take ``GSHARE_PROBE_TIMEOUT`` seconds: a session stopped by its owner meanwhile (Stopping, its
    delete under way) or reported by the operator (an earlier attempt reached the apiserver) is left as it is.
    """
    session = Session.objects.select_for_update().get(pk=session.pk)
    if session.phase != Session.Phase.SCHEDULED:
        return session
    return session_fail(session=session, message=f"Could not apply the session to its cluster after several attempts: {reason}.")


@transaction.atomic
def session_stop(*, session: Session, reason: str = "Stopped on request.", stop_reason: str = Session.StopReason.REQUESTED) -> Session:
    """Stop a session: Stopping now, its GShareSession is deleted by a task, then Terminated. Idempotent.

    Args:
        session: the session.
        reason: why it is stopped, written as its ``message`` and kept through Terminated (status reports do not
            replace the message of a Stopping session): "Stopped on request." by default; the credits task
            (``billing.overdrawn.overdrawn_sessions_stop``) says the credits ran out, the idle policy
            (``sessions.idle``) names itself and the last activity.
        stop_reason: ``Session.StopReason`` (``requested``, ``credits``, ``idle``), kept as ``stop_reason``.

    Returns:
        The session (unchanged when it already ended or is stopping).
    """
    session = Session.objects.select_for_update().get(pk=session.pk)
    if not session.is_live or session.phase == Session.Phase.STOPPING:
        return session
    previous = session.phase
    session.phase = Session.Phase.STOPPING
    session.message = reason[:2000]
    session.stop_requested_at = timezone.now()
    session.stop_reason = stop_reason
    session.save(update_fields=["phase", "message", "stop_requested_at", "stop_reason"])
    audit_record(action=Action.SESSION_STOP, obj=session, changes={"phase": (previous, session.phase)},
                 details={"owner": session.owner.get_username(), "reason": session.message, "stop_reason": stop_reason})
    _forget(session)
    transaction.on_commit(lambda: _enqueue("sessions.delete", session.pk))
    return session


def session_delete_remote(*, session: Session) -> Session:
    """Delete the session's GShareSession from its cluster (404 counts as done) and mark it Terminated.

    Raises:
        TransientApplyError: the apiserver did not answer; the task retries.
    """
    session = Session.objects.select_related("cluster").get(pk=session.pk)
    _delete_object(session)
    return _terminate(session=session, message="Stopped on request.")


def _delete_object(session: Session) -> None:
    """Delete the session's GShareSession (bounded by ``GSHARE_PROBE_TIMEOUT``; 404 counts as done; no row lock held).

    Raises:
        TransientApplyError: the apiserver did not answer or refused.
    """
    cluster = session.cluster
    if cluster is None or cluster.status == Cluster.Status.DEREGISTERED:
        return
    try:
        with _gateway(cluster) as kube:
            kube.delete(GSHARE_SESSIONS, contract.session_object_name(session.public_id), namespace=settings.GSHARE_SESSION_NAMESPACE,
                        propagation_policy="Foreground")
    except KubeUnavailable as exc:
        if exc.status:
            raise TransientApplyError(f"deleting the GShareSession answered {exc.status} ({exc.reason})") from None
        raise TransientApplyError(f"the apiserver did not answer ({exc.cause_name})") from None
    except KubeRefused as exc:
        raise TransientApplyError(f"deleting the GShareSession answered {exc.status} ({exc.reason})") from None


def sessions_reconcile(*, older_than: float, limit: int = 200) -> dict[str, int]:
    """Publish again the applies and deletes whose first publish was lost (the outbox relay; beat: every 30 s).

    Due: sessions ``Scheduled`` (not applied to their cluster yet) created more than ``older_than`` seconds ago,
    and sessions ``Stopping`` (GShareSession not deleted yet) asked to stop more than ``older_than`` seconds ago,
    and (deleted again, counted in ``delete``) sessions stopped before they ran that ended more than ``older_than``
    seconds but less than ``REDELETE_WINDOW`` ago (an apply in flight at the stop may have re-created the object),
    and (``reapply``) sessions marked for a re-apply after a routing change more than ``older_than`` seconds ago
    (``Session.reapply_due_at``, ``sessions.reapply``), oldest first, at most ``limit`` of each. ``older_than`` should exceed a task's usual retry chain
    (``sessions.tasks.RETRY``), so a task still retrying is rarely doubled. Idempotent: both tasks do nothing for
    a session that moved on (a doubled task is harmless), and a run that finds nothing due publishes nothing. The first publish that fails
    (broker still down) ends the run; the next run starts over.

    Args:
        older_than: seconds a session must have been due before it is published again.
        limit: most sessions of each kind per run.

    Returns:
        ``{"apply": n, "delete": m, "reapply": r, "unpublished": k}``: tasks published, and due sessions left for
        the next run.
    """
    cutoff = timezone.now() - timedelta(seconds=older_than)
    scheduled = Session.objects.filter(phase=Session.Phase.SCHEDULED, created_at__lt=cutoff).order_by("created_at", "pk")
    # Rows stopped before stop_requested_at existed have none: they are due too.
    stopping = Session.objects.filter(phase=Session.Phase.STOPPING).filter(
        Q(stop_requested_at__lt=cutoff) | Q(stop_requested_at__isnull=True)
    ).order_by(F("stop_requested_at").asc(nulls_first=True), "pk")
    # Stopped before they ran: an apply in flight at the stop may have created the GShareSession after the stop's
    # delete (session_apply deletes it again; this covers that delete failing). Deleting again is harmless (404).
    ended = Session.objects.filter(
        phase__in=Session.TERMINAL_PHASES, stop_requested_at__isnull=False, started_at__isnull=True,
        ended_at__lt=cutoff, ended_at__gte=cutoff - REDELETE_WINDOW,
    ).order_by("ended_at", "pk")
    due = [("sessions.apply", pk) for pk in scheduled.values_list("pk", flat=True)[:limit]]
    due += [("sessions.delete", pk) for pk in stopping.values_list("pk", flat=True)[:limit]]
    due += [("sessions.delete", pk) for pk in ended.values_list("pk", flat=True)[:limit]]
    due += [("sessions.reapply", pk) for pk in reapply.sessions_reapply_due(cutoff=cutoff, limit=limit)]
    published = {"apply": 0, "delete": 0, "reapply": 0}
    for done, (task_name, pk) in enumerate(due):
        if not _enqueue(task_name, pk):
            return {**published, "unpublished": len(due) - done}
        published[task_name.removeprefix("sessions.")] += 1
    return {**published, "unpublished": 0}


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
    reports (each session's ``observed_at`` strictly increases, ``operator_agent.sessions.next_observed_at``). When
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
            _forget(session)
    if ended:
        _release_allocations(cluster_id=cluster.pk, session_ids=ended)
    return {"applied": applied, "ignored": ignored}


def session_connect(*, session: Session, user) -> str:
    """Mint a connect link for ``session``: its URL with a short-lived connect token.

    The token (RS256, audience ``gshare-connect``, ``use: "link"``, ``GSHARE_CONNECT_TOKEN_TTL`` seconds) names
    the session (``sid``), the user (``sub`` = ``user:<pk>``, ``name``) and the host it is valid on
    (``sessions.connect.link_token_sign``).

    Raises:
        Forbidden: 403 ``forbidden`` when ``user`` is neither the owner nor allowed to open any session
            (``sessions.permissions.may_open_any_session``: staff with ``gpu_sessions.change_session``, superusers).
        Conflict: 409 ``session_not_running`` when the session has ended or has no URL yet.
    """
    if not may_open_session(user, session):
        raise Forbidden("Only the session's owner (or staff allowed to change sessions) may connect to it.", code=FORBIDDEN)
    url = session_url(session)
    if not session.is_live or url is None:
        raise Conflict(f"Session {session.public_id} is {session.phase}: start a new session.", code=SESSION_NOT_RUNNING)
    token = connect.link_token_sign(user=user, session_id=session.public_id, host=session.cluster.session_domain)
    return f"{url}?token={token}"
