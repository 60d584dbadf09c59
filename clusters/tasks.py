"""Celery tasks of the clusters app (thin: look up, call a service, log)."""

import logging

from celery import shared_task

from clusters import services

logger = logging.getLogger(__name__)


@shared_task(name="clusters.mark_stale", ignore_result=True)
def clusters_mark_stale() -> int:
    """Mark clusters whose operator stopped reporting as degraded (beat: every 60 s)."""
    changed = services.clusters_mark_stale()
    if changed:
        logger.info("marked %d cluster(s) degraded: operator not reporting", changed)
    return changed
