"""Read queries for clusters, nodes and GPUs (querysets with their joins already applied)."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Count, Max, Min, Q, QuerySet, Value

from clusters.errors import CLUSTER_NOT_FOUND
from clusters.models import Cluster, ClusterGpuModel, GpuDevice, Node
from core.exceptions import NotFound


def cluster_list(*, include_deregistered: bool = True) -> QuerySet[Cluster]:
    """Clusters with ``node_count``, ``gpu_count`` and ``gpu_models`` (sorted distinct models) annotations, ordered by name."""
    qs = Cluster.objects.annotate(
        node_count=Count("nodes", distinct=True),
        gpu_count=Count("devices", distinct=True),
        gpu_models=ArrayAgg("devices__model", distinct=True, order_by="devices__model", filter=Q(devices__isnull=False), default=Value([])),
    ).order_by("name", "id")
    if not include_deregistered:
        qs = qs.exclude(status=Cluster.Status.DEREGISTERED)
    return qs


def cluster_get(*, public_id: str) -> Cluster:
    """Return one cluster (annotated as in :func:`cluster_list`).

    Raises:
        NotFound: ``cluster_not_found`` (404).
    """
    cluster = cluster_list().filter(public_id=public_id).first()
    if cluster is None:
        raise NotFound(f"No cluster has the id {public_id!r}: list them with `GET /api/v1/clusters`.", code=CLUSTER_NOT_FOUND)
    return cluster


def node_list() -> QuerySet[Node]:
    """GPU nodes with their cluster and ``gpu_count`` (the API's ``?cluster=``: ``clusters.filters.NodeFilter``)."""
    return Node.objects.select_related("cluster").annotate(gpu_count=Count("devices")).order_by("cluster__name", "name")


def gpu_list() -> QuerySet[GpuDevice]:
    """GPU devices with node and cluster (the API's ``?cluster=``: ``clusters.filters.GpuFilter``)."""
    return GpuDevice.objects.select_related("node", "cluster").order_by("cluster__name", "node__name", "index")


def fleet_gpu_models() -> list[str]:
    """The GPU models of the fleet (``GpuDevice.model`` as the operator reports them: HAMi's device type without its
    ``NVIDIA-`` prefix), distinct and sorted, from the clusters that are not deregistered. One query on the per-cluster
    summary (``ClusterGpuModel``), not on the GPU rows."""
    return list(
        ClusterGpuModel.objects.exclude(cluster__status=Cluster.Status.DEREGISTERED)
        .order_by("model").values_list("model", flat=True).distinct()
    )


def gpu_model_memory() -> dict[str, tuple[int, int]]:
    """Per GPU model of the clusters that take sessions: ``(least, most)`` MiB one of its healthy GPUs on a ready node
    registers (HAMi's memory, after ``deviceMemoryScaling``; usually one figure). One query."""
    rows = (
        GpuDevice.objects.filter(health=True, node__ready=True, cluster__status=Cluster.Status.CONNECTED)
        .exclude(cluster__session_domain="")
        .values("model").annotate(least=Min("memory_mib"), most=Max("memory_mib")).order_by("model")
    )
    return {row["model"]: (row["least"], row["most"]) for row in rows}


def gpu_model_availability(*, cluster_ids: Iterable[int] | None = None) -> list[tuple[str, int, int]]:
    """Per GPU model of the clusters that take sessions (connected, with a session domain): ``(model, free, total)``,
    sorted by model, where ``total`` counts the healthy GPUs on ready nodes and ``free`` those of them with nothing
    reserved on them now (a whole GPU could start there). One query.

    Args:
        cluster_ids: only these clusters (``Cluster`` pks: a policy's ``allowed_clusters``); None: every cluster.
    """
    devices = GpuDevice.objects.filter(health=True, node__ready=True, cluster__status=Cluster.Status.CONNECTED)
    if cluster_ids is not None:
        devices = devices.filter(cluster_id__in=list(cluster_ids))
    rows = (
        devices.exclude(cluster__session_domain="")
        .values("model").annotate(total=Count("id"), free=Count("id", filter=Q(used_count=0))).order_by("model")
    )
    return [(row["model"], row["free"], row["total"]) for row in rows]
