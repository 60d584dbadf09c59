"""Serializers of the sessions API."""

from __future__ import annotations

from rest_framework import serializers

from gshare.api_fields import StrictIntegerField
from sessions.manifests import session_url
from sessions.models import Session


class SessionCreateSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/sessions``. Numbers are JSON numbers; ranges are checked by the service (one validation)."""

    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=63)
    image = serializers.CharField(max_length=512, allow_blank=True)
    gpus = StrictIntegerField(required=False, default=1)
    gpu_memory_mib = StrictIntegerField(required=False, allow_null=True, default=None, help_text="MiB per GPU; omit for whole GPUs")
    gpu_cores = StrictIntegerField(required=False, allow_null=True, default=None, help_text="Percent of one GPU (1-100); omit for whole GPUs")
    cluster = serializers.CharField(required=False, allow_null=True, allow_blank=True, default=None, help_text="Pin to a cluster (id or name)")
    volumes = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list,
        help_text="Ids (vol_...) of your volumes to mount at /data/<volume name>, at most 8; a volume already on a cluster keeps the session there",
    )


class SessionSerializer(serializers.ModelSerializer):
    """Output of the sessions API."""

    id = serializers.CharField(source="public_id", read_only=True)
    cluster = serializers.SerializerMethodField()
    cluster_name = serializers.SerializerMethodField()
    owner = serializers.CharField(source="owner.username", read_only=True)
    url = serializers.SerializerMethodField()
    volumes = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = [
            "id", "name", "owner", "cluster", "cluster_name", "phase", "url", "image", "gpus", "gpu_memory_mib",
            "gpu_cores", "node", "devices", "message", "volumes", "created_at", "started_at", "ended_at", "last_status_at",
        ]
        read_only_fields = fields

    def get_cluster(self, obj: Session) -> str | None:
        """The cluster's id (``clu_...``)."""
        return obj.cluster.public_id if obj.cluster else None

    def get_cluster_name(self, obj: Session) -> str | None:
        """The cluster's name."""
        return obj.cluster.name if obj.cluster else None

    def get_url(self, obj: Session) -> str | None:
        """``https://<cluster session_domain>/s/<id>/``."""
        return session_url(obj)

    def get_volumes(self, obj: Session) -> list[str]:
        """Ids (``vol_...``) of the volumes the session mounts, by volume name."""
        return [v.public_id for v in sorted(obj.volumes.all(), key=lambda v: (v.name, v.pk))]
