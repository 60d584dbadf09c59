"""Where a pool's capacity number comes from, which clusters may use a pool, and where it is usable (reads only).

Precedence, first that applies (docs/storage.md):

1. ``csi``: the LARGEST ``capacity_bytes`` among the fresh ``StorageCapacityReading`` rows of the pool's
   ``storage_class`` reported by the clusters that may use the pool. Several CSIStorageCapacity objects (one per
   topology segment) and several clusters describe the same storage server, so their sum would count it many
   times: the largest is the best estimate. Fresh = ``read_at`` at most ``GSHARE_STORAGE_READING_MAX_AGE`` seconds
   ago; a stale reading does not count and the note says so.
2. ``manual``: the pool's ``manual_capacity_gb``, else the fleet default ``STORAGE_POOL_CAPACITY_GB`` (GiB).
3. ``node_disk``: the system drive of the pool's ``storage_node`` on its cluster, as that cluster's operator
   reported it (a stand-in, labelled so).
4. ``none``: unknown; the capacity gate refuses volumes on such a pool (``pool_capacity_unknown``).

Units are bytes; GiB = 2^30 bytes.

Usable (``pools_usability``): a cluster its sharing names can mount a pool's volumes only where the pool's
StorageClass exists; what exists is what the cluster's operator last listed (``ClusterStorageClasses``). A cluster
whose operator never listed its StorageClasses is assumed to have it (nothing is known; operators before the list).
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Q, prefetch_related_objects
from django.utils import timezone

from clusters.models import Cluster
from storage.models import GIB, ClusterStorageClasses, NodeDisk, StorageCapacityReading, StoragePool

Source = StoragePool.Source


@dataclass(frozen=True)
class CapacityResolution:
    """A pool's capacity and where it came from.

    Attributes:
        capacity_bytes: bytes, or None when unknown (``source`` ``none``).
        source: ``csi``, ``manual``, ``node_disk`` or ``none`` (``StoragePool.Source``).
        note: one sentence saying which number was used and why (stale readings, stand-ins).
        readings: the ``StorageCapacityReading`` rows considered (the pool's class, from the clusters that may
            use the pool), newest first, fresh or stale, published or not.
    """

    capacity_bytes: int | None
    source: str
    note: str
    readings: list = field(default_factory=list)


def format_bytes(value: int | None) -> str:
    """``2199023255552`` -> ``"2048 GiB"``; ``None`` -> ``"unknown"``."""
    if value is None:
        return "unknown"
    if value % GIB == 0:
        return f"{value // GIB} GiB"
    return f"{value / GIB:.2f} GiB"


def registered_cluster_ids() -> set[int]:
    """Primary keys of the clusters that are not deregistered (one query)."""
    return set(Cluster.objects.exclude(status=Cluster.Status.DEREGISTERED).values_list("pk", flat=True))


def pool_clusters(pool: StoragePool, *, registered: set[int] | None = None) -> set[int]:
    """The primary keys of the clusters that may use ``pool``.

    Its own cluster (where the storage server sits), plus every registered cluster with sharing ``all``, or the
    registered clusters of ``allowed_clusters`` with sharing ``selected``.

    Args:
        pool: the pool.
        registered: ``registered_cluster_ids()`` when the caller already has it (several pools: no query for ``all``).

    Returns:
        A set of ``Cluster`` primary keys. At most one query (the registered clusters, or the allowed clusters unless
        prefetched).
    """
    ids = {pool.cluster_id}
    if pool.sharing == StoragePool.Sharing.ALL:
        ids |= registered if registered is not None else registered_cluster_ids()
    else:
        ids |= {c.pk for c in pool.allowed_clusters.all() if c.status != Cluster.Status.DEREGISTERED}
    return ids


def _age_seconds(reading_time: datetime.datetime, now: datetime.datetime) -> int:
    return max(0, int((now - reading_time).total_seconds()))


def _resolve(
    pool: StoragePool,
    *,
    readings: list[StorageCapacityReading],
    disk: NodeDisk | None,
    now: datetime.datetime,
    max_age: int,
    default_gb: int | None,
) -> CapacityResolution:
    """The precedence of the module docstring, for one pool whose data is already read."""
    readings = sorted(readings, key=lambda r: r.read_at, reverse=True)
    published = [r for r in readings if r.capacity_bytes is not None]
    fresh = [r for r in published if _age_seconds(r.read_at, now) <= max_age]
    own = [r for r in fresh if r.cluster_id == pool.cluster_id]
    if own:
        # The storage server sits on the pool's own cluster: its readings are the ones to trust. Other clusters'
        # readings of the same StorageClass name count only when it has none (they may describe another server).
        fresh = own
    if fresh:
        best = max(fresh, key=lambda r: (r.capacity_bytes, r.read_at))
        note = (
            f"CSIStorageCapacity of {pool.storage_class}: {format_bytes(best.capacity_bytes)} reported by {best.cluster.name} "
            f"{_age_seconds(best.read_at, now)} s ago"
        )
        if len(fresh) > 1:
            clusters = len({r.cluster_id for r in fresh})
            note += (
                f"; the largest of {len(fresh)} fresh readings from {clusters} cluster(s), which all describe the same "
                "storage server (never their sum)"
            )
        return CapacityResolution(best.capacity_bytes, Source.CSI, note, readings)

    if published:
        newest = published[0]
        why = f"CSI reading from {newest.cluster.name} is {_age_seconds(newest.read_at, now)} s old (limit {max_age} s)"
    elif readings:
        names = ", ".join(sorted({r.cluster.name for r in readings}))
        why = f"No CSIStorageCapacity is published for {pool.storage_class} (reported by {names})"
    else:
        why = f"No CSI reading of {pool.storage_class} from the clusters that may use this pool"

    if pool.manual_capacity_gb:
        gb, which = int(pool.manual_capacity_gb), "the pool's manual_capacity_gb"
    elif default_gb and default_gb > 0:
        gb, which = int(default_gb), "the fleet default STORAGE_POOL_CAPACITY_GB"
    else:
        gb = None
    if gb is not None:
        return CapacityResolution(gb * GIB, Source.MANUAL, f"{why}: using the stated capacity, {gb} GiB ({which})", readings)

    if disk is not None:
        note = (
            f"{why} and no stated capacity: using a stand-in, the system drive of node {disk.node} on {pool.cluster.name} "
            f"({format_bytes(disk.disk_bytes)}, read {_age_seconds(disk.read_at, now)} s ago), not the pool's real size; "
            "set the pool's manual_capacity_gb"
        )
        return CapacityResolution(int(disk.disk_bytes), Source.NODE_DISK, note, readings)

    storage_node = f"the storage node {pool.storage_node!r} has no disk reported" if pool.storage_node else "no storage_node is set"
    note = (
        f"{why}, no manual_capacity_gb, no STORAGE_POOL_CAPACITY_GB and {storage_node}: capacity unknown; "
        "set the pool's manual_capacity_gb"
    )
    return CapacityResolution(None, Source.NONE, note, readings)


def pools_capacity(pools: Iterable[StoragePool], *, now: datetime.datetime | None = None) -> dict[int, CapacityResolution]:
    """Resolve several pools at once in a constant number of queries (at most five, whatever the number of pools).

    Returns:
        pool primary key -> ``CapacityResolution``.
    """
    pools = list(pools)
    if not pools:
        return {}
    now = now or timezone.now()
    prefetch_related_objects(pools, "cluster", "allowed_clusters")
    registered = registered_cluster_ids() if any(p.sharing == StoragePool.Sharing.ALL for p in pools) else set()
    by_class: dict[str, list[StorageCapacityReading]] = defaultdict(list)
    for reading in StorageCapacityReading.objects.filter(storage_class__in={p.storage_class for p in pools}).select_related("cluster"):
        by_class[reading.storage_class].append(reading)
    wanted = [(p.cluster_id, p.storage_node) for p in pools if p.storage_node]
    disks: dict[tuple[int, str], NodeDisk] = {}
    if wanted:
        query = Q()
        for cluster_id, node in wanted:
            query |= Q(cluster_id=cluster_id, node=node)
        disks = {(d.cluster_id, d.node): d for d in NodeDisk.objects.filter(query)}
    max_age = int(settings.GSHARE_STORAGE_READING_MAX_AGE)
    default_gb = settings.STORAGE_POOL_CAPACITY_GB
    result = {}
    for pool in pools:
        usable = pool_clusters(pool, registered=registered)
        result[pool.pk] = _resolve(
            pool,
            readings=[r for r in by_class[pool.storage_class] if r.cluster_id in usable],
            disk=disks.get((pool.cluster_id, pool.storage_node)) if pool.storage_node else None,
            now=now,
            max_age=max_age,
            default_gb=default_gb,
        )
    return result


def pool_capacity(*, pool: StoragePool, now: datetime.datetime | None = None) -> CapacityResolution:
    """Resolve one pool's capacity now (see the module docstring for the precedence).

    Args:
        pool: the pool.
        now: the time freshness is judged at (default: now).

    Returns:
        A ``CapacityResolution(capacity_bytes, source, note, readings)``.
    """
    return pools_capacity([pool], now=now)[pool.pk]


# --------------------------------------------------------------------------- where a pool is usable


@dataclass(frozen=True)
class PoolUse:
    """Whether one cluster can mount the volumes of one pool.

    Attributes:
        cluster: the ``Cluster``.
        usable: False only when the cluster's operator listed its StorageClasses and the pool's is not among them.
        reason: one sentence saying why (what was reported, how long ago).
    """

    cluster: Cluster
    usable: bool
    reason: str


@dataclass(frozen=True)
class PoolUsability:
    """Every registered cluster a pool's sharing names (``pool_clusters``), by name, each usable or not.

    Attributes:
        uses: one ``PoolUse`` per cluster, sorted by cluster name.
    """

    uses: tuple[PoolUse, ...]

    @property
    def usable_ids(self) -> frozenset[int]:
        """Primary keys of the clusters that can mount its volumes."""
        return frozenset(u.cluster.pk for u in self.uses if u.usable)

    @property
    def unusable(self) -> dict[int, PoolUse]:
        """Cluster primary key -> ``PoolUse`` of the clusters its sharing names that lack its StorageClass."""
        return {u.cluster.pk: u for u in self.uses if not u.usable}

    def use_on(self, cluster_id: int) -> PoolUse | None:
        """The ``PoolUse`` of one cluster, or None when the pool's sharing does not name it."""
        return next((u for u in self.uses if u.cluster.pk == cluster_id), None)


