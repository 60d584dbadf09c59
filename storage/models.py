"""Storage pools on the shared NFS server(s), capacity readings from each cluster, and user volumes.

A pool is one storage server (one export) that clusters mount through their own democratic-csi driver, under
the StorageClass name ``storage_class`` on every cluster that shares it. A volume has an owner and a quota and
lives on one pool; the operator of the cluster a session lands on creates its PersistentVolumeClaim
(``claim_name``) and records it here (``cluster``), and later sessions that mount it stay on that cluster.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from billing.models import MAX_CAPACITY_GB
from clusters.models import dns_name_validator
from core.ids import new_pool_id, new_volume_id

#: A volume name is a DNS label (it becomes the mount path ``/data/<name>`` and a label value).
volume_name_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    message="must be a lowercase DNS label (letters, digits and '-', at most 63), e.g. datasets",
    code="invalid_volume_name",
)

GIB = 1024**3


class StoragePool(models.Model):
    """A storage server (NFS export) that one or more clusters provision volumes from.

    Capacity is resolved by ``storage.services`` from, in order: ``csi`` (the latest fresh
    ``StorageCapacityReading`` of ``storage_class`` from any cluster that shares the pool: the largest, never
    the sum), ``manual`` (``manual_capacity_gb``, else the fleet default ``STORAGE_POOL_CAPACITY_GB``),
    ``node_disk`` (the system drive of ``storage_node`` on ``cluster``, a stand-in). The resolved value is kept
    in ``capacity_bytes``/``capacity_source``/``capacity_note`` for listing; the gate re-resolves it.
    """

    class Sharing(models.TextChoices):
        ALL = "all", "All clusters"
        SELECTED = "selected", "Selected clusters"

    class Source(models.TextChoices):
        CSI = "csi", "CSIStorageCapacity"
        MANUAL = "manual", "Stated capacity"
        NODE_DISK = "node_disk", "Storage node's system drive (stand-in)"
        NONE = "none", "Unknown"

    public_id = models.CharField(max_length=24, unique=True, default=new_pool_id, editable=False)
    name = models.CharField(max_length=63, unique=True)
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="storage_pools",
                                help_text="The cluster where the storage server sits")
    storage_class = models.CharField(max_length=253, validators=[dns_name_validator],
                                     help_text="StorageClass that provisions from this pool, the same name on every cluster sharing it")
    sharing = models.CharField(max_length=16, choices=Sharing.choices, default=Sharing.ALL)
    allowed_clusters = models.ManyToManyField("clusters.Cluster", blank=True, related_name="shared_storage_pools",
                                              help_text="With sharing 'selected': the clusters (besides its own) that may use it")
    manual_capacity_gb = models.PositiveBigIntegerField(null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_CAPACITY_GB)],
                                                       help_text="Stated capacity in GiB, used when no fresh CSI reading exists")
    storage_node = models.CharField(max_length=253, blank=True, default="",
                                    help_text="Node of `cluster` whose system drive stands in when nothing else is known")
    capacity_bytes = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    capacity_source = models.CharField(max_length=16, choices=Source.choices, default=Source.NONE, editable=False)
    capacity_note = models.CharField(max_length=500, blank=True, default="", editable=False)
    capacity_updated_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"


class StorageCapacityReading(models.Model):
    """The latest CSIStorageCapacity reading of one StorageClass on one cluster (``POST /internal/v1/storage``).

    ``capacity_bytes`` is the largest ``capacity`` among that class's CSIStorageCapacity objects on the cluster
    (one per topology segment, all describing the same server), or null when none was published.
    """

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.CASCADE, related_name="storage_readings")
    storage_class = models.CharField(max_length=253)
    capacity_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    object_count = models.PositiveIntegerField(default=0, help_text="CSIStorageCapacity objects seen for the class")
    read_at = models.DateTimeField(help_text="When the operator read them (UTC)")
    received_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "storage_class"], name="storage_reading_unique_per_class")]


class ClusterStorageClasses(models.Model):
    """The StorageClasses that exist on a cluster, as its operator last listed them (``existing_storage_classes`` of
    ``POST /internal/v1/storage``).

    A pool is usable by a cluster only where its ``storage_class`` is among ``names`` (``storage.capacity``). No row:
    the cluster's operator never sent the list (none yet, or an operator older than the field), so nothing is known.
    """

    cluster = models.OneToOneField("clusters.Cluster", on_delete=models.CASCADE, related_name="storage_class_inventory")
    names = ArrayField(models.CharField(max_length=253), default=list, blank=True, help_text="StorageClass names, sorted")
    read_at = models.DateTimeField(help_text="When the operator listed them (UTC)")
    received_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "cluster's StorageClasses"
        verbose_name_plural = "clusters' StorageClasses"

    def __str__(self) -> str:
        return f"{self.cluster_id}: {', '.join(self.names) or 'none'}"


class NodeDisk(models.Model):
    """A node's system drive as the operator reported it (``ephemeral-storage`` capacity, bytes)."""

    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.CASCADE, related_name="node_disks")
    node = models.CharField(max_length=253)
    disk_bytes = models.PositiveBigIntegerField()
    read_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "node"], name="node_disk_unique_per_node")]


class Volume(models.Model):
    """A user's volume on a pool; its PVC lives on one cluster at a time (``cluster``, empty until first mounted).

    ``status`` follows the PVC as the holding cluster's operator reports it (``pending`` with the event message,
    e.g. a node without an NFS client, ``bound``, ``lost``); ``available`` before the first mount; ``moving`` and
    ``deleting`` while the control plane changes its PVC through an apiserver (no row lock is held meanwhile).
    """

    class Status(models.TextChoices):
        AVAILABLE = "available", "Available (no PVC yet)"
        PENDING = "pending", "PVC pending"
        BOUND = "bound", "Bound"
        LOST = "lost", "PVC lost"
        MOVING = "moving", "Moving to another cluster"
        DELETING = "deleting", "Being deleted"
        DELETED = "deleted", "Deleted"

    public_id = models.CharField(max_length=24, unique=True, default=new_volume_id, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="volumes")
    name = models.CharField(max_length=63, validators=[volume_name_validator])
    quota_gb = models.PositiveBigIntegerField(validators=[MinValueValidator(1)], help_text="Size in GiB (the PVC's request)")
    pool = models.ForeignKey(StoragePool, on_delete=models.PROTECT, related_name="volumes")
    cluster = models.ForeignKey("clusters.Cluster", on_delete=models.PROTECT, related_name="volumes", null=True, blank=True,
                                help_text="The cluster that holds its PVC")
    claim_name = models.CharField(max_length=253, blank=True, default="", help_text="PVC name in the session namespace")
    pv_name = models.CharField(max_length=253, blank=True, default="", help_text="PersistentVolume bound to the PVC")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.AVAILABLE)
    status_message = models.TextField(blank=True, default="")
    status_reported_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], condition=~Q(status="deleted"), name="volume_name_unique_per_owner"),
            models.CheckConstraint(condition=Q(quota_gb__gte=1), name="volume_quota_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"

    @property
    def quota_bytes(self) -> int:
        """The quota in bytes (GiB × 2^30)."""
        return int(self.quota_gb) * GIB
