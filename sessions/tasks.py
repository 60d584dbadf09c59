"""Celery tasks of the sessions app (thin: look up, call a service, log)."""

import logging

from celery import shared_task

from sessions import services
from sessions.models import Session

logger = logging.getLogger(__name__)

#: Bounded retries for applying/deleting a GShareSession: 5 attempts, 2 s doubling to 30 s.
RETRY = {"max_retries": 4, "countdown_base": 2, "countdown_max": 30}


def _countdown(retries: int) -> int:
    return min(RETRY["countdown_max"], RETRY["countdown_base"] * 2**retries)


@shared_task(name="sessions.apply", bind=True, ignore_result=True, max_retries=RETRY["max_retries"])
def session_apply_task(self, session_pk: int) -> None:
    """Apply a session's GShareSession to its cluster; after the last retry the session fails."""
    session = Session.objects.get(pk=session_pk)
    try:
        session = services.session_apply(session=session)
    except services.TransientApplyError as exc:
        if self.request.is_eager or self.request.retries >= self.max_retries:
            # Eager mode (tests) has no broker to schedule a retry: the first failure is final there.
            services.session_apply_gave_up(session=session, reason=str(exc))
            logger.warning("session %s: apply gave up: %s", session.public_id, exc)
            return
        raise self.retry(exc=exc, countdown=_countdown(self.request.retries)) from None
    logger.info("session %s applied: %s", session.public_id, session.phase)


@shared_task(name="sessions.delete", bind=True, ignore_result=True, max_retries=RETRY["max_retries"])
def session_delete_task(self, session_pk: int) -> None:
    """Delete a stopping session's GShareSession; after the last retry it is marked Failed with a message to delete it by hand."""
    session = Session.objects.get(pk=session_pk)
    try:
        session = services.session_delete_remote(session=session)
    except services.TransientApplyError as exc:
        if self.request.is_eager or self.request.retries >= self.max_retries:
            services.session_fail(session=session, message=f"Stopped, but its GShareSession could not be deleted: {exc}. Delete it by hand.")
            return
        raise self.retry(exc=exc, countdown=_countdown(self.request.retries)) from None
    logger.info("session %s stopped: %s", session.public_id, session.phase)
