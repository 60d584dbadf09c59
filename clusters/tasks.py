"""Celery tasks of the clusters app (thin: look up, call a service, log)."""

import logging
from functools import partial

from celery import Task, shared_task
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


#: Celery's retry options of a token push that failed for a reason that may pass (``OperatorTokenPushUnavailable``):
#: the daily run schedules the first retry after 5 min, which retries up to 5 more times with full-jitter exponential
#: backoff (at most 10, 20, 40, 60, 60 min), far inside the 3 days before expiry at which the console warns.
TOKEN_PUSH_RETRY = {"max_retries": 5, "retry_backoff": 300, "retry_backoff_max": 3600, "retry_jitter": True}


@shared_task(name="clusters.rotate_operator_tokens", ignore_result=True)
def rotate_operator_tokens() -> int:
    """Push a fresh operator token to every cluster that is due (beat: daily); schedule a retry of each failure.

    Returns:
        How many clusters were rotated.
    """
    results = rotation.operator_tokens_rotate()
    for result in results:
        if result.outcome == rotation.Outcome.FAILED:
            transaction.on_commit(partial(retry_operator_token_push.apply_async, (result.cluster_id,),
                                          countdown=TOKEN_PUSH_RETRY["retry_backoff"]))
    rotated = sum(result.outcome == rotation.Outcome.ROTATED for result in results)
    failed = [result.cluster_name for result in results if not result.ok]
    logger.info("operator token rotation: %d rotated, %d failed%s", rotated, len(failed), f" ({', '.join(failed)}; retrying)" if failed else "")
    return rotated


class _TokenPushRetry(Task):
    """Logs each retry of a failed push and the giving up (the failure itself is recorded on the cluster)."""

    def on_retry(self, exc, task_id, args, kwargs, einfo):
        retry = self.request.retries + 1
        bound = min(TOKEN_PUSH_RETRY["retry_backoff_max"], TOKEN_PUSH_RETRY["retry_backoff"] * 2 ** self.request.retries)
        logger.warning("operator token push to %s failed (retry %d of %d: %s); retrying in at most %d s",
                       args[0], retry, self.max_retries, getattr(exc, "code", type(exc).__name__), bound)

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        logger.warning("operator token push to %s: giving up after %d retries (%s); the console shows the warning",
                       args[0], self.request.retries, getattr(exc, "code", type(exc).__name__))


@shared_task(name="clusters.retry_operator_token_push", base=_TokenPushRetry, bind=True, ignore_result=True,
             autoretry_for=(rotation.OperatorTokenPushUnavailable,), **TOKEN_PUSH_RETRY)
def retry_operator_token_push(self, cluster_id: str) -> None:
    """Push again to a cluster whose rotation failed; Celery retries a push that may pass (``TOKEN_PUSH_RETRY``),
    and gives up (``on_failure``) after the last retry or on a refusal that will not pass.

    Args:
        cluster_id: the cluster's public id. Nothing is done once a rotation succeeded or the cluster is deregistered.
    """
    result = rotation.operator_token_push_retry(cluster_id=cluster_id)
    logger.info("operator token push to %s: %s", cluster_id, result.outcome if result else "nothing left to retry")
