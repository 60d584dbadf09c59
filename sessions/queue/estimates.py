"""What a queued session shows: its position, its estimated start, why it waits (``waiting_for``) and up to three
``alternatives`` that would start sooner, each priced; and the record of how good the estimate was.

The accuracy of the estimates is a product figure: each session keeps the estimate made when it was queued
(``first_estimated_start``) and the time it was admitted (``admitted_at``); ``/metrics`` exports the error
(``metrics.fleet``) and ``bench/fleet.py`` reports its median and 90th percentile as a share of the wait.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from django.db import connection

from billing import pricing
from contract import rfc3339
from sessions.queue.plan import Fleet, Job, Outcome

#: Queued sessions (the front of the queue) that get ``alternatives`` computed by one pass; those behind keep none
#: until they come near the front (each alternative is a search over the fleet).
ALTERNATIVES_FOR = 200
#: Offers per queued session.
MAX_ALTERNATIVES = 3


def ask_text(job: Job) -> str:
    """The request in words: ``"8 × whole GPU of H100"``, ``"2 × share (20000 MiB, 50 % cores) of any model"``."""
    kind = "whole GPU" if job.whole else (f"share ({job.memory_mib or 'all'} MiB, "
                                          f"{job.cores if job.cores is not None else 100} % cores)")
    models = " or ".join(sorted(job.models)) if job.models else "any model"
    return f"{job.gpus} × {kind} of {models}" + (" on one node" if job.gpus > 1 else "")


def waiting_text(outcome: Outcome, *, now: datetime) -> str:
    """Why ``outcome``'s session waits, and for what (its ``waiting_for``)."""
    ask = ask_text(outcome.job)
    if outcome.job.clusters is not None and not outcome.job.clusters:
        return f"{ask}: no cluster may take it now (its volumes' clusters and its policy's allowed clusters have none in common)."
    if outcome.start is None:
        return (f"{ask}: no estimate. The GPUs it could use are held by sessions with no known end (no time limit, no idle "
                "stop coming, credits that last), or no ready node of its clusters has that many.")
    at = rfc3339.format_utc(outcome.start)
    if outcome.blocker is None or outcome.start <= now:
        return f"{ask}: the GPUs are expected to be free at {at}."
    who, why = outcome.blocker
    return f"{ask}: the earliest frees at {at} when {who} {why}."


def alternatives(fleet: Fleet, outcome: Outcome, *, prices: dict[str, Decimal], unrestricted: frozenset[int] | None) -> list[dict]:
    """Up to ``MAX_ALTERNATIVES`` requests that would start sooner than ``outcome`` (now, or before its estimate) on
    ``fleet`` as planned (so none of them delays a session ahead): another GPU model, a share instead of a whole GPU,
    fewer GPUs, another cluster (a pinned request; ``unrestricted``: the clusters its policy allows, None any).

    Returns:
        ``[{"gpus", "gpu_memory_mib", "gpu_cores", "gpu_models", "cluster", "starts", "credits_per_hour", "why"}]``:
        the request fields to send, when it would start (RFC 3339; now for one that fits now), its price per hour.
    """
    job = outcome.job
    variants: list[tuple[str, Job]] = []
    if job.models and fleet.models - job.models:
        variants.append(("any GPU model", replace(job, models=frozenset())))
    if job.whole:
        variants.append(("a half-GPU share instead of whole GPUs", replace(job, cores=50, memory_mib=None)))
    if job.gpus > 1:
        for fewer in range(job.gpus - 1, 0, -1):
            variants.append((f"{fewer} GPU(s) instead of {job.gpus}", replace(job, gpus=fewer)))
    if job.clusters is not None and unrestricted != job.clusters and not job.has_volumes:  # volumes keep it where they are
        variants.append(("another cluster", replace(job, clusters=unrestricted)))
    offers: list[dict] = []
    seen_kinds = set()
    for why, variant in variants:
        kind = why.split(" ")[1] if why[0].isdigit() else why
        if kind in seen_kinds:
            continue
        placed = fleet.start_now(variant)
        if placed is not None:
            start, (node, devices) = fleet.now, placed
        else:
            found = fleet.earliest(variant)
            if found is None or (outcome.start is not None and found[0] >= outcome.start):
                continue
            start, node, devices = found
        seen_kinds.add(kind)
        offers.append(_offer(variant, why=why, start=start, node=node, devices=devices, prices=prices, now=fleet.now))
        if len(offers) == MAX_ALTERNATIVES:
            break
    return offers


