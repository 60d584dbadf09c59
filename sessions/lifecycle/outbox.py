"""Publishing the sessions' Celery tasks (``sessions.apply``, ``sessions.delete``, ``sessions.reapply``) after a commit.

A session's row says what is still due (its phase, ``stop_requested_at``, ``reapply_due_at``), so a publish that is
lost costs only time: ``sessions.reconcile`` (``sessions.lifecycle.reconcile``) publishes it again. The tasks are
found by name in the Celery app's registry, as a ``shared_task`` itself is: ``sessions.tasks`` defines them on top of
this package, and ``sessions.apps`` imports it when Django starts, which registers them.
"""

from __future__ import annotations

import logging

from celery import current_app
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError

logger = logging.getLogger(__name__)

#: Apply a Scheduled session's GShareSession to its cluster (``sessions.lifecycle.apply.session_apply``).
APPLY = "sessions.apply"
#: Delete a stopping (or stopped) session's GShareSession (``sessions.lifecycle.stop.session_delete_remote``).
DELETE = "sessions.delete"
#: Apply a live session's GShareSession again after its cluster's routing changed (``sessions.lifecycle.reapply``).
REAPPLY = "sessions.reapply"


def publish(task_name: str, session_pk: int) -> bool:
    """Publish ``task_name`` (``APPLY``, ``DELETE`` or ``REAPPLY``) for one session, now.

    The publish is bounded (``GSHARE_REDIS_TIMEOUT``, gshare/settings/celery.py). When the broker is down or does not
    answer, the failure is logged, not raised: the row is committed, it says the work is still due, and
    ``sessions.reconcile`` publishes it again.

    Returns:
        True when the task was published (or, in eager mode, ran).
    """
    try:
        current_app.tasks[task_name].delay(session_pk)
    except BrokerError as exc:
        logger.warning("session #%s: could not publish %s (%s); sessions.reconcile publishes it again", session_pk, task_name, exc)
        return False
    return True


def publish_each(task_name: str, pks: list[int]) -> int:
    """Publish ``task_name`` for each session pk, stopping at the first publish that fails (the broker is down: each
    would wait ``GSHARE_REDIS_TIMEOUT``); the rest stay due for ``sessions.reconcile``.

    Returns:
        How many were published.
    """
    for done, pk in enumerate(pks):
        if not publish(task_name, pk):
            return done
    return len(pks)


def publish_after_commit(task_name: str, *session_pks: int) -> None:
    """Publish ``task_name`` for each of ``session_pks`` once the current transaction commits (``publish_each``; at
    once outside a transaction, never when it rolls back)."""
    pks = list(session_pks)
    transaction.on_commit(lambda: publish_each(task_name, pks))
