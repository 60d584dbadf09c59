"""Taking one of a queued session's ``alternatives`` instead of waiting: a new session with that request (and the queued
one's image, name, volumes and time limit) is started, and the queued one leaves the queue."""

from __future__ import annotations

from django.db import transaction

from billing import admission
from core.errors import FORBIDDEN, INVALID_REQUEST
from core.exceptions import ApplicationError, Conflict
from sessions import create, lifecycle
from sessions.errors import SESSION_NOT_QUEUED
from sessions.models import Session


def alternative_take(*, session: Session, index: int, user) -> Session:
    """Start ``session``'s alternative number ``index`` (0-based, as listed) for its owner, then take ``session`` out
    of the queue. The new session goes through ``session_create`` like any request (its own admission and placement; an
    offer that no longer starts now is refused with ``no_capacity``, and the session keeps its place); the queued one is
    left, in the same transaction, only once the new one exists. CPU and memory are the policy's defaults for the
    offer's GPUs (an offer may have fewer GPUs than the request).

    Args:
        session: a queued session of ``user``.
        index: which of its ``alternatives``.
        user: its owner (staff start sessions of their own, not others').

    Returns:
        The new session.

    Raises:
        ApplicationError: 400 ``invalid_request`` for an index out of range; 403 ``forbidden`` for another user's session.
        Conflict: 409 ``session_not_queued`` once it left the queue. And whatever ``session_create`` raises.
    """
    if session.owner_id != user.pk:
        raise ApplicationError("Only the session's owner may start one of its alternatives.", code=FORBIDDEN, status=403)
    with transaction.atomic():
        # The owner's account first (the lock order of every admission), then the queued row: a second click, or a pass
        # admitting it meanwhile, finds it no longer queued.
        admission.account_lock(user=user)
        session = Session.objects.select_for_update().get(pk=session.pk)
        if session.phase != Session.Phase.QUEUED:
            raise Conflict(f"Session {session.public_id} no longer waits in the queue.", code=SESSION_NOT_QUEUED)
        offers = session.alternatives or []
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(offers):
            raise ApplicationError(f"There is no alternative number {index} for session {session.public_id}.", code=INVALID_REQUEST)
        offer = offers[index]
        # Not queued: an offer that no longer starts now is refused (no_capacity), and the session keeps its place.
        started = create.session_create(
            owner=user, image=session.image, name=session.name, gpus=offer["gpus"], gpu_memory_mib=offer["gpu_memory_mib"],
            gpu_cores=offer["gpu_cores"], gpu_models=offer["gpu_models"], cluster=offer["cluster"],
            volumes=[v.public_id for v in session.volumes.all()], runtime_hours=session.runtime_hours,
        )
        lifecycle.session_stop(session=session, reason=f"Left the queue for {started.public_id}, one of its alternatives.")
    return started
