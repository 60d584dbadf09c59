"""Serializers of the storage API. Input and output serializers differ; sizes are bytes, quotas GiB (2^30 bytes)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.models import CREDIT_PLACES, MAX_CAPACITY_GB
from billing.storage_charges import storage_pricing
from core.api.fields import RefuseUnknownFieldsMixin, StrictIntegerField
from storage.models import GIB, StoragePool, Volume

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
CLUSTER_REF_HELP = "Cluster id (clu_...) or name"


class PoolCreateSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/storage/pools``."""

    name = serializers.RegexField(DNS_LABEL, max_length=63, error_messages={
        "invalid": "must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit (e.g. nfs-a)",
    })
    cluster = serializers.CharField(max_length=253, help_text=f"Where the storage server sits. {CLUSTER_REF_HELP}")
    storage_class = serializers.CharField(max_length=253, help_text="StorageClass that provisions from this pool, the same name on every cluster sharing it")
    sharing = serializers.ChoiceField(choices=StoragePool.Sharing.choices, default=StoragePool.Sharing.ALL)
    allowed_clusters = serializers.ListField(
        child=serializers.CharField(max_length=253), required=False, default=list, max_length=1000,
        help_text="With sharing 'selected': the clusters (ids or names) besides its own that may use it",
    )
    manual_capacity_gb = StrictIntegerField(min_value=1, max_value=MAX_CAPACITY_GB, required=False, allow_null=True, default=None,
                                            help_text="Stated capacity, GiB")
    storage_node = serializers.CharField(max_length=253, required=False, allow_blank=True, default="")


class PoolUpdateSerializer(RefuseUnknownFieldsMixin, PoolCreateSerializer):
    """Input of ``PATCH /api/v1/storage/pools/{id}`` (any subset of the fields of ``POST``)."""


class CapacitySerializer(serializers.Serializer):
    """A pool's stored capacity (refreshed every minute and on every change of the pool)."""

    bytes = serializers.IntegerField(allow_null=True)
    source = serializers.ChoiceField(choices=StoragePool.Source.choices)
    note = serializers.CharField()
    updated_at = serializers.DateTimeField(allow_null=True)


class PoolUseSerializer(serializers.Serializer):
    """One cluster in a pool's ``usable_on`` / ``not_usable_on``."""

    cluster = serializers.CharField(source="cluster.public_id", help_text="Cluster id (clu_...)")
    name = serializers.CharField(source="cluster.name", help_text="Cluster name")
    reason = serializers.CharField(help_text="Why: what that cluster's operator listed, and when")


class PoolSerializer(serializers.ModelSerializer):
    """Output of the pools API. ``usable_on`` / ``not_usable_on`` need ``context["usability"]``
    (``storage.capacity.pools_usability`` of the pools serialized: one computation per page)."""

    id = serializers.CharField(source="public_id", read_only=True)
    cluster = serializers.CharField(source="cluster.public_id", read_only=True)
    allowed_clusters = serializers.SerializerMethodField()
    capacity = serializers.SerializerMethodField()
    allocated_bytes = serializers.SerializerMethodField()
    volumes = serializers.IntegerField(source="volume_count", read_only=True, default=0)
    usable_on = serializers.SerializerMethodField()
    not_usable_on = serializers.SerializerMethodField()

    class Meta:
        model = StoragePool
        fields = [
            "id", "name", "cluster", "sharing", "allowed_clusters", "manual_capacity_gb",
            "capacity", "allocated_bytes", "volumes", "usable_on", "not_usable_on", "created_at",
        ]
        read_only_fields = fields

    def _uses(self, obj: StoragePool, usable: bool) -> list[dict]:
        usability = self.context["usability"][obj.pk]
        return PoolUseSerializer([u for u in usability.uses if u.usable is usable], many=True).data

    @extend_schema_field(PoolUseSerializer(many=True))
    def get_usable_on(self, obj: StoragePool) -> list[dict]:
        """The clusters its sharing names where its StorageClass exists (or is not known not to), by name."""
        return self._uses(obj, True)

    @extend_schema_field(PoolUseSerializer(many=True))
    def get_not_usable_on(self, obj: StoragePool) -> list[dict]:
        """The clusters its sharing names whose operator listed StorageClasses without its own, by name."""
        return self._uses(obj, False)

    def get_allowed_clusters(self, obj: StoragePool) -> list[str]:
        """Ids (``clu_...``) of the clusters besides its own allowed with sharing ``selected`` (prefetched)."""
        return sorted(c.public_id for c in obj.allowed_clusters.all())

    @extend_schema_field(CapacitySerializer)
    def get_capacity(self, obj: StoragePool) -> dict:
        """``{"bytes", "source", "note", "updated_at"}`` as last resolved."""
        return CapacitySerializer({
            "bytes": obj.capacity_bytes, "source": obj.capacity_source, "note": obj.capacity_note, "updated_at": obj.capacity_updated_at,
        }).data

    def get_allocated_bytes(self, obj: StoragePool) -> int:
        """Sum of the quotas of the volumes on it that are not deleted, bytes."""
        return int(getattr(obj, "allocated_gb", 0) or 0) * GIB


