"""The errors billing raises (``ApplicationError`` subclasses: each a stable ``code`` and HTTP ``status``).

Admission (``billing.admission``), the ledger (``billing.services``), usage parsing (``billing.usage``) and ingestion
(``billing.ingest``) raise them; those modules import them from here, so ``services.IdempotencyKeyReused`` and the
like keep working.
"""

from __future__ import annotations

import contract
from billing.errors import (
    BALANCE_OUT_OF_RANGE,
    BATCH_TOO_LARGE,
    CLUSTER_NOT_ALLOWED,
    IDEMPOTENCY_KEY_MISSING,
    IDEMPOTENCY_KEY_REUSED,
    INSUFFICIENT_CREDITS,
    INVALID_AMOUNT,
    QUOTA_EXCEEDED,
    USAGE_CONFLICT,
)
from core.exceptions import ApplicationError, Conflict

# --------------------------------------------------------------------------- admission


class InsufficientCredits(ApplicationError):
    """402: the available balance does not cover the policy's minimum for the request."""

    code = INSUFFICIENT_CREDITS
    status = 402


class QuotaExceeded(ApplicationError):
    """403: the request would pass the user's concurrent sessions or GPUs limit."""

    code = QUOTA_EXCEEDED
    status = 403


class ClusterNotAllowed(ApplicationError):
    """403: the request asks for (or its volumes need) a cluster the user's policy does not allow."""

    code = CLUSTER_NOT_ALLOWED
    status = 403


# --------------------------------------------------------------------------- the ledger, prices and policies


class BalanceOutOfRange(ApplicationError):
    """409: the entry would move the balance beyond what ``numeric(18, 6)`` holds."""

    code = BALANCE_OUT_OF_RANGE
    status = 409


class UsageConflict(ApplicationError):
    """409: a window of the batch was stored by another writer while the batch was being written; nothing was stored."""

    code = USAGE_CONFLICT
    status = 409


class InvalidAmount(ApplicationError):
    """400: an amount that is not a positive decimal number of credits with at most 6 places."""

    code = INVALID_AMOUNT
    status = 400


class IdempotencyKeyReused(Conflict):
    """409: the idempotency key already names an entry with another account, kind or amount."""

    code = IDEMPOTENCY_KEY_REUSED


class IdempotencyKeyMissing(ApplicationError):
    """400: a write that must be retry-safe came without an idempotency key."""

    code = IDEMPOTENCY_KEY_MISSING
    status = 400


# --------------------------------------------------------------------------- usage


class InvalidUsageSample(ApplicationError):
    """400: a sample of the batch is malformed; ``index`` (in the body) names the first one. Nothing was stored."""

    code = contract.INVALID_USAGE_SAMPLE
    status = 400


class BatchTooLarge(ApplicationError):
    """400: more than ``contract.USAGE_MAX_SAMPLES_PER_CALL`` samples in one call."""

    code = BATCH_TOO_LARGE
    status = 400
