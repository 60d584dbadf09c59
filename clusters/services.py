"""Cluster services: registration, updates, deregistration, connection test, inventory ingest.

These are the only functions that change clusters, nodes and GPU devices; the API, the console,
the management commands and the Celery tasks call them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from clusters.kubeconfig import validate_kubeconfig
from clusters.models import Cluster, GpuDevice, Node, node_summary_update_sql
from clusters.probe import ClusterUnreachable, probe_cluster
from gshare.exceptions import ApplicationError, Conflict, Forbidden
from operator_agent.contract import FORBIDDEN_CLUSTER_SCOPE, GPU_MODE_LABEL

logger = logging.getLogger(__name__)

EDITABLE_FIELDS = ("session_domain", "ingress_node", "volume_storage_class")
_INVENTORY_LOCK_ID = 0x6753_494E  # "gSIN"


class ClusterPrerequisiteMissing(ApplicationError):
    """422: the cluster answers but lacks something gShare needs (RuntimeClass, HAMi)."""

    status = 422
    code = "cluster_prerequisite_missing"


def _name_taken(name: str) -> Conflict:
    return Conflict(
        f"A registered cluster is already named {name!r}: choose another name, or deregister that cluster first "
        "(`DELETE /api/v1/clusters/<id>`).",
        code="name_taken",
    )


def cluster_register(
    *,
    name: str,
    kubeconfig: str,
    session_domain: str = "",
    ingress_node: str = "",
    volume_storage_class: str = "",
) -> Cluster:
    """Validate a kubeconfig, probe the cluster from the control plane, and record it.

    The probe runs before any row is written, bounded by ``GSHARE_PROBE_TIMEOUT`` seconds, and
    outside a transaction, so no lock is held while a slow apiserver is dialled.

    Args:
        name: unique among clusters that are not deregistered (1-63 chars).
        kubeconfig: kubeconfig text (token or client-certificate user, inline data only).
        session_domain: hostname at which this cluster's ingress serves sessions.
        ingress_node: node that runs the cluster's ingress controller.
        volume_storage_class: StorageClass the operator uses for session volumes.

    Returns:
        The new ``Cluster`` (status ``pending`` until its operator's first inventory).

    Raises:
        KubeconfigError: ``kubeconfig_invalid``, ``kubeconfig_localhost``,
            ``kubeconfig_exec_forbidden``, ``kubeconfig_local_file`` (400).
        Conflict: ``name_taken`` (409).
        ClusterUnreachable: ``cluster_unreachable`` (504).
        ClusterAuthFailed: ``cluster_auth_failed`` (400).
        django.core.exceptions.ValidationError: a field is malformed (rendered as 400 ``invalid_request``).
        ClusterPrerequisiteMissing: ``runtime_class_missing`` or ``hami_missing`` (422).
    """
    valid = validate_kubeconfig(kubeconfig, loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST)
    if Cluster.objects.filter(name=name).exclude(status=Cluster.Status.DEREGISTERED).exists():
        raise _name_taken(name)

    cluster = Cluster(
        name=name,
        apiserver_url=valid.server,
        kubeconfig=valid.as_yaml(),
        session_domain=session_domain,
        ingress_node=ingress_node,
        volume_storage_class=volume_storage_class,
        status=Cluster.Status.PENDING,
    )
    cluster.full_clean(validate_constraints=False)  # before dialling anything

    result = probe_cluster(valid.config, server=valid.server, timeout=settings.GSHARE_PROBE_TIMEOUT)
    if not result.checks.get("apiserver_reachable"):
        raise ClusterUnreachable(result.details["apiserver_reachable"])
    if not result.checks.get("runtime_class_nvidia"):
        raise ClusterPrerequisiteMissing(result.details["runtime_class_nvidia"], code="runtime_class_missing")
    if not result.checks.get("hami_device_plugin"):
        raise ClusterPrerequisiteMissing(result.details["hami_device_plugin"], code="hami_missing")
    cluster.kubernetes_version = result.kubernetes_version
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError:
        # Two registrations of one name raced past the check above; the partial unique index decided.
        raise _name_taken(name) from None
    logger.info("cluster registered: %s %s (%s)", cluster.public_id, cluster.name, cluster.kubernetes_version)
    return cluster


@transaction.atomic
def cluster_update(*, cluster: Cluster, changes: dict) -> Cluster:
    """Change a cluster's editable settings.

    Args:
        cluster: the cluster (not deregistered).
        changes: field -> new value; only ``session_domain``, ``ingress_node``, ``volume_storage_class``.

    Raises:
        Conflict: ``cluster_deregistered`` (409) for a deregistered cluster.
        ApplicationError: ``invalid_request`` (400) for a field that cannot be changed.
    """
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict("This cluster is deregistered and can no longer be changed: register it again.", code="cluster_deregistered")
    unknown = set(changes) - set(EDITABLE_FIELDS)
    if unknown:
        raise ApplicationError(
            f"Only {', '.join(EDITABLE_FIELDS)} can be changed; to change {', '.join(sorted(unknown))}, deregister and register again.",
            code="invalid_request",
        )
    for key, value in changes.items():
        setattr(cluster, key, value)
    cluster.full_clean(validate_constraints=False)
    cluster.save(update_fields=list(changes))
    return cluster


def cluster_live_allocations(*, cluster: Cluster) -> int:
    """Return how many live sessions or GPU allocations exist on ``cluster``.

    Later issues (sessions) extend this with their own models; until then nothing is allocated.
    """
    from django.apps import apps

    count = 0
    for model in apps.get_models():
        check = getattr(model, "live_on_cluster", None)
        if callable(check):
            count += check(cluster)
    return count


@transaction.atomic
def cluster_deregister(*, cluster: Cluster) -> Cluster:
    """Deregister a cluster: drop its nodes and devices, keep the row for history.

    From then on its operator tokens are refused with 401 and its name is free. Idempotent.

    Raises:
        Conflict: ``cluster_busy`` (409) while live sessions or GPU allocations exist on it.
    """
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if cluster.status == Cluster.Status.DEREGISTERED:
        return cluster
    live = cluster_live_allocations(cluster=cluster)
    if live:
        raise Conflict(
            f"{live} live session(s) or GPU allocation(s) are on {cluster.name}: stop them "
            "(`DELETE /api/v1/sessions/<id>`) and try again.",
            code="cluster_busy",
        )
    GpuDevice.objects.filter(cluster=cluster).delete()
    Node.objects.filter(cluster=cluster).delete()
    cluster.status = Cluster.Status.DEREGISTERED
    cluster.deregistered_at = timezone.now()
    cluster.save(update_fields=["status", "deregistered_at"])
    logger.info("cluster deregistered: %s %s", cluster.public_id, cluster.name)
    return cluster


def operator_reporting(cluster: Cluster, *, now=None) -> bool:
    """True when the cluster's operator reported within ``GSHARE_HEARTBEAT_STALE_SECONDS``."""
    now = now or timezone.now()
    stale = timedelta(seconds=settings.GSHARE_HEARTBEAT_STALE_SECONDS)
    return cluster.last_heartbeat_at is not None and now - cluster.last_heartbeat_at <= stale


def cluster_connection_test(*, cluster: Cluster) -> dict:
    """Probe the cluster now and record the result and the resulting status.

    Returns:
        ``{"status": "connected"|"degraded"|"unreachable", "checks": {name: bool},
        "detail": {name: sentence}, "kubernetes_version": str, "tested_at": ISO 8601 UTC}``.
        ``connected`` when every check passes, ``unreachable`` when the apiserver did not answer,
        ``degraded`` otherwise.

    Raises:
        Conflict: ``cluster_deregistered`` (409).
    """
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict("This cluster is deregistered: register it again to test it.", code="cluster_deregistered")
    import yaml

    result = probe_cluster(yaml.safe_load(cluster.kubeconfig), server=cluster.apiserver_url, timeout=settings.GSHARE_PROBE_TIMEOUT)
    checks = {name: result.checks.get(name, False) for name in ("apiserver_reachable", "runtime_class_nvidia", "hami_device_plugin", "gpu_nodes")}
    details = dict(result.details)
    if not checks["apiserver_reachable"]:
        for name in ("runtime_class_nvidia", "hami_device_plugin", "gpu_nodes"):
            details.setdefault(name, "Not checked: the apiserver did not answer.")
    checks["operator_reporting"] = operator_reporting(cluster)
    if not checks["operator_reporting"]:
        details["operator_reporting"] = (
            f"The operator has not reported for more than {settings.GSHARE_HEARTBEAT_STALE_SECONDS} s: check its pod "
            "(`kubectl -n gshare-system logs deploy/gshare-operator`) and its token (`manage.py mint_operator_token`)."
        )
    if not checks["apiserver_reachable"]:
        status = Cluster.Status.UNREACHABLE
    elif all(checks.values()):
        status = Cluster.Status.CONNECTED
    else:
        status = Cluster.Status.DEGRADED
    now = timezone.now()
    report = {
        "status": str(status),
        "checks": checks,
        "detail": details,
        "kubernetes_version": result.kubernetes_version,
        "tested_at": now.isoformat(),
    }
    update = {"status": status, "last_connection_test": report, "last_connection_test_at": now}
    if result.kubernetes_version:
        update["kubernetes_version"] = result.kubernetes_version
    Cluster.objects.filter(pk=cluster.pk).exclude(status=Cluster.Status.DEREGISTERED).update(**update)
    for key, value in update.items():
        setattr(cluster, key, value)
    return report


@dataclass(frozen=True)
class InventoryResult:
    """Counts after an inventory snapshot was applied (nodes and GPUs now on record, and removed)."""

    nodes: int
    gpus: int
    nodes_removed: int
    gpus_removed: int


@transaction.atomic
def inventory_apply(*, cluster: Cluster, nodes: list[dict]) -> InventoryResult:
    """Replace a cluster's nodes and GPU devices with a full snapshot from its operator.

    Upserts with ``INSERT ... ON CONFLICT DO UPDATE`` and deletes what is gone, in one transaction
    and a constant number of queries, whatever the number of nodes (asserted in the tests).

    Args:
        cluster: the cluster named in the operator token.
        nodes: validated snapshot nodes: ``{"name", "labels", "ready", "devices": [{"uuid", "index",
            "model", "memory_mib", "split_count", "cores", "health", "mode"?}]}``.

    Returns:
        An ``InventoryResult``.

    Raises:
        Forbidden: ``forbidden_cluster_scope`` (403) when a GPU UUID in the snapshot belongs to
            another cluster; nothing is changed.
        Conflict: ``cluster_deregistered`` (409) if the cluster was deregistered meanwhile.
    """
    with connection.cursor() as cursor:
        # One fleet-wide lock: a GPU UUID's owner is checked and upserted atomically, so two operators
        # reporting the same UUID at once cannot both succeed (HAMi UUIDs are fleet-unique).
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_INVENTORY_LOCK_ID])
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if cluster.status == Cluster.Status.DEREGISTERED:
        raise Conflict("This cluster is deregistered; its inventory is no longer accepted.", code="cluster_deregistered")
    uuids = [device["uuid"] for node in nodes for device in node["devices"]]
    foreign = list(
        GpuDevice.objects.filter(uuid__in=uuids).exclude(cluster=cluster).values_list("uuid", flat=True)[:5]
    )
    if foreign:
        raise Forbidden(
            f"GPU(s) {', '.join(foreign)} belong to another cluster; an operator may only report its own cluster's "
            "GPUs. Check that this operator runs with its own cluster's token.",
            code=FORBIDDEN_CLUSTER_SCOPE,
        )

    now = timezone.now()
    node_rows = [
        Node(
            cluster=cluster,
            cluster_name=cluster.name,
            name=node["name"],
            labels=node.get("labels") or {},
            gpu_mode=(node.get("labels") or {}).get(GPU_MODE_LABEL, ""),
            ready=bool(node.get("ready")),
            inventory_error=(node.get("hami_error") or "")[:500],
            last_seen_at=now,
        )
        for node in nodes
    ]
    names = [row.name for row in node_rows]
    gpus_removed, _ = GpuDevice.objects.filter(cluster=cluster).exclude(uuid__in=uuids).delete()
    _, removed_by_model = Node.objects.filter(cluster=cluster).exclude(name__in=names).delete()
    nodes_removed = removed_by_model.get(Node._meta.label, 0)
    if node_rows:
        Node.objects.bulk_create(
            node_rows,
            update_conflicts=True,
            unique_fields=["cluster", "name"],
            update_fields=["cluster_name", "labels", "gpu_mode", "ready", "inventory_error", "last_seen_at"],
        )
    device_rows = [
        GpuDevice(
            node=row,
            cluster=cluster,
            uuid=device["uuid"],
            index=device["index"],
            model=device["model"],
            memory_mib=device["memory_mib"],
            split_count=device["split_count"],
            cores=device["cores"],
            health=bool(device["health"]),
            mode=device.get("mode") or "",
            last_seen_at=now,
        )
        for row, node in zip(node_rows, nodes, strict=True)
        for device in node["devices"]
    ]
    if device_rows:
        GpuDevice.objects.bulk_create(
            device_rows,
            update_conflicts=True,
            unique_fields=["uuid"],
            # Never the usage counters (used_*): they belong to placement and the reservations.
            update_fields=["node", "index", "model", "memory_mib", "split_count", "cores", "health", "mode", "last_seen_at"],
        )
    restores_connected = _reporting_restores_connected(cluster)
    # One statement for two things, so the query count stays what it was: the heartbeat, and
    # placement's per-node summary (clusters.models.NODE_SUMMARY) recomputed from the device counters
    # for every node of the cluster. GPUs may have gone (their reservations went with them), moved to
    # another node, changed health, or come new; rows already right are not written. The cluster's
    # row lock, held since the start, keeps reservations from changing meanwhile.
    summary = node_summary_update_sql(devices="clusters_gpudevice", nodes_where="n2.cluster_id = %(cluster)s")
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH nodes AS ({summary} RETURNING n.id)
            UPDATE clusters_cluster SET last_heartbeat_at = %(now)s, status = COALESCE(%(status)s, status) WHERE id = %(cluster)s
            """,
            {"cluster": cluster.pk, "now": now, "status": str(Cluster.Status.CONNECTED) if restores_connected else None},
        )
    return InventoryResult(nodes=len(node_rows), gpus=len(device_rows), nodes_removed=nodes_removed, gpus_removed=gpus_removed)


def _reporting_restores_connected(cluster: Cluster) -> bool:
    """A report makes a cluster ``connected`` unless its last connection test found another problem."""
    if cluster.status in (Cluster.Status.PENDING, Cluster.Status.UNREACHABLE):
        return True
    if cluster.status != Cluster.Status.DEGRADED:
        return False
    checks = (cluster.last_connection_test or {}).get("checks", {})
    return all(ok for name, ok in checks.items() if name != "operator_reporting")


def clusters_mark_stale(*, now=None) -> int:
    """Mark connected clusters whose operator stopped reporting as ``degraded``.

    Idempotent: a second run with nothing new changes nothing.

    Returns:
        How many clusters changed status.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.GSHARE_HEARTBEAT_STALE_SECONDS)
    return Cluster.objects.filter(status=Cluster.Status.CONNECTED, last_heartbeat_at__lt=cutoff).update(
        status=Cluster.Status.DEGRADED
    )
