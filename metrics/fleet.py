"""Gauges of every registered cluster, its GPUs and sessions, computed per scrape from the control plane's tables.

:func:`inventory_exposition` reads the fleet in :data:`QUERIES` queries whatever its size (clusters, GPUs with
their node names, live sessions by phase, idle sessions and their GPUs, charged credits by cluster, the queue and its
estimates' accuracy), builds the metric families with
prometheus-client and renders them in the Prometheus text format. The text is cached for
``GSHARE_METRICS_CACHE_SECONDS`` in Django's cache (Redis), so several Prometheus replicas and several gunicorn
workers scraping within that window cost one computation. Decimal credits become floats only here.

Metric names follow Prometheus' conventions: ``gshare_`` prefix, base units (bytes, seconds; GPU cores as
fractions of one GPU, 1.0 = a whole GPU, since HAMi's ``gpucores`` are percent), ``_total`` on counters.
"""

from __future__ import annotations

import datetime
import logging
from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from billing.models import LedgerEntry
from clusters.models import Cluster, GpuDevice
from sessions import selectors as session_selectors
from sessions.models import Session

logger = logging.getLogger(__name__)

#: Queries one computation makes, whatever the number of clusters, nodes, GPUs or sessions.
QUERIES = 6
CACHE_KEY = "gshare:metrics:inventory"
MIB = 1024 * 1024
#: Phases counted by gshare_cluster_sessions (the terminal ones would only count history).
LIVE_PHASES = [phase for phase in Session.Phase.values if phase not in Session.TERMINAL_PHASES]


@dataclass
class _Totals:
    """Per cluster and GPU model: counts of GPUs."""

    total: int = 0
    healthy: int = 0
    whole: int = 0
    shared: int = 0


@dataclass
class _Capacity:
    """Per cluster: summed capacity and reservations of its GPUs (healthy or not: a reservation stays on a sick GPU)."""

    memory_bytes: int = 0
    memory_reserved_bytes: int = 0
    cores: float = 0.0
    cores_reserved: float = 0.0
    slots: int = 0
    slots_reserved: int = 0
    models: dict[str, _Totals] = field(default_factory=lambda: defaultdict(_Totals))


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _seconds(delta: datetime.timedelta) -> float:
    return round(delta.total_seconds(), 3)


