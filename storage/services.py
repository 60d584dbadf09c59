"""Storage services: pools, capacity refresh, volumes and the capacity gate.

These are the only functions that change pools and volumes (``storage.move`` moves volumes between clusters,
``storage.reports`` applies the operator's storage report: capacity readings, node disks, PVC phases); the API, the
console, the Celery tasks and the operator-facing view call them. Their errors are in ``storage.exceptions``.

Locks: the owner's credit account row (``billing.admission.account_lock``) serialises every change of what a user's
volumes hold in all (``max_volume_gb`` of their policy) and of what they are charged for (``billing.storage_charges``);
a pool row (``select_for_update``) serialises every change of what is allocated on it (volume creation, quota
increase). When several rows are locked: the credit account, then pools, then volumes, each kind in primary-key order.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from audit.services import Action, audit_record, created, diff, snapshot
from billing import storage_charges
from billing.admission import account_lock, policy_for
from clusters.models import Cluster
from clusters.probe import ClusterAuthFailed, ClusterUnreachable
from contract import CLUSTER_DEREGISTERED
from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError, Conflict, NotFound
from kube import Deadline, KubeGateway, KubeRefused, KubeUnavailable
from kube.gateway import PERSISTENT_VOLUME_CLAIMS, STORAGE_CLASSES
from storage.capacity import CapacityResolution, PoolUsability, format_bytes, pools_capacity, pools_usability, registered_cluster_ids
from storage.capacity import pool_capacity as pool_capacity  # re-exported: storage.services is where callers look
from storage.capacity import pool_clusters as pool_clusters  # re-exported (placement imports it)
from storage.errors import POOL_NOT_FOUND, VOLUME_NOT_FOUND
from storage.exceptions import (
    NoStoragePool,
    PoolCapacityUnknown,
    PoolChanged,
    PoolFull,
    PoolInUse,
    PoolNameTaken,
    StorageClassMissing,
    VolumeDeleteFailed,
    VolumeDeleting,
    VolumeInUse,
    VolumeMoveDisabled,
    VolumeMoving,
    VolumeNameTaken,
    VolumeNotMountable,
    VolumeQuotaExceeded,
    VolumeShrinkUnsupported,
)
from storage.models import GIB, ClusterStorageClasses, StoragePool, Volume
from storage.reports import storage_report_apply as storage_report_apply  # re-exported: the operator-facing view calls it

logger = logging.getLogger(__name__)

#: Fields of ``pool_update``'s ``changes``.
POOL_EDITABLE_FIELDS = ("name", "cluster", "storage_class", "sharing", "allowed_clusters", "manual_capacity_gb", "storage_node")

#: A pool name: a DNS label (as ``POST /api/v1/storage/pools`` requires).
_POOL_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

#: First key of the advisory lock a volume's deletion holds while it calls the apiserver (the second is the volume's pk).
_DELETE_LOCK_CLASS = 0x67536476  # "gSdv"


def _invalid(detail: str) -> ApplicationError:
    return ApplicationError(detail, code=INVALID_REQUEST, status=400)


def _refuse_deregistered(clusters: Iterable[Cluster]) -> None:
    gone = [c for c in clusters if c.status == Cluster.Status.DEREGISTERED]
    if gone:
        names = ", ".join(f"{c.name} ({c.public_id})" for c in gone)
        raise Conflict(
            f"Cluster(s) {names} are deregistered and cannot hold or use a storage pool: name registered clusters "
            "(`GET /api/v1/clusters`).",
            code=CLUSTER_DEREGISTERED,
        )


# --------------------------------------------------------------------------- pools


def pool_validate(
    *,
    pool: StoragePool | None = None,
    name: str,
    cluster: Cluster,
    storage_class: str,
    sharing: str = StoragePool.Sharing.ALL,
    allowed_clusters: Iterable[Cluster] = (),
    manual_capacity_gb: int | None = None,
    storage_node: str = "",
    check_storage_class: bool = True,
) -> StoragePool:
    """Check a pool's wanted state (a new pool with ``pool=None``, else a change of ``pool``); write nothing.

    The one validation of ``pool_create``, ``pool_update`` and the console's form. Last, for a new pool or a new
    cluster or StorageClass (and ``check_storage_class``), the StorageClass is read on the pool's cluster through its
    apiserver (``pool_check_storage_class``): call it with no row lock held.

    Returns:
        An unsaved ``StoragePool`` with the wanted fields (``allowed_clusters`` excepted: see ``pool_create``).

    Raises:
        ApplicationError: ``invalid_request`` (400): a new name that is not a DNS label; ``allowed_clusters`` with
            sharing ``all``.
        django.core.exceptions.ValidationError: a field is malformed (400 ``invalid_request``).
        PoolNameTaken: ``pool_name_taken`` (409).
        Conflict: ``cluster_deregistered`` (409) for a deregistered cluster newly named as the pool's cluster or an
            allowed one.
        PoolInUse: ``pool_in_use`` (409) when the pool holds volumes and the change would move it to another
            cluster or StorageClass, or stop sharing it with a cluster that holds one of its volumes' PVCs.
        StorageClassMissing, ClusterAuthFailed, ClusterUnreachable, KubeconfigError: as ``pool_check_storage_class``.
    """
    # The API's serializer checks the same; this is the check the console's form reaches. A pool keeps a name it
    # already has (one saved before the check) until it is renamed.
    if (pool is None or name != pool.name) and not (isinstance(name, str) and _POOL_NAME.fullmatch(name)):
        raise _invalid(f"name {str(name)[:70]!r} must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit (e.g. nfs-a).")
    allowed = {c.pk: c for c in allowed_clusters if c.pk != cluster.pk}
    if sharing == StoragePool.Sharing.ALL and allowed:
        raise _invalid("allowed_clusters applies only with sharing 'selected': send sharing 'selected', or no allowed_clusters.")
    # A deregistered cluster cannot be newly named; one the pool already names (since deregistered) may stay.
    named = {pool.cluster_id, *(c.pk for c in pool.allowed_clusters.all())} if pool is not None else set()
    _refuse_deregistered([c for c in [cluster, *allowed.values()] if c.pk not in named])
    if StoragePool.objects.filter(name=name).exclude(pk=pool.pk if pool else None).exists():
        raise PoolNameTaken(f"A storage pool is already named {name!r}: choose another name.")
    candidate = StoragePool(
        pk=pool.pk if pool else None,
        name=name,
        cluster=cluster,
        storage_class=storage_class,
        sharing=sharing,
        manual_capacity_gb=manual_capacity_gb,
        storage_node=storage_node or "",
    )
    if pool is not None:
        candidate.public_id = pool.public_id
    candidate.full_clean(validate_unique=False, validate_constraints=False)

    if pool is not None:
        live = Volume.objects.filter(pool=pool).exclude(status=Volume.Status.DELETED)
        count = live.count()
        if count and (cluster.pk != pool.cluster_id or storage_class != pool.storage_class):
            raise PoolInUse(
                f"Pool {pool.name} ({pool.public_id}) holds {count} volume(s) provisioned through StorageClass "
                f"{pool.storage_class} from the server on its cluster: its cluster and storage_class cannot change while "
                "they exist. Delete them first (`DELETE /api/v1/storage/volumes/<id>`), or register another pool.",
            )
        if count:
            if sharing == StoragePool.Sharing.ALL:
                usable = {cluster.pk} | registered_cluster_ids()
            else:
                usable = {cluster.pk, *allowed}
            stranded = list(live.filter(cluster__isnull=False).exclude(cluster_id__in=usable).select_related("cluster")[:5])
            if stranded:
                held = ", ".join(f"{v.public_id} on {v.cluster.name}" for v in stranded)
                raise PoolInUse(
                    f"Pool {pool.name} ({pool.public_id}) would no longer be shared with clusters that hold its volumes' "
                    f"PVCs ({held}). Keep those clusters allowed, or delete the volumes first.",
                )
    if check_storage_class and (pool is None or cluster.pk != pool.cluster_id or storage_class != pool.storage_class):
        pool_check_storage_class(cluster=cluster, storage_class=storage_class)
    return candidate


def pool_check_storage_class(*, cluster: Cluster, storage_class: str) -> None:
    """Read StorageClass ``storage_class`` on ``cluster`` through its kubeconfig; refuse when it does not exist there.

    One apiserver call, bounded as a whole by ``GSHARE_PROBE_TIMEOUT`` seconds (``Deadline.call``). Call it with no
    row lock held (it may wait that long).

    Raises:
        StorageClassMissing: ``storage_class_missing`` (400): the apiserver answered 404; the detail names the
            cluster and the class.
        ClusterAuthFailed: ``cluster_auth_failed`` (400): the apiserver answered 401 or 403.
        ClusterUnreachable: ``cluster_unreachable`` (504): no complete answer in time, or another error status.
        KubeconfigError: ``kubeconfig_invalid`` (400): the stored kubeconfig cannot be used.
    """
    timeout = settings.GSHARE_PROBE_TIMEOUT
    where = f"cluster {cluster.name} ({cluster.public_id})"
    checked_at = timezone.now()
    try:
        with KubeGateway.for_cluster(cluster, deadline=Deadline(timeout)) as kube:
            kube.get(STORAGE_CLASSES, storage_class)
    except KubeRefused as exc:
        if exc.status == 404:
            raise StorageClassMissing(
                f'StorageClass "{storage_class}" does not exist on {where}, so no volume of this pool could be provisioned there. '
                f"Fix: name the StorageClass the storage server's CSI driver installed on {cluster.name} (`kubectl get storageclass`), "
                "or install it there first (docs/storage.md).",
                extra={"cluster": cluster.public_id, "storage_class": storage_class},
            ) from None
        if exc.status in (401, 403):
            raise ClusterAuthFailed(
                f"The apiserver of {where} answered {exc.status} ({exc.reason}) to reading StorageClass {storage_class}: its "
                "kubeconfig's credentials are refused or may not read StorageClasses. Fix: grant `get` on "
                "storageclasses.storage.k8s.io to the control plane's ServiceAccount (docs/attach-a-cluster.md), or register "
                f"a fresh kubeconfig (`PATCH /api/v1/clusters/{cluster.public_id}`)."
            ) from None
        raise _storage_class_unchecked(exc, where=where, cluster=cluster, storage_class=storage_class) from None
    except KubeUnavailable as exc:
        if exc.status:
            raise _storage_class_unchecked(exc, where=where, cluster=cluster, storage_class=storage_class) from None
        raise ClusterUnreachable(
            f"The apiserver of {where} at {cluster.apiserver_url} did not answer within {timeout:g} s ({exc.cause_name}), "
            f"so StorageClass {storage_class} could not be checked there; nothing was changed. Fix: check the cluster "
            f"(`POST /api/v1/clusters/{cluster.public_id}/connection-test`) and retry."
        ) from None
    _storage_class_seen(cluster=cluster, storage_class=storage_class, checked_at=checked_at)


@transaction.atomic
def _storage_class_seen(*, cluster: Cluster, storage_class: str, checked_at: datetime.datetime) -> None:
    """Add ``storage_class``, just read on ``cluster``'s apiserver, to the cluster's StorageClass list.

    ``ClusterStorageClasses`` stays the one record of which classes exist (``storage.capacity`` reads only it): a
    live read is a listing as of ``checked_at`` (taken before the call), so the class counts at once instead of
    after the operator's next report, and that report, being newer, replaces the list as usual (a class deleted
    meanwhile goes again); a report the operator read before the check is older and is kept out. No row: nothing was
    listed yet and every class is assumed to exist, so there is nothing to add.
    """
    row = ClusterStorageClasses.objects.select_for_update().filter(cluster=cluster).first()
    if row is None or storage_class in row.names or row.read_at >= checked_at:
        return
    row.names = sorted({*row.names, storage_class})
    row.read_at = checked_at
    row.save(update_fields=["names", "read_at", "received_at"])


def _storage_class_unchecked(exc: KubeRefused | KubeUnavailable, *, where: str, cluster: Cluster, storage_class: str) -> ClusterUnreachable:
    """504 for an answer to the StorageClass read that is neither the class, 404 nor 401/403."""
    return ClusterUnreachable(
        f"The apiserver of {where} answered {exc.status} ({exc.reason}) to reading StorageClass {storage_class}, so it "
        f"could not be checked; nothing was changed. Fix: check the cluster (`POST /api/v1/clusters/{cluster.public_id}/connection-test`) and retry."
    )


def _pool_store_capacity(pools: list[StoragePool], *, now: datetime.datetime | None = None) -> int:
    """Resolve ``pools`` and store the result on them (one ``UPDATE``); return how many changed bytes or source."""
    if not pools:
        return 0
    now = now or timezone.now()
    resolved = pools_capacity(pools, now=now)
    changed = 0
    for pool in pools:
        capacity = resolved[pool.pk]
        if (pool.capacity_bytes, pool.capacity_source) != (capacity.capacity_bytes, capacity.source):
            changed += 1
        pool.capacity_bytes = capacity.capacity_bytes
        pool.capacity_source = capacity.source
        pool.capacity_note = capacity.note[:500]
        pool.capacity_updated_at = now
    StoragePool.objects.bulk_update(pools, ["capacity_bytes", "capacity_source", "capacity_note", "capacity_updated_at"])
    return changed


def pool_create(
    *,
    name: str,
    cluster: Cluster,
    storage_class: str,
    sharing: str = StoragePool.Sharing.ALL,
    allowed_clusters: Iterable[Cluster] = (),
    manual_capacity_gb: int | None = None,
    storage_node: str = "",
) -> StoragePool:
    """Register a storage pool (a storage server, one export) and resolve its capacity.

    Args:
        name: unique pool name.
        cluster: the cluster where the storage server sits.
        storage_class: the StorageClass that provisions from it, the same name on every cluster sharing it.
        sharing: ``all`` (every registered cluster may use it) or ``selected`` (``allowed_clusters`` only).
        allowed_clusters: with ``selected``, the clusters besides ``cluster`` that may use it.
        manual_capacity_gb: stated capacity, GiB, used when no fresh CSI reading exists.
        storage_node: node of ``cluster`` whose system drive stands in when nothing else is known.

    Returns:
        The new ``StoragePool`` with its capacity resolved and stored.

    Raises:
        As ``pool_validate`` (which reads the StorageClass on ``cluster``: 400 ``storage_class_missing``).
    """
    allowed_clusters = list(allowed_clusters)
    # Validated before the transaction: the StorageClass check waits on the cluster's apiserver.
    pool = pool_validate(
        name=name, cluster=cluster, storage_class=storage_class, sharing=sharing, allowed_clusters=allowed_clusters,
        manual_capacity_gb=manual_capacity_gb, storage_node=storage_node,
    )
    with transaction.atomic():
        try:
            with transaction.atomic():
                pool.save()
        except IntegrityError:
            raise PoolNameTaken(f"A storage pool is already named {name!r}: choose another name.") from None
        if sharing == StoragePool.Sharing.SELECTED:
            pool.allowed_clusters.set([c for c in allowed_clusters if c.pk != cluster.pk])
        _pool_store_capacity([pool])
        audit_record(action=Action.POOL_CREATE, obj=pool, changes=created(_pool_audit(pool)))
    logger.info("storage pool created: %s %s (%s on %s, sharing %s)", pool.public_id, pool.name, storage_class, cluster.name, sharing)
    return pool


def _pool_audit(pool: StoragePool) -> dict:
    """A pool's fields as its audit rows show them (the clusters by id)."""
    return {**snapshot(pool, ("name", "cluster", "storage_class", "sharing", "manual_capacity_gb", "storage_node")),
            "allowed_clusters": sorted(c.public_id for c in pool.allowed_clusters.all())}


