"""Serializers of the clusters API. Input and output serializers differ; the kubeconfig is input only."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from clusters.diagnosis import cluster_problems
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_token.rotation import operator_token_state
from clusters.services import CREDENTIAL_FIELD, EDITABLE_FIELDS
from core.api.fields import RefuseUnknownFieldsMixin

HOSTNAME_HELP = "A DNS name (RFC 1123), e.g. gpu-a.example.com"
ROUTING_HELP = (
    "How sessions are reached: gateway-api (an HTTPRoute per session on the Gateway below, Envoy Gateway's ext_authz) "
    "or ingress-nginx (an Ingress per session with its auth-url; retired upstream on 2026-03-24). Refused with 400 "
    "invalid_routing otherwise."
)
GATEWAY_NAME_HELP = "The Gateway session HTTPRoutes attach to (gateway-api), a DNS name; 400 invalid_gateway_name otherwise"
GATEWAY_NAMESPACE_HELP = "Namespace of that Gateway, a DNS label; 400 invalid_gateway_namespace otherwise"


class ServiceCheckedField(serializers.CharField):
    """A string setting whose rules, and the stable code of their refusal, are the service's (``clusters.routing_mode``):
    the value is passed on as given (a number or a list too), so every malformed value gets that code."""

    def __init__(self, **kwargs):
        super().__init__(required=False, allow_blank=True, trim_whitespace=False, **kwargs)
        self.validators = []  # CharField's own (NUL, surrogates) would answer invalid_request; the service refuses them

    def to_internal_value(self, data):  # noqa: D102
        return data


class ClusterCreateSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/clusters``."""

    name = serializers.RegexField(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", max_length=63, error_messages={
        "invalid": "must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit (e.g. lab-c1)",
    })
    kubeconfig = serializers.CharField(trim_whitespace=False, write_only=True, max_length=256 * 1024)
    session_domain = serializers.CharField(required=False, allow_blank=True, default="", max_length=253, help_text=HOSTNAME_HELP)
    ingress_node = serializers.CharField(required=False, allow_blank=True, default="", max_length=253)
    volume_storage_class = serializers.CharField(required=False, allow_blank=True, default="", max_length=253)
    routing = ServiceCheckedField(help_text=ROUTING_HELP + " Default ingress-nginx (attach_cluster registers gateway-api).")
    gateway_name = ServiceCheckedField(help_text=GATEWAY_NAME_HELP + " (default gshare-sessions)")
    gateway_namespace = ServiceCheckedField(help_text=GATEWAY_NAMESPACE_HELP + " (default gshare-system)")


class ClusterUpdateSerializer(RefuseUnknownFieldsMixin, serializers.Serializer):
    """Input of ``PATCH /api/v1/clusters/{id}``: only these fields can change (``kubeconfig``: same cluster only)."""

    def unknown_fields_message(self, unknown: list[str]) -> str:  # noqa: D102
        return (f"Only {', '.join(EDITABLE_FIELDS)} and {CREDENTIAL_FIELD} can be changed; to change {', '.join(unknown)}, "
                "deregister and register again.")

    session_domain = serializers.CharField(required=False, allow_blank=True, max_length=253, help_text=HOSTNAME_HELP)
    ingress_node = serializers.CharField(required=False, allow_blank=True, max_length=253)
    volume_storage_class = serializers.CharField(required=False, allow_blank=True, max_length=253)
    routing = ServiceCheckedField(help_text=ROUTING_HELP + " A change re-applies the cluster's live sessions.")
    gateway_name = ServiceCheckedField(help_text=GATEWAY_NAME_HELP)
    gateway_namespace = ServiceCheckedField(help_text=GATEWAY_NAMESPACE_HELP)
    kubeconfig = serializers.CharField(
        required=False, trim_whitespace=False, write_only=True, max_length=256 * 1024,
        help_text="A new kubeconfig for the same cluster (checked like registration's, probed; its kube-system uid must match). Never returned.",
    )


class OperatorTokenSerializer(serializers.Serializer):
    """The cluster's operator token as ``GET /api/v1/clusters/{id}`` shows it (never the token itself)."""

    expires_at = serializers.DateTimeField(allow_null=True, help_text="Expiry of the newest token issued (UTC)")
    rotated_at = serializers.DateTimeField(allow_null=True, help_text="When a rotation last wrote a token into the cluster's Secret")
    last_rotation_error = serializers.CharField(allow_blank=True, help_text="Why the last rotation failed; empty when it succeeded")
    warning = serializers.CharField(allow_null=True, help_text="Null, or a sentence naming the problem and the fix (docs/rotation.md)")


class ClusterSerializer(serializers.ModelSerializer):
    """Output of the clusters API for every user: what a researcher needs to pick a cluster.

    Nothing about how the control plane reaches the cluster (apiserver, identity, credential, operator token)
    or how it is wired (ingress node, storage class, Gateway): that is :class:`ClusterStaffSerializer`'s. The routing
    mode is shown to everyone (it decides how a session's URL is served).
    """

    id = serializers.CharField(source="public_id", read_only=True)
    node_count = serializers.IntegerField(read_only=True, default=0)
    gpu_count = serializers.IntegerField(read_only=True, default=0)
    gpu_models = serializers.ListField(
        child=serializers.CharField(), read_only=True, default=list, help_text="GPU models on the cluster's nodes, sorted"
    )

    class Meta:
        model = Cluster
        fields = ["id", "name", "status", "session_domain", "routing", "gpu_models", "node_count", "gpu_count", "registered_at",
                  "deregistered_at"]
        read_only_fields = fields


