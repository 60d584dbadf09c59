"""The outbox's relay (``sessions.reconcile``, beat: every 30 s): publishing again the applies, deletes and re-applies
whose first publish was lost."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F, Q
from django.utils import timezone

from sessions.lifecycle import outbox
from sessions.lifecycle.reapply import sessions_reapply_due
from sessions.lifecycle.stop import REDELETE_WINDOW
from sessions.models import Session


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
    due = [(outbox.APPLY, pk) for pk in scheduled.values_list("pk", flat=True)[:limit]]
    due += [(outbox.DELETE, pk) for pk in stopping.values_list("pk", flat=True)[:limit]]
    due += [(outbox.DELETE, pk) for pk in ended.values_list("pk", flat=True)[:limit]]
    due += [(outbox.REAPPLY, pk) for pk in sessions_reapply_due(cutoff=cutoff, limit=limit)]
    published = {"apply": 0, "delete": 0, "reapply": 0}
    for done, (task_name, pk) in enumerate(due):
        if not outbox.publish(task_name, pk):
            return {**published, "unpublished": len(due) - done}
        published[task_name.removeprefix("sessions.")] += 1
    return {**published, "unpublished": 0}
