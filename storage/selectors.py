"""Read queries for storage pools and volumes, and the fleet storage summary."""

from __future__ import annotations

import datetime

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from clusters.models import Cluster
from clusters.refs import cluster_by_ref  # noqa: F401 (re-exported: request bodies name clusters by the same rule)
from core.exceptions import NotFound
from storage.capacity import cluster_storage_classes, pool_clusters, pools_capacity, pools_usability, registered_cluster_ids
from storage.errors import POOL_NOT_FOUND, VOLUME_NOT_FOUND
from storage.models import GIB, StoragePool, Volume

_LIVE = ~Q(volumes__status=Volume.Status.DELETED)


def pool_list(*, cluster: Cluster | None = None) -> QuerySet[StoragePool]:
    """Pools with their cluster and allowed clusters, annotated with ``allocated_gb`` (sum of the quotas of volumes
    that are not deleted) and ``volume_count``, ordered by name.

    Args:
        cluster: only the pools this cluster may use (``storage.capacity.pool_clusters``) whose StorageClass exists
            there, as far as its operator listed them (``storage.capacity.pools_usability``; one more query).
    """
    qs = (
        StoragePool.objects.select_related("cluster")
        .prefetch_related("allowed_clusters")
        .annotate(allocated_gb=Coalesce(Sum("volumes__quota_gb", filter=_LIVE), 0), volume_count=Count("volumes", filter=_LIVE))
        .order_by("name", "id")
    )
    return pools_usable_on(qs, cluster) if cluster is not None else qs


def pools_usable_on(qs: QuerySet[StoragePool], cluster: Cluster) -> QuerySet[StoragePool]:
    """``qs`` narrowed to the pools ``cluster`` may use (:func:`pools_shared_with`) whose StorageClass exists there, as
    far as its operator listed them (one query for the listing)."""
    qs = qs.filter(pools_shared_with(cluster))
    listed = cluster_storage_classes([cluster.pk]).get(cluster.pk)
    if listed is not None:
        qs = qs.filter(storage_class__in=listed.names)
    return qs


def pools_shared_with(cluster: Cluster) -> Q:
    """The pools ``cluster`` may use by their sharing, as a filter: its own pools, and, unless it is deregistered,
    the pools shared with every cluster or selected for it (``storage.capacity.pool_clusters``' rule). Whether the
    pool's StorageClass exists there is not checked (:func:`pool_list` does that on top)."""
    usable = Q(cluster=cluster)
    if cluster.status != Cluster.Status.DEREGISTERED:
        allowed = StoragePool.allowed_clusters.through.objects.filter(cluster=cluster).values("storagepool_id")
        usable |= Q(sharing=StoragePool.Sharing.ALL) | Q(sharing=StoragePool.Sharing.SELECTED, pk__in=allowed)
    return usable


def usable_pools_and_clusters() -> tuple[frozenset[int], frozenset[int]]:
    """Where a volume can be created: ``(pool pks, cluster pks)``, the pools usable on at least one cluster and the
    clusters on which at least one pool is usable (``storage.capacity.pools_usability``). Three queries."""
    pools = list(StoragePool.objects.select_related("cluster").order_by("pk"))
    usability = pools_usability(pools)
    pool_ids = frozenset(pk for pk, use in usability.items() if use.usable_ids)
    cluster_ids = frozenset().union(*(use.usable_ids for use in usability.values()))
    return pool_ids, cluster_ids


def pool_get(*, public_id: str) -> StoragePool:
    """One pool (annotated as in :func:`pool_list`).

    Raises:
        NotFound: ``pool_not_found`` (404).
    """
    pool = pool_list().filter(public_id=public_id).first()
    if pool is None:
        raise NotFound(f"No storage pool has the id {public_id!r}: list them with `GET /api/v1/storage/pools`.", code=POOL_NOT_FOUND)
    return pool


