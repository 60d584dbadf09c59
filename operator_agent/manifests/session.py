"""Pure functions that build the Kubernetes objects of one session from its ``GShareSession`` (routing aside).

Each function takes the ``GShareSession`` object as the apiserver serves it (a dict with
``apiVersion``, ``kind``, ``metadata`` -- ``name``, ``namespace`` and ``uid`` are required --
and the ``spec`` of ``docs/contracts.md``) and returns a new dict ready for ``create`` or
server-side apply. Nothing here talks to a cluster; the tests validate every object against
the Kubernetes 1.32 schema with ``kubernetes-validate``.

Where the formats come from:

* object shapes: Kubernetes API reference v1.32 (``core/v1`` Pod, Service and PersistentVolumeClaim);
* owner references: ``metadata.ownerReferences`` with ``controller: true`` and
  ``blockOwnerDeletion: true``, the same entry ``kopf.build_owner_reference`` (used by
  ``kopf.adopt``) builds, so deleting the GShareSession garbage-collects its children;
* GPU resources: HAMi's extended resource names, ``charts/hami/values.yaml`` v2.10.0
  (``resourceName``/``resourceMem``/``resourceCores``; identical since v2.4.0; copy in
  ``/work/shared/fixtures/hami/helm-values.resource-names.v2.10.0.yaml``);
* routing objects (Ingress, HTTPRoute, Envoy Gateway policies): ``operator_agent.manifests.routing``;
* session volumes: ``core/v1`` PersistentVolumeClaim (``ReadWriteMany``: every cluster mounts the same NFS
  export through its democratic-csi driver, and a session pod may land on any node), mounted through a
  ``persistentVolumeClaim`` pod volume;
* Jupyter base URL: ``NOTEBOOK_ARGS`` is appended to the ``jupyter lab`` command line by the
  Jupyter Docker Stacks' ``start-notebook.py`` (``images/base-notebook/start-notebook.py``);
  ``--ServerApp.base_url`` and ``--ServerApp.port`` are Jupyter Server 2 options.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from typing import Any

from contract import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    SESSION_ID_LABEL,
    SESSION_PORT_DEFAULT,
    VOLUME_ID_LABEL,
    VOLUME_MANAGED_BY,
    VOLUME_NAME_LABEL,
    session_object_name,
)

__all__ = [
    "CONTAINER_NAME",
    "HAMI_RESOURCE_CORES",
    "HAMI_RESOURCE_GPU",
    "HAMI_RESOURCE_MEMORY",
    "HAMI_USE_GPUTYPE",
    "HAMI_USE_GPUUUID",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "PORT_NAME",
    "RUNTIME_CLASS",
    "SHM_PATH",
    "SHM_VOLUME",
    "VOLUME_ACCESS_MODES",
    "cpu_quantity",
    "pod_volume_name",
    "session_labels",
    "session_metadata",
    "session_owner_reference",
    "session_pod",
    "session_port",
    "session_pvc",
    "session_service",
    "session_volumes",
    "shm_size",
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

HAMI_USE_GPUTYPE = "nvidia.com/use-gputype"
"""HAMi Pod annotation: comma-separated GPU types; HAMi's scheduler only uses a GPU whose type contains one of them,
ignoring case (``checkGPUtype`` in HAMi's ``pkg/device/nvidia/device.go``, v2.x: ``strings.Contains`` of the upper-cased
type and entry; entries split on ``,`` and not trimmed)."""

HAMI_USE_GPUUUID = "nvidia.com/use-gpuuuid"
"""HAMi Pod annotation: comma-separated GPU UUIDs; HAMi's scheduler only uses a GPU whose UUID is one of them (exact)."""

RUN_AS_USER = 1000
"""UID of the session container: ``jovyan`` in the Jupyter Docker Stacks images (never root)."""

RUN_AS_GROUP = 100
"""GID of the session container: ``users`` in the Jupyter Docker Stacks images (also the fsGroup)."""

VOLUME_ACCESS_MODES = ("ReadWriteMany",)
"""Access modes of a volume's PVC: NFS, mountable from every node (and cluster) at once."""

SHM_VOLUME = "dshm"
"""The pod volume mounted at ``/dev/shm`` (memory-backed); never a ``vol-`` name, so never a gShare volume's."""

SHM_PATH = "/dev/shm"
"""Where the shared-memory volume is mounted (PyTorch's DataLoader workers pass tensors through it)."""

POD_VOLUME_PREFIX = "vol-"
"""Pod volume names are ``vol-<volume name>``."""

