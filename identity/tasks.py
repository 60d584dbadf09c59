"""Celery tasks of the gshare app (thin: call a service, log)."""

import logging

from celery import shared_task

from identity import keys

logger = logging.getLogger(__name__)


@shared_task(name="gshare.signing_key_rotate", ignore_result=True)
def signing_key_rotate() -> dict:
    """Rotate the internal JWT signing key if it is due, and retire keys past ``retire_after`` (beat: monthly).

    Returns:
        ``{"rotated": bool, "active": kid, "replaced": [kid], "retired": [kid], "reason": str}``.
    """
    rotation = keys.signing_key_rotate_scheduled()
    if not rotation.created:
        logger.info("signing key not rotated: %s", rotation.reason)
    return {
        "rotated": rotation.created,
        "active": rotation.active.kid,
        "replaced": [key.kid for key in rotation.replaced],
        "retired": rotation.retired,
        "reason": rotation.reason,
    }


@shared_task(name="gshare.signing_keys_retire", ignore_result=True)
def signing_keys_retire() -> list[str]:
    """Retire the signing keys whose ``retire_after`` has passed (beat: daily). Returns their kids."""
    return keys.signing_keys_retire()
