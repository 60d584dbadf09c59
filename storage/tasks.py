"""Celery tasks of the storage app (thin: look up, call a service, log)."""

import logging

from celery import shared_task

from storage import services

logger = logging.getLogger(__name__)


@shared_task(name="storage.refresh_pool_capacity", ignore_result=True)
def refresh_pool_capacity() -> int:
    """Re-resolve and store every pool's capacity (beat: every 60 s); stale CSI readings are noted on the pool."""
    changed = services.pools_refresh_capacity()
    if changed:
        logger.info("storage pool capacity: %d pool(s) changed capacity or source", changed)
    return changed
