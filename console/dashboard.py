"""Reads behind the console's dashboard (the admin index, ``/``): one selector per tile and one for the chart.

Every selector takes the console's cluster scope (``console.scope.console_cluster``: a ``Cluster`` or None
for all clusters) and runs a fixed number of queries, whatever the number of nodes, GPUs, sessions or ledger
entries: counts are SQL aggregates, never Python loops over rows. :func:`dashboard` gathers them all.

Definitions (docs/console.md#the-dashboard):

- A GPU is **reserved whole** when it has an exclusive allocation (``sessions.Allocation.exclusive``), **reserved as
  shares** when it has only non-exclusive ones, **free** when it is healthy and has none.
- A session is **starting** while Pending, Scheduled or Starting; **failed in the last 24 h** when Failed and it
  ended (``ended_at``, else its last status report, else its creation) in the last 24 hours.
- **Burn per hour** is what the Running sessions cost per hour now at the prices (``billing.selectors.burn_rate``'s
  definition, summed fleet-wide): the ledger lags behind it, since usage is charged as operators report it.
- **Idle GPUs** are the GPUs held (live allocations) by ``sessions.selectors.idle_sessions(now)``: Running sessions
  with fresh, known GPU activity and no kernel, connection or start for ``IDLE_DISPLAY_MINUTES`` policy minutes; their
  credits per hour are the burn definition above over those sessions.
- The **storage** tile is the fleet-wide ``storage.selectors.storage_summary``: its headline is the largest single
  pool (pools never add up), whichever cluster is chosen.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, IntegerField, OuterRef, Q, Subquery, Value, Window
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from billing import pricing
from billing.models import CREDITS, CreditAccount
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_token.rotation import operator_token_state
from console.reuse import reused
from sessions.models import Allocation, Session
from sessions.selectors import IDLE_DISPLAY_MINUTES, idle_sessions
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
_CODE = re.compile(r"`([^`]+)`")
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

    @property
    def warnings_html(self) -> list[tuple[Cluster, SafeString]]:
        """:attr:`warnings` as HTML: the sentence escaped, its `commands` as ``<code>``."""
        return [(c, mark_safe(_CODE.sub(r"<code>\1</code>", escape(w)))) for c, w in self.warnings]  # noqa: S308 - escaped first


def _count_of(model, **where) -> Subquery:
    """A correlated ``COUNT(*)`` of ``model`` rows of the outer cluster (no join fan-out between nodes and GPUs)."""
    qs = model.objects.filter(cluster=OuterRef("pk"), **where).order_by().values("cluster").annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(qs, output_field=IntegerField()), Value(0))


def clusters_tile(*, cluster: Cluster | None = None, now: datetime.datetime | None = None,
                  gpu_counts: dict[int, int] | None = None) -> ClustersTile:
    """The registered clusters (only ``cluster`` when given), by name, with node and GPU counts and warnings.

    Warnings: the operator token's (``clusters.operator_token.rotation.operator_token_state``: callbacks refused since a
    time, for a reason, as recorded by ``clusters.operator_refusals``; rotation failed, none on record, expired or
    expiring within ``GSHARE_OPERATOR_TOKEN_WARN_BEFORE``), and an operator that has not reported within
    ``GSHARE_HEARTBEAT_STALE_SECONDS`` (without a refusal on record: it is stopped, cannot reach the control plane,
    or sends a token no published key verifies).

    Args:
        gpu_counts: GPUs per cluster id when the caller counted them (:attr:`GpusTile.by_cluster`); None counts them
            here (a correlated count per cluster over its GPUs, the query's largest part).

    Returns:
        A :class:`ClustersTile`. One query.
    """
    now = now or timezone.now()
    counts_of = {"node_count": _count_of(Node), "ready_nodes": _count_of(Node, ready=True)}
    if gpu_counts is None:
        counts_of["gpu_count"] = _count_of(GpuDevice)
    qs = Cluster.objects.registered().annotate(**counts_of).order_by("name", "id")
    if cluster is not None:
        qs = qs.filter(pk=cluster.pk)
    stale = settings.GSHARE_HEARTBEAT_STALE_SECONDS
    rows, counts = [], {s: 0 for s in ("connected", "degraded", "unreachable", "pending")}
    for c in qs:
        if gpu_counts is not None:
            c.gpu_count = gpu_counts.get(c.pk, 0)
        counts[c.status] = counts.get(c.status, 0) + 1
        heartbeat_age = (now - c.last_heartbeat_at).total_seconds() if c.last_heartbeat_at else None
        reporting = heartbeat_age is not None and heartbeat_age <= stale
        warnings = []
        token = operator_token_state(c, now=now).warning
        if token:
            warnings.append(token)
        if not reporting and heartbeat_age is None:
            warnings.append(
                "Its operator has not reported yet: install it (docs/attach-a-cluster.md), then check its pod "
                "(`kubectl -n gshare-system logs deploy/gshare-operator`) and its token "
                f"(`manage.py rotate_operator_tokens --cluster {c.public_id}`)."
            )
        elif not reporting:
            warnings.append(
                f"The operator has not reported for {age(heartbeat_age)} (last report {utc(c.last_heartbeat_at)}): its "
                "callbacks are refused or it is not running. Check its pod (`kubectl -n gshare-system logs "
                "deploy/gshare-operator`); a 401 there (token_revoked, expired) is fixed by "
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
    """``by_model`` (sorted by model), their sum ``total``, and ``by_cluster``: GPUs per cluster id (the fleet
    table's GPU column, counted in the same pass)."""

    by_model: list[GpuCounts]
    total: GpuCounts
    by_cluster: dict[int, int] = field(default_factory=dict)


def gpus_tile(*, cluster: Cluster | None = None) -> GpusTile:
    """GPU counts by model, from the GPUs and their allocations (``sessions.Allocation``, the reservations).

    Reserved whole: an exclusive allocation; as shares: allocations, none exclusive; free: healthy, no allocation.
    An unhealthy GPU with an allocation counts as reserved (and not healthy), never as free.

    Returns:
        A :class:`GpusTile` (with the GPUs per cluster). One query.
    """
    # One pass over the GPUs joined to their allocations summed per GPU (a hash join): cheaper than an EXISTS per
    # GPU, whose cost estimate also makes PostgreSQL JIT-compile the query.
    sql = f"""
        SELECT d.model, d.cluster_id,
               COUNT(*),
               COUNT(*) FILTER (WHERE d.health),
               COUNT(*) FILTER (WHERE a.exclusive),
               COUNT(*) FILTER (WHERE a.device_id IS NOT NULL AND NOT a.exclusive),
               COUNT(*) FILTER (WHERE d.health AND a.device_id IS NULL)
          FROM {GpuDevice._meta.db_table} d
          LEFT JOIN (SELECT device_id, BOOL_OR(exclusive) AS exclusive FROM {Allocation._meta.db_table} GROUP BY device_id) a
            ON a.device_id = d.id
         {"WHERE d.cluster_id = %s" if cluster is not None else ""}
         GROUP BY d.model, d.cluster_id"""
    keys = ("total", "healthy", "whole", "shared", "free")
    models: dict[str, dict[str, int]] = {}
    by_cluster: dict[int, int] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, [cluster.pk] if cluster is not None else [])
        for model, cluster_id, *numbers in cursor.fetchall():
            sums = models.setdefault(model, dict.fromkeys(keys, 0))
            for key, n in zip(keys, numbers, strict=True):
                sums[key] += n
            by_cluster[cluster_id] = by_cluster.get(cluster_id, 0) + numbers[0]
    by_model = [GpuCounts(model=model, **models[model]) for model in sorted(models)]
    total = GpuCounts(model="", **{k: sum(getattr(r, k) for r in by_model) for k in ("total", "healthy", "whole", "shared", "free")})
    return GpusTile(by_model=by_model, total=total, by_cluster=by_cluster)


# --------------------------------------------------------------------------- sessions


@dataclass(frozen=True)
class SessionsTile:
    """Sessions running, starting (Pending, Scheduled, Starting), stopping, and failed in the last 24 hours."""

    running: int
    starting: int
    stopping: int
    failed_24h: int


def _sessions_of(cluster: Cluster | None):
    return _narrow(Session.objects.all(), cluster)


def _narrow(qs, cluster: Cluster | None):
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


def burn_per_hour(*, cluster: Cluster | None = None, prices: dict[str, Decimal] | None = None, sessions=None) -> Decimal:
    """Credits per hour the Running sessions (of ``cluster``, or all; or the Running ones of ``sessions``) cost now.

    The same sum as ``billing.selectors.session_hourly_cost`` over each session (each GPU's ``share × price``
    rounded to 0.000001 credits; a session without reservations ``gpus × share × the default price``), computed
    from one grouped query: identical terms are counted, not read one by one.

    Args:
        sessions: a ``Session`` queryset to sum over instead of all sessions (the idle tile's), still narrowed to ``cluster``.

    Returns:
        Credits per hour (``Decimal``). One query (two without ``prices``).
    """
    if prices is None:
        prices = pricing.prices_by_model()
    running = _sessions_of(cluster) if sessions is None else _narrow(sessions, cluster)
    running = running.filter(phase=Session.Phase.RUNNING)
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
    return total


def credits_tile(*, cluster: Cluster | None = None, threshold: Decimal | None = None, running: int | None = None) -> CreditsTile:
    """Burn per hour now (:func:`burn_per_hour`) and the credit accounts below ``threshold`` (default the setting
    ``GSHARE_CONSOLE_LOW_BALANCE``); with ``cluster``, only the accounts of users with a live session on it.

    Args:
        running: how many Running sessions the burn is of, when the caller counted them (the sessions tile); None
            counts them (one more query).

    Returns:
        A :class:`CreditsTile`. Three queries (four without ``running``).
    """
    threshold = low_balance_threshold() if threshold is None else threshold
    burn = burn_per_hour(cluster=cluster)
    if running is None:
        running = _sessions_of(cluster).filter(phase=Session.Phase.RUNNING).count()
    accounts = CreditAccount.objects.filter(balance__lt=threshold)
    if cluster is not None:
        live_here = _sessions_of(cluster).filter(owner=OuterRef("user")).exclude(phase__in=Session.TERMINAL_PHASES)
        accounts = accounts.filter(Exists(live_here))
    # The window counts every matching account before the LIMIT: the count and the lowest in one query.
    rows = list(accounts.annotate(matching=Window(Count("id"))).order_by("balance", "id")
                .values_list("user__username", "balance", "matching")[:LOW_ACCOUNTS_SHOWN])
    return CreditsTile(burn_per_hour=burn, running=running, threshold=threshold, low_count=rows[0][2] if rows else 0,
                       lowest=[(name, balance) for name, balance, _ in rows])


# --------------------------------------------------------------------------- idle GPUs


@dataclass(frozen=True)
class IdleTile:
    """GPUs held by idle sessions (``sessions.selectors.idle_sessions``), how many sessions, and what they cost.

    Attributes:
        gpus: distinct GPUs the idle sessions hold (live allocations).
        sessions: how many sessions are idle.
        burn_per_hour: credits per hour those sessions cost now at the prices (``Decimal``, :func:`burn_per_hour`).
        quiet_minutes: policy minutes without a GPU kernel after which a session counts as idle.
    """

    gpus: int
    sessions: int
    burn_per_hour: Decimal
    quiet_minutes: int = IDLE_DISPLAY_MINUTES

    @property
    def burn_text(self) -> str:
        """The idle sessions' burn as text, ``12.5``."""
        return credits_text(self.burn_per_hour)


def idle_tile(*, cluster: Cluster | None = None, now: datetime.datetime | None = None) -> IdleTile:
    """The idle sessions of ``cluster`` (or all) at ``now``: their GPUs, their number and their credits per hour.

    Returns:
        An :class:`IdleTile`. Three queries (the counts; the prices and the burn only when a session is idle).
    """
    now = now or timezone.now()
    idle = _narrow(idle_sessions(now=now), cluster)
    counts = idle.aggregate(sessions=Count("id", distinct=True), gpus=Count("allocations__device", distinct=True))
    burn = burn_per_hour(sessions=idle) if counts["sessions"] else _ZERO
    return IdleTile(gpus=counts["gpus"], sessions=counts["sessions"], burn_per_hour=burn)


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


#: One query for both series, one pass over the sessions (not one per hour). Each session's time, clipped to the
#: window, is hour ``i`` (where it begins) to hour ``j`` (where it ends): its part of hour ``i`` (``head``), its
#: part of hour ``j`` when that is another hour (``tail``), and the whole hours between, summed in Python from
#: where they ``open`` (``i + 1``) and ``close`` (``j``). Then the ledger's charges by hour (``burned``) and the open
#: accruals by the hour their period began (``accrued``), looked up
#: through the recent sessions (the ledger's session index) rather than by reading the whole ledger: a usage window
#: ends at most a few minutes after its session (docs/billing.md), so an hour's margin finds every charge. Times are
#: seconds since the window's start as ``date_part`` doubles (small numbers: exact to the microsecond), the sums
#: rounded back to microseconds: numeric ``EXTRACT``s per row cost more than the rest of the query.
_CHART_SQL = """
    WITH recent AS (
        SELECT s.id, s.gpus, s.created_at, s.ended_at
          FROM gpu_sessions_session s
         WHERE s.cluster_id IS NOT NULL {session_cluster}
           AND (s.ended_at IS NULL OR s.ended_at > %(first)s - interval '1 hour')
    ),
    k AS (
        SELECT gpus, c, e, FLOOR(c / 3600)::int AS i, FLOOR(e / 3600)::int AS j
          FROM (SELECT gpus, date_part('epoch', GREATEST(created_at, %(first)s) - %(first)s) AS c,
                       date_part('epoch', LEAST(COALESCE(ended_at, %(now)s), %(now)s) - %(first)s) AS e
                  FROM recent WHERE created_at < %(now)s) clipped
         WHERE e > c
    )
    SELECT 'head', i, ROUND(SUM(gpus * (LEAST(e, (i + 1) * 3600.0::float8) - c))::numeric, 6) FROM k GROUP BY i
    UNION ALL
    SELECT 'tail', j, ROUND(SUM(gpus * (e - j * 3600.0::float8))::numeric, 6) FROM k WHERE j > i GROUP BY j
    UNION ALL
    SELECT 'open', i + 1, SUM(gpus) FROM k WHERE j > i + 1 GROUP BY i
    UNION ALL
    SELECT 'close', j, SUM(gpus) FROM k WHERE j > i + 1 GROUP BY j
    UNION ALL
    SELECT 'burned', FLOOR(EXTRACT(EPOCH FROM COALESCE(e.period_start, e.window_end, e.created_at) - %(first)s) / 3600)::int,
           -SUM(e.amount)
      FROM billing_ledgerentry e
     WHERE e.session_id IN (SELECT id FROM recent)
       AND e.kind = 'charge' AND COALESCE(e.period_start, e.window_end, e.created_at) >= %(first)s
     GROUP BY 2
    UNION ALL
    SELECT 'accrued', FLOOR(EXTRACT(EPOCH FROM a.period_start - %(first)s) / 3600)::int, SUM(a.amount)
      FROM billing_accrual a
     WHERE a.session_id IN (SELECT id FROM recent) AND a.samples > 0 AND a.period_start >= %(first)s
     GROUP BY 2"""


def usage_chart(*, cluster: Cluster | None = None, now: datetime.datetime | None = None, hours: int = CHART_HOURS) -> list[HourBucket]:
    """The last ``hours`` hours, hour by hour (the last one runs to now), of ``cluster`` (or all).

    GPUs reserved: the average over the hour of the GPUs the sessions held (a session holds its ``gpus`` from its
    creation, when placement reserves them, until it ends, when they are released: allocations are deleted then, so
    the sessions' times are the history). Credits burned: the charges of the ledger of a billing period that began in
    the hour (charges from before billing periods: whose usage window ended in it, or their creation time without a
    window) plus the usage accrued in open periods that began in it, refunds not deducted.

    Returns:
        ``hours`` :class:`HourBucket` rows, oldest first. One query, one pass over the sessions.
    """
    now = now or timezone.now()
    last = now.astimezone(datetime.UTC).replace(minute=0, second=0, microsecond=0)
    first = last - datetime.timedelta(hours=hours - 1)
    params: dict = {"now": now, "first": first}
    sql = _CHART_SQL.format(session_cluster="AND s.cluster_id = %(cluster)s" if cluster else "")
    if cluster is not None:
        params["cluster"] = cluster.pk
    parts: dict[str, dict[int, Decimal]] = {"head": {}, "tail": {}, "open": {}, "close": {}, "burned": {}, "accrued": {}}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for part, hour, value in cursor.fetchall():
            parts[part][hour] = Decimal(value)
    buckets, whole = [], Decimal(0)
    for i in range(hours):
        start = first + datetime.timedelta(hours=i)
        whole += parts["open"].get(i, 0) - parts["close"].get(i, 0)  # GPUs held through all of hour i
        seconds = (min(start + datetime.timedelta(hours=1), now) - start).total_seconds()
        gpu_seconds = parts["head"].get(i, 0) + parts["tail"].get(i, 0) + whole * 3600
        buckets.append(HourBucket(
            start=start,
            gpus_reserved=(Decimal(gpu_seconds) / Decimal(max(seconds, 1))).quantize(Decimal("0.01")),
            credits_burned=(parts["burned"].get(i, _ZERO) + parts["accrued"].get(i, _ZERO)).quantize(CREDITS),
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
    idle: IdleTile
    storage: StorageTile
    chart: list[HourBucket]

    @property
    def now_display(self) -> str:
        """When it was read, ``2026-12-01 11:35 UTC``."""
        return utc(self.now)


def _reused(part: str, cluster: Cluster | None, compute):
    """``compute()``, or its result from the last few seconds for this scope (:func:`console.reuse.reused`)."""
    return reused(f"console:dashboard:{part}:{cluster.pk if cluster is not None else 'all'}", compute)


def dashboard(*, cluster: Cluster | None = None, now: datetime.datetime | None = None) -> Dashboard:
    """Every tile and the chart for ``cluster`` (or all clusters), judged at ``now``.

    The counts (clusters, GPUs, sessions) are read on every call. The 24-hour chart (hourly history), the storage
    tile (capacity readings, which come every few minutes) and the credits tile's burn and lowest accounts may be
    up to ``GSHARE_CONSOLE_CACHE_SECONDS`` (3) seconds old, computed by an earlier request (only when
    ``now`` is not given): together they were more than half the page's time on a big fleet (docs/performance.md).

    Returns:
        A :class:`Dashboard`. A fixed number of queries (ten, plus one to three for the idle tile), whatever the
        fleet's size; four to six when the reused parts are fresh.
    """
    # An explicit time (tests, reports): everything computed for it, nothing reused.
    reuse = now is None
    now = now or timezone.now()

    def part(name: str, compute):
        return _reused(name, cluster, compute) if reuse else compute()

    # No transaction of their own: each tile is one consistent statement, and BEGIN/COMMIT would be two more round
    # trips. The queries are shaped so that PostgreSQL's cost estimates stay far below jit_above_cost (whose JIT
    # compilation took longer than running them): a join on allocations summed per GPU, one pass over the sessions.
    sessions = sessions_tile(cluster=cluster, now=now)
    gpus = gpus_tile(cluster=cluster)
    credits = part("credits", lambda: credits_tile(cluster=cluster, running=sessions.running))
    return Dashboard(
        cluster=cluster,
        now=now,
        clusters=clusters_tile(cluster=cluster, now=now, gpu_counts=gpus.by_cluster),
        gpus=gpus,
        sessions=sessions,
        credits=dataclasses.replace(credits, running=sessions.running),
        idle=idle_tile(cluster=cluster, now=now),
        storage=part("storage", lambda: storage_tile(cluster=cluster, now=now)),
        chart=part("chart", lambda: usage_chart(cluster=cluster, now=now)),
    )
