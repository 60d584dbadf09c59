"""The ``GShareSession`` custom resource the control plane applies to a cluster (pure functions).

Format: ``gshare.io/v1alpha1`` as defined by ``charts/gshare-operator/crds/`` and docs/contracts.md.
"""

from __future__ import annotations

from django.conf import settings

from operator_agent.contract import (
    CLUSTER_ID_LABEL,
    CONNECT_VERIFY_PATH,
    GSHARE_API_GROUP,
    GSHARE_API_VERSION,
    GSHARE_SESSION_KIND,
    SESSION_ID_LABEL,
    SESSION_PORT_DEFAULT,
    session_object_name,
)


def session_path(session_id: str) -> str:
    """The URL path of a session on its cluster's hostname: ``/s/<session id>/``."""
    return f"/s/{session_id}/"


def session_url(session) -> str | None:
    """``https://<cluster session_domain>/s/<session id>/``, or None while the session has no cluster."""
    if session.cluster is None or not session.cluster.session_domain:
        return None
    return f"{settings.GSHARE_SESSION_SCHEME}://{session.cluster.session_domain}{session_path(session.public_id)}"


def gshare_session_manifest(session) -> dict:
    """Build the GShareSession object for ``session`` (with its cluster and owner loaded).

    Returns:
        A dict ready for server-side apply: metadata (name = session id with ``-``, namespace
        ``GSHARE_SESSION_NAMESPACE``, labels), and ``spec`` with image, GPU request (HAMi units:
        ``gpuMemoryMiB`` MiB, ``gpuCores`` percent, both omitted for whole GPUs), host, path and the
        ingress-nginx ``authUrl``.
    """
    spec = {
        "sessionId": session.public_id,
        "owner": session.owner.get_username(),
        "image": session.image,
        "gpus": session.gpus,
        "port": SESSION_PORT_DEFAULT,
        "host": session.cluster.session_domain,
        "path": session_path(session.public_id),
        "authUrl": settings.GSHARE_CONTROL_PLANE_URL.rstrip("/") + CONNECT_VERIFY_PATH,
    }
    if session.gpu_memory_mib is not None:
        spec["gpuMemoryMiB"] = session.gpu_memory_mib
    if session.gpu_cores is not None:
        spec["gpuCores"] = session.gpu_cores
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
