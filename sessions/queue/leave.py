"""Leaving the queue unstarted (``queued_end``: cancelled, out of credits, waited too long), and asking for a pass of
the queue after a change (``publish_after_commit``). Below ``sessions.lifecycle``, which stops queued sessions here."""

from __future__ import annotations

import logging

from celery import current_app
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from audit.services import Action, audit_record
from sessions.models import Session

logger = logging.getLogger(__name__)

#: The Celery task that runs a pass (``sessions.tasks``; beat runs it every 30 s, ``sessions/migrations/0013``).
TICK_TASK = "sessions.queue_tick"


def publish_after_commit() -> None:
    """Run a pass once the current transaction commits (published to Celery; a lost publish waits for the beat)."""
    transaction.on_commit(_publish)


def _publish() -> None:
    try:
        current_app.tasks[TICK_TASK].delay()
    except BrokerError as exc:
        logger.warning("queue: could not publish a pass (%s); the beat runs one within 30 s", exc)


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
