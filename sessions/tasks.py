"""Celery tasks of the sessions app (thin: look up, call a service, log)."""

import logging

from celery import Task, shared_task
from django.conf import settings

from clusters.models import Cluster
from sessions import activity, idle, lifecycle, overdrawn, runtime
from sessions.lifecycle import outbox
from sessions.models import Session
from sessions.queue import admit as queue_admit
from sessions.queue import leave as queue_leave

logger = logging.getLogger(__name__)

#: Celery's retry options for applying/deleting a GShareSession when its apiserver did not answer or was overloaded
#: (``lifecycle.TransientApplyError``): 5 attempts, full-jitter exponential backoff from 2 s doubling to 30 s at most.
RETRY = {"max_retries": 4, "retry_backoff": 2, "retry_backoff_max": 30, "retry_jitter": True}


class _SessionTask(Task):
    """A task on one session (its first argument, the pk) that gives up with :meth:`give_up` once Celery's retries of
    ``TransientApplyError`` are spent.

    Eager mode (tests) has no broker to schedule a retry: there the first transient failure is final (the task body
    gives up at once instead of raising).
    """

    def give_up(self, session: Session, exc: Exception) -> None:
        raise NotImplementedError

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        if isinstance(exc, lifecycle.TransientApplyError):
            self._gave_up(args[0], exc)

    def run_once(self, session_pk: int, action) -> None:
        """Run ``action(session=...)``; a transient failure is left to Celery's retries (or, eager, gives up)."""
        session = Session.objects.get(pk=session_pk)
        try:
            session = action(session=session)
        except lifecycle.TransientApplyError as exc:
            if not self.request.is_eager:
                raise
            self._gave_up(session_pk, exc)
            return
        logger.info("session %s: %s done, phase %s", session.public_id, self.name, session.phase)

    def _gave_up(self, session_pk: int, exc: Exception) -> None:
        session = Session.objects.filter(pk=session_pk).first()
        if session is None:  # deleted since the task was queued: nothing left to give up on
            logger.info("session pk %s: %s gave up on a session that no longer exists: %s", session_pk, self.name, exc)
            return
        self.give_up(session, exc)
        logger.warning("session %s: %s gave up: %s", session.public_id, self.name, exc)


class _ApplyTask(_SessionTask):
    def give_up(self, session: Session, exc: Exception) -> None:
        lifecycle.session_apply_gave_up(session=session, reason=str(exc))


class _DeleteTask(_SessionTask):
    def give_up(self, session: Session, exc: Exception) -> None:
        lifecycle.session_fail(session=session, message=f"Stopped, but its GShareSession could not be deleted: {exc}. Delete it by hand.")


@shared_task(name=outbox.APPLY, base=_ApplyTask, bind=True, ignore_result=True,
             autoretry_for=(lifecycle.TransientApplyError,), **RETRY)
def session_apply_task(self, session_pk: int) -> None:
    """Apply a session's GShareSession to its cluster; after the last retry the session fails."""
    self.run_once(session_pk, lifecycle.session_apply)


@shared_task(name=outbox.DELETE, base=_DeleteTask, bind=True, ignore_result=True,
             autoretry_for=(lifecycle.TransientApplyError,), **RETRY)
def session_delete_task(self, session_pk: int) -> None:
    """Delete a stopping session's GShareSession; after the last retry it is marked Failed with a message to delete it by hand.

    For a session that already ended (``sessions.reconcile`` deleting again what a late apply may have created) only the delete runs.
    """
    self.run_once(session_pk, lifecycle.session_delete_remote)


class _ReapplyTask(_SessionTask):
    def give_up(self, session: Session, exc: Exception) -> None:
        """Nothing to fail: the session runs on its old routing objects, and its mark (``reapply_due_at``) stays for
        ``sessions.reconcile``."""


@shared_task(name=outbox.REAPPLY, base=_ReapplyTask, bind=True, ignore_result=True,
             autoretry_for=(lifecycle.TransientApplyError,), **RETRY)
def session_reapply_task(self, session_pk: int) -> None:
    """Apply a live session's GShareSession again after its cluster's routing changed (``sessions.reapply``); after
    the last retry it stays marked and ``sessions.reconcile`` publishes it again."""
    self.run_once(session_pk, lifecycle.session_reapply)


@shared_task(name="sessions.reconcile", ignore_result=True)
def sessions_reconcile_task() -> dict:
    """Publish again the applies and deletes whose first publish was lost (beat: every 30 s; ``lifecycle.sessions_reconcile``)."""
    result = lifecycle.sessions_reconcile(older_than=settings.GSHARE_SESSION_RECONCILE_AFTER)
    if any(result.values()):
        logger.info("sessions reconciled: %s", result)
    return result


@shared_task(name=idle.ENFORCE_TASK, ignore_result=True)
def idle_enforce_task(cluster_pk: int | None = None) -> dict:
    """Run the idle policy (``sessions.idle.idle_enforce``) on one cluster's sessions, or (beat, every 30 s) the fleet's."""
    cluster = None
    if cluster_pk is not None:
        cluster = Cluster.objects.filter(pk=cluster_pk).first()
        if cluster is None:
            return {"checked": 0, "warned": 0, "stopped": 0}
    result = idle.idle_enforce(cluster=cluster)
    if result["stopped"]:
        logger.info("idle policy: %s", result)
    return result


@shared_task(name=runtime.ENFORCE_TASK, ignore_result=True)
def runtime_enforce_task() -> dict:
    """Stop the sessions past their time limit (beat, every 30 s; ``sessions.runtime.runtime_enforce``)."""
    result = runtime.runtime_enforce()
    if result["stopped"]:
        logger.info("time limit: %s", result)
    return result


@shared_task(name=queue_leave.TICK_TASK, ignore_result=True)
def queue_tick_task() -> dict:
    """A pass of the queue: admit what the plan starts now, drop what waited too long, refresh the estimates (after each
    release, inventory or cancellation, and on the beat every 30 s; ``sessions.queue.admit.queue_pass``)."""
    queue_leave.pass_started()
    return queue_admit.queue_pass()


@shared_task(name="sessions.flush_connections", ignore_result=True)
def connections_flush_task() -> int:
    """Write the connections connect verify noted in Redis to the database (beat, every minute; ``sessions.activity``)."""
    return activity.connections_flush()


# Registered under billing's name, which its beat schedule (billing/0002_stop_overdrawn_schedule) and the audit
# trail's actor (``beat:billing.stop_overdrawn_sessions``) carry.
@shared_task(name="billing.stop_overdrawn_sessions", ignore_result=True)
def stop_overdrawn_sessions() -> int:
    """Stop the sessions of accounts below zero past their policy's grace (beat: every 60 s; idempotent;
    ``sessions.overdrawn.overdrawn_sessions_stop``)."""
    stopped = overdrawn.overdrawn_sessions_stop()
    if stopped:
        logger.info("credits: stopped %d session(s) of accounts below zero past their grace", stopped)
    return stopped
