"""Public API views for storage pools, volumes and the storage summary. They parse input and call services/selectors."""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from clusters.filters import HELP as CLUSTER_HELP
from clusters.filters import cluster_param
from core.api.base import IsStaffOrReadOnly as StaffWriteOrReadOnly
from storage import selectors, services
from storage.api.filters import PoolFilter, VolumeFilter
from storage.api.serializers import (
    PoolCreateSerializer,
    PoolSerializer,
    PoolStaffSerializer,
    PoolUpdateSerializer,
    SummarySerializer,
    VolumeCreateSerializer,
    VolumeMoveSerializer,
    VolumeSerializer,
    VolumeUpdateSerializer,
)
from storage.capacity import pools_usability
from storage.models import StoragePool, Volume
from storage.move import volume_move

CLUSTER_FILTER = OpenApiParameter("cluster", str, description=CLUSTER_HELP)


class IsStaffOrReadOnly(StaffWriteOrReadOnly):
    """Anyone authenticated may read; only staff may change storage pools."""

    message = "Only staff users may change storage pools: ask an operator of this control plane."


def _pool_changes(data: dict) -> dict:
    """Serializer output -> service arguments: cluster references become ``Cluster`` rows."""
    changes = dict(data)
    if "cluster" in changes:
        changes["cluster"] = selectors.cluster_by_ref(changes["cluster"])
    if "allowed_clusters" in changes:
        changes["allowed_clusters"] = [selectors.cluster_by_ref(ref) for ref in dict.fromkeys(changes["allowed_clusters"] or [])]
    return changes