#: Fields of a cluster only staff users see (``GET /api/v1/clusters`` answers them to staff alone).
CLUSTER_STAFF_FIELDS = [
    "apiserver_url", "kube_system_uid", "credential_generation", "operator_token", "ingress_node", "volume_storage_class",
    "gateway_name", "gateway_namespace", "kubernetes_version", "last_heartbeat_at", "heartbeat_age_seconds", "last_connection_test", "last_connection_test_at",
    "operator_checks", "problems",
]


class ProblemSerializer(serializers.Serializer):
    """One problem of a cluster as ``GET /api/v1/clusters/{id}`` shows it (``clusters.diagnosis.cluster_problems``)."""

    check = serializers.CharField(help_text="The connection-test check that fails (or operator_token)")
    detail = serializers.CharField(help_text="What is wrong and the fix")


class ClusterStaffSerializer(ClusterSerializer):
    """Output of the clusters API for staff users: :class:`ClusterSerializer` plus ``CLUSTER_STAFF_FIELDS``.

    Never includes the kubeconfig.
    """

    heartbeat_age_seconds = serializers.SerializerMethodField()
    operator_token = serializers.SerializerMethodField()
    problems = serializers.SerializerMethodField()
    operator_checks = serializers.JSONField(
        read_only=True,
        help_text="The session-path checks the operator last reported from inside the cluster: name -> {ok, detail, "
                  "checked_at}; {} when it reported none",
    )

    class Meta(ClusterSerializer.Meta):
        fields = [*ClusterSerializer.Meta.fields, *CLUSTER_STAFF_FIELDS]
        read_only_fields = fields

    def get_heartbeat_age_seconds(self, obj: Cluster) -> int | None:
        """Seconds since the operator's last report, or null if it never reported."""
        if obj.last_heartbeat_at is None:
            return None
        return int((timezone.now() - obj.last_heartbeat_at).total_seconds())

    @extend_schema_field(ProblemSerializer(many=True))
    def get_problems(self, obj: Cluster) -> list[dict]:
        """Every problem known now, each with its fix (``[]`` when none; no query of its own)."""
        return ProblemSerializer(cluster_problems(obj), many=True).data

    @extend_schema_field(OperatorTokenSerializer)
    def get_operator_token(self, obj: Cluster) -> dict:
        """``{"expires_at", "rotated_at", "last_rotation_error", "warning"}`` (no query of its own)."""
        return OperatorTokenSerializer(operator_token_state(obj)).data


class ClusterUpdatedSerializer(ClusterStaffSerializer):
    """Answer of ``PATCH /api/v1/clusters/{id}``: :class:`ClusterStaffSerializer` and how many live sessions the change
    re-applies (``clusters.services.cluster_update``)."""

    sessions_reapplied = serializers.IntegerField(
        read_only=True, default=0,
        help_text="Live sessions (Scheduled, Starting, Running) re-applied because the routing or its Gateway changed; 0 otherwise",
    )

    class Meta(ClusterStaffSerializer.Meta):
        fields = [*ClusterStaffSerializer.Meta.fields, "sessions_reapplied"]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    """Output of ``GET /api/v1/nodes`` for every user (no labels: they describe the host, not the GPUs)."""

    cluster = serializers.CharField(source="cluster.public_id", read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    gpu_count = serializers.IntegerField(read_only=True, default=0)
    last_seen_at = serializers.DateTimeField(source="reported_at", read_only=True, help_text="When the operator last reported the node")

    class Meta:
        model = Node
        fields = ["name", "cluster", "cluster_name", "gpu_mode", "ready", "last_seen_at", "gpu_count"]
        read_only_fields = fields


#: Fields of a node only staff users see.
NODE_STAFF_FIELDS = ["labels", "inventory_error"]


class NodeStaffSerializer(NodeSerializer):
    """Output of ``GET /api/v1/nodes`` for staff users: :class:`NodeSerializer` plus ``NODE_STAFF_FIELDS``."""

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, *NODE_STAFF_FIELDS]
        read_only_fields = fields


class GpuSerializer(serializers.ModelSerializer):
    """Output of ``GET /api/v1/gpus`` (every user): one physical GPU (memory in MiB, cores in percent of one GPU)."""

    cluster = serializers.CharField(source="cluster.public_id", read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True)
    last_seen_at = serializers.DateTimeField(source="reported_at", read_only=True, help_text="When the operator last reported the GPU")

    class Meta:
        model = GpuDevice
        fields = ["uuid", "cluster", "cluster_name", "node", "index", "model", "memory_mib", "split_count", "cores", "health", "mode", "last_seen_at"]
        read_only_fields = fields
