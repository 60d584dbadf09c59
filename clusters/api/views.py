"""Public API views for clusters, nodes and GPUs. They parse input and call services/selectors."""

from __future__ import annotations

from django.conf import settings
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema, extend_schema_view
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from clusters import selectors, services
from clusters.api.serializers import (
    ClusterCreateSerializer,
    ClusterSerializer,
    ClusterStaffSerializer,
    ClusterUpdatedSerializer,
    ClusterUpdateSerializer,
    GpuSerializer,
    NodeSerializer,
    NodeStaffSerializer,
)
from clusters.filters import HELP as CLUSTER_HELP
from clusters.filters import ClusterFilter, GpuFilter, NodeFilter
from clusters.models import GpuDevice, Node
from clusters.operator_token.rotation import operator_token_push
from core.api.base import IsStaffOrReadOnly as StaffWriteOrReadOnly

CLUSTER_FILTER = OpenApiParameter("cluster", str, description=CLUSTER_HELP)

#: A cluster as staff see it, or as every other user does (fewer fields): the schema lists both.
CLUSTER_OUT = PolymorphicProxySerializer(
    component_name="ClusterOut", serializers=[ClusterStaffSerializer, ClusterSerializer], resource_type_field_name=None,
)


def _staff(request) -> bool:
    return bool(request.user and request.user.is_staff)


class IsStaffOrReadOnly(StaffWriteOrReadOnly):
    """Anyone authenticated may read; only staff may change the fleet."""

    message = "Only staff users may change clusters: ask an operator of this control plane."


@extend_schema_view(list=extend_schema(responses=CLUSTER_OUT, description="List clusters (``?status=`` filters)."),
                    retrieve=extend_schema(responses=CLUSTER_OUT, description="Show one cluster."))
class ClusterViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """``/api/v1/clusters``: register, list, show, change, deregister, connection test.

    Staff users get :class:`ClusterStaffSerializer`, everyone else :class:`ClusterSerializer` (no apiserver,
    identity, credential or operator token fields).
    """

    serializer_class = ClusterSerializer
    permission_classes = [permissions.IsAuthenticated, IsStaffOrReadOnly]
    filter_backends = [DjangoFilterBackend]
    filterset_class = ClusterFilter
    lookup_field = "public_id"
    lookup_value_regex = "[^/]+"

    def get_serializer_class(self):  # noqa: D102
        return ClusterStaffSerializer if _staff(self.request) else ClusterSerializer

    def get_queryset(self):  # noqa: D102
        return selectors.cluster_list()

    def get_object(self):
        """The cluster of the URL (404 ``cluster_not_found``)."""
        return selectors.cluster_get(public_id=self.kwargs["public_id"])

    @extend_schema(request=ClusterCreateSerializer, responses={201: ClusterStaffSerializer})
    def create(self, request):
        """Register a cluster after probing it (see docs/errors.md for every refusal)."""
        data = ClusterCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        cluster = services.cluster_register(**data.validated_data)
        return Response(ClusterStaffSerializer(selectors.cluster_get(public_id=cluster.public_id)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ClusterUpdateSerializer, responses=ClusterUpdatedSerializer)
    def partial_update(self, request, public_id: str):
        """Change ``session_domain``, ``ingress_node``, ``volume_storage_class``, ``routing``, ``gateway_name``,
        ``gateway_namespace`` and/or the ``kubeconfig``.

        A new kubeconfig must reach the same cluster (409 ``different_cluster`` otherwise); the cluster keeps
        its id, operator and tokens. Refusals as registration's for the kubeconfig (docs/errors.md). A change of the
        routing (or of the Gateway, in gateway-api mode) re-applies every live session of the cluster: the answer's
        ``sessions_reapplied`` says how many (0 otherwise).
        """
        cluster = selectors.cluster_get(public_id=public_id)
        data = ClusterUpdateSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        updated = services.cluster_update(cluster=cluster, changes=data.validated_data, actor=f"api:{request.user.get_username()}")
        shown = selectors.cluster_get(public_id=public_id)
        shown.sessions_reapplied = updated.sessions_reapplied
        return Response(ClusterUpdatedSerializer(shown).data)

    @extend_schema(responses=ClusterStaffSerializer)
    def destroy(self, request, public_id: str):
        """Deregister (refused with 409 ``cluster_busy`` while anything runs on it)."""
        cluster = selectors.cluster_get(public_id=public_id)
        services.cluster_deregister(cluster=cluster, actor=f"api:{request.user.get_username()}")
        return Response(ClusterStaffSerializer(selectors.cluster_get(public_id=public_id)).data)

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"], url_path="connection-test")
    def connection_test(self, request, public_id: str):
        """Probe the cluster now: ``{"status", "checks": {...}, "detail": {...}}``."""
        cluster = selectors.cluster_get(public_id=public_id)
        return Response(services.cluster_connection_test(cluster=cluster))

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"], url_path="operator-token/push")
    def operator_token_push(self, request, public_id: str):
        """Mint a fresh operator token and write it into the cluster's Secret through its apiserver (staff only).

        The same push as the daily rotation (``clusters.operator_token.rotation.operator_token_push``), audited; the
        token itself is never in the answer: ``{"cluster", "outcome", "secret", "secret_action", "generation",
        "expires_at"}``. Refusals: 502 ``token_push_*`` (docs/errors.md), 409 ``cluster_deregistered``.
        """
        cluster = selectors.cluster_get(public_id=public_id)
        result = operator_token_push(cluster)
        return Response({
            "cluster": result.cluster_id, "outcome": result.outcome,
            "secret": f"{settings.GSHARE_OPERATOR_NAMESPACE}/{settings.GSHARE_OPERATOR_TOKEN_SECRET}",
            "secret_action": result.secret_action, "generation": result.generation,
            "expires_at": result.expires_at.isoformat() if result.expires_at else None,
        })


@extend_schema(parameters=[CLUSTER_FILTER], responses=PolymorphicProxySerializer(
    component_name="NodeOut", serializers=[NodeStaffSerializer, NodeSerializer], resource_type_field_name=None, many=True,
))
class NodeViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/nodes[?cluster=]``: GPU nodes from the latest inventories (labels and errors for staff only)."""

    serializer_class = NodeSerializer
    queryset = Node.objects.none()  # the model, for the schema; get_queryset reads the selector
    filter_backends = [DjangoFilterBackend]
    filterset_class = NodeFilter

    def get_serializer_class(self):  # noqa: D102
        return NodeStaffSerializer if _staff(self.request) else NodeSerializer

    def get_queryset(self):  # noqa: D102
        return selectors.node_list()


@extend_schema(parameters=[CLUSTER_FILTER])
class GpuViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/gpus[?cluster=]``: GPU devices from the latest inventories."""

    serializer_class = GpuSerializer
    queryset = GpuDevice.objects.none()  # the model, for the schema; get_queryset reads the selector
    filter_backends = [DjangoFilterBackend]
    filterset_class = GpuFilter

    def get_queryset(self):  # noqa: D102
        return selectors.gpu_list()