def _pool_state(pool: StoragePool, changes: dict) -> dict:
    """``pool``'s fields with ``changes`` applied: the keyword arguments of ``pool_validate``."""
    state = {
        "name": pool.name, "cluster": pool.cluster, "storage_class": pool.storage_class, "sharing": pool.sharing,
        "allowed_clusters": list(pool.allowed_clusters.all()), "manual_capacity_gb": pool.manual_capacity_gb,
        "storage_node": pool.storage_node,
    }
    if changes.get("sharing") == StoragePool.Sharing.ALL and "allowed_clusters" not in changes:
        state["allowed_clusters"] = []
    state.update(changes)
    state["allowed_clusters"] = list(state["allowed_clusters"] or [])
    return state


def pool_update(*, pool: StoragePool, changes: dict) -> StoragePool:
    """Change a pool's fields (``POOL_EDITABLE_FIELDS``), all or nothing, with its row locked; re-resolve its capacity.

    Switching ``sharing`` to ``all`` clears ``allowed_clusters``. A new cluster or StorageClass is checked on the
    cluster's apiserver first, without the lock; the locked row then decides the rest.

    Args:
        pool: the pool.
        changes: field -> new value (``cluster`` a ``Cluster``, ``allowed_clusters`` a list of ``Cluster``).

    Raises:
        ApplicationError: ``invalid_request`` (400) for a field that cannot be changed.
        PoolChanged: ``pool_changed`` (409): another change gave the pool another cluster or StorageClass meanwhile.
        As ``pool_validate`` (400 ``storage_class_missing`` for a StorageClass missing on the pool's cluster).
    """
    unknown = set(changes) - set(POOL_EDITABLE_FIELDS)
    if unknown:
        raise _invalid(f"Only {', '.join(POOL_EDITABLE_FIELDS)} can be changed; not {', '.join(sorted(unknown))}.")
    current = StoragePool.objects.select_related("cluster").get(pk=pool.pk)
    wanted = _pool_state(current, changes)
    checked = (wanted["cluster"].pk, wanted["storage_class"])
    if checked == (current.cluster_id, current.storage_class):
        checked = None
    pool_validate(pool=current, **wanted)  # reads the StorageClass when cluster or class change: no lock held yet
    with transaction.atomic():
        return _pool_update_locked(pool=current, changes=changes, checked=checked)


