"""The error codes of billing: admission, the ledger, prices and policies, and usage ingestion. ``invalid_usage_sample``
is the contract's (``contract.INVALID_USAGE_SAMPLE``): the operator reads it."""

from __future__ import annotations

# --------------------------------------------------------------------------- admission
INSUFFICIENT_CREDITS = "insufficient_credits"
"""402: the available balance does not cover the policy's minimum for the request."""

QUOTA_EXCEEDED = "quota_exceeded"
"""403: the request would pass the user's concurrent sessions or GPUs limit."""

CLUSTER_NOT_ALLOWED = "cluster_not_allowed"
"""403: the request asks for (or its volumes need) a cluster the user's policy does not allow."""

# --------------------------------------------------------------------------- the ledger, prices and policies
BALANCE_OUT_OF_RANGE = "balance_out_of_range"
"""409: the entry would move the balance beyond what the ledger's columns hold."""

INVALID_AMOUNT = "invalid_amount"
"""400: an amount that is not a positive decimal number of credits with at most 6 places."""

IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
"""409: the idempotency key already names an entry (or a session) of another request."""

IDEMPOTENCY_KEY_MISSING = "idempotency_key_missing"
"""400: a write that must be retry-safe came without an idempotency key."""

# --------------------------------------------------------------------------- usage
USAGE_CONFLICT = "usage_conflict"
"""409: another writer stored a window of the batch while it was being written; nothing was stored."""

BATCH_TOO_LARGE = "batch_too_large"
"""400: more than ``contract.USAGE_MAX_SAMPLES_PER_CALL`` samples in one call."""