def _offer(job: Job, *, why: str, start: datetime, node, devices, prices: dict[str, Decimal], now: datetime) -> dict:
    model = devices[0].model
    share = pricing.gpu_share(device_memory_mib=devices[0].memory_mib, gpu_memory_mib=job.memory_mib, gpu_cores=job.cores)
    rate = job.gpus * pricing.hourly_cost(price=pricing.price_for_model(model, prices), share=share)
    return {
        "why": why,
        "gpus": job.gpus,
        "gpu_memory_mib": job.memory_mib,
        "gpu_cores": job.cores,
        "gpu_models": sorted(job.models) if job.models else [model],
        "cluster": node.cluster_name,  # where it was found: taken, it starts there
        "starts": "now" if start <= now else rfc3339.format_utc(start),
        "credits_per_hour": str(rate),
    }


#: Writes the pass's figures to the queued sessions in one statement (arrays of equal length, one element per session).
_WRITE_SQL = """
UPDATE gpu_sessions_session s
   SET queue_position = v.position, estimated_start = v.estimate, waiting_for = v.waiting,
       alternatives = v.offers::jsonb, first_estimated_start = COALESCE(s.first_estimated_start, v.estimate)
  FROM unnest(%s::bigint[], %s::int[], %s::timestamptz[], %s::text[], %s::text[]) AS v(id, position, estimate, waiting, offers)
 WHERE s.id = v.id AND s.phase = 'Queued'
"""


def estimates_write(*, fleet: Fleet, outcomes: list[Outcome], now: datetime, held_back: dict[int, str] | None = None,
                    shown: dict | None = None) -> int:
    """Write each waiting session's position, estimate, ``waiting_for`` and (the first ``ALTERNATIVES_FOR``) alternatives,
    in one statement; ``first_estimated_start`` keeps the first estimate ever written. Returns how many rows it wrote.

    Args:
        fleet: the plan's fleet, as planned (alternatives are searched on it).
        outcomes: the waiting sessions' outcomes, in queue order.
        now: the pass's time.
        held_back: session pk -> why admission held it back although its GPUs were free (its owner's quota), which
            replaces the plan's reason.
        shown: session pk -> ``(queue_position, estimated_start, waiting_for, alternatives)`` as stored: a session whose
            figures are all the same is not written again.
    """
    if not outcomes:
        return 0
    prices = fleet.prices if fleet.prices is not None else pricing.prices_by_model()
    ids, positions, starts, texts, offers = [], [], [], [], []
    held_back, shown = held_back or {}, shown or {}
    for rank, outcome in enumerate(outcomes):
        text = held_back.get(outcome.job.key) or waiting_text(outcome, now=now)
        offered = (alternatives(fleet, outcome, prices=prices, unrestricted=outcome.job.policy_clusters)
                   if rank < ALTERNATIVES_FOR else [])
        if shown.get(outcome.job.key) == (outcome.position, outcome.start, text, offered):
            continue
        ids.append(outcome.job.key)
        positions.append(outcome.position)
        starts.append(outcome.start)
        texts.append(text)
        offers.append(json.dumps(offered))
    if ids:
        with connection.cursor() as cursor:
            cursor.execute(_WRITE_SQL, [ids, positions, starts, texts, offers])
    return len(ids)
