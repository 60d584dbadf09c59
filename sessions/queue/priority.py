"""Staff changing a queued session's priority (its place in the queue's order, ``sessions.queue.order``)."""

from __future__ import annotations

from django.db import transaction

from audit.services import Action, audit_record
from billing.services import MAX_PRIORITY as BILLING_MAX_PRIORITY
from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError, Conflict, Forbidden
from sessions.errors import PRIORITY_FORBIDDEN, SESSION_NOT_QUEUED
from sessions.models import Session
from sessions.permissions import may_open_any_session
from sessions.queue import leave

#: The range of a session's priority: the policy's (``billing.services.MAX_PRIORITY``).
MIN_PRIORITY, MAX_PRIORITY = -BILLING_MAX_PRIORITY, BILLING_MAX_PRIORITY


def queue_priority_set(*, session: Session, user, priority) -> Session:
    """Set a queued session's ``priority`` (higher starts first); audited, and a pass of the queue follows.

    Args:
        session: the session.
        user: who asks: staff who may manage every session.
        priority: a whole number from ``MIN_PRIORITY`` to ``MAX_PRIORITY`` (a JSON integer).

    Raises:
        Forbidden: 403 ``priority_forbidden`` for anyone but staff (the owner included: their policy sets theirs).
        ApplicationError: 400 ``invalid_request`` for a priority out of range or not a whole number.
        Conflict: 409 ``session_not_queued`` when the session no longer waits in the queue.
    """
    if not may_open_any_session(user):
        raise Forbidden("Only staff may change a session's priority; yours comes from your policy's priority.", code=PRIORITY_FORBIDDEN)
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ApplicationError(f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}.", code=INVALID_REQUEST)
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        if locked.phase != Session.Phase.QUEUED:
            raise Conflict(f"Session {locked.public_id} is not waiting in the queue (phase {locked.phase}): its priority no longer "
                           "matters.", code=SESSION_NOT_QUEUED)
        before = locked.priority
        if before != priority:
            locked.priority = priority
            locked.save(update_fields=["priority"])
            audit_record(action=Action.SESSION_PRIORITY, obj=locked, changes={"priority": (before, priority)},
                         details={"owner": locked.owner.get_username()})
            leave.publish_after_commit()
    return locked