def volume_list(*, user, owner: str | None = None, include_deleted: bool = False) -> QuerySet[Volume]:
    """Volumes visible to ``user``: their own; staff see all. Deleted volumes only with ``include_deleted``
    (the API's ``?cluster=`` and ``?pool=``: ``storage.api.filters.VolumeFilter``).

    Args:
        owner: staff only: filter by the owner's username.
    """
    qs = Volume.objects.select_related("owner", "pool", "cluster").order_by("-created_at", "-id")
    if not include_deleted:
        qs = qs.exclude(status=Volume.Status.DELETED)
    if not user.is_staff:
        qs = qs.filter(owner=user)
    elif owner:
        qs = qs.filter(owner__username=owner)
    return qs


def volume_get(*, user, public_id: str, include_deleted: bool = False) -> Volume:
    """One volume visible to ``user`` (not deleted, unless ``include_deleted``).

    Raises:
        NotFound: ``volume_not_found`` (404), also for another user's volume.
    """
    volume = volume_list(user=user, include_deleted=include_deleted).filter(public_id=public_id).first()
    if volume is None:
        raise NotFound(f"No volume {public_id!r} of yours: list yours with `GET /api/v1/storage/volumes`.", code=VOLUME_NOT_FOUND)
    return volume


def storage_summary(*, cluster: Cluster | None = None, now: datetime.datetime | None = None) -> dict:
    """The fleet's storage at a glance, every pool resolved now, fleet-wide (docs/storage.md#summary).

    Without ``cluster``: every pool. With it: the pools that cluster may use (``pool_list``: shared with it, and its
    StorageClass exists there as far as its operator listed them), each still resolved
    from every cluster's readings; ``shared_across_clusters`` is then true for a pool whose own cluster is another one.
    Without it, a pool is ``shared_across_clusters`` when more clusters than its own may use it.

    The headline numbers describe ONE pool, the one with the largest capacity (what a single volume could at most be
    given; pools never add up): ``capacity_bytes``, ``source``, ``allocated_bytes`` and ``pool`` are that pool's;
    ``largest_free_bytes`` is the most free room on any one listed pool (the largest volume that fits now).

    Returns:
        ``{"cluster", "capacity_bytes", "source", "allocated_bytes", "pool", "largest_free_bytes",
        "shared_across_clusters", "pools": [{"id", "name", "cluster", "storage_class", "capacity_bytes", "source",
        "note", "allocated_bytes", "free_bytes", "shared_across_clusters"}]}``. A constant number of queries.
    """
    pools = list(pool_list(cluster=cluster))
    registered = registered_cluster_ids()
    usable = {p.pk: pool_clusters(p, registered=registered) for p in pools}
    capacities = pools_capacity(pools, now=now)
    rows = []
    for pool in pools:
        capacity = capacities[pool.pk]
        allocated = int(pool.allocated_gb) * GIB
        shared = pool.cluster_id != cluster.pk if cluster is not None else len(usable[pool.pk]) > 1
        rows.append({
            "id": pool.public_id,
            "name": pool.name,
            "cluster": pool.cluster.public_id,
            "storage_class": pool.storage_class,
            "capacity_bytes": capacity.capacity_bytes,
            "source": capacity.source,
            "note": capacity.note,
            "allocated_bytes": allocated,
            "free_bytes": None if capacity.capacity_bytes is None else max(0, capacity.capacity_bytes - allocated),
            "shared_across_clusters": shared,
        })
    known = [row for row in rows if row["capacity_bytes"] is not None]
    head = max(known, key=lambda row: (row["capacity_bytes"], row["free_bytes"])) if known else None
    return {
        "cluster": cluster.public_id if cluster is not None else None,
        "capacity_bytes": head["capacity_bytes"] if head else None,
        "source": head["source"] if head else StoragePool.Source.NONE.value,
        "allocated_bytes": head["allocated_bytes"] if head else 0,
        "pool": head["id"] if head else None,
        "largest_free_bytes": max((row["free_bytes"] for row in known), default=None),
        "shared_across_clusters": any(row["shared_across_clusters"] for row in rows),
        "pools": rows,
    }
