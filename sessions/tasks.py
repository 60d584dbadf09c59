"""Celery tasks of the sessions app (thin: look up, call a service, log)."""

import logging

from celery import shared_task
from django.conf import settings

from sessions import services
from sessions.models import Session

logger = logging.getLogger(__name__)

#: Bounded retries for applying/deleting a GShareSession: 5 attempts, 2 s doubling to 30 s.
RETRY = {"max_retries": 4, "countdown_base": 2, "countdown_max": 30}


def _countdown(retries: int) -> int:
    return min(RETRY["countdown_max"], RETRY["countdown_base"] * 2**retries)


def _run_with_retries(task, session_pk: int, action, give_up) -> None:
    """Run ``action(session=...)``; on a transient failure retry with backoff, after the last try ``give_up``.

    Eager mode (tests) has no broker to schedule a retry: the first failure is final there.
    """
    session = Session.objects.get(pk=session_pk)
    try:
        session = action(session=session)
    except services.TransientApplyError as exc:
        if task.request.is_eager or task.request.retries >= task.max_retries:
            give_up(session, exc)
            logger.warning("session %s: %s gave up: %s", session.public_id, task.name, exc)
            return
        raise task.retry(exc=exc, countdown=_countdown(task.request.retries)) from None
    logger.info("session %s: %s done, phase %s", session.public_id, task.name, session.phase)


@shared_task(name="sessions.apply", bind=True, ignore_result=True, max_retries=RETRY["max_retries"])
def session_apply_task(self, session_pk: int) -> None:
    """Apply a session's GShareSession to its cluster; after the last retry the session fails."""
    _run_with_retries(
        self, session_pk, services.session_apply,
        lambda session, exc: services.session_apply_gave_up(session=session, reason=str(exc)),
    )


@shared_task(name="sessions.delete", bind=True, ignore_result=True, max_retries=RETRY["max_retries"])
def session_delete_task(self, session_pk: int) -> None:
    """Delete a stopping session's GShareSession; after the last retry it is marked Failed with a message to delete it by hand.

    For a session that already ended (``sessions.reconcile`` deleting again what a late apply may have created) only the delete runs.
    """
    _run_with_retries(
        self, session_pk, services.session_delete_remote,
        lambda session, exc: services.session_fail(
            session=session, message=f"Stopped, but its GShareSession could not be deleted: {exc}. Delete it by hand."
        ),
    )


@shared_task(name="sessions.reconcile", ignore_result=True)
def sessions_reconcile_task() -> dict:
    """Publish again the applies and deletes whose first publish was lost (beat: every 30 s; ``services.sessions_reconcile``)."""
    result = services.sessions_reconcile(older_than=settings.GSHARE_SESSION_RECONCILE_AFTER)
    if any(result.values()):
        logger.info("sessions reconciled: %s", result)
    return result
