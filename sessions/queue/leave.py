"""Leaving the queue unstarted (``queued_end``: cancelled, out of credits, waited too long), and asking for a pass of
the queue after a change (``publish_after_commit``). Below ``sessions.lifecycle``, which stops queued sessions here."""

from __future__ import annotations

import logging

import redis
from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from audit.services import Action, audit_record
from sessions import connect
from sessions.models import Session

logger = logging.getLogger(__name__)

#: The Celery task that runs a pass (``sessions.tasks``; beat runs it every 30 s, ``sessions/migrations/0013``).
TICK_TASK = "sessions.queue_tick"


#: How long the mark of a published pass that has not started lasts, seconds (a lost task: then the next change
#: publishes again; the beat runs a pass every 30 s anyway).
PENDING_SECONDS = 60


def _pending_key() -> str:
    return f"{settings.CACHES['default'].get('KEY_PREFIX', '')}:queue-pass-pending"


def publish_after_commit() -> None:
    """Run a pass once the current transaction commits (published to Celery; a lost publish waits for the beat).

    Changes come in bursts (every release, every full inventory snapshot of every cluster): while a published pass has
    not started yet, further changes publish nothing, since that pass reads the fleet and the queue when it starts
    (``pass_started`` clears the mark). Without Redis every change publishes."""
    transaction.on_commit(publish_now)


def publish_now() -> None:
    """Publish a pass now, unless one is published and has not started yet (``publish_after_commit``)."""
    try:
        if not connect.redis_client().set(_pending_key(), 1, nx=True, ex=PENDING_SECONDS):
            return  # a pass not started yet will see this change
    except (redis.RedisError, OSError):
        pass  # cannot tell: publish
    try:
        current_app.tasks[TICK_TASK].delay()
    except BrokerError as exc:
        pass_started()  # nothing is pending: the next change publishes again
        logger.warning("queue: could not publish a pass (%s); the beat runs one within 30 s", exc)


def pass_started() -> None:
    """Clear the mark of a pending pass (``sessions.tasks`` calls it as a pass starts): changes from now on publish
    another one. Never raises."""
    try:
        connect.redis_client().delete(_pending_key())
    except (redis.RedisError, OSError) as exc:
        logger.warning("queue: could not clear the pending pass mark (%s); it expires within %s s", exc, PENDING_SECONDS)


def queued_end(*, session: Session, stop_reason: str, message: str) -> Session:
    """End a queued session unstarted (Terminated; it held nothing), audited. Call it holding the session's row lock.

    Args:
        session: a ``Queued`` session, locked.
        stop_reason: ``Session.StopReason`` (``requested``, ``credits``, ``queue_timeout``).
        message: why, in words (its ``message``).
    """
    session.phase, session.ended_at, session.stop_reason = Session.Phase.TERMINATED, timezone.now(), stop_reason
    session.stop_requested_at = session.ended_at
    session.message = message[:2000]
    session.queue_position, session.estimated_start, session.alternatives = None, None, []
    session.save(update_fields=["phase", "ended_at", "stop_reason", "stop_requested_at", "message", "queue_position",
                                "estimated_start", "alternatives"])
    audit_record(action=Action.SESSION_STOP, obj=session, changes={"phase": (Session.Phase.QUEUED, session.phase)},
                 details={"owner": session.owner.get_username(), "reason": session.message, "stop_reason": stop_reason})
    return session
