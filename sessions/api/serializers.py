"""Serializers of the sessions API."""

from __future__ import annotations

from rest_framework import serializers

from gshare.api_fields import StrictIntegerField
from sessions import activity as session_activity
from sessions import selectors
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


class _SessionListSerializer(serializers.ListSerializer):
    """Reads the connections not yet flushed to the database for the whole page at once (one Redis call)."""

    def to_representation(self, data):  # noqa: D102
        items = list(data.all() if hasattr(data, "all") else data)
        self.child.context["pending_connections"] = session_activity.connections_pending([s.public_id for s in items]) or {}
        return super().to_representation(items)


class IdleExemptionSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/sessions/{id}/idle-exemption`` (staff)."""

    until = serializers.DateTimeField(help_text="When the exemption ends (RFC 3339 with a zone), at most a year ahead")
    reason = serializers.CharField(max_length=500, help_text="Why the session may stay idle (audited)")


def _time(value):
    return serializers.DateTimeField().to_representation(value) if value else None


class SessionSerializer(serializers.ModelSerializer):
    """Output of the sessions API."""

    id = serializers.CharField(source="public_id", read_only=True)
    cluster = serializers.SerializerMethodField()
    cluster_name = serializers.SerializerMethodField()
    owner = serializers.CharField(source="owner.username", read_only=True)
    url = serializers.SerializerMethodField()
    volumes = serializers.SerializerMethodField()
    idle_since = serializers.SerializerMethodField()
    stops_at = serializers.SerializerMethodField()
    activity = serializers.SerializerMethodField()
    share = serializers.SerializerMethodField()

    class Meta:
        model = Session
        list_serializer_class = _SessionListSerializer
        fields = [
            "id", "name", "owner", "cluster", "cluster_name", "phase", "url", "image", "gpus", "gpu_memory_mib",
            "gpu_cores", "node", "devices", "message", "volumes", "created_at", "started_at", "ended_at", "last_status_at",
            "stop_reason", "idle_since", "stops_at", "activity", "share",
        ]
        read_only_fields = fields

    @staticmethod
    def _row(obj: Session):
        try:
            return obj.activity
        except Session.activity.RelatedObjectDoesNotExist:
            return None

    def get_idle_since(self, obj: Session) -> str | None:
        """While the idle policy's warning runs: when the session's idle time started (else null)."""
        row = self._row(obj)
        return _time(row.idle_since) if row and obj.is_live else None

    def get_stops_at(self, obj: Session) -> str | None:
        """While the idle policy's warning runs: when it stops the session (else null)."""
        row = self._row(obj)
        return _time(row.stops_at) if row and obj.is_live else None

    def get_activity(self, obj: Session) -> dict:
        """GPU activity from HAMi's vGPU monitor (per GPU: ``last_kernel_seconds`` as of its ``sampled_at``,
        ``utilization_percent``, ``memory_used_bytes``/``memory_limit_bytes``), ``state`` (``ok``, ``unknown`` with
        ``reason``, ``none`` before any reading), ``last_kernel_at``, ``last_connected_at`` and any idle exemption."""
        row = self._row(obj)
        pending = self.context.get("pending_connections")
        if pending is None:
            pending = (session_activity.connections_pending([obj.public_id]) if obj.is_live else None) or {}
        connected = session_activity.last_connection(row, pending, obj.public_id)
        if row is None:
            return {"state": "none", "reason": "", "sampled_at": None, "gpus": [], "last_kernel_at": None,
                    "last_connected_at": _time(connected), "exempt_until": None, "exempt_reason": "", "exempt_by": ""}
        return {
            "state": row.state or "none", "reason": row.reason, "sampled_at": _time(row.sampled_at), "gpus": row.gpus,
            "last_kernel_at": _time(row.last_kernel_at), "last_connected_at": _time(connected),
            "exempt_until": _time(row.exempt_until), "exempt_reason": row.exempt_reason, "exempt_by": row.exempt_by,
        }

    def get_share(self, obj: Session) -> dict | None:
        """What the session holds of each GPU while it holds them (``whole``, ``memory_mib`` per GPU, ``cores``
        percent, ``fraction``: the priced fraction of one GPU, a decimal string), null when nothing is reserved."""
        return selectors.session_share(obj)

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