def collect_families(*, now: datetime.datetime | None = None) -> list:
    """The inventory's metric families, read from the database in :data:`QUERIES` queries.

    Args:
        now: the time ages and expiries are measured from (default: now).

    Returns:
        prometheus-client ``Metric`` objects (gauges, one counter), ready for a registry's ``collect``.
    """
    now = now or timezone.now()
    clusters = list(
        Cluster.objects.registered()
        .order_by("name")
        .values(
            "pk",
            "name",
            "public_id",
            "status",
            "last_heartbeat_at",
            "operator_token_expires_at",
            "operator_refused_since",
            "operator_refused_reason",
        )
    )
    names = {c["pk"]: c["name"] for c in clusters}

    info = _gauge("gshare_cluster_info", "A registered cluster: 1, labelled with its id and status.", ["cluster", "cluster_id", "status"])
    heartbeat = _gauge(
        "gshare_cluster_heartbeat_age_seconds", "Seconds since the cluster's operator last reported (absent before its first report).", ["cluster"]
    )
    expires = _gauge(
        "gshare_cluster_operator_token_expires_in_seconds", "Seconds until the cluster's newest operator token expires (negative: expired).", ["cluster"]
    )
    refused = _gauge(
        "gshare_cluster_operator_refused_seconds",
        "Seconds the cluster's operator callbacks have been refused, by the latest reason on record (absent when accepted).",
        ["cluster", "reason"],
    )
    for c in clusters:
        info.add_metric([c["name"], c["public_id"], c["status"]], 1)
        if c["last_heartbeat_at"] is not None:
            heartbeat.add_metric([c["name"]], max(0.0, _seconds(now - c["last_heartbeat_at"])))
        if c["operator_token_expires_at"] is not None:
            expires.add_metric([c["name"]], _seconds(c["operator_token_expires_at"] - now))
        if c["operator_refused_since"] is not None:
            refused.add_metric([c["name"], c["operator_refused_reason"] or "unknown"], max(0.0, _seconds(now - c["operator_refused_since"])))

    per_cluster: dict[int, _Capacity] = defaultdict(_Capacity)
    gpu_families = {
        "healthy": _gauge("gshare_gpu_healthy", "1 when the GPU is healthy and reported (HAMi's registration), else 0.", ["cluster", "node", "uuid", "model"]),
        "memory": _gauge("gshare_gpu_memory_bytes", "GPU memory HAMi registers for the GPU, bytes.", ["cluster", "node", "uuid", "model"]),
        "memory_reserved": _gauge("gshare_gpu_memory_reserved_bytes", "GPU memory reserved by live sessions, bytes.", ["cluster", "node", "uuid", "model"]),
        "cores": _gauge("gshare_gpu_cores", "Core capacity of the GPU in GPUs (1 = the whole GPU).", ["cluster", "node", "uuid", "model"]),
        "cores_reserved": _gauge(
            "gshare_gpu_cores_reserved", "Cores reserved by live sessions, in GPUs (1 = the whole GPU).", ["cluster", "node", "uuid", "model"]
        ),
        "slots": _gauge("gshare_gpu_slots", "Sessions that may share the GPU (HAMi's split count).", ["cluster", "node", "uuid", "model"]),
        "slots_reserved": _gauge("gshare_gpu_slots_reserved", "Live reservations on the GPU.", ["cluster", "node", "uuid", "model"]),
        "whole": _gauge("gshare_gpu_reserved_whole", "1 when one session holds the whole GPU, else 0.", ["cluster", "node", "uuid", "model"]),
    }
    devices = (
        GpuDevice.objects.filter(cluster_id__in=list(names))
        .order_by("cluster_id", "node__name", "index")
        .values_list(
            "cluster_id",
            "node__name",
            "uuid",
            "model",
            "health",
            "memory_mib",
            "cores",
            "split_count",
            "used_count",
            "used_memory_mib",
            "used_cores",
            "used_exclusive",
        )
    )
    for cluster_id, node, uuid, model, health, memory_mib, cores, split, used, used_mib, used_cores, exclusive in devices:
        labels = [names[cluster_id], node, uuid, model]
        values = {
            "healthy": int(health),
            "memory": memory_mib * MIB,
            "memory_reserved": used_mib * MIB,
            "cores": cores / 100,
            "cores_reserved": used_cores / 100,
            "slots": split,
            "slots_reserved": used,
            "whole": int(exclusive),
        }
        for key, family in gpu_families.items():
            family.add_metric(labels, values[key])
        capacity = per_cluster[cluster_id]
        capacity.memory_bytes += memory_mib * MIB
        capacity.memory_reserved_bytes += used_mib * MIB
        capacity.cores += cores / 100
        capacity.cores_reserved += used_cores / 100
        capacity.slots += split
        capacity.slots_reserved += used
        totals = capacity.models[model]
        totals.total += 1
        totals.healthy += int(health)
        if exclusive:
            totals.whole += 1
        elif used:
            totals.shared += 1

    gpus = _gauge("gshare_cluster_gpus", "GPUs of the cluster, by model.", ["cluster", "model"])
    healthy = _gauge("gshare_cluster_gpus_healthy", "Healthy GPUs of the cluster, by model.", ["cluster", "model"])
    reserved = _gauge(
        "gshare_cluster_gpus_reserved",
        "GPUs with a live reservation, by model and kind: whole (one session holds it) or shared (one or more shares).",
        ["cluster", "model", "kind"],
    )
    cluster_capacity = {
        "memory_bytes": _gauge("gshare_cluster_gpu_memory_bytes", "GPU memory of the cluster's GPUs, bytes.", ["cluster"]),
        "memory_reserved_bytes": _gauge("gshare_cluster_gpu_memory_reserved_bytes", "GPU memory reserved by live sessions, bytes.", ["cluster"]),
        "cores": _gauge("gshare_cluster_gpu_cores", "Core capacity of the cluster's GPUs, in GPUs.", ["cluster"]),
        "cores_reserved": _gauge("gshare_cluster_gpu_cores_reserved", "Cores reserved by live sessions, in GPUs.", ["cluster"]),
        "slots": _gauge("gshare_cluster_gpu_slots", "Sessions the cluster's GPUs may hold (sum of HAMi's split counts).", ["cluster"]),
        "slots_reserved": _gauge("gshare_cluster_gpu_slots_reserved", "Live reservations on the cluster's GPUs.", ["cluster"]),
    }
    for c in clusters:
        capacity = per_cluster.get(c["pk"], _Capacity())
        for key, family in cluster_capacity.items():
            family.add_metric([c["name"]], getattr(capacity, key))
        for model, totals in sorted(capacity.models.items()):
            gpus.add_metric([c["name"], model], totals.total)
            healthy.add_metric([c["name"], model], totals.healthy)
            reserved.add_metric([c["name"], model, "whole"], totals.whole)
            reserved.add_metric([c["name"], model, "shared"], totals.shared)

    sessions = _gauge("gshare_cluster_sessions", "Live sessions placed on the cluster, by phase.", ["cluster", "phase"])
    by_phase = {
        (row["cluster_id"], row["phase"]): row["n"]
        for row in Session.objects.filter(cluster_id__in=list(names), phase__in=LIVE_PHASES).values("cluster_id", "phase").annotate(n=Count("pk")).order_by()
    }
    for c in clusters:
        for phase in LIVE_PHASES:
            sessions.add_metric([c["name"], phase], by_phase.get((c["pk"], phase), 0))

    idle_sessions = _gauge("gshare_cluster_idle_sessions", "Running sessions idle now: known GPU activity, no kernel (nor a connection "
                           "while part of its GPUs is unreported) for 15 policy minutes (sessions.selectors.idle_sessions).", ["cluster"])
    idle_gpus = _gauge("gshare_cluster_idle_gpus", "GPUs held by the idle sessions.", ["cluster"])
    idle = {row["cluster_id"]: (row["n"], row["gpus"]) for row in session_selectors.idle_sessions(now=now).filter(cluster_id__in=list(names))
            .values("cluster_id").annotate(n=Count("pk"), gpus=Sum("gpus")).order_by()}
    for c in clusters:
        n, held = idle.get(c["pk"], (0, 0))
        idle_sessions.add_metric([c["name"]], n)
        idle_gpus.add_metric([c["name"]], held or 0)

    burned = CounterMetricFamily(
        "gshare_cluster_credits_burned", "Credits charged for usage of the cluster's GPUs (ledger charges; refunds not subtracted).", labels=["cluster"]
    )
    charged = {
        row["session__cluster_id"]: row["amount"]
        for row in LedgerEntry.objects.filter(kind=LedgerEntry.Kind.CHARGE, session__cluster_id__in=list(names))
        .values("session__cluster_id")
        .annotate(amount=Sum("amount"))
        .order_by()
    }
    for c in clusters:
        burned.add_metric([c["name"]], float(-(charged.get(c["pk"]) or 0)))

    figures = session_selectors.queue_figures(since=now - datetime.timedelta(hours=24))
    queued = _gauge("gshare_queue_sessions", "Sessions waiting in the fleet's queue.", [])
    queued.add_metric([], figures["queued"])
    admitted = _gauge("gshare_queue_admitted_24h", "Sessions the queue started in the last 24 hours (what the error figures cover).", [])
    admitted.add_metric([], figures["admitted"])
    error = _gauge("gshare_queue_estimate_error_seconds", "How far the estimate made when a session was queued was from its actual "
                   "start, over the sessions the queue started in the last 24 hours, seconds (absent before any).", ["quantile"])
    share = _gauge("gshare_queue_estimate_error_ratio", "That error as a share of the session's actual wait (0.1: off by a tenth of "
                   "the wait), over the same sessions.", ["quantile"])
    for quantile, seconds, ratio in (("0.5", figures["error_p50_seconds"], figures["error_p50_share"]),
                                     ("0.9", figures["error_p90_seconds"], figures["error_p90_share"])):
        if seconds is not None:
            error.add_metric([quantile], float(seconds))
            share.add_metric([quantile], float(ratio))

    generated = _gauge(
        "gshare_inventory_generated_timestamp_seconds",
        "When these inventory metrics were computed (Unix time; older by up to GSHARE_METRICS_CACHE_SECONDS).",
        [],
    )
    generated.add_metric([], now.timestamp())
    return [info, heartbeat, expires, refused, gpus, healthy, reserved, *cluster_capacity.values(), sessions, idle_sessions, idle_gpus, burned,
            *gpu_families.values(), queued, admitted, error, share, generated]


class _Families:
    """A prometheus-client collector yielding precomputed families."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):  # noqa: D102
        return iter(self.families)


def render_inventory(*, now: datetime.datetime | None = None) -> bytes:
    """The inventory metrics in the Prometheus text format (0.0.4), computed now (no cache)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(collect_families(now=now)))
    return generate_latest(registry)


def inventory_exposition() -> bytes:
    """The inventory metrics, from the cache when computed less than ``GSHARE_METRICS_CACHE_SECONDS`` ago.

    A cache failure (Redis down) is logged and the metrics are computed anyway: a scrape must not fail for it.
    """
    ttl = settings.GSHARE_METRICS_CACHE_SECONDS
    if ttl <= 0:
        return render_inventory()
    try:
        cached = cache.get(CACHE_KEY)
    except Exception as exc:  # any cache backend failure
        logger.warning("metrics cache unavailable (%s): computing the inventory", type(exc).__name__)
        return render_inventory()
    if cached is not None:
        return cached
    text = render_inventory()
    try:
        cache.set(CACHE_KEY, text, timeout=ttl)
    except Exception as exc:
        logger.warning("metrics cache unavailable (%s): inventory not cached", type(exc).__name__)
    return text
