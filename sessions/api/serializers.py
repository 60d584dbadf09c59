"""Serializers of the sessions API."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing import admission, pricing
from billing.models import CREDIT_PLACES
from billing.selectors import session_hourly_cost
from core.api.fields import StrictCharField, StrictIntegerField
from sessions import activity as session_activity
from sessions import idle, runtime, selectors
from sessions.gpu_models import MAX_GPU_MODEL_LENGTH, MAX_GPU_MODELS
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
    gpu_models = serializers.ListField(
        child=StrictCharField(max_length=MAX_GPU_MODEL_LENGTH), required=False, default=list, max_length=MAX_GPU_MODELS,
        help_text="GPU models you accept, e.g. [\"H100\"]: each a model of GET /api/v1/gpus or whole words of one, ignoring "
                  "case (H100 matches NVIDIA H100 80GB HBM3; A10 does not match A100); at most 16; omit for any model",
    )

    runtime_hours = serializers.JSONField(
        required=False, allow_null=True, default=None,
        help_text="How long the session may hold its GPUs, hours from now (a number or decimal string, more than 0, at most 2 decimal "
                  "places and at most your policy's max_runtime_hours; omitted: that maximum). Sets ends_at.",
    )

    cpu = serializers.JSONField(
        required=False, allow_null=True, default=None,
        help_text="CPU cores for the session's pod, its request and limit (a number or decimal string, more than 0, at most 3 decimal "
                  "places, e.g. 4 or \"0.5\"; at most your policy's max_cpu_per_gpu × gpus; omitted: its default_cpu_per_gpu × gpus)",
    )
    memory_gib = serializers.JSONField(
        required=False, allow_null=True, default=None,
        help_text="Memory (GiB) for the session's pod, its request and limit; /dev/shm gets half of it (a number or decimal string, "
                  "more than 0, at most 3 decimal places; at most your policy's max_memory_gib_per_gpu × gpus; omitted: its "
                  "default_memory_gib_per_gpu × gpus)",
    )
    queue = serializers.BooleanField(
        required=False, default=False,
        help_text="true: when nothing can host the session now, wait in the fleet's queue (phase Queued, with queue_position, "
                  "estimated_start, waiting_for and alternatives) instead of 409 no_capacity; a request that can never fit is "
                  "refused with 409 never_fits. Default false.",
    )

    def validate_queue(self, value):  # noqa: D102
        if not isinstance(self.initial_data.get("queue", False), bool):
            raise serializers.ValidationError("queue must be true or false (a JSON boolean).")
        return value

    def validate(self, attrs):  # noqa: D102
        for field in ("runtime_hours", "cpu", "memory_gib"):
            if attrs.get(field) is None:
                attrs.pop(field, None)  # omitted: session_create's default (and the idempotency fingerprint of old requests)
        if not attrs.get("queue"):
            attrs.pop("queue", None)  # as before the queue: the idempotency fingerprint of requests that do not queue is unchanged
        return attrs


class PrioritySerializer(serializers.Serializer):
    """Input of ``POST /api/v1/sessions/{id}/priority`` (staff)."""

    priority = StrictIntegerField(help_text="Higher starts first (a whole number from -1000 to 1000); ties: arrival order")


class QueueEntrySerializer(serializers.ModelSerializer):
    """One queued session in ``GET /api/v1/queue``."""

    id = serializers.CharField(source="public_id", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    cluster = serializers.SerializerMethodField()
    gpu_models = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = Session
        fields = ["id", "name", "owner", "queue_position", "priority", "gpus", "gpu_memory_mib", "gpu_cores", "gpu_models", "cluster",
                  "runtime_hours", "queued_at", "queue_expires_at", "estimated_start", "waiting_for", "alternatives"]
        read_only_fields = fields

    def get_cluster(self, obj: Session) -> str | None:
        """The cluster it is pinned to (``clu_...``), or null for any."""
        return obj.requested_cluster.public_id if obj.requested_cluster_id else None


class ExtendSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/sessions/{id}/extend``."""

    hours = serializers.JSONField(help_text="Hours to add to ends_at (a number or decimal string, more than 0, at most 2 decimal places)")


