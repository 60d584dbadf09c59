"""The operator's storage report (``POST /internal/v1/storage``): capacity readings, node disks, the StorageClasses a
cluster has, and the phases of its volumes' PVCs."""

from __future__ import annotations

import re

from django.db import transaction
from django.utils import timezone

from clusters.models import Cluster
from contract import FORBIDDEN_CLUSTER_SCOPE
from core.exceptions import Forbidden
from storage.models import ClusterStorageClasses, NodeDisk, StorageCapacityReading, Volume

#: PVC phases the operator reports -> volume status.
_PVC_PHASES = {"Bound": Volume.Status.BOUND, "Pending": Volume.Status.PENDING, "Lost": Volume.Status.LOST}

#: Statuses a report never overwrites: the control plane is changing the volume's PVC (a move, a deletion).
_BUSY = (Volume.Status.MOVING, Volume.Status.DELETING)


@transaction.atomic
def storage_report_apply(*, cluster: Cluster, report: dict) -> dict:
    """Apply an operator's storage report (``POST /internal/v1/storage``) in one transaction and a constant number
    of queries, whatever its size.

    Upserts one ``StorageCapacityReading`` per StorageClass and one ``NodeDisk`` per node (``INSERT ... ON
    CONFLICT DO UPDATE``; a row already newer than the report is kept), and applies each listed PVC's phase to the
    cluster's volume: ``Bound`` -> ``bound``, ``Pending`` -> ``pending`` (with the event message), ``Lost`` ->
    ``lost``, with ``pv_name`` and ``status_reported_at``. Volumes unknown, deleted, held by no cluster yet, being
    moved or deleted, or already updated by a newer report are ignored (counted). ``existing_storage_classes``, when sent,
    replaces the cluster's ``ClusterStorageClasses`` (where its pools are usable; a newer list is kept); a pending
    volume whose pool's StorageClass is missing here gets a message that says so and names the cluster.

    Args:
        cluster: the cluster named in the operator token.
        report: validated body: ``{"read_at": datetime (UTC), "storage_classes": [{"storage_class", "capacity_bytes",
            "objects"}], "existing_storage_classes": [name, ...], "volumes": [{"volume_id", "claim_name", "phase",
            "volume_name", "message"}], "nodes": [{"name", "disk_bytes"}]}`` (every key but ``read_at`` may be
            absent). A ``read_at`` in the future counts as now.

    Returns:
        ``{"storage_classes": n, "existing_storage_classes": n or None when not sent, "volumes": applied,
        "volumes_ignored": n, "nodes": n}``.

    Raises:
        Forbidden: ``forbidden_cluster_scope`` (403) when a listed volume's PVC is held by another cluster; nothing
            is stored.
    """
    now = timezone.now()
    read_at = min(report["read_at"], now)
    volume_reports = report.get("volumes") or []
    ids = sorted({v["volume_id"] for v in volume_reports})
    volumes = {
        v.public_id: v
        for v in Volume.objects.select_for_update(of=("self",)).select_related("pool").filter(public_id__in=ids)
        .exclude(status=Volume.Status.DELETED).order_by("pk")
    } if ids else {}
    foreign = [vid for vid, v in volumes.items() if v.cluster_id is not None and v.cluster_id != cluster.pk]
    if foreign:
        raise Forbidden(
            f"Volume(s) {', '.join(foreign[:5])} are held by another cluster; an operator may only report its own cluster's "
            "volumes. Nothing was stored. Check that this operator runs with its own cluster's token.",
            code=FORBIDDEN_CLUSTER_SCOPE,
        )

    existing = report.get("existing_storage_classes")
    changed = []
    for item in volume_reports:
        volume = volumes.get(item["volume_id"])
        if (
            volume is None
            or volume.cluster_id is None
            or volume.status in _BUSY
            or (volume.status_reported_at is not None and read_at < volume.status_reported_at)
        ):
            continue
        volume.status = _PVC_PHASES[item["phase"]]
        message = item.get("message") or ""
        if volume.status != Volume.Status.BOUND:
            message = _class_missing_message(volume=volume, cluster=cluster, existing=existing, event=message)
        volume.status_message = message[:4000]
        volume.pv_name = item.get("volume_name") or ""
        volume.status_reported_at = read_at
        changed.append(volume)
    if changed:
        Volume.objects.bulk_update(changed, ["status", "status_message", "pv_name", "status_reported_at"])

    classes = report.get("storage_classes") or []
    nodes = report.get("nodes") or []
    # A late report never overwrites a newer reading (one query per kind, only when the report lists any).
    newer_classes = set(
        StorageCapacityReading.objects.filter(cluster=cluster, read_at__gt=read_at).values_list("storage_class", flat=True)
    ) if classes else set()
    newer_nodes = set(NodeDisk.objects.filter(cluster=cluster, read_at__gt=read_at).values_list("node", flat=True)) if nodes else set()
    readings = [
        StorageCapacityReading(
            cluster=cluster, storage_class=item["storage_class"], capacity_bytes=item.get("capacity_bytes"),
            object_count=item.get("objects") or 0, read_at=read_at,
        )
        for item in classes if item["storage_class"] not in newer_classes
    ]
    if readings:
        StorageCapacityReading.objects.bulk_create(
            readings, update_conflicts=True, unique_fields=["cluster", "storage_class"],
            update_fields=["capacity_bytes", "object_count", "read_at", "received_at"],
        )
    disks = [
        NodeDisk(cluster=cluster, node=item["name"], disk_bytes=item["disk_bytes"], read_at=read_at)
        for item in nodes if item["name"] not in newer_nodes
    ]
    if disks:
        NodeDisk.objects.bulk_create(disks, update_conflicts=True, unique_fields=["cluster", "node"], update_fields=["disk_bytes", "read_at"])
    if existing is not None and not ClusterStorageClasses.objects.filter(cluster=cluster, read_at__gt=read_at).exists():
        ClusterStorageClasses.objects.bulk_create(
            [ClusterStorageClasses(cluster=cluster, names=sorted(existing), read_at=read_at)],
            update_conflicts=True, unique_fields=["cluster"], update_fields=["names", "read_at", "received_at"],
        )
    return {
        "storage_classes": len(classes),
        "existing_storage_classes": None if existing is None else len(existing),
        "volumes": len(changed),
        "volumes_ignored": len(volume_reports) - len(changed),
        "nodes": len(nodes),
    }


#: The PV controller's ``ProvisioningFailed`` message for a PVC naming a StorageClass that does not exist.
_CLASS_NOT_FOUND = re.compile(r'storageclass\.storage\.k8s\.io "([^"]+)" not found')


def _class_missing_message(*, volume: Volume, cluster: Cluster, existing: list[str] | None, event: str) -> str:
    """A pending volume's message: when its pool's StorageClass is missing on ``cluster`` (not in the operator's list
    ``existing``, or the PVC's event says so), a sentence naming the class, the cluster and the fix, then ``event``."""
    storage_class = volume.pool.storage_class
    found = _CLASS_NOT_FOUND.search(event)
    if not ((existing is not None and storage_class not in existing) or (found and found.group(1) == storage_class)):
        return event
    return (
        f'storageclass "{storage_class}" not found on {cluster.name}: the PVC {volume.claim_name} of volume {volume.name} '
        f"cannot be provisioned there. Fix: create StorageClass {storage_class} on {cluster.name} (the CSI driver of "
        f"pool {volume.pool.name}, docs/storage.md), or delete the volume." + (f" (event: {event})" if event else "")
    )