@extend_schema_view(
    list=extend_schema(parameters=[OpenApiParameter("cluster", str, description=PoolFilter.base_filters["cluster"].extra["help_text"])],
                       responses=PoolSerializer(many=True),
                       description="List pools with their stored capacity (``?cluster=``: the pools that cluster may use)."),
    retrieve=extend_schema(responses=PoolSerializer, description="Show one pool."),
)
class StoragePoolViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """``/api/v1/storage/pools``: register, list, show, change, delete storage pools (writes: staff)."""

    serializer_class = PoolSerializer
    queryset = StoragePool.objects.none()  # the model, for the schema; get_queryset reads the selector
    permission_classes = [permissions.IsAuthenticated, IsStaffOrReadOnly]
    filter_backends = [DjangoFilterBackend]
    filterset_class = PoolFilter
    lookup_field = "public_id"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):  # noqa: D102
        return selectors.pool_list()

    def get_object(self):
        """The pool of the URL (404 ``pool_not_found``)."""
        return selectors.pool_get(public_id=self.kwargs["public_id"])

    def get_serializer_class(self):  # noqa: D102
        return PoolStaffSerializer if self.request.user and self.request.user.is_staff else PoolSerializer

    def get_serializer(self, instance=None, *args, **kwargs):
        """The serializer, with where each pool is usable computed once for all those serialized (``usability``)."""
        if instance is not None:
            listed = list(instance) if kwargs.get("many") else [instance]
            kwargs["context"] = {**self.get_serializer_context(), "usability": pools_usability(listed)}
            instance = listed if kwargs.get("many") else instance
        return super().get_serializer(instance, *args, **kwargs)

    @extend_schema(request=PoolCreateSerializer, responses={201: PoolSerializer})
    def create(self, request):
        """Register a pool (staff)."""
        data = PoolCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pool = services.pool_create(**_pool_changes(data.validated_data))
        return Response(self.get_serializer(selectors.pool_get(public_id=pool.public_id)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=PoolUpdateSerializer, responses=PoolSerializer)
    def partial_update(self, request, public_id: str):
        """Change a pool (staff); refused with 409 ``pool_in_use`` when the change would strand its volumes."""
        pool = selectors.pool_get(public_id=public_id)
        data = PoolUpdateSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        services.pool_update(pool=pool, changes=_pool_changes(data.validated_data))
        return Response(self.get_serializer(selectors.pool_get(public_id=public_id)).data)

    def destroy(self, request, public_id: str):
        """Delete a pool (staff); refused with 409 ``pool_in_use`` while volumes live on it."""
        services.pool_delete(pool=selectors.pool_get(public_id=public_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(parameters=[CLUSTER_FILTER])
class StorageSummaryViewSet(viewsets.GenericViewSet):
    """``GET /api/v1/storage/summary[?cluster=]``: capacity and allocation, every pool resolved now."""

    serializer_class = SummarySerializer
    pagination_class = None

    @extend_schema(responses=SummarySerializer)
    def list(self, request):
        """The summary (see docs/storage.md#summary for the exact meaning of each number)."""
        return Response(SummarySerializer(selectors.storage_summary(cluster=cluster_param(request.query_params))).data)


@extend_schema(parameters=[
    CLUSTER_FILTER,
    OpenApiParameter("owner", str, description="Staff only: the owner's username"),
    OpenApiParameter("pool", str, description="Pool id (pool_...)"),
])
@extend_schema_view(
    list=extend_schema(description="List volumes (``?cluster=``, ``?pool=``, staff: ``?owner=``); deleted volumes are not listed."),
    retrieve=extend_schema(description="Show one volume (``status`` and ``status_message`` follow its PVC)."),
)
class VolumeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """``/api/v1/storage/volumes``: create, list, show, grow, delete, move. Users see their own; staff see all."""

    serializer_class = VolumeSerializer
    queryset = Volume.objects.none()  # the model, for the schema; get_queryset reads the selector
    filter_backends = [DjangoFilterBackend]
    filterset_class = VolumeFilter
    lookup_field = "public_id"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):  # noqa: D102
        return selectors.volume_list(user=self.request.user, owner=self.request.query_params.get("owner"))

    def get_object(self):
        """The volume of the URL (404 ``volume_not_found``, also for another user's)."""
        return selectors.volume_get(user=self.request.user, public_id=self.kwargs["public_id"])

    @extend_schema(request=VolumeCreateSerializer, responses={201: VolumeSerializer})
    def create(self, request):
        """Create a volume after the capacity gate (409 ``pool_full``, ``pool_capacity_unknown``, ``volume_name_taken``,
        ``volume_not_mountable``)."""
        data = VolumeCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pool_id, cluster_ref = data.validated_data["pool"], data.validated_data["cluster"]
        pool = selectors.pool_get(public_id=pool_id) if pool_id else None
        cluster = selectors.cluster_by_ref(cluster_ref) if cluster_ref else None
        volume = services.volume_create(owner=request.user, name=data.validated_data["name"], quota_gb=data.validated_data["quota_gb"],
                                        pool=pool, cluster=cluster)
        return Response(VolumeSerializer(selectors.volume_get(user=request.user, public_id=volume.public_id)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=VolumeUpdateSerializer, responses=VolumeSerializer)
    def partial_update(self, request, public_id: str):
        """Raise the quota (through the capacity gate); a decrease is refused with 409 ``volume_shrink_unsupported``."""
        volume = selectors.volume_get(user=request.user, public_id=public_id)
        data = VolumeUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.volume_update_quota(volume=volume, quota_gb=data.validated_data["quota_gb"])
        return Response(VolumeSerializer(selectors.volume_get(user=request.user, public_id=public_id)).data)

    @extend_schema(responses=VolumeSerializer)
    def destroy(self, request, public_id: str):
        """Delete a volume and its PVC (409 ``volume_in_use`` while a live session mounts it); answers the deleted volume."""
        volume = services.volume_delete(volume=selectors.volume_get(user=request.user, public_id=public_id))
        volume = selectors.volume_get(user=request.user, public_id=volume.public_id, include_deleted=True)
        return Response(VolumeSerializer(volume).data)

    @extend_schema(request=VolumeMoveSerializer, responses=VolumeSerializer)
    @action(detail=True, methods=["post"])
    def move(self, request, public_id: str):
        """Hand the volume's PVC to another cluster sharing its pool (409 ``volume_move_disabled`` unless enabled)."""
        volume = selectors.volume_get(user=request.user, public_id=public_id)
        data = VolumeMoveSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        volume_move(volume=volume, cluster=selectors.cluster_by_ref(data.validated_data["cluster"]))
        return Response(VolumeSerializer(selectors.volume_get(user=request.user, public_id=public_id)).data)