class _SessionListSerializer(serializers.ListSerializer):
    """Reads the connections not yet flushed to the database (one Redis call) and the owners' policies (one query) for
    the whole page at once."""

    def to_representation(self, data):  # noqa: D102
        items = list(data.all() if hasattr(data, "all") else data)
        self.child.context["pending_connections"] = session_activity.connections_pending([s.public_id for s in items]) or {}
        self.child.context["policies"] = admission.policies_for(user_ids={s.owner_id for s in items}) if items else {}
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
    credits_per_hour = serializers.SerializerMethodField()
    share = serializers.SerializerMethodField()
    gpu_models = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="The GPU models the session may run on (the fleet's names its request resolved to); empty: any model",
    )

    ends_soon = serializers.SerializerMethodField()

    class Meta:
        model = Session
        list_serializer_class = _SessionListSerializer
        fields = [
            "id", "name", "owner", "cluster", "cluster_name", "phase", "url", "image", "gpus", "gpu_memory_mib",
            "gpu_cores", "gpu_models", "node", "devices", "message", "volumes", "created_at", "started_at", "ended_at", "last_status_at",
            "stop_reason", "idle_since", "stops_at", "activity", "credits_per_hour", "share", "ends_at", "ends_soon",
            "runtime_hours", "priority", "queued_at", "queue_expires_at", "queue_position", "estimated_start", "waiting_for",
            "alternatives", "admitted_at", "cpu", "memory_gib",
        ]
        read_only_fields = fields

    @staticmethod
    def _row(obj: Session):
        try:
            return obj.activity
        except Session.activity.RelatedObjectDoesNotExist:
            return None

    def _pending(self, obj: Session) -> dict:
        pending = self.context.get("pending_connections")
        if pending is None:
            pending = (session_activity.connections_pending([obj.public_id]) if obj.is_live else None) or {}
            self.context["pending_connections"] = pending
        return pending

    def _policy(self, obj: Session) -> admission.EffectivePolicy:
        """Its owner's policy: the page's (read once by the list), else read once per owner and answer."""
        policies = self.context.setdefault("policies", {})
        if obj.owner_id not in policies:
            policies[obj.owner_id] = admission.policy_for(obj.owner)
        return policies[obj.owner_id]

    def _judgement(self, obj: Session) -> idle.IdleJudgement:
        """``sessions.idle.idle_status`` now: the rule the stop task acts on (once per session and answer)."""
        cache = self.context.setdefault("idle_judgements", {})
        if obj.pk not in cache:
            if obj.phase != Session.Phase.RUNNING:
                cache[obj.pk] = idle.IdleJudgement()
            else:
                policy = self._policy(obj)
                row = self._row(obj)
                connected = session_activity.last_connection(row, self._pending(obj), obj.public_id)
                cache[obj.pk] = idle.idle_status(session=obj, row=row, policy=policy, connected=connected, now=timezone.now())
        return cache[obj.pk]

    def get_ends_soon(self, obj: Session) -> bool:
        """True while the time limit's warning runs: the session is live, not stopping, and ``ends_at`` is within its owner's policy's
        ``runtime_warning_minutes`` (``sessions.runtime.runtime_warning``); it is stopped at ``ends_at`` unless extended."""
        if obj.ends_at is None or not obj.offers_stop:
            return False
        return runtime.runtime_warning(session=obj, policy=self._policy(obj), now=timezone.now())

    def get_idle_since(self, obj: Session) -> str | None:
        """While the idle policy's warning runs: since when its GPUs ran no kernel (or, while connections count, nobody
        connected) (else null)."""
        return _time(self._judgement(obj).idle_since)

    def get_stops_at(self, obj: Session) -> str | None:
        """While the idle policy's warning runs: when it stops the session (else null)."""
        return _time(self._judgement(obj).stops_at)

    def get_activity(self, obj: Session) -> dict:
        """GPU activity from HAMi's vGPU monitor (per GPU: ``last_kernel_seconds`` as of its ``sampled_at``,
        ``utilization_percent``, ``memory_used_bytes``/``memory_limit_bytes``), ``state`` (``ok``, ``unknown`` with
        ``reason``, ``none`` before any reading), ``last_kernel_at``, ``last_connected_at``, any idle exemption, and how the
        idle policy reads connections now: ``connections_count`` (they reset the idle clock: GPU activity of some GPU is
        not reported) and ``stop_postponed`` (a connection during the warning postponed the stop, once)."""
        row = self._row(obj)
        connected = session_activity.last_connection(row, self._pending(obj), obj.public_id)
        judgement = self._judgement(obj)
        rule = {"connections_count": judgement.connections_count, "stop_postponed": judgement.postponed}
        if row is None:
            return {"state": "none", "reason": "", "sampled_at": None, "gpus": [], "last_kernel_at": None,
                    "last_connected_at": _time(connected), "exempt_until": None, "exempt_reason": "", "exempt_by": "", **rule}
        return {
            "state": row.state or "none", "reason": row.reason, "sampled_at": _time(row.sampled_at), "gpus": row.gpus,
            "last_kernel_at": _time(row.last_kernel_at), "last_connected_at": _time(connected),
            "exempt_until": _time(row.exempt_until), "exempt_reason": row.exempt_reason, "exempt_by": row.exempt_by, **rule,
        }

    @extend_schema_field(serializers.DecimalField(max_digits=18, decimal_places=CREDIT_PLACES, allow_null=True))
    def get_credits_per_hour(self, obj: Session) -> str | None:
        """What the session costs per hour while it holds its GPUs (Σ over its GPUs of the model's price × its share:
        the rate usage is charged at, ``billing.selectors.session_hourly_cost``), a decimal string; null once ended or while
        queued."""
        if not obj.is_live or obj.phase == Session.Phase.QUEUED:  # a queued session holds nothing yet
            return None
        prices = self.context.get("prices")
        if prices is None:
            prices = self.context["prices"] = pricing.prices_by_model()
        return serializers.DecimalField(max_digits=18, decimal_places=CREDIT_PLACES).to_representation(session_hourly_cost(obj, prices))

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