def _pool_update_locked(*, pool: StoragePool, changes: dict, checked: tuple[int, str] | None) -> StoragePool:
    """``pool_update`` under the pool's row lock; ``checked`` is the (cluster pk, StorageClass) already checked."""
    pool = StoragePool.objects.select_for_update().select_related("cluster").get(pk=pool.pk)
    before = _pool_audit(pool)
    state = _pool_state(pool, changes)
    pair = (state["cluster"].pk, state["storage_class"])
    if pair != (pool.cluster_id, pool.storage_class) and pair != checked:
        raise PoolChanged(
            f"Pool {pool.name} ({pool.public_id}) was given another cluster or StorageClass while this change was being "
            "checked; nothing was changed. Fix: read it again (`GET /api/v1/storage/pools/<id>`) and retry."
        )
    candidate = pool_validate(pool=pool, **state, check_storage_class=False)
    fields = ["name", "cluster", "storage_class", "sharing", "manual_capacity_gb", "storage_node"]
    for name in fields:
        setattr(pool, name, getattr(candidate, name))
    try:
        with transaction.atomic():
            pool.save(update_fields=fields)
    except IntegrityError:
        raise PoolNameTaken(f"A storage pool is already named {pool.name!r}: choose another name.") from None
    pool.allowed_clusters.set([c for c in state["allowed_clusters"] if c.pk != pool.cluster_id] if pool.sharing == StoragePool.Sharing.SELECTED else [])
    _pool_store_capacity([pool])
    if changed := diff(before, _pool_audit(pool)):
        audit_record(action=Action.POOL_UPDATE, obj=pool, changes=changed)
    return pool


