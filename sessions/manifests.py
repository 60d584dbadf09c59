"""The ``GShareSession`` custom resource the control plane applies to a cluster (pure functions).

Format: ``gshare.io/v1alpha1`` as defined by ``charts/gshare-operator/crds/`` and docs/contracts.md.
"""

from __future__ import annotations

from django.conf import settings

from contract import (
    CLUSTER_ID_LABEL,
    CONNECT_EXT_AUTHZ_PATH,
    CONNECT_VERIFY_PATH,
    GSHARE_API_GROUP,
    GSHARE_API_VERSION,
    GSHARE_SESSION_KIND,
    ROUTING_GATEWAY_API,
    SESSION_ID_LABEL,
    SESSION_PORT_DEFAULT,
    session_object_name,
)
from sessions.resources import cpu_millicores, memory_mib


def session_path(session_id: str) -> str:
    """The URL path of a session on its cluster's hostname: ``/s/<session id>/``."""
    return f"/s/{session_id}/"


def session_url(session) -> str | None:
    """``https://<cluster session_domain>/s/<session id>/`` (``:<GSHARE_SESSION_PORT>`` after the domain when set), or
    None while the session has no cluster."""
    if session.cluster is None or not session.cluster.session_domain:
        return None
    port = f":{settings.GSHARE_SESSION_PORT}" if settings.GSHARE_SESSION_PORT else ""
    return f"{settings.GSHARE_SESSION_SCHEME}://{session.cluster.session_domain}{port}{session_path(session.public_id)}"


def volume_mount_path(name: str) -> str:
    """Where a volume is mounted in the session's container: ``/data/<volume name>``."""
    return f"/data/{name}"


def session_volumes_spec(volumes) -> list[dict]:
    """``spec.volumes`` of a GShareSession: one entry per volume (with its pool loaded), by name.

    Each entry: ``volumeId``, ``name``, ``claimName`` (the PVC in the session namespace the operator
    creates if missing), ``storageClassName`` (the pool's class), ``size`` (the quota, ``<n>Gi``),
    ``mountPath`` (``/data/<name>``).
    """
    return [
        {
            "volumeId": vol.public_id,
            "name": vol.name,
            "claimName": vol.claim_name,
            "storageClassName": vol.pool.storage_class,
            "size": f"{vol.quota_gb}Gi",
            "mountPath": volume_mount_path(vol.name),
        }
        for vol in sorted(volumes, key=lambda v: (v.name, v.pk))
    ]


def share_gpu_limits(session) -> dict:
    """The HAMi limits of ``session``'s GShareSession: ``{"gpuMemoryMiB": MiB, "gpuCores": percent}``, each key only
    when known; ``{}`` for whole GPUs.

    What HAMi is asked to enforce is what placement reserved and what the share is priced at (docs/billing.md,
    "What a share takes"): ``gpu_cores`` is the cores reserved (placement writes it back, 100 when none were asked),
    and a share that asked no memory holds each GPU's whole memory, written out (its allocations' MiB, when its
    GPUs register the same memory) so that a HAMi configured with ``nvidia.defaultMem`` cannot hand it less. GPUs
    of different memory on one node keep HAMi's default, 100 % of each (``nvidia.defaultMem`` 0). One query for a
    share without memory whose allocations are not prefetched.
    """
    if session.whole_gpus:
        return {}
    limits = {}
    if session.gpu_memory_mib is not None:
        limits["gpuMemoryMiB"] = session.gpu_memory_mib
    elif session.pk is not None:
        reserved = {a.memory_mib for a in session.allocations.all()}
        if len(reserved) == 1:
            limits["gpuMemoryMiB"] = reserved.pop()
    if session.gpu_cores is not None:
        limits["gpuCores"] = session.gpu_cores
    return limits


def gshare_session_manifest(session, *, gpu_uuids: list[str] | None = None) -> dict:
    """Build the GShareSession object for ``session`` (with its cluster, owner and volumes' pools loaded); ``gpu_uuids``
    (``sessions.gpu_models.hami_gpu_uuids``), when not empty, becomes ``spec.gpuUuids``: the only GPUs HAMi may give it.

    Returns:
        A dict ready for server-side apply: metadata (name = session id with ``-``, namespace
        ``GSHARE_SESSION_NAMESPACE``, labels), and ``spec`` with image, GPU request (HAMi units:
        ``gpuMemoryMiB`` MiB, ``gpuCores`` percent, both omitted for whole GPUs; for a share, what placement reserved:
        ``share_gpu_limits``), ``gpuModels`` (the accepted GPU models, only when the session names some), ``cpuMillicores``
        and ``memoryMiB`` (the pod's CPU and memory, requests = limits; only when the session has them: sessions made
        before CPU requests keep their pod's shape), host, path, the cluster's
        ``routing`` (``gateway-api``: with ``gateway`` {name, namespace}), the ingress-nginx ``authUrl``, Envoy's
        ``extAuthUrl`` (the ext_authz path prefix) and, when the session mounts volumes, ``volumes``
        (``session_volumes_spec``).
    """
    spec = {
        "sessionId": session.public_id,
        "owner": session.owner.get_username(),
        "image": session.image,
        "gpus": session.gpus,
        "port": SESSION_PORT_DEFAULT,
        "host": session.cluster.session_domain,
        "path": session_path(session.public_id),
        "routing": session.cluster.routing,
        "authUrl": settings.GSHARE_CONTROL_PLANE_URL.rstrip("/") + CONNECT_VERIFY_PATH,
        "extAuthUrl": settings.GSHARE_CONTROL_PLANE_URL.rstrip("/") + CONNECT_EXT_AUTHZ_PATH,
    }
    if session.cluster.routing == ROUTING_GATEWAY_API:
        spec["gateway"] = {"name": session.cluster.gateway_name, "namespace": session.cluster.gateway_namespace}
    spec.update(share_gpu_limits(session))
    if session.gpu_models:
        spec["gpuModels"] = list(session.gpu_models)
    if session.cpu is not None:
        spec["cpuMillicores"] = cpu_millicores(session.cpu)
    if session.memory_gib is not None:
        spec["memoryMiB"] = memory_mib(session.memory_gib)
    if gpu_uuids:
        spec["gpuUuids"] = list(gpu_uuids)
    volumes = session_volumes_spec(session.volumes.all()) if session.pk is not None else []
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": f"{GSHARE_API_GROUP}/{GSHARE_API_VERSION}",
        "kind": GSHARE_SESSION_KIND,
        "metadata": {
            "name": session_object_name(session.public_id),
            "namespace": settings.GSHARE_SESSION_NAMESPACE,
            "labels": {SESSION_ID_LABEL: session.public_id, CLUSTER_ID_LABEL: session.cluster.public_id},
        },
        "spec": spec,
    }
