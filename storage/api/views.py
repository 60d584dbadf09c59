"""Public API views for storage pools, volumes and the storage summary. They parse input and call services/selectors."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from clusters.filters import HELP as CLUSTER_HELP
from clusters.filters import cluster_param
from gshare.api import IsStaffOrReadOnly as StaffWriteOrReadOnly
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
from storage.move import volume_move

CLUSTER_FILTER = OpenApiParameter("cluster", str, description=CLUSTER_HELP)


class IsStaffOrReadOnly(StaffWriteOrReadOnly):
    """Anyone authenticated may read; only staff may change storage pools."""

    message = "Only staff users may change storage pools: ask an operator of this control plane."


def _pool_data(pools, *, request, many: bool = False):
    """Serialized pool(s), with where each is usable computed once for all of them (staff: with the wiring)."""
    listed = list(pools) if many else [pools]
    serializer = PoolStaffSerializer if request.user.is_staff else PoolSerializer
    data = serializer(listed, many=True, context={"usability": pools_usability(listed)}).data
    return data if many else data[0]


def _pool_changes(data: dict) -> dict:
    """Serializer output -> service arguments: cluster references become ``Cluster`` rows."""
    changes = dict(data)
    if "cluster" in changes:
        changes["cluster"] = selectors.cluster_by_ref(changes["cluster"])
    if "allowed_clusters" in changes:
        changes["allowed_clusters"] = [selectors.cluster_by_ref(ref) for ref in dict.fromkeys(changes["allowed_clusters"] or [])]
    return changes


class StoragePoolViewSet(viewsets.GenericViewSet):
    """``/api/v1/storage/pools``: register, list, show, change, delete storage pools (writes: staff)."""

    serializer_class = PoolSerializer
    permission_classes = [permissions.IsAuthenticated, IsStaffOrReadOnly]
    lookup_field = "public_id"
    lookup_value_regex = "[^/]+"

    @extend_schema(parameters=[OpenApiParameter("cluster", str, description=PoolFilter.base_filters["cluster"].extra["help_text"])],
                   responses=PoolSerializer(many=True))
    def list(self, request):
        """List pools with their stored capacity (``?cluster=``: the pools that cluster may use)."""
        pools = PoolFilter(request.query_params, queryset=selectors.pool_list()).qs
        page = self.paginate_queryset(pools)
        return self.get_paginated_response(_pool_data(page, request=request, many=True))

    @extend_schema(request=PoolCreateSerializer, responses={201: PoolSerializer})
    def create(self, request):
        """Register a pool (staff)."""
        data = PoolCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pool = services.pool_create(**_pool_changes(data.validated_data))
        return Response(_pool_data(selectors.pool_get(public_id=pool.public_id), request=request), status=status.HTTP_201_CREATED)

    @extend_schema(responses=PoolSerializer)
    def retrieve(self, request, public_id: str):
        """Show one pool."""
        return Response(_pool_data(selectors.pool_get(public_id=public_id), request=request))

    @extend_schema(request=PoolUpdateSerializer, responses=PoolSerializer)
    def partial_update(self, request, public_id: str):
        """Change a pool (staff); refused with 409 ``pool_in_use`` when the change would strand its volumes."""
        pool = selectors.pool_get(public_id=public_id)
        data = PoolUpdateSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        services.pool_update(pool=pool, changes=_pool_changes(data.validated_data))
        return Response(_pool_data(selectors.pool_get(public_id=public_id), request=request))

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
class VolumeViewSet(viewsets.GenericViewSet):
    """``/api/v1/storage/volumes``: create, list, show, grow, delete, move. Users see their own; staff see all."""

    serializer_class = VolumeSerializer
    lookup_field = "public_id"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):  # noqa: D102
        return selectors.volume_list(user=self.request.user, owner=self.request.query_params.get("owner"))

    def list(self, request):
        """List volumes (``?cluster=``, ``?pool=``, staff: ``?owner=``); deleted volumes are not listed."""
        page = self.paginate_queryset(VolumeFilter(request.query_params, queryset=self.get_queryset()).qs)
        return self.get_paginated_response(VolumeSerializer(page, many=True).data)

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

    def retrieve(self, request, public_id: str):
        """Show one volume (``status`` and ``status_message`` follow its PVC)."""
        return Response(VolumeSerializer(selectors.volume_get(user=request.user, public_id=public_id)).data)

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