def storage_class_use(*, storage_class: str, cluster: Cluster, inventory: ClusterStorageClasses | None,
                      now: datetime.datetime) -> PoolUse:
    """Whether ``storage_class`` exists on ``cluster`` according to its operator's last list (``inventory``)."""
    if inventory is None:
        return PoolUse(cluster, True, f"the operator of {cluster.name} has not listed its StorageClasses (not yet, or it is older "
                                      f"than this control plane): StorageClass {storage_class} is assumed to exist there")
    age = _age_seconds(inventory.read_at, now)
    if storage_class in inventory.names:
        return PoolUse(cluster, True, f"StorageClass {storage_class} exists on {cluster.name} (listed by its operator {age} s ago)")
    listed = ", ".join(inventory.names[:10]) + (", ..." if len(inventory.names) > 10 else "") if inventory.names else "none"
    return PoolUse(cluster, False, f'storageclass "{storage_class}" not found on {cluster.name} (its operator listed {listed} '
                                   f"{age} s ago)")


def cluster_storage_classes(cluster_ids: Iterable[int] | None = None) -> dict[int, ClusterStorageClasses]:
    """Cluster primary key -> its operator's last StorageClass list (one query; all clusters when ``cluster_ids`` is None)."""
    qs = ClusterStorageClasses.objects.all()
    if cluster_ids is not None:
        qs = qs.filter(cluster_id__in=list(cluster_ids))
    return {row.cluster_id: row for row in qs}


