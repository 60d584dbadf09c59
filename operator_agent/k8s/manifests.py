"""Pure functions that build the Kubernetes objects of one session from its ``GShareSession``.

Each function takes the ``GShareSession`` object as the apiserver serves it (a dict with
``apiVersion``, ``kind``, ``metadata`` -- ``name``, ``namespace`` and ``uid`` are required --
and the ``spec`` of ``docs/contracts.md``) and returns a new dict ready for ``create`` or
server-side apply. Nothing here talks to a cluster; the tests validate every object against
the Kubernetes 1.32 schema with ``kubernetes-validate``.

Where the formats come from:

* object shapes: Kubernetes API reference v1.32 (``core/v1`` Pod and Service,
  ``networking.k8s.io/v1`` Ingress);
* owner references: ``metadata.ownerReferences`` with ``controller: true`` and
  ``blockOwnerDeletion: true``, the same entry ``kopf.build_owner_reference`` (used by
  ``kopf.adopt``) builds, so deleting the GShareSession garbage-collects its children;
* GPU resources: HAMi's extended resource names, ``charts/hami/values.yaml`` v2.10.0
  (``resourceName``/``resourceMem``/``resourceCores``; identical since v2.4.0; copy in
  ``/work/shared/fixtures/hami/helm-values.resource-names.v2.10.0.yaml``);
* Ingress annotations: ingress-nginx "External Authentication" and "Custom timeouts"
  annotations (``docs/user-guide/nginx-configuration/annotations.md``);
* Jupyter base URL: ``NOTEBOOK_ARGS`` is appended to the ``jupyter lab`` command line by the
  Jupyter Docker Stacks' ``start-notebook.py`` (``images/base-notebook/start-notebook.py``);
  ``--ServerApp.base_url`` and ``--ServerApp.port`` are Jupyter Server 2 options.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from operator_agent.contract import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    SESSION_ID_LABEL,
    SESSION_PORT_DEFAULT,
    session_object_name,
)

__all__ = [
    "CONTAINER_NAME",
    "HAMI_RESOURCE_CORES",
    "HAMI_RESOURCE_GPU",
    "HAMI_RESOURCE_MEMORY",
    "INGRESS_CLASS",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "RUNTIME_CLASS",
    "session_ingress",
    "session_labels",
    "session_owner_reference",
    "session_pod",
    "session_service",
]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
"""Kubernetes recommended label naming the tool that manages an object."""

MANAGED_BY = "gshare-operator"
"""Value of ``MANAGED_BY_LABEL`` on every object the operator creates."""

COMPONENT_LABEL = "app.kubernetes.io/component"
"""Kubernetes recommended label; ``session`` on session objects."""

RUNTIME_CLASS = "nvidia"
"""RuntimeClass of the NVIDIA container runtime (the one HAMi's device plugin expects)."""

CONTAINER_NAME = "session"
"""Name of the session pod's only container."""

PORT_NAME = "http"
"""Name of the session server's container and Service port."""

HAMI_RESOURCE_GPU = "nvidia.com/gpu"
"""HAMi ``resourceName``: number of vGPUs (GPU shares) the pod asks for (count)."""

HAMI_RESOURCE_MEMORY = "nvidia.com/gpumem"
"""HAMi ``resourceMem``: device memory per vGPU, in MiB."""

HAMI_RESOURCE_CORES = "nvidia.com/gpucores"
"""HAMi ``resourceCores``: share of the GPU's SMs per vGPU, in percent (100 = whole GPU)."""

INGRESS_CLASS = "nginx"
"""IngressClass of the data-plane cluster's ingress-nginx."""

PROXY_TIMEOUT_SECONDS = "3600"
"""ingress-nginx proxy read/send timeout, seconds: idle Jupyter websockets (kernels, terminals) stay open an hour."""

AUTH_RESPONSE_HEADERS = "X-Auth-Request-User"
"""Headers of the verify answer ingress-nginx copies onto the proxied request (the authenticated user)."""

RUN_AS_USER = 1000
"""UID of the session container: ``jovyan`` in the Jupyter Docker Stacks images (never root)."""

RUN_AS_GROUP = 100
"""GID of the session container: ``users`` in the Jupyter Docker Stacks images (also the fsGroup)."""


def session_labels(gss: Mapping[str, Any]) -> dict[str, str]:
    """Labels of every object made for a session.

    Returns:
        ``{"gshare.io/session-id": "ses_...", "app.kubernetes.io/managed-by": "gshare-operator",
        "app.kubernetes.io/component": "session"}``; the session-id label is also the Service's selector.
    """
    return {
        SESSION_ID_LABEL: _spec(gss)["sessionId"],
        MANAGED_BY_LABEL: MANAGED_BY,
        COMPONENT_LABEL: "session",
    }


def session_owner_reference(gss: Mapping[str, Any]) -> dict[str, Any]:
    """The ``metadata.ownerReferences`` entry pointing at the GShareSession.

    Same dict as ``kopf.build_owner_reference(gss)``: ``{"apiVersion", "kind", "name", "uid",
    "controller": True, "blockOwnerDeletion": True}``, so the garbage collector deletes the child
    with its GShareSession and ``kubectl`` shows the session as the controller.
    """
    metadata = gss["metadata"]
    return {
        "apiVersion": gss["apiVersion"],
        "kind": gss["kind"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def session_pod(gss: Mapping[str, Any]) -> dict[str, Any]:
    """The session's Pod (``core/v1``), named ``session_object_name(spec.sessionId)``.

    * ``runtimeClassName: nvidia``, ``nodeSelector: {gpu: "on"}``, ``restartPolicy: Never`` (a session
      that ends is over: the operator reports Succeeded/Failed and never restarts it);
    * one container ``session`` running ``spec.image``, port ``spec.port`` named ``http``;
    * ``resources.limits`` (quantity strings): ``nvidia.com/gpu: spec.gpus``; ``nvidia.com/gpumem`` (MiB) and
      ``nvidia.com/gpucores`` (percent) only when ``spec.gpuMemoryMiB``/``spec.gpuCores`` are given
      (HAMi resource names; omitted = whole GPUs);
    * env ``GSHARE_SESSION_ID`` (``ses_...``), ``GSHARE_BASE_PATH`` (``spec.path``, the URL prefix the
      Ingress routes) and ``NOTEBOOK_ARGS`` (``--ServerApp.base_url=<path> --ServerApp.port=<port>``,
      read by the Jupyter Docker Stacks' start script);
    * non-root (UID 1000, GID 100), no privilege escalation, all capabilities dropped, RuntimeDefault
      seccomp, no service-account token mounted, no service links;
    * labels ``session_labels``; owned by the GShareSession (``session_owner_reference``).
    """
    spec = _spec(gss)
    session_id = spec["sessionId"]
    port = _port(spec)
    path = spec["path"]
    # Quantities as strings (the apiserver's canonical form; the typed kubernetes client refuses ints).
    limits: dict[str, str] = {HAMI_RESOURCE_GPU: str(int(spec["gpus"]))}
    if spec.get("gpuMemoryMiB") is not None:
        limits[HAMI_RESOURCE_MEMORY] = str(int(spec["gpuMemoryMiB"]))
    if spec.get("gpuCores") is not None:
        limits[HAMI_RESOURCE_CORES] = str(int(spec["gpuCores"]))
    notebook_args = shlex.join([f"--ServerApp.base_url={path}", f"--ServerApp.port={port}"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(gss),
        "spec": {
            "runtimeClassName": RUNTIME_CLASS,
            "nodeSelector": {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE},
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUN_AS_USER,
                "runAsGroup": RUN_AS_GROUP,
                "fsGroup": RUN_AS_GROUP,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER_NAME,
                    "image": spec["image"],
                    "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
                    "env": [
                        {"name": "GSHARE_SESSION_ID", "value": session_id},
                        {"name": "GSHARE_BASE_PATH", "value": path},
                        {"name": "NOTEBOOK_ARGS", "value": notebook_args},
                    ],
                    "resources": {"limits": limits},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def session_service(gss: Mapping[str, Any]) -> dict[str, Any]:
    """The session's Service (``core/v1``): ClusterIP, port ``spec.port`` (``http``) to the pod's ``http`` port.

    Selects the pod by the ``gshare.io/session-id`` label only; same name, labels and owner as the pod.
    """
    spec = _spec(gss)
    port = _port(spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(gss),
        "spec": {
            "type": "ClusterIP",
            "selector": {SESSION_ID_LABEL: spec["sessionId"]},
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }


def session_ingress(gss: Mapping[str, Any]) -> dict[str, Any]:
    """The session's Ingress (``networking.k8s.io/v1``) for ingress-nginx.

    ``ingressClassName: nginx``; one rule ``spec.host`` + ``spec.path`` (``Prefix``) to the session
    Service's ``http`` port. ingress-nginx annotations:

    * ``auth-url: spec.authUrl`` -- every request is first checked by the control plane's
      ``/internal/connect/verify`` (2xx lets it through, 401/403 refuse it);
    * ``auth-response-headers: X-Auth-Request-User`` -- the verified user reaches the pod;
    * ``auth-always-set-cookie: "true"`` -- the ``Set-Cookie`` of the verify answer reaches the
      browser whatever the pod answers (by default ingress-nginx adds it only when the upstream
      answers 200/201/204/206/30x, so a first visit answered 404 by the pod would lose the cookie);
    * ``proxy-read-timeout``/``proxy-send-timeout: "3600"`` -- kernel websockets are not cut after
      the default 60 s of silence;
    * ``proxy-body-size: "0"`` -- no request body limit, so saving a notebook larger than
      ingress-nginx's default 1 MiB does not fail with 413.

    No ``auth-signin``: the connect flow hands the browser its cookie; an unauthenticated request
    gets the verify endpoint's 401/403.
    """
    spec = _spec(gss)
    metadata = _metadata(gss)
    metadata["annotations"] = {
        "nginx.ingress.kubernetes.io/auth-url": spec["authUrl"],
        "nginx.ingress.kubernetes.io/auth-response-headers": AUTH_RESPONSE_HEADERS,
        "nginx.ingress.kubernetes.io/auth-always-set-cookie": "true",
        "nginx.ingress.kubernetes.io/proxy-read-timeout": PROXY_TIMEOUT_SECONDS,
        "nginx.ingress.kubernetes.io/proxy-send-timeout": PROXY_TIMEOUT_SECONDS,
        "nginx.ingress.kubernetes.io/proxy-body-size": "0",
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": metadata,
        "spec": {
            "ingressClassName": INGRESS_CLASS,
            "rules": [
                {
                    "host": spec["host"],
                    "http": {
                        "paths": [
                            {
                                "path": spec["path"],
                                "pathType": "Prefix",
                                "backend": {
                                    "service": {
                                        "name": session_object_name(spec["sessionId"]),
                                        "port": {"name": PORT_NAME},
                                    }
                                },
                            }
                        ]
                    },
                }
            ],
        },
    }


def _spec(gss: Mapping[str, Any]) -> Mapping[str, Any]:
    """The GShareSession's ``spec``."""
    return gss["spec"]


def _port(spec: Mapping[str, Any]) -> int:
    """``spec.port`` as an int (``SESSION_PORT_DEFAULT``, 8888, when absent: the CRD defaults it too)."""
    return int(spec.get("port") or SESSION_PORT_DEFAULT)


def _metadata(gss: Mapping[str, Any]) -> dict[str, Any]:
    """Name, namespace, labels and owner reference shared by the session's Pod, Service and Ingress."""
    return {
        "name": session_object_name(_spec(gss)["sessionId"]),
        "namespace": gss["metadata"]["namespace"],
        "labels": session_labels(gss),
        "ownerReferences": [session_owner_reference(gss)],
    }
