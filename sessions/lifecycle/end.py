"""A session's end: its terminal phase, its GPU reservations released (kept as held time for billing), its cached
connect facts dropped."""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from billing import held
from clusters.models import Cluster
from sessions import connect, placement
from sessions.models import Session
from sessions.queue import leave


def facts_forget_after_commit(session: Session) -> None:
    """Drop ``session``'s cached connect facts once the current transaction commits (``connect.facts_forget`` never
    raises: the change is committed whatever Redis does)."""
    transaction.on_commit(lambda: connect.facts_forget(connect.connect_cache_key(session.public_id)))


def allocations_release(*, cluster_id: int | None, session_ids: list[int]) -> None:
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
    if nodes:
        leave.publish_after_commit()  # GPUs were freed: the queue may start sessions on them


def session_fail(*, session: Session, message: str) -> Session:
    """Mark a session Failed (unless it already ended), release its GPUs, record why."""
    return _end(session=session, phase=Session.Phase.FAILED, message=message[:2000], keep_message=False)


def session_terminate(*, session: Session, message: str) -> Session:
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
    allocations_release(cluster_id=session.cluster_id, session_ids=[session.pk])
    facts_forget_after_commit(session)
    return session
