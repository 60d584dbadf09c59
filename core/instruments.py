"""Counters and histograms incremented in request handlers (prometheus-client).

They are registered in :data:`REGISTRY` (not prometheus-client's global one, which also carries process and
platform collectors that multiprocess mode cannot aggregate). With ``PROMETHEUS_MULTIPROC_DIR`` set before
Python starts, prometheus-client keeps each value in a per-process memory-mapped file there and the view
exposes the sum over every worker; without it (tests, ``runserver``) each process counts on its own.
Incrementing one is a few microseconds and takes no lock shared between processes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

#: Buckets (seconds) for the connect-verify hot path: answered from caches in well under a millisecond,
#: a database or Redis round trip in a few.
VERIFY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Buckets (seconds) for placement: one fit query under the cluster locks.
PLACEMENT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

USAGE_SAMPLES = Counter(
    "gshare_usage_samples", "Usage samples reported by operators (POST /internal/v1/usage), by outcome: "
    "accepted (new, priced), duplicate (already stored or repeated), refused (the batch was refused).",
    ["cluster", "outcome"], registry=REGISTRY,
)
PLACEMENT_DECISIONS = Counter(
    "gshare_placement_decisions", "Session placements by outcome: placed, no_capacity, refused_by_policy "
    "(insufficient credits, over a quota, cluster not allowed), contended (concurrent requests took the chosen capacity "
    "on every attempt).", ["outcome"], registry=REGISTRY,
)
PLACEMENT_SECONDS = Histogram(
    "gshare_placement_duration_seconds", "Time of one placement (fit without a lock, the chosen cluster's lock, fit and reservation under it), seconds.",
    buckets=PLACEMENT_BUCKETS, registry=REGISTRY,
)
CONNECT_VERIFY_SECONDS = Histogram(
    "gshare_connect_verify_duration_seconds", "Time to answer /internal/connect/verify and Envoy's "
    "/internal/connect/ext-authz check, seconds, by outcome: allowed (200; the ext-authz check's 307 of a link), "
    "refused (401/403), unavailable (503).", ["outcome"], buckets=VERIFY_BUCKETS, registry=REGISTRY,
)
OPERATOR_REFUSALS = Counter(
    "gshare_operator_callbacks_refused", "Operator callbacks refused although their token's signature verified, "
    "by cluster and reason (token_expired, token_revoked, cluster_deregistered, ...).",
    ["cluster_id", "reason"], registry=REGISTRY,
)

#: Outcomes of PLACEMENT_DECISIONS.
PLACED, NO_CAPACITY, REFUSED_BY_POLICY, CONTENDED = "placed", "no_capacity", "refused_by_policy", "contended"

#: The verify histogram's children, bound once: the hot path skips the label lookup.
_VERIFY_CHILDREN = {
    "allowed": CONNECT_VERIFY_SECONDS.labels(outcome="allowed"),
    "refused": CONNECT_VERIFY_SECONDS.labels(outcome="refused"),
    "unavailable": CONNECT_VERIFY_SECONDS.labels(outcome="unavailable"),
}


def connect_verify_observe(status: int, seconds: float) -> None:
    """Record one answer of ``/internal/connect/verify`` or of the ext-authz check: its HTTP status (a 307 is a link
    let in) and how long it took (seconds)."""
    outcome = "allowed" if status in (200, 307) else "unavailable" if status >= 500 else "refused"
    _VERIFY_CHILDREN[outcome].observe(seconds)