@transaction.atomic
def pool_delete(*, pool: StoragePool) -> None:
    """Delete a pool that holds no volume any more (the records of its deleted volumes go with it; their storage
    charges stay in the ledger, naming the volume's id).

    Raises:
        PoolInUse: ``pool_in_use`` (409) while volumes that are not deleted are on it, or while the storage its deleted
            volumes held is not all charged yet (``billing.storage_charges``; at most a billing period and the settle
            time after the last deletion).
    """
    pool = StoragePool.objects.select_for_update().get(pk=pool.pk)
    live = Volume.objects.filter(pool=pool).exclude(status=Volume.Status.DELETED)
    count = live.count()
    if count:
        sample = ", ".join(live.order_by("pk").values_list("public_id", flat=True)[:5])
        raise PoolInUse(
            f"Pool {pool.name} ({pool.public_id}) still holds {count} volume(s) ({sample}{', ...' if count > 5 else ''}): "
            "delete them first (`DELETE /api/v1/storage/volumes/<id>`), then the pool.",
        )
    owed = storage_charges.uncharged_until(volume_ids=Volume.objects.filter(pool=pool).values_list("pk", flat=True))
    if owed is not None:
        raise PoolInUse(
            f"Pool {pool.name} ({pool.public_id}) had volumes until {owed:%Y-%m-%d %H:%M:%S} UTC whose storage is not charged "
            "yet; the charge is written once that billing period closes (GSHARE_BILLING_PERIOD_SECONDS, plus "
            "GSHARE_BILLING_SETTLE_SECONDS, later). Delete the pool after that.",
        )
    audit_record(action=Action.POOL_DELETE, obj=pool, changes={name: (value, None) for name, value in _pool_audit(pool).items()})
    Volume.objects.filter(pool=pool).delete()  # only deleted volumes are left: their PVCs are gone
    pool.delete()
    logger.info("storage pool deleted: %s %s", pool.public_id, pool.name)


def pools_refresh_capacity(*, now: datetime.datetime | None = None, pools: Iterable[StoragePool] | None = None) -> int:
    """Re-resolve pools' capacity and store it (``capacity_bytes``, ``capacity_source``, ``capacity_note``,
    ``capacity_updated_at``: what listings show; the capacity gate always re-resolves). Idempotent; a constant
    number of queries.

    Args:
        now: the time freshness is judged at (default: now).
        pools: the pools to refresh (default: every pool).

    Returns:
        How many pools' capacity or source changed.
    """
    pools = list(StoragePool.objects.select_related("cluster").order_by("pk") if pools is None else pools)
    return _pool_store_capacity(pools, now=now)


# --------------------------------------------------------------------------- volumes


def volume_claim_name(public_id: str) -> str:
    """The PVC name of a volume: ``vol_ab12`` -> ``gshare-vol-ab12`` (DNS-1123: no ``_``)."""
    return "gshare-" + public_id.replace("_", "-")


