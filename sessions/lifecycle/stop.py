"""Stopping a session: Stopping now (``session_stop``), its GShareSession deleted by ``sessions.delete``
(``session_delete_remote``), then Terminated."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from audit.services import Action, audit_record
from sessions.lifecycle import outbox
from sessions.lifecycle.end import facts_forget_after_commit, session_terminate
from sessions.lifecycle.remote import gshare_session_delete
from sessions.models import Session
from sessions.queue import leave

#: How long after its end a session stopped before it ran keeps getting its GShareSession deleted again by
#: ``sessions_reconcile`` (an apply in flight at the stop lands within its retry chain, ``sessions.tasks.RETRY``).
REDELETE_WINDOW = timedelta(minutes=10)


#: ``session_stop``'s default reason.
STOPPED_ON_REQUEST = "Stopped on request."


@transaction.atomic
def session_stop(*, session: Session, reason: str = STOPPED_ON_REQUEST, stop_reason: str = Session.StopReason.REQUESTED) -> Session:
    """Stop a session: Stopping now, its GShareSession is deleted by a task, then Terminated. Idempotent.

    Args:
        session: the session.
        reason: why it is stopped, written as its ``message`` and kept through Terminated (status reports do not
            replace the message of a Stopping session): "Stopped on request." by default; the credits task
            (``sessions.overdrawn.overdrawn_sessions_stop``) says the credits ran out, the idle policy
            (``sessions.idle``) names itself and the last activity.
        stop_reason: ``Session.StopReason`` (``requested``, ``credits``, ``idle``), kept as ``stop_reason``.

    A queued session is not stopped but ends at once (Terminated, unstarted: ``sessions.queue.leave``).

    Returns:
        The session (unchanged when it already ended or is stopping).
    """
    session = Session.objects.select_for_update().get(pk=session.pk)
    if not session.is_live or session.phase == Session.Phase.STOPPING:
        return session
    if session.phase == Session.Phase.QUEUED:
        # It holds nothing and has no pod: it leaves the queue at once, and the sessions behind it may start sooner.
        leave.queued_end(session=session, stop_reason=stop_reason,
                         message="Left the queue on request." if reason == STOPPED_ON_REQUEST else reason)
        leave.publish_after_commit()
        return session
    previous = session.phase
    session.phase = Session.Phase.STOPPING
    session.message = reason[:2000]
    session.stop_requested_at = timezone.now()
    session.stop_reason = stop_reason
    session.save(update_fields=["phase", "message", "stop_requested_at", "stop_reason"])
    audit_record(action=Action.SESSION_STOP, obj=session, changes={"phase": (previous, session.phase)},
                 details={"owner": session.owner.get_username(), "reason": session.message, "stop_reason": stop_reason})
    facts_forget_after_commit(session)
    outbox.publish_after_commit(outbox.DELETE, session.pk)
    return session


def session_delete_remote(*, session: Session) -> Session:
    """Delete the session's GShareSession from its cluster (404 counts as done) and mark it Terminated.

    Raises:
        TransientApplyError: the apiserver did not answer; the task retries.
    """
    session = Session.objects.select_related("cluster").get(pk=session.pk)
    gshare_session_delete(session)
    return session_terminate(session=session, message="Stopped on request.")