_POD_VOLUME_NAME_MAX = 63  # a pod volume name is a DNS-1123 label


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
    * with ``spec.cpuMillicores``/``spec.memoryMiB``, ``resources.requests`` = ``resources.limits`` for ``cpu``
      (``cpu_quantity``) and ``memory`` (``<MiB>Mi``), and with ``spec.memoryMiB`` a pod volume ``dshm`` (``emptyDir``,
      ``medium: Memory``, ``sizeLimit`` half the memory: ``shm_size``) mounted at ``/dev/shm``; without them (a
      GShareSession made before CPU requests) neither, as before;
    * env ``GSHARE_SESSION_ID`` (``ses_...``), ``GSHARE_BASE_PATH`` (``spec.path``, the URL prefix the
      session route serves) and ``NOTEBOOK_ARGS`` (``--ServerApp.base_url=<path> --ServerApp.port=<port>``,
      read by the Jupyter Docker Stacks' start script);
    * non-root (UID 1000, GID 100), no privilege escalation, all capabilities dropped, RuntimeDefault
      seccomp, no service-account token mounted, no service links;
    * each ``spec.volumes`` entry mounted at its ``mountPath`` from pod volume ``vol-<name>``
      (``persistentVolumeClaim.claimName``; see ``session_pvc``, ``pod_volume_name``);
    * with ``spec.gpuModels``, the annotation ``nvidia.com/use-gputype: <models joined by ",">`` so HAMi's scheduler
      only gives it GPUs of those models (the models are the fleet's names, HAMi's types without their ``NVIDIA-``
      prefix, so each is contained in its own type); with ``spec.gpuUuids`` also ``nvidia.com/use-gpuuuid: <UUIDs joined
      by ",">``, the exact GPUs of those models, sent when a model of the cluster contains an accepted name (the type
      annotation matches by substring: ``NVIDIA A10`` is in ``NVIDIA A100-PCIE-40GB``);
    * labels ``session_labels``; owned by the GShareSession (``session_owner_reference``).
    """
    spec = _spec(gss)
    session_id = spec["sessionId"]
    port = session_port(spec)
    path = spec["path"]
    # Quantities as strings (the apiserver's canonical form; the typed kubernetes client refuses ints).
    limits: dict[str, str] = {HAMI_RESOURCE_GPU: str(int(spec["gpus"]))}
    if spec.get("gpuMemoryMiB") is not None:
        limits[HAMI_RESOURCE_MEMORY] = str(int(spec["gpuMemoryMiB"]))
    if spec.get("gpuCores") is not None:
        limits[HAMI_RESOURCE_CORES] = str(int(spec["gpuCores"]))
    resources: dict[str, Any] = {"limits": limits}
    requests: dict[str, str] = {}
    if spec.get("cpuMillicores") is not None:
        requests["cpu"] = cpu_quantity(int(spec["cpuMillicores"]))
    memory = int(spec["memoryMiB"]) if spec.get("memoryMiB") is not None else None
    if memory is not None:
        requests["memory"] = f"{memory}Mi"
    if requests:
        limits.update(requests)
        resources["requests"] = dict(requests)
    notebook_args = shlex.join([f"--ServerApp.base_url={path}", f"--ServerApp.port={port}"])
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec["image"],
        "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": [
            {"name": "GSHARE_SESSION_ID", "value": session_id},
            {"name": "GSHARE_BASE_PATH", "value": path},
            {"name": "NOTEBOOK_ARGS", "value": notebook_args},
        ],
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_spec: dict[str, Any] = {
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
        "containers": [container],
    }
    volumes = session_volumes(gss)
    mounts = [{"name": pod_volume_name(volume["name"]), "mountPath": volume["mountPath"]} for volume in volumes]
    pod_volumes: list[dict[str, Any]] = [
        {"name": pod_volume_name(volume["name"]), "persistentVolumeClaim": {"claimName": volume["claimName"]}} for volume in volumes
    ]
    if memory is not None:
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
        pod_volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(memory)}})
    if mounts:
        container["volumeMounts"] = mounts
        pod_spec["volumes"] = pod_volumes
    metadata = session_metadata(gss)
    models = [str(model) for model in spec.get("gpuModels") or []]
    if models:
        metadata["annotations"] = {HAMI_USE_GPUTYPE: ",".join(models)}
        uuids = [str(uuid) for uuid in spec.get("gpuUuids") or []]
        if uuids:
            metadata["annotations"][HAMI_USE_GPUUUID] = ",".join(uuids)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def cpu_quantity(millicores: int) -> str:
    """A CPU quantity: whole cores as ``"4"``, else millicores as ``"500m"`` (the apiserver's canonical forms)."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def shm_size(memory_mib: int) -> str:
    """``sizeLimit`` of the ``/dev/shm`` volume: half of ``memory_mib``, as ``"<n>Mi"`` (or ``"<n>Ki"`` when odd)."""
    return f"{memory_mib // 2}Mi" if memory_mib % 2 == 0 else f"{memory_mib * 512}Ki"


def session_volumes(gss: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The GShareSession's ``spec.volumes`` (``[]`` when absent or empty).

    Each entry: ``{"volumeId": "vol_...", "name": "datasets", "claimName": "gshare-vol-...",
    "storageClassName": "nfs-a", "size": "100Gi", "mountPath": "/data/datasets"}`` (all required; CRD schema).
    """
    return list(_spec(gss).get("volumes") or [])


def pod_volume_name(volume_name: str) -> str:
    """The pod volume of a gShare volume: ``vol-<name>``.

    A pod volume name is a DNS-1123 label (63 characters at most) and a volume name may itself be 63 long: a
    longer result keeps the first characters and ends with 8 hex digits of the name's SHA-256, so two volumes
    of one session never share a pod volume.
    """
    candidate = f"{POD_VOLUME_PREFIX}{volume_name}"
    if len(candidate) <= _POD_VOLUME_NAME_MAX:
        return candidate
    digest = hashlib.sha256(volume_name.encode("utf-8")).hexdigest()[:8]
    head = candidate[: _POD_VOLUME_NAME_MAX - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


def session_pvc(volume: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The PersistentVolumeClaim (``core/v1``) of one ``spec.volumes`` entry, in ``namespace``.

    * name ``volume.claimName`` (chosen by the control plane, the same on every cluster);
    * labels ``app.kubernetes.io/managed-by: gshare``, ``gshare.io/volume-id: <volumeId>``,
      ``gshare.io/volume-name: <name>`` (how the volume-sync tick finds the volumes it holds);
    * ``accessModes: [ReadWriteMany]``, ``storageClassName``, ``resources.requests.storage: <size>``;
    * no owner reference: the volume outlives the session (deleting the GShareSession must not delete it),
      and no ``volumeName``: a PVC the control plane pre-binds after a move is created by the control plane,
      and the operator never changes an existing PVC.
    """
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": volume["claimName"],
            "namespace": namespace,
            "labels": {
                MANAGED_BY_LABEL: VOLUME_MANAGED_BY,
                VOLUME_ID_LABEL: volume["volumeId"],
                VOLUME_NAME_LABEL: volume["name"],
            },
        },
        "spec": {
            "accessModes": list(VOLUME_ACCESS_MODES),
            "storageClassName": volume["storageClassName"],
            "resources": {"requests": {"storage": str(volume["size"])}},
        },
    }


def session_service(gss: Mapping[str, Any]) -> dict[str, Any]:
    """The session's Service (``core/v1``): ClusterIP, port ``spec.port`` (``http``) to the pod's ``http`` port.

    Selects the pod by the ``gshare.io/session-id`` label only; same name, labels and owner as the pod.
    """
    spec = _spec(gss)
    port = session_port(spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": session_metadata(gss),
        "spec": {
            "type": "ClusterIP",
            "selector": {SESSION_ID_LABEL: spec["sessionId"]},
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }


def _spec(gss: Mapping[str, Any]) -> Mapping[str, Any]:
    """The GShareSession's ``spec``."""
    return gss["spec"]


def session_port(spec: Mapping[str, Any]) -> int:
    """``spec.port`` as an int (``SESSION_PORT_DEFAULT``, 8888, when absent: the CRD defaults it too)."""
    return int(spec.get("port") or SESSION_PORT_DEFAULT)


def session_metadata(gss: Mapping[str, Any]) -> dict[str, Any]:
    """Name, namespace, labels and owner reference shared by every object of a session that its GShareSession owns.

    Returns:
        ``{"name": session_object_name(spec.sessionId), "namespace": <the GShareSession's>, "labels":
        session_labels(gss), "ownerReferences": [session_owner_reference(gss)]}`` (a new dict on every call).
    """
    return {
        "name": session_object_name(_spec(gss)["sessionId"]),
        "namespace": gss["metadata"]["namespace"],
        "labels": session_labels(gss),
        "ownerReferences": [session_owner_reference(gss)],
    }