class PoolStaffSerializer(PoolSerializer):
    """The pools API for staff: also the wiring (StorageClass and storage node), which researchers do not need."""

    class Meta(PoolSerializer.Meta):
        fields = [*PoolSerializer.Meta.fields[:3], "storage_class", *PoolSerializer.Meta.fields[3:6], "storage_node",
                  *PoolSerializer.Meta.fields[6:]]
        read_only_fields = fields


class VolumeCreateSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/storage/volumes``."""

    name = serializers.CharField(max_length=63, help_text="A DNS label, unique among your volumes; mounted at /data/<name>")
    quota_gb = StrictIntegerField(min_value=1, max_value=MAX_CAPACITY_GB,
                                  help_text="Size, GiB (2^30 bytes); charged per GiB-month (the created volume's pricing)")
    pool = serializers.CharField(max_length=32, required=False, allow_null=True, default=None,
                                 help_text="Pool id (pool_...); omitted: the pool with the most free room")
    cluster = serializers.CharField(max_length=253, required=False, allow_null=True, default=None,
                                    help_text=f"Where it will be mounted: only pools usable there are used. {CLUSTER_REF_HELP}")


class VolumeUpdateSerializer(RefuseUnknownFieldsMixin, serializers.Serializer):
    """Input of ``PATCH /api/v1/storage/volumes/{id}``: only the quota changes, and only upward."""

    quota_gb = StrictIntegerField(min_value=1, max_value=MAX_CAPACITY_GB)


class VolumeMoveSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/storage/volumes/{id}/move``."""

    cluster = serializers.CharField(max_length=253, help_text=f"The cluster to hand the volume to. {CLUSTER_REF_HELP}")


class VolumePricingSerializer(serializers.Serializer):
    """What a volume's quota costs (``billing.storage_charges``): charged per billing period for the quota held."""

    credits_per_gb_month = serializers.DecimalField(max_digits=18, decimal_places=CREDIT_PLACES, coerce_to_string=True,
                                                    help_text="Credits per GiB of quota per month (GSHARE_STORAGE_PRICE_PER_GB_MONTH)")
    monthly_credits = serializers.DecimalField(max_digits=18, decimal_places=CREDIT_PLACES, coerce_to_string=True,
                                               help_text="Credits this quota costs per month")
    month_days = serializers.IntegerField(help_text="A month is exactly this many days (30)")


class VolumeSerializer(serializers.ModelSerializer):
    """Output of the volumes API."""

    id = serializers.CharField(source="public_id", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    pool = serializers.CharField(source="pool.public_id", read_only=True)
    cluster = serializers.SerializerMethodField()
    pricing = serializers.SerializerMethodField()

    class Meta:
        model = Volume
        fields = ["id", "name", "owner", "quota_gb", "pool", "cluster", "claim_name", "status", "status_message", "pricing", "created_at"]
        read_only_fields = fields

    @extend_schema_field(VolumePricingSerializer)
    def get_pricing(self, obj: Volume) -> dict:
        """The price per GiB-month and what this quota costs per month (credits, decimal strings)."""
        return VolumePricingSerializer(storage_pricing(quota_gb=obj.quota_gb)).data

    def get_cluster(self, obj: Volume) -> str | None:
        """Id of the cluster holding its PVC, or null before the first mount."""
        return obj.cluster.public_id if obj.cluster_id else None


class SummaryPoolSerializer(serializers.Serializer):
    """One pool of ``GET /api/v1/storage/summary``, resolved now."""

    id = serializers.CharField()
    name = serializers.CharField()
    cluster = serializers.CharField(help_text="The pool's own cluster (where the storage server sits)")
    storage_class = serializers.CharField()
    capacity_bytes = serializers.IntegerField(allow_null=True)
    source = serializers.ChoiceField(choices=StoragePool.Source.choices)
    note = serializers.CharField()
    allocated_bytes = serializers.IntegerField()
    free_bytes = serializers.IntegerField(allow_null=True)
    shared_across_clusters = serializers.BooleanField()


class SummarySerializer(serializers.Serializer):
    """``GET /api/v1/storage/summary``: the headline numbers are those of the largest single pool (docs/storage.md)."""

    cluster = serializers.CharField(allow_null=True)
    capacity_bytes = serializers.IntegerField(allow_null=True, help_text="Capacity of the largest pool (pools never add up)")
    source = serializers.ChoiceField(choices=StoragePool.Source.choices)
    allocated_bytes = serializers.IntegerField(help_text="Allocated on that pool")
    pool = serializers.CharField(allow_null=True, help_text="The pool the headline numbers describe")
    largest_free_bytes = serializers.IntegerField(allow_null=True, help_text="Most free room on one pool: the largest volume that fits now")
    shared_across_clusters = serializers.BooleanField()
    pools = SummaryPoolSerializer(many=True)
    credits_per_gb_month = serializers.SerializerMethodField(help_text="What a volume costs per GiB of quota per month (30 days)")

    @extend_schema_field(serializers.DecimalField(max_digits=18, decimal_places=CREDIT_PLACES))
    def get_credits_per_gb_month(self, obj) -> str:
        """The storage price (credits per GiB-month, a decimal string with 6 places)."""
        return f"{storage_pricing(quota_gb=1)['credits_per_gb_month']:.{CREDIT_PLACES}f}"
