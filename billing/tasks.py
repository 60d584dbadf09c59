"""Celery tasks of the billing app (thin: look up, call a service, log)."""

import logging

from celery import shared_task

from billing import periods, storage_charges

logger = logging.getLogger(__name__)


@shared_task(name="billing.close_billing_periods", ignore_result=True)
def close_billing_periods() -> int:
    """Charge the billing periods that ended (or whose session ended) without a later sample, and the volumes' quotas
    of the periods that ended (beat: every 60 s; idempotent)."""
    written = periods.periods_close()
    if written:
        logger.info("billing: %d period charge(s) written by the periodic close", written)
    stored = storage_charges.storage_charges_close()
    if stored:
        logger.info("billing: %d storage charge(s) written by the periodic close", stored)
    return written + stored
