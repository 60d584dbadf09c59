"""Celery tasks of the billing app (thin: look up, call a service, log)."""

import logging

from celery import shared_task

from billing import overdrawn

logger = logging.getLogger(__name__)


@shared_task(name="billing.stop_overdrawn_sessions", ignore_result=True)
def stop_overdrawn_sessions() -> int:
    """Stop the sessions of accounts below zero past their policy's grace (beat: every 60 s; idempotent)."""
    stopped = overdrawn.overdrawn_sessions_stop()
    if stopped:
        logger.info("credits: stopped %d session(s) of accounts below zero past their grace", stopped)
    return stopped