def _allocated_bytes(pool_ids: list[int], *, exclude_volume: int | None = None) -> dict[int, int]:
    """Bytes allocated (quotas of volumes that are not deleted) per pool, in one query."""
    qs = Volume.objects.filter(pool_id__in=pool_ids).exclude(status=Volume.Status.DELETED)
    if exclude_volume is not None:
        qs = qs.exclude(pk=exclude_volume)
    rows = qs.values("pool_id").annotate(total=Sum("quota_gb")).order_by()
    allocated = {pk: 0 for pk in pool_ids}
    allocated.update({row["pool_id"]: int(row["total"] or 0) * GIB for row in rows})
    return allocated


def _capacity_unknown(pool: StoragePool, capacity: CapacityResolution, *, others: int = 0) -> PoolCapacityUnknown:
    also = f" (nor that of the {others} other pool(s))" if others else ""
    return PoolCapacityUnknown(
        f"The capacity of pool {pool.name} ({pool.public_id}) is unknown{also} ({capacity.note}), so no volume can be placed on it. "
        f"Fix: set its manual_capacity_gb (`PATCH /api/v1/storage/pools/{pool.public_id}` with {{\"manual_capacity_gb\": <GiB>}}), "
        "set STORAGE_POOL_CAPACITY_GB, or let the CSI driver publish CSIStorageCapacity objects.",
        extra={"pool": pool.public_id, "source": capacity.source},
    )


def _pool_full(pool: StoragePool, capacity: CapacityResolution, allocated: int, requested: int, *, chosen: bool) -> PoolFull:
    free = max(0, capacity.capacity_bytes - allocated)
    facts = (
        f"a capacity of {format_bytes(capacity.capacity_bytes)} (source {capacity.source}: "
        f"{capacity.note}), of which {format_bytes(allocated)} is allocated, leaving {format_bytes(free)}"
    )
    if chosen:
        detail = (
            f"A {format_bytes(requested)} quota does not fit: pool {pool.name} ({pool.public_id}) has {facts}. "
            f"Fix: ask for at most {free // GIB} GiB, use another pool "
            "(`GET /api/v1/storage/summary`), delete volumes on this one, or raise its capacity (grow the storage server, or "
            "its manual_capacity_gb when no CSI reading counts)."
        )
    else:
        detail = (
            f"No single storage pool has room for a {format_bytes(requested)} quota. The one with the most free room is pool "
            f"{pool.name} ({pool.public_id}), which has {facts}. A volume "
            "lives on one pool, so free room on several pools does not add up. Fix: ask for at most "
            f"{free // GIB} GiB, delete volumes, or raise a pool's capacity."
        )
    return PoolFull(
        detail,
        extra={
            "pool": pool.public_id, "capacity_bytes": capacity.capacity_bytes, "source": capacity.source,
            "allocated_bytes": allocated, "requested_bytes": requested,
        },
    )


def _gate(pools: list[StoragePool], requested: int, *, named: bool, exclude_volume: int | None = None) -> StoragePool:
    """The capacity gate, under the locks of ``pools``: the pool the quota fits in (the one with most free room).

    Raises:
        NoStoragePool, PoolCapacityUnknown, PoolFull.
    """
    if not pools:
        raise NoStoragePool("No storage pool is registered, so a volume has nowhere to live: ask an operator to register one "
                            "(`POST /api/v1/storage/pools`, docs/storage.md).")
    capacities = pools_capacity(pools)
    allocated = _allocated_bytes([p.pk for p in pools], exclude_volume=exclude_volume)
    known = [p for p in pools if capacities[p.pk].capacity_bytes is not None]
    if not known:
        raise _capacity_unknown(pools[0], capacities[pools[0].pk], others=len(pools) - 1)
    best = max(known, key=lambda p: (capacities[p.pk].capacity_bytes - allocated[p.pk], -p.pk))
    if allocated[best.pk] + requested > capacities[best.pk].capacity_bytes:
        raise _pool_full(best, capacities[best.pk], allocated[best.pk], requested, chosen=named)
    return best


def _check_user_total(*, owner, quota_gb: int, volume: Volume | None = None) -> None:
    """Refuse when ``owner``'s volumes (not deleted; ``volume``, being raised, counted at ``quota_gb``) would hold more
    than their policy's ``max_volume_gb``. Call under the owner's credit account lock.

    Raises:
        VolumeQuotaExceeded: ``volume_quota_exceeded`` (403).
    """
    limit = policy_for(owner).max_volume_gb
    if limit is None:
        return
    others = Volume.objects.filter(owner=owner).exclude(status=Volume.Status.DELETED)
    if volume is not None:
        others = others.exclude(pk=volume.pk)
    used = others.aggregate(total=Sum("quota_gb"), count=Count("pk"))
    total, count = int(used["total"] or 0), used["count"]
    if total + quota_gb <= limit:
        return
    change = f"raising volume {volume.name} ({volume.public_id}) to {quota_gb} GiB" if volume is not None else f"a new {quota_gb} GiB volume"
    room = max(0, limit - total)
    held = f"your {count} other volume(s) already hold {total} GiB" if count else "you hold no other volume"
    raise VolumeQuotaExceeded(
        f"Your volumes may hold at most {limit} GiB in all (your policy's max_volume_gb); {held}, so {change} would "
        f"make {total + quota_gb} GiB. Fix: "
        + (f"ask for at most {room} GiB, " if room else "")
        + "delete a volume you no longer need (`DELETE /api/v1/storage/volumes/<id>`), or ask an administrator to raise "
        "your max_volume_gb.",
        extra={"max_volume_gb": limit, "held_gb": total, "requested_gb": quota_gb},
    )


def _check_quota(quota_gb) -> None:
    if not isinstance(quota_gb, int) or isinstance(quota_gb, bool) or quota_gb < 1:
        raise _invalid("quota_gb must be a whole number of GiB, at least 1.")