def pools_usability(pools: Iterable[StoragePool], *, now: datetime.datetime | None = None) -> dict[int, PoolUsability]:
    """Where each pool is usable: every registered cluster its sharing names, with whether its StorageClass exists
    there (a deregistered cluster mounts nothing: left out).

    Two queries whatever the number of pools: the registered clusters with their operators' StorageClass lists, and
    the pools' allowed clusters unless prefetched.

    Returns:
        pool primary key -> ``PoolUsability``.
    """
    pools = list(pools)
    if not pools:
        return {}
    now = now or timezone.now()
    prefetch_related_objects([p for p in pools if p.sharing == StoragePool.Sharing.SELECTED], "allowed_clusters")
    clusters = {c.pk: c for c in Cluster.objects.exclude(status=Cluster.Status.DEREGISTERED).select_related("storage_class_inventory")}
    registered = set(clusters)
    result = {}
    for pool in pools:
        ids = pool_clusters(pool, registered=registered)
        named = sorted((clusters[pk] for pk in ids if pk in clusters), key=lambda c: (c.name, c.pk))
        result[pool.pk] = PoolUsability(tuple(
            storage_class_use(storage_class=pool.storage_class, cluster=c, inventory=getattr(c, "storage_class_inventory", None), now=now)
            for c in named
        ))
    return result
