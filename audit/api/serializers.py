"""Serializers of the audit API (output only: the trail is written by services, never through the API)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from audit.models import AuditRecord


class AuditObjectSerializer(serializers.Serializer):
    """The object a row is about."""

    type = serializers.CharField(source="object_type")
    id = serializers.CharField(source="object_id")
    name = serializers.CharField(source="object_repr")


class AuditClusterSerializer(serializers.Serializer):
    """The cluster a row is about (its id and its name at the time of the row)."""

    id = serializers.CharField(source="cluster")
    name = serializers.CharField(source="cluster_name")


class AuditRecordSerializer(serializers.ModelSerializer):
    """One audit row: when, who, what, on which object (and cluster), the fields changed, from where."""

    object = AuditObjectSerializer(source="*")
    cluster = serializers.SerializerMethodField()

    class Meta:
        model = AuditRecord
        fields = ["id", "at", "actor", "action", "object", "cluster", "changes", "details", "source_address"]
        read_only_fields = fields

    @extend_schema_field(AuditClusterSerializer(allow_null=True))
    def get_cluster(self, record: AuditRecord) -> dict | None:  # noqa: D102
        return AuditClusterSerializer(record).data if record.cluster else None
