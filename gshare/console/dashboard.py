"""Reads behind the console's dashboard (the admin index, ``/``): one selector per tile and one for the chart.

Every selector takes the console's cluster scope (``gshare.console.scope.console_cluster``: a ``Cluster`` or None
for all clusters) and runs a fixed number of queries, whatever the number of nodes, GPUs, sessions or ledger
entries: counts are SQL aggregates, never Python loops over rows. :func:`dashboard` gathers them all.

Definitions (docs/console.md#the-dashboard):

- A GPU is **reserved whole** when it has an exclusive allocation (``sessions.Allocation.exclusive``), **reserved as
  shares** when it has only non-exclusive ones, **free** when it is healthy and has none.
- A session is **starting** while Pending, Scheduled or Starting; **failed in the last 24 h** when Failed and it
  ended (``ended_at``, else its last status report, else its creation) in the last 24 hours.
- **Burn per hour** is what the Running sessions cost per hour now at the prices (``billing.selectors.burn_rate``'s
  definition, summed fleet-wide): the ledger lags behind it, since usage is charged as operators report it.
- The **storage** tile is the fleet-wide ``storage.selectors.storage_summary``: its headline is the largest single
  pool (pools never add up), whichever cluster is chosen.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, IntegerField, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing import pricing
from billing.models import CREDITS, CreditAccount
from clusters.models import Cluster, GpuDevice, Node
from clusters.token_rotation import operator_token_state
from sessions.models import Allocation, Session
from storage.capacity import format_bytes
from storage.models import StoragePool
from storage.selectors import storage_summary

#: Phases counted as "starting": placed or waiting, not Running yet.
STARTING_PHASES = (Session.Phase.PENDING, Session.Phase.SCHEDULED, Session.Phase.STARTING)
#: Accounts below this many credits are listed on the credits tile (setting ``GSHARE_CONSOLE_LOW_BALANCE``).
DEFAULT_LOW_BALANCE = Decimal(10)
#: How many of the lowest accounts the credits tile names.
LOW_ACCOUNTS_SHOWN = 5
CHART_HOURS = 24
_ZERO = Decimal(0).quantize(CREDITS)


def utc(value: datetime.datetime | None) -> str:
    """``2026-12-01 11:35 UTC`` (minutes), or ``never`` for None."""
    if value is None:
        return "never"
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def age(seconds: float | None) -> str:
    """A short age: ``42 s``, ``5 min``, ``3 h``, ``2 days``; ``never`` for None."""
    if seconds is None:
        return "never"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


def credits_text(value: Decimal) -> str:
    """Credits as a plain decimal without trailing zeros (``12.5``, ``0.083333``, ``-3``)."""
    text = format(Decimal(value).quantize(CREDITS), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def low_balance_threshold() -> Decimal:
    """Setting ``GSHARE_CONSOLE_LOW_BALANCE`` (credits, a ``Decimal``; default 10)."""
    return Decimal(str(getattr(settings, "GSHARE_CONSOLE_LOW_BALANCE", DEFAULT_LOW_BALANCE)))


# --------------------------------------------------------------------------- clusters (and the fleet table)


@dataclass(frozen=True)
class ClusterRow:
    """One registered cluster as the clusters tile and the fleet table show it.

    Attributes:
        cluster: the ``Cluster`` (annotated ``node_count``, ``ready_nodes``, ``gpu_count``).
        heartbeat_age: seconds since its operator's last report (None: never reported).
        reporting: whether that report is within ``GSHARE_HEARTBEAT_STALE_SECONDS``.
        warnings: sentences naming a problem and its fix (operator token, operator not reporting).
    """

    cluster: Cluster
    heartbeat_age: float | None
    reporting: bool
    warnings: tuple[str, ...]

    @property
    def heartbeat(self) -> str:
        """``5 min ago (2026-12-01 11:30 UTC)`` or ``never``."""
        if self.cluster.last_heartbeat_at is None:
            return "never"
        return f"{age(self.heartbeat_age)} ago ({utc(self.cluster.last_heartbeat_at)})"


@dataclass(frozen=True)
class ClustersTile:
    """Counts by status (``connected``, ``degraded``, ``unreachable``, ``pending``) and one row per cluster."""

    rows: list[ClusterRow]
    counts: dict[str, int]

    @property
    def warnings(self) -> list[tuple[Cluster, str]]:
        """``(cluster, sentence)`` for every warning of every cluster."""
        return [(row.cluster, w) for row in self.rows for w in row.warnings]


def _count_of(model, **where) -> Subquery:
    """A correlated ``COUNT(*)`` of ``model`` rows of the outer cluster (no join fan-out between nodes and GPUs)."""
    qs = model.objects.filter(cluster=OuterRef("pk"), **where).order_by().values("cluster").annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(qs, output_field=IntegerField()), Value(0))


def clusters_tile(*, cluster: Cluster | None = None, now: datetime.datetime | None = None) -> ClustersTile:
    """The registered clusters (only ``cluster`` when given), by name, with node and GPU counts and warnings.

    Warnings: the operator token's (``clusters.token_rotation.operator_token_state``: rotation failed, none on
    record, expired or expiring within ``GSHARE_OPERATOR_TOKEN_WARN_BEFORE``; an operator whose token is revoked or
    expired has its callbacks refused with 401), and an operator that has not reported within
    ``GSHARE_HEARTBEAT_STALE_SECONDS`` (a refused callback or a stopped operator look the same from here).

    Returns:
        A :class:`ClustersTile`. One query.
    """
    now = now or timezone.now()
    qs = Cluster.objects.exclude(status=Cluster.Status.DEREGISTERED).defer("kubeconfig").annotate(
        node_count=_count_of(Node), ready_nodes=_count_of(Node, ready=True), gpu_count=_count_of(GpuDevice),
    ).order_by("name", "id")
    if cluster is not None:
        qs = qs.filter(pk=cluster.pk)
    stale = settings.GSHARE_HEARTBEAT_STALE_SECONDS
    rows, counts = [], {s: 0 for s in ("connected", "degraded", "unreachable", "pending")}
    for c in qs:
        counts[c.status] = counts.get(c.status, 0) + 1
        heartbeat_age = (now - c.last_heartbeat_at).total_seconds() if c.last_heartbeat_at else None
        reporting = heartbeat_age is not None and heartbeat_age <= stale
        warnings = []
        token = operator_token_state(c, now=now).warning
        if token:
            warnings.append(token)
        if not reporting:
            since = f"for {age(heartbeat_age)} (last report {utc(c.last_heartbeat_at)})" if heartbeat_age is not None else "yet"
            warnings.append(
                f"The operator has not reported {since}: its callbacks are refused or it is not running. Check its pod "
                "(`kubectl -n gshare-system logs deploy/gshare-operator`); a 401 there (token_revoked, expired) is fixed by "
                f"`manage.py rotate_operator_tokens --cluster {c.public_id}`."
            )
        rows.append(ClusterRow(cluster=c, heartbeat_age=heartbeat_age, reporting=reporting, warnings=tuple(warnings)))
    return ClustersTile(rows=rows, counts=counts)


# --------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuCounts:
    """GPUs of one model (or of all, ``model`` ""): total, healthy, reserved whole, reserved as shares, free."""

    model: str
    total: int = 0
    healthy: int = 0
    whole: int = 0
    shared: int = 0
    free: int = 0


@dataclass(frozen=True)
class GpusTile:
    """``by_model`` (sorted by model) and their sum ``total``."""

    by_model: list[GpuCounts]
    total: GpuCounts


def gpus_tile(*, cluster: Cluster | None = None) -> GpusTile:
    """GPU counts by model, from the GPUs and their allocations (``sessions.Allocation``, the reservations).

    Reserved whole: an exclusive allocation; as shares: allocations, none exclusive; free: healthy, no allocation.
    An unhealthy GPU with an allocation counts as reserved (and not healthy), never as free.

    Returns:
        A :class:`GpusTile`. One query.
    """
    any_allocation = Exists(Allocation.objects.filter(device=OuterRef("pk")))
    exclusive = Exists(Allocation.objects.filter(device=OuterRef("pk"), exclusive=True))
    qs = GpuDevice.objects.all()
    if cluster is not None:
        qs = qs.filter(cluster=cluster)
    rows = (
        qs.order_by().values("model").annotate(
            total=Count("id"),
            healthy=Count("id", filter=Q(health=True)),
            whole=Count("id", filter=Q(exclusive)),
            shared=Count("id", filter=Q(any_allocation) & ~Q(exclusive)),
            free=Count("id", filter=Q(health=True) & ~Q(any_allocation)),
        ).order_by("model")
    )
    by_model = [GpuCounts(**row) for row in rows]
    total = GpuCounts(model="", **{k: sum(getattr(r, k) for r in by_model) for k in ("total", "healthy", "whole", "shared", "free")})
    return GpusTile(by_model=by_model, total=total)


# --------------------------------------------------------------------------- sessions


@dataclass(frozen=True)
class SessionsTile:
    """Sessions running, starting (Pending, Scheduled, Starting), stopping, and failed in the last 24 hours."""

    running: int
    starting: int
    stopping: int
    failed_24h: int


def _sessions_of(cluster: Cluster | None):
    qs = Session.objects.all()
    if cluster is not None:
        # A session not placed yet belongs to the cluster it is pinned to.
        qs = qs.filter(Q(cluster=cluster) | Q(cluster__isnull=True, requested_cluster=cluster))
    return qs


def sessions_tile(*, cluster: Cluster | None = None, now: datetime.datetime | None = None) -> SessionsTile:
    """Session counts of ``cluster`` (or all). A Failed session counts as failed in the last 24 h when it ended then
    (``ended_at``, else its last status report, else its creation).

    Returns:
        A :class:`SessionsTile`. One query.
    """
    now = now or timezone.now()
    since = now - datetime.timedelta(hours=24)
    ended = Coalesce("ended_at", "last_status_at", "created_at")
    # Only the live sessions and the recent failures are read, not the whole history.
    recent_failure = Q(phase=Session.Phase.FAILED) & (Q(ended_at__gte=since) | Q(ended_at__isnull=True))
    counts = (
        _sessions_of(cluster).filter(~Q(phase__in=Session.TERMINAL_PHASES) | recent_failure).annotate(ended=ended).aggregate(
            running=Count("id", filter=Q(phase=Session.Phase.RUNNING)),
            starting=Count("id", filter=Q(phase__in=STARTING_PHASES)),
            stopping=Count("id", filter=Q(phase=Session.Phase.STOPPING)),
            failed_24h=Count("id", filter=Q(phase=Session.Phase.FAILED, ended__gte=since)),
        )
    )
    return SessionsTile(**counts)


# --------------------------------------------------------------------------- credits


@dataclass(frozen=True)
class CreditsTile:
    """Burn per hour now and the accounts below the threshold.

    Attributes:
        burn_per_hour: credits per hour the Running sessions cost now at the prices (``Decimal``).
        running: how many Running sessions that is.
        threshold: ``GSHARE_CONSOLE_LOW_BALANCE`` (credits).
        low_count: accounts whose balance is below the threshold (with a cluster chosen: of users with a live
            session on it).
        lowest: up to five of them, lowest balance first: ``(username, balance)``.
    """

    burn_per_hour: Decimal
    running: int
    threshold: Decimal
    low_count: int
    lowest: list[tuple[str, Decimal]] = field(default_factory=list)

    @property
    def burn_text(self) -> str:
        """The burn as text, ``12.5``."""
        return credits_text(self.burn_per_hour)

    @property
    def threshold_display(self) -> str:
        """``10 credits``."""
        return f"{credits_text(self.threshold)} credits"

    @property
    def lowest_display(self) -> list[tuple[str, str]]:
        """:attr:`lowest` with the balances as text."""
        return [(name, credits_text(balance)) for name, balance in self.lowest]


def burn_per_hour(*, cluster: Cluster | None = None, prices: dict[str, Decimal] | None = None) -> tuple[Decimal, int]:
    """Credits per hour the Running sessions (of ``cluster``, or all) cost now, and how many they are.

    The same sum as ``billing.selectors.session_hourly_cost`` over each session (each GPU's ``share × price``
    rounded to 0.000001 credits; a session without reservations ``gpus × share × the default price``), computed
    from one grouped query: identical terms are counted, not read one by one.

    Returns:
        ``(credits per hour, running sessions)``. Two queries (three without ``prices``).
    """
    if prices is None:
        prices = pricing.prices_by_model()
    running = _sessions_of(cluster).filter(phase=Session.Phase.RUNNING)
    rows = (
        running.order_by()
        .values("gpus", "gpu_memory_mib", "gpu_cores", "allocations__device__model", "allocations__device__memory_mib")
        .annotate(terms=Count("*"))
    )
    total = _ZERO
    for row in rows:
        memory, cores, model = row["gpu_memory_mib"], row["gpu_cores"], row["allocations__device__model"]
        device_memory = row["allocations__device__memory_mib"]
        if device_memory is None:  # no reservation: its GPUs at the default price
            share = pricing.gpu_share(device_memory_mib=None, gpu_memory_mib=memory, gpu_cores=cores)
            total += row["terms"] * row["gpus"] * pricing.hourly_cost(price=pricing.price_for_model("", prices), share=share)
        else:
            share = pricing.gpu_share(device_memory_mib=device_memory, gpu_memory_mib=memory, gpu_cores=cores)
            total += row["terms"] * pricing.hourly_cost(price=pricing.price_for_model(model, prices), share=share)
    sessions = running.count()
    return total, sessions


def credits_tile(*, cluster: Cluster | None = None, threshold: Decimal | None = None) -> CreditsTile:
    """Burn per hour now (:func:`burn_per_hour`) and the credit accounts below ``threshold`` (default the setting
    ``GSHARE_CONSOLE_LOW_BALANCE``); with ``cluster``, only the accounts of users with a live session on it.

    Returns:
        A :class:`CreditsTile`. Four or five queries.
    """
    threshold = low_balance_threshold() if threshold is None else threshold
    burn, running = burn_per_hour(cluster=cluster)
    accounts = CreditAccount.objects.filter(balance__lt=threshold)
    if cluster is not None:
        live_here = _sessions_of(cluster).filter(owner=OuterRef("user")).exclude(phase__in=Session.TERMINAL_PHASES)
        accounts = accounts.filter(Exists(live_here))
    lowest = list(accounts.order_by("balance", "id").values_list("user__username", "balance")[:LOW_ACCOUNTS_SHOWN])
    low_count = len(lowest) if len(lowest) < LOW_ACCOUNTS_SHOWN else accounts.count()
    return CreditsTile(burn_per_hour=burn, running=running, threshold=threshold, low_count=low_count, lowest=lowest)


# --------------------------------------------------------------------------- storage


@dataclass(frozen=True)
class StorageTile:
    """The fleet's storage headline: the largest single pool a placement could use (never the sum of pools).

    Attributes:
        pools: how many pools there are (fleet-wide).
        pool: the name of the pool with the largest capacity ("" when none is known).
        capacity: its capacity (``"2048 GiB"``, or ``"unknown"``). capacity_bytes: the same in bytes (or None).
        source: ``csi``, ``manual``, ``node_disk`` or ``none`` (``StoragePool.Source``).
        source_label: the source in words (``node_disk`` says "stand-in").
        note: the resolution's sentence (why that number), or what to do when nothing is known.
        allocated: quotas allocated on that pool (``"30 GiB"``). largest_free: the most free room on one pool.
        fell_back: True when the capacity is the storage node's disk (no CSI reading, no stated capacity).
        shared_note: with a cluster chosen, the sentence saying the figure is fleet-wide (pools are shared across
            clusters), else "".
    """

    pools: int
    pool: str
    capacity: str
    capacity_bytes: int | None
    source: str
    source_label: str
    note: str
    allocated: str
    largest_free: str
    fell_back: bool
    shared_note: str


def storage_tile(*, cluster: Cluster | None = None, now: datetime.datetime | None = None) -> StorageTile:
    """The fleet-wide ``storage.selectors.storage_summary`` as the dashboard shows it.

    The pool is the fleet's, not a cluster's: with ``cluster`` given the figure stays the fleet-wide one and
    ``shared_note`` says so ("shared across clusters").

    Returns:
        A :class:`StorageTile`. The summary's constant number of queries (about six).
    """
    summary = storage_summary(cluster=None, now=now)
    head = next((p for p in summary["pools"] if p["id"] == summary["pool"]), None)
    source = summary["source"]
    labels = {
        StoragePool.Source.CSI: "csi: the largest fresh CSIStorageCapacity reading",
        StoragePool.Source.MANUAL: "manual: the stated capacity",
        StoragePool.Source.NODE_DISK: "node_disk: the storage node's system drive, a stand-in",
        StoragePool.Source.NONE: "none: unknown",
    }
    if head is not None:
        note = head["note"]
    elif summary["pools"]:
        note = "No pool's capacity is known: set a pool's manual_capacity_gb, or STORAGE_POOL_CAPACITY_GB for the fleet."
    else:
        note = "No storage pool is registered yet: add one under Resources → Volumes → Storage pools (docs/storage.md)."
    shared_note = ""
    if cluster is not None:
        own = head is not None and head["cluster"] == cluster.public_id and not head["shared_across_clusters"]
        shared_note = (
            f"This pool is {cluster.name}'s own; the figure is fleet-wide." if own else
            f"Fleet-wide figure, shared across clusters: the pool is not {cluster.name}'s own, and every cluster it is "
            "shared with allocates from the same capacity."
        )
    return StorageTile(
        pools=len(summary["pools"]),
        pool=next((p["name"] for p in summary["pools"] if p["id"] == summary["pool"]), ""),
        capacity=format_bytes(summary["capacity_bytes"]),
        capacity_bytes=summary["capacity_bytes"],
        source=source,
        source_label=labels.get(source, source),
        note=note,
        allocated=format_bytes(summary["allocated_bytes"]),
        largest_free=format_bytes(summary["largest_free_bytes"]),
        fell_back=source == StoragePool.Source.NODE_DISK,
        shared_note=shared_note,
    )


# --------------------------------------------------------------------------- the 24-hour chart


@dataclass(frozen=True)
class HourBucket:
    """One hour of the chart: ``start`` (UTC, on the hour), average GPUs reserved over it, credits charged in it."""

    start: datetime.datetime
    gpus_reserved: Decimal
    credits_burned: Decimal


_RESERVED_SQL = """
    WITH b AS (
        SELECT g AS start, LEAST(g + interval '1 hour', %(now)s) AS stop
          FROM generate_series(%(first)s::timestamptz, %(last)s::timestamptz, interval '1 hour') g
    )
    SELECT b.start,
           COALESCE(SUM(s.gpus * EXTRACT(EPOCH FROM LEAST(b.stop, COALESCE(s.ended_at, %(now)s)) - GREATEST(b.start, s.created_at))), 0)
             / GREATEST(EXTRACT(EPOCH FROM b.stop - b.start), 1)
      FROM b
      LEFT JOIN gpu_sessions_session s
        ON s.cluster_id IS NOT NULL {cluster}
       AND s.created_at < b.stop AND COALESCE(s.ended_at, %(now)s) > b.start
     GROUP BY b.start, b.stop
     ORDER BY b.start"""

_BURNED_SQL = """
    SELECT date_trunc('hour', COALESCE(e.window_end, e.created_at) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', -SUM(e.amount)
      FROM billing_ledgerentry e {join}
     WHERE e.kind = 'charge' AND COALESCE(e.window_end, e.created_at) >= %(first)s {cluster}
     GROUP BY 1"""


def usage_chart(*, cluster: Cluster | None = None, now: datetime.datetime | None = None, hours: int = CHART_HOURS) -> list[HourBucket]:
    """The last ``hours`` hours, hour by hour (the last one runs to now), of ``cluster`` (or all).

    GPUs reserved: the average over the hour of the GPUs the sessions held (a session holds its ``gpus`` from its
    creation, when placement reserves them, until it ends, when they are released: allocations are deleted then, so
    the sessions' times are the history). Credits burned: the charges of the ledger whose usage window ended in the
    hour (their creation time for a charge without a window), refunds not deducted.

    Returns:
        ``hours`` :class:`HourBucket` rows, oldest first. Two queries.
    """
    now = now or timezone.now()
    last = now.astimezone(datetime.UTC).replace(minute=0, second=0, microsecond=0)
    first = last - datetime.timedelta(hours=hours - 1)
    params = {"now": now, "first": first, "last": last}
    if cluster is not None:
        params["cluster"] = cluster.pk
    with connection.cursor() as cursor:
        cursor.execute(_RESERVED_SQL.format(cluster="AND s.cluster_id = %(cluster)s" if cluster else ""), params)
        reserved = {start: Decimal(value) for start, value in cursor.fetchall()}
        cursor.execute(
            _BURNED_SQL.format(
                join="JOIN gpu_sessions_session s ON s.id = e.session_id" if cluster else "",
                cluster="AND s.cluster_id = %(cluster)s" if cluster else "",
            ),
            params,
        )
        burned = {start: Decimal(value) for start, value in cursor.fetchall()}
    buckets = []
    for i in range(hours):
        start = first + datetime.timedelta(hours=i)
        buckets.append(HourBucket(
            start=start,
            gpus_reserved=reserved.get(start, Decimal(0)).quantize(Decimal("0.01")),
            credits_burned=burned.get(start, _ZERO).quantize(CREDITS),
        ))
    return buckets


# --------------------------------------------------------------------------- all of it


@dataclass(frozen=True)
class Dashboard:
    """Everything the dashboard shows, for one scope (``cluster`` None: all clusters)."""

    cluster: Cluster | None
    now: datetime.datetime
    clusters: ClustersTile
    gpus: GpusTile
    sessions: SessionsTile
    credits: CreditsTile
    storage: StorageTile
    chart: list[HourBucket]

    @property
    def now_display(self) -> str:
        """When it was read, ``2026-12-01 11:35 UTC``."""
        return utc(self.now)


def dashboard(*, cluster: Cluster | None = None, now: datetime.datetime | None = None) -> Dashboard:
    """Every tile and the chart for ``cluster`` (or all clusters), judged at ``now``.

    Returns:
        A :class:`Dashboard`. A fixed number of queries (about sixteen), whatever the fleet's size.
    """
    now = now or timezone.now()
    return Dashboard(
        cluster=cluster,
        now=now,
        clusters=clusters_tile(cluster=cluster, now=now),
        gpus=gpus_tile(cluster=cluster),
        sessions=sessions_tile(cluster=cluster, now=now),
        credits=credits_tile(cluster=cluster),
        storage=storage_tile(cluster=cluster, now=now),
        chart=usage_chart(cluster=cluster, now=now),
    )