def _name_taken(name: str) -> VolumeNameTaken:
    return VolumeNameTaken(
        f"You already have a volume named {name!r}: choose another name, or delete that volume first "
        "(`GET /api/v1/storage/volumes` lists yours)."
    )


def _not_mountable(pools: list[StoragePool], usability: dict[int, PoolUsability], *, cluster: Cluster | None, named: bool) -> VolumeNotMountable:
    """Why no pool of ``pools`` can provision a volume on ``cluster`` (or on any cluster), and the fix."""
    where = f"cluster {cluster.name} ({cluster.public_id})" if cluster is not None else "any cluster"
    reasons = []
    for pool in pools[:5]:
        use = usability[pool.pk].use_on(cluster.pk) if cluster is not None else None
        if cluster is not None and use is None:
            why = f"it is not shared with {cluster.name}"
        else:
            uses = [use] if use is not None else list(usability[pool.pk].uses)
            why = "; ".join(u.reason for u in uses[:3]) + ("; ..." if len(uses) > 3 else "") if uses else "no cluster may use it"
        reasons.append(f"pool {pool.name} ({pool.public_id}): {why}")
    subject = f"Storage pool {pools[0].name} ({pools[0].public_id}) cannot" if named else "No storage pool can"
    listing = f"`GET /api/v1/storage/pools?cluster={cluster.public_id}`" if cluster is not None else "`GET /api/v1/storage/pools`"
    missing = sorted({pool.storage_class for pool in pools})
    return VolumeNotMountable(
        f"{subject} provision a volume on {where}, so a session mounting it would wait for its PVC forever: "
        f"{'; '.join(reasons)}. Fix: pick a pool usable there ({listing} shows each pool's usable_on), or ask an "
        f"administrator to create StorageClass {', '.join(missing)} on {cluster.name if cluster is not None else 'a cluster sharing the pool'} "
        "(docs/storage.md).",
        extra={"cluster": cluster.public_id if cluster is not None else None, "pools": [p.public_id for p in pools[:5]]},
    )


def volume_create(*, owner, name: str, quota_gb: int, pool: StoragePool | None = None, cluster: Cluster | None = None) -> Volume:
    """Create a volume after the capacity gate, on ``pool`` or, when none is named, on the pool with most free room.

    First the owner's total: the quotas of their volumes (not deleted) plus this one must not exceed their policy's
    ``max_volume_gb`` (checked under their credit account's row lock, so concurrent creates and raises cannot pass it
    together). The volume is charged per GiB-month from its creation (``billing.storage_charges``).

    Only pools usable where the volume will be mounted count (``storage.capacity.pools_usability``: shared with the
    cluster and its StorageClass exists there): on ``cluster`` when given, else on at least one cluster.

    The gate: the quota plus the quotas of the volumes already on the pool (not deleted) must not exceed the pool's
    capacity, resolved now (``pool_capacity``). Without a pool, the bound is the largest free room of a SINGLE pool,
    never the sum over pools. The pool rows are locked (``select_for_update``, primary-key order) while the gate runs,
    so concurrent creates cannot both take the last room. The PVC is created later, by the operator of the cluster
    the first session that mounts it lands on.

    Args:
        owner: the user who owns it.
        name: a DNS label, unique among the owner's volumes that are not deleted (mount path ``/data/<name>``).
        quota_gb: size, GiB (2^30 bytes), at least 1.
        pool: the pool, or None to let the service pick.
        cluster: where the volume will be mounted (its first session's cluster), or None for anywhere.

    Returns:
        The new ``Volume`` (status ``available``; ``claim_name`` ``gshare-vol-...``).

    Raises:
        django.core.exceptions.ValidationError: the name is not a DNS label (400 ``invalid_request``).
        ApplicationError: ``invalid_request`` (400) for a quota that is not a whole number >= 1.
        VolumeNameTaken: ``volume_name_taken`` (409).
        VolumeQuotaExceeded: ``volume_quota_exceeded`` (403): over the owner's ``max_volume_gb``.
        NoStoragePool: ``no_storage_pool`` (409).
        VolumeNotMountable: ``volume_not_mountable`` (409): ``pool`` (or, without one, every pool) is not usable on
            ``cluster`` (without one: on any cluster); the detail names the cluster, the StorageClass and the fix.
        PoolCapacityUnknown: ``pool_capacity_unknown`` (409).
        PoolFull: ``pool_full`` (409).
    """
    _check_quota(quota_gb)
    Volume(owner=owner, name=name, quota_gb=quota_gb).clean_fields(exclude=["owner", "pool", "cluster"])
    if Volume.objects.filter(owner=owner, name=name).exclude(status=Volume.Status.DELETED).exists():
        raise _name_taken(name)
    try:
        with transaction.atomic():
            account = account_lock(user=owner)
            _check_user_total(owner=owner, quota_gb=quota_gb)
            locked = StoragePool.objects.select_for_update().select_related("cluster").order_by("pk")
            if pool is not None:
                locked = locked.filter(pk=pool.pk)
            locked = list(locked)
            if pool is not None and not locked:
                raise NotFound(f"Storage pool {pool.public_id} no longer exists: list pools with `GET /api/v1/storage/pools`.", code=POOL_NOT_FOUND)
            usability = pools_usability(locked)
            usable = [p for p in locked if (cluster.pk in usability[p.pk].usable_ids if cluster is not None else usability[p.pk].usable_ids)]
            if locked and not usable:
                raise _not_mountable(locked, usability, cluster=cluster, named=pool is not None)
            chosen = _gate(usable, quota_gb * GIB, named=pool is not None)
            volume = Volume(owner=owner, name=name, quota_gb=quota_gb, pool=chosen)
            volume.claim_name = volume_claim_name(volume.public_id)
            volume.full_clean(validate_constraints=False)
            volume.save()
            storage_charges.holding_open(volume=volume, account=account, quota_gb=quota_gb, at=timezone.now())
            audit_record(action=Action.VOLUME_CREATE, obj=volume, changes=created({"name": name, "quota_gb": quota_gb, "pool": chosen}),
                         details={"owner": owner.get_username()})
    except IntegrityError:
        raise _name_taken(name) from None
    logger.info("volume created: %s %s (%d GiB) on pool %s for %s", volume.public_id, name, quota_gb, chosen.name, owner)
    return volume


