"""Celery tasks of the clusters app (thin: look up, call a service, log)."""

import logging
from functools import partial

from celery import shared_task
from django.db import transaction

from clusters import services
from clusters.operator_token import rotation

logger = logging.getLogger(__name__)


@shared_task(name="clusters.mark_stale", ignore_result=True)
def clusters_mark_stale() -> int:
    """Mark clusters whose operator stopped reporting as degraded (beat: every 60 s)."""
    changed = services.clusters_mark_stale()
    if changed:
        logger.info("marked %d cluster(s) degraded: operator not reporting", changed)
    return changed


#: Bounded retries of a failed token push: the daily run schedules the first after 5 min, which retries up
#: to 5 more times, doubling to 1 h (6 retries over about 3 h), far inside the 3 days before expiry at which
#: the console warns.
TOKEN_PUSH_RETRY = {"max_retries": 5, "countdown_base": 300, "countdown_max": 3600}


def _token_push_countdown(retries: int) -> int:
    """Seconds before retry number ``retries`` (0-based) of a failed token push."""
    return min(TOKEN_PUSH_RETRY["countdown_max"], TOKEN_PUSH_RETRY["countdown_base"] * 2**retries)


@shared_task(name="clusters.rotate_operator_tokens", ignore_result=True)
def rotate_operator_tokens() -> int:
    """Push a fresh operator token to every cluster that is due (beat: daily); schedule a retry of each failure.

    Returns:
        How many clusters were rotated.
    """
    results = rotation.operator_tokens_rotate()
    for result in results:
        if result.outcome == rotation.Outcome.FAILED:
            transaction.on_commit(partial(retry_operator_token_push.apply_async, (result.cluster_id,), countdown=_token_push_countdown(0)))
    rotated = sum(result.outcome == rotation.Outcome.ROTATED for result in results)
    failed = [result.cluster_name for result in results if not result.ok]
    logger.info("operator token rotation: %d rotated, %d failed%s", rotated, len(failed), f" ({', '.join(failed)}; retrying)" if failed else "")
    return rotated


@shared_task(name="clusters.retry_operator_token_push", bind=True, ignore_result=True, max_retries=TOKEN_PUSH_RETRY["max_retries"])
def retry_operator_token_push(self, cluster_id: str) -> None:
    """Push again to a cluster whose rotation failed, with bounded exponential backoff (``TOKEN_PUSH_RETRY``).

    Args:
        cluster_id: the cluster's public id. Nothing is done once a rotation succeeded or the cluster is deregistered.
    """
    try:
        result = rotation.operator_token_push_retry(cluster_id=cluster_id)
    except rotation.OperatorTokenPushFailed as exc:
        attempt = self.request.retries + 1
        if self.request.retries >= self.max_retries:
            logger.warning("operator token push to %s: giving up after %d retries (%s); the console shows the warning", cluster_id, attempt, exc.code)
            return
        countdown = _token_push_countdown(attempt)
        logger.warning("operator token push to %s failed (retry %d of %d: %s); retrying in %d s", cluster_id, attempt, self.max_retries, exc.code, countdown)
        raise self.retry(countdown=countdown) from None
    logger.info("operator token push to %s: %s", cluster_id, result.outcome if result else "nothing left to retry")