@transaction.atomic
def volume_update_quota(*, volume: Volume, quota_gb: int) -> Volume:
    """Raise a volume's quota, through its owner's ``max_volume_gb`` (their credit account locked) and the capacity
    gate of its pool (locked). Equal: nothing changes. The new quota is charged from now on (``billing.storage_charges``).

    Raises:
        ApplicationError: ``invalid_request`` (400) for a quota that is not a whole number >= 1.
        VolumeQuotaExceeded: ``volume_quota_exceeded`` (403): the owner's volumes would hold more than ``max_volume_gb``.
        NotFound: ``volume_not_found`` (404) for a deleted volume.
        VolumeMoving: ``volume_moving`` (409).
        VolumeDeleting: ``volume_deleting`` (409).
        VolumeShrinkUnsupported: ``volume_shrink_unsupported`` (409) for a decrease.
        PoolCapacityUnknown, PoolFull: as ``volume_create`` (409).
    """
    _check_quota(quota_gb)
    owner = volume.owner
    account = account_lock(user=owner)
    pool = StoragePool.objects.select_for_update().select_related("cluster").get(pk=volume.pool_id)
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    if volume.status == Volume.Status.DELETED:
        raise NotFound(f"Volume {volume.public_id} is deleted.", code=VOLUME_NOT_FOUND)
    if volume.status == Volume.Status.MOVING:
        raise VolumeMoving(f"Volume {volume.public_id} is being moved to another cluster: change its quota once the move is done.")
    if volume.status == Volume.Status.DELETING:
        raise VolumeDeleting(f"Volume {volume.public_id} is being deleted: its quota cannot change.")
    if quota_gb < volume.quota_gb:
        raise VolumeShrinkUnsupported(
            f"Volume {volume.public_id} has {volume.quota_gb} GiB; a quota can only grow (a PersistentVolumeClaim cannot shrink). "
            f"Fix: ask for at least {volume.quota_gb} GiB, or create a smaller volume and copy the data."
        )
    if quota_gb == volume.quota_gb:
        return volume
    _check_user_total(owner=owner, quota_gb=quota_gb, volume=volume)
    _gate([pool], quota_gb * GIB, named=True, exclude_volume=volume.pk)
    audit_record(action=Action.VOLUME_UPDATE, obj=volume, changes={"quota_gb": (volume.quota_gb, quota_gb)})
    volume.quota_gb = quota_gb
    volume.save(update_fields=["quota_gb"])
    storage_charges.holding_change(volume=volume, account=account, quota_gb=quota_gb, at=timezone.now())
    logger.info("volume quota raised: %s to %d GiB", volume.public_id, quota_gb)
    return volume


def _pvc_delete(volume: Volume) -> None:
    """Delete the volume's PVC on its cluster (404 counts as done), bounded as a whole by ``GSHARE_PROBE_TIMEOUT``.

    Raises:
        ClusterUnreachable: ``cluster_unreachable`` (504). VolumeDeleteFailed: ``volume_delete_failed`` (502).
        KubeconfigError: the stored kubeconfig cannot be used (400).
    """
    cluster = volume.cluster
    namespace = settings.GSHARE_SESSION_NAMESPACE
    try:
        with KubeGateway.for_cluster(cluster, deadline=Deadline(settings.GSHARE_PROBE_TIMEOUT)) as kube:
            kube.delete(PERSISTENT_VOLUME_CLAIMS, volume.claim_name, namespace=namespace)
    except KubeUnavailable as exc:
        if exc.status:
            raise _pvc_delete_refused(volume, exc) from None
        raise ClusterUnreachable(
            f"The apiserver of cluster {cluster.name} ({cluster.public_id}) at {cluster.apiserver_url} did not answer within "
            f"{settings.GSHARE_PROBE_TIMEOUT:g} s ({exc.cause_name}), so the PVC {namespace}/{volume.claim_name} of volume "
            f"{volume.public_id} could not be deleted; nothing was changed. Fix: check the cluster "
            f"(`POST /api/v1/clusters/{cluster.public_id}/connection-test`) and retry."
        ) from None
    except KubeRefused as exc:
        raise _pvc_delete_refused(volume, exc) from None


def _pvc_delete_refused(volume: Volume, exc: KubeRefused | KubeUnavailable) -> VolumeDeleteFailed:
    cluster, namespace = volume.cluster, settings.GSHARE_SESSION_NAMESPACE
    hint = {
        401: "the cluster refused the control plane's credentials: register a fresh kubeconfig (`PATCH /api/v1/clusters/<id>`)",
        403: f"the control plane's ServiceAccount may not delete PersistentVolumeClaims in {namespace}: grant it (docs/attach-a-cluster.md)",
    }.get(exc.status, f"retry later; check the cluster with `POST /api/v1/clusters/{cluster.public_id}/connection-test`")
    return VolumeDeleteFailed(
        f"The apiserver of cluster {cluster.name} ({cluster.public_id}) answered {exc.status} ({exc.reason}) to deleting the "
        f"PVC {namespace}/{volume.claim_name} of volume {volume.public_id}; nothing was changed. Fix: {hint}."
    )


@contextlib.contextmanager
def _delete_lock(volume: Volume) -> Iterator[None]:
    """Hold the volume's deletion lock (a session-level PostgreSQL advisory lock, not a row lock) while it lasts.

    A second deletion of the volume waits here (at most the first one's apiserver budget) and then finds it deleted;
    a deletion that died half-way (its lock went with its connection) is taken over by the next one.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", [_DELETE_LOCK_CLASS, volume.pk])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_DELETE_LOCK_CLASS, volume.pk])


def volume_delete(*, volume: Volume) -> Volume:
    """Delete a volume: its PVC on the holding cluster (through that cluster's apiserver), then mark it deleted.

    The row is kept (status ``deleted``, ``deleted_at``) and its name becomes free. No row lock is held while the
    apiserver is called: the volume is first marked ``deleting`` under its row lock (committed; sessions, quota changes
    and moves refuse it meanwhile), then the PVC is deleted (at most ``GSHARE_PROBE_TIMEOUT`` seconds), then the row is
    marked ``deleted``; a failure puts the status it had back and changes nothing else. Concurrent deletions of one
    volume are serialised by an advisory lock (``_delete_lock``). A volume no cluster holds, or whose cluster was
    deregistered, has no reachable PVC: it is only marked, in the transaction that checked it. Idempotent for a
    deleted volume.

    Raises:
        VolumeInUse: ``volume_in_use`` (409) while a session that has not ended (Terminated, Failed) mounts it.
        VolumeMoving: ``volume_moving`` (409).
        ClusterUnreachable: ``cluster_unreachable`` (504): the PVC's cluster did not answer.
        VolumeDeleteFailed: ``volume_delete_failed`` (502): the apiserver refused the deletion.
    """
    with _delete_lock(volume):
        with transaction.atomic():
            account_lock(user=volume.owner)  # lock order: the owner's account before the volume (_delete_finish)
            volume, previous, pvc = _delete_begin(volume=volume)
            if previous is None:
                return volume
            if not pvc:  # nothing to call: marked deleted under the row lock its check took (it was never "deleting")
                volume = _delete_finish(volume=volume, previous=previous)
        if pvc:
            try:
                _pvc_delete(volume)
            except BaseException:
                Volume.objects.filter(pk=volume.pk, status=Volume.Status.DELETING).update(status=previous)
                raise
            volume = _delete_finish(volume=volume, previous=previous)
    logger.info("volume deleted: %s %s", volume.public_id, volume.name)
    return volume


@transaction.atomic
def _delete_begin(*, volume: Volume) -> tuple[Volume, str | None, bool]:
    """Check the locked row; mark it ``deleting`` when its PVC must be deleted through an apiserver.

    Returns:
        ``(volume, previous, pvc)``: ``previous`` is None when it is already deleted (nothing to do), else its status
        (the one to put back if the PVC's deletion fails); ``pvc`` says whether a PVC is to be deleted (the row was
        marked ``deleting``).
    """
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    if volume.status == Volume.Status.DELETED:
        return volume, None, False
    if volume.status == Volume.Status.MOVING:
        raise VolumeMoving(f"Volume {volume.public_id} is being moved to another cluster: delete it once the move is done.")
    live = list(volume.sessions.live().order_by("pk").values_list("public_id", flat=True)[:6])
    if live:
        shown = ", ".join(live[:5]) + (", ..." if len(live) > 5 else "")
        raise VolumeInUse(
            f"Volume {volume.name} ({volume.public_id}) is mounted by session(s) that have not ended: {shown}. Stop them "
            "(`DELETE /api/v1/sessions/<id>`) and delete the volume once they are Terminated.",
            extra={"sessions": live[:5]},
        )
    if volume.cluster_id is None or not volume.claim_name:
        return volume, volume.status, False
    volume.cluster = Cluster.objects.get(pk=volume.cluster_id)
    if volume.cluster.status == Cluster.Status.DEREGISTERED:
        return volume, volume.status, False
    # A volume left "deleting" by a deletion that died (we hold its lock now): the operator's next report sets the real
    # status, so put back pending on a failure.
    previous = Volume.Status.PENDING if volume.status == Volume.Status.DELETING else volume.status
    volume.status = Volume.Status.DELETING
    volume.save(update_fields=["status"])
    return volume, previous, True


@transaction.atomic
def _delete_finish(*, volume: Volume, previous: str) -> Volume:
    """Mark the (locked) volume deleted, with its audit row (``previous``: its status before the deletion began)."""
    cluster = volume.cluster if volume.cluster_id is not None else None
    account_lock(user=volume.owner)  # lock order: account, then volume; the holding is the account's
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    volume.cluster = cluster
    audit_record(action=Action.VOLUME_DELETE, obj=volume, changes={"status": (previous, Volume.Status.DELETED)})
    volume.status = Volume.Status.DELETED
    volume.deleted_at = timezone.now()
    volume.save(update_fields=["status", "deleted_at"])
    storage_charges.holding_close(volume=volume, at=volume.deleted_at)
    return volume


def volume_move_check_enabled() -> None:
    """Refuse when volume moves are off.

    Raises:
        VolumeMoveDisabled: ``volume_move_disabled`` (409) unless ``GSHARE_VOLUME_MOVE_ENABLED``.
    """
    if not settings.GSHARE_VOLUME_MOVE_ENABLED:
        raise VolumeMoveDisabled(
            "Moving volumes between clusters is off on this control plane (it needs a CSI driver it was tested with). "
            "An operator can turn it on with GSHARE_VOLUME_MOVE_ENABLED=true (docs/storage.md); until then a volume stays "
            "on the cluster that holds its PVC."
        )
