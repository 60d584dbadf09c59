"""HAMi's resources, pod annotations and fit rules: what the scheduler stand-in (``hami_scheduler``) decides with.

Formats and rules follow Project-HAMi/HAMi v2.10.0 (and agree with v2.4 ... v2.9 where noted):
resource names from ``charts/hami/values.yaml`` (copied as ``demo/data/hami/helm-values.resource-names.v2.10.0.yaml``),
pod annotation keys and value grammar from ``pkg/device/devices.go`` EncodePodSingleDevice/DecodePodDevices and
``pkg/util/types.go``, fit rules from ``pkg/device/nvidia/device.go`` Fit, failure reason codes from
``pkg/scheduler`` (``common.CardInsufficientMemory`` ...), node score from ``pkg/scheduler/policy`` (binpack).
Real values as seen on pods: ``demo/data/hami/pod-annotations.observed.yaml``.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.quantity import parse_quantity
from operator_agent.hami import HamiDevice

logger = logging.getLogger(__name__)

HAMI_RESOURCE_COUNT = "nvidia.com/gpu"
"""Extended resource: number of vGPUs of a container; each vGPU is on a different physical GPU (count)."""

HAMI_RESOURCE_MEMORY = "nvidia.com/gpumem"
"""Extended resource: device memory per vGPU, MiB (HAMi ``memoryFactor`` 1). Unset: 100 % of the GPU's memory."""

HAMI_RESOURCE_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
"""Extended resource: device memory per vGPU in percent of the GPU's registered memory (values > 100 clamped)."""

HAMI_RESOURCE_CORES = "nvidia.com/gpucores"
"""Extended resource: SM share per vGPU in percent of one GPU (100 = whole GPU); unset/0 = no core limit."""

HAMI_DEVICE_TYPE = "NVIDIA"
"""The ``<type>`` field of every device in HAMi's pod allocation annotations (``NvidiaGPUDevice``), not the model."""

HAMI_DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
"""Pod annotation: devices the device plugin still has to hand out; the scheduler writes the allocation, the
device plugin empties it container by container (``;`` per container when done)."""

HAMI_DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
"""Pod annotation: the scheduler's allocation, ``<uuid>,NVIDIA,<usedmem MiB>,<usedcores %>:`` per device, one
``;``-terminated segment per container (init containers first; empty segment for a container without GPU)."""

HAMI_VGPU_NODE = "hami.io/vgpu-node"
"""Pod annotation: the node HAMi's scheduler chose."""

HAMI_VGPU_TIME = "hami.io/vgpu-time"
"""Pod annotation: when the scheduler chose the node, Unix seconds as a decimal string."""

HAMI_BIND_TIME = "hami.io/bind-time"
"""Pod annotation: when the scheduler bound the pod, Unix seconds as a decimal string."""

HAMI_BIND_PHASE = "hami.io/bind-phase"
"""Pod annotation: ``allocating`` (scheduler, at bind) then ``success`` (device plugin, containers allocated)."""

HAMI_USE_GPUTYPE = "nvidia.com/use-gputype"
"""Pod annotation: comma-separated model names; only GPUs whose model contains one of them (case-insensitive)."""

HAMI_NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
"""Pod annotation: comma-separated model names; GPUs whose model contains one of them are excluded."""

HAMI_USE_GPUUUID = "nvidia.com/use-gpuuuid"
"""Pod annotation: comma-separated GPU UUIDs; only these GPUs."""

HAMI_NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
"""Pod annotation: comma-separated GPU UUIDs excluded from the allocation."""

@dataclass(frozen=True)
class GpuRequest:
    """What one container asks of HAMi (HAMi ``ContainerDeviceRequest``).

    Attributes:
        count: vGPUs (``nvidia.com/gpu``), each on a different physical GPU of one node.
        memory_mib: device memory per vGPU, MiB (``nvidia.com/gpumem``), or None.
        memory_percent: device memory per vGPU in percent of the GPU's registered memory
            (``nvidia.com/gpumem-percentage``, at most 100), or None; ignored when ``memory_mib`` is set.
        cores_percent: SM share per vGPU in percent of one GPU (``nvidia.com/gpucores``, at most 100), or None.
    """

    count: int
    memory_mib: int | None = None
    memory_percent: int | None = None
    cores_percent: int | None = None

    @property
    def exclusive(self) -> bool:
        """A whole-GPU request: neither memory nor cores asked (how gShare asks for whole GPUs).

        Such a vGPU gets a GPU nothing else holds, and nothing else is put on it while it is held. HAMi
        reaches the same result through its memory default (the request takes 100 % of the memory).
        """
        return self.memory_mib is None and self.memory_percent is None and self.cores_percent is None

    @property
    def cores(self) -> int:
        """Cores taken per vGPU, percent of one GPU; 0 = no core limit (HAMi's default ``gpucores``)."""
        return self.cores_percent or 0

    def memory_for(self, device_memory_mib: int) -> int:
        """MiB taken on a GPU registering ``device_memory_mib`` MiB (HAMi default: 100 % of it)."""
        if self.memory_mib is not None:
            return self.memory_mib
        percent = 100 if self.memory_percent is None else self.memory_percent
        return device_memory_mib * percent // 100


def _container_gpu_request(container: Mapping[str, Any]) -> GpuRequest | None:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}

    def read(name: str) -> int | None:
        raw = limits.get(name, requests.get(name))
        if raw is None:
            return None
        try:
            return parse_quantity(raw)
        except ValueError:
            logger.warning("container %r: %s=%r is not a quantity, ignored", container.get("name"), name, raw)
            return None

    count = read(HAMI_RESOURCE_COUNT)
    memory = read(HAMI_RESOURCE_MEMORY)
    percent = read(HAMI_RESOURCE_MEMORY_PERCENTAGE)
    cores = read(HAMI_RESOURCE_CORES)
    if count is None and (memory is not None or percent is not None or cores is not None):
        count = 1  # HAMi's admission webhook adds nvidia.com/gpu: 1 (defaultGPUNum) to such a container
    if not count or count < 1:
        return None
    return GpuRequest(
        count=count,
        memory_mib=memory if memory is not None and memory > 0 else None,
        memory_percent=min(max(percent, 0), 100) if percent is not None else None,
        cores_percent=min(max(cores, 0), 100) if cores is not None else None,
    )


def pod_gpu_requests(pod_spec: Mapping[str, Any]) -> list[GpuRequest | None]:
    """The HAMi request of every container of a Pod spec, init containers first (HAMi's annotation order).

    Values come from ``resources.limits``, else ``resources.requests`` (HAMi reads limits first). A container
    that asks for ``gpumem``/``gpumem-percentage``/``gpucores`` without ``nvidia.com/gpu`` gets 1 vGPU.

    Returns:
        One entry per container; None for a container that asks for no GPU.
    """
    containers = list(pod_spec.get("initContainers") or []) + list(pod_spec.get("containers") or [])
    return [_container_gpu_request(c) for c in containers]


@dataclass(frozen=True)
class GpuAllocation:
    """One vGPU in HAMi's pod allocation annotation.

    Attributes:
        uuid: GPU UUID (``GPU-xxxxxxxx-…``, the node register annotation's ``id``).
        memory_mib: ``usedmem``, device memory reserved, MiB.
        cores_percent: ``usedcores``, SM share reserved, percent of one GPU (0 = no core limit).
        device_type: ``NVIDIA`` for NVIDIA GPUs (the vendor keyword, not the model).
    """

    uuid: str
    memory_mib: int
    cores_percent: int
    device_type: str = HAMI_DEVICE_TYPE


def encode_pod_devices(containers: Iterable[Iterable[GpuAllocation]]) -> str:
    """Encode an allocation as HAMi writes ``hami.io/vgpu-devices-allocated`` (EncodePodSingleDevice @ v2.10.0).

    Args:
        containers: per container (init containers first), its vGPUs; empty for a container without GPU.

    Returns:
        e.g. ``GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;`` (one container, one vGPU) or
        ``;GPU-…,NVIDIA,6144,30:;`` (container 0 has no GPU).
    """
    return "".join(
        "".join(f"{d.uuid},{d.device_type},{d.memory_mib},{d.cores_percent}:" for d in devices) + ";"
        for devices in containers
    )


@dataclass
class GpuState:
    """A registered GPU and what the pods bound to its node hold on it (HAMi ``DeviceUsage``)."""

    device: HamiDevice
    used: int = 0  # vGPUs placed on it (HAMi counts one per container device)
    used_mem: int = 0  # MiB
    used_cores: int = 0  # percent of one GPU
    exclusive: bool = False  # held by a whole-GPU request

    def take(self, allocation: GpuAllocation, exclusive: bool) -> None:
        self.used += 1
        self.used_mem += allocation.memory_mib
        self.used_cores += allocation.cores_percent
        self.exclusive = self.exclusive or exclusive


def _listed(annotations: Mapping[str, str], key: str) -> list[str]:
    return [item.strip() for item in (annotations.get(key) or "").split(",") if item.strip()]


def _gpu_refusal(gpu: GpuState, request: GpuRequest, annotations: Mapping[str, str]) -> str | None:
    """Why HAMi would not put one vGPU of ``request`` on ``gpu`` (its reason code), or None if it fits."""
    device = gpu.device
    model = device.model.upper()
    use_types = _listed(annotations, HAMI_USE_GPUTYPE)
    if use_types and not any(t.upper() in model for t in use_types):
        return "CardTypeMismatch"
    if any(t.upper() in model for t in _listed(annotations, HAMI_NOUSE_GPUTYPE)):
        return "CardTypeMismatch"
    use_uuids = _listed(annotations, HAMI_USE_GPUUUID)
    if (use_uuids and device.uuid not in use_uuids) or device.uuid in _listed(annotations, HAMI_NOUSE_GPUUUID):
        return "CardUuidMismatch"
    if gpu.used >= device.split_count:
        return "CardTimeSlicingExhausted"
    if device.memory_mib - gpu.used_mem < request.memory_for(device.memory_mib):
        return "CardInsufficientMemory"
    if device.cores - gpu.used_cores < request.cores:
        return "CardInsufficientCore"
    if gpu.exclusive or (request.exclusive and gpu.used > 0):
        return "ExclusiveDeviceAllocateConflict"
    if device.cores == 100 and request.cores == 100 and gpu.used > 0:  # HAMi: gpucores 100 = the card alone
        return "ExclusiveDeviceAllocateConflict"
    if device.cores != 0 and gpu.used_cores == device.cores and request.cores == 0:
        return "CardComputeUnitsExhausted"  # HAMi: no core-less job on a GPU whose cores are all taken
    return None


def fit_pod(gpus: list[GpuState], requests: list[GpuRequest | None], annotations: Mapping[str, str]) -> tuple[
        list[list[GpuAllocation]] | None, collections.Counter[str]]:
    """Place every container's vGPUs on one node's GPUs, container by container (HAMi ``fitInDevices``).

    Args:
        gpus: the node's healthy GPUs in index order; updated in place with what is placed.
        requests: per container (``pod_gpu_requests``).
        annotations: the Pod's annotations (``nvidia.com/use-gputype`` ...).

    Returns:
        ``(allocation, reasons)``: per container its vGPUs (GPUs by index, distinct within a container), or None
        when the node cannot host the pod; ``reasons`` counts HAMi's reason codes of the refused GPUs.
    """
    reasons: collections.Counter[str] = collections.Counter()
    allocation: list[list[GpuAllocation]] = []
    for request in requests:
        if request is None:
            allocation.append([])
            continue
        if request.count > len(gpus):
            reasons["NodeInsufficientDevice"] += 1
            return None, reasons
        chosen: list[tuple[GpuState, GpuAllocation]] = []
        for gpu in gpus:
            refusal = _gpu_refusal(gpu, request, annotations)
            if refusal is not None:
                reasons[refusal] += 1
                continue
            chosen.append((gpu, GpuAllocation(gpu.device.uuid, request.memory_for(gpu.device.memory_mib),
                                              request.cores)))
            if len(chosen) == request.count:
                break
        if len(chosen) < request.count:
            if chosen:
                reasons["AllocatedCardsInsufficientRequest"] += len(chosen)
            return None, reasons
        for gpu, device in chosen:
            gpu.take(device, request.exclusive)
        allocation.append([device for _, device in chosen])
    return allocation, reasons


def binpack_score(gpus: Iterable[GpuState]) -> float:
    """HAMi's node score (``policy.NodeScore.ComputeDefaultScore``): share of vGPU slots + cores + memory in use.

    The binpack node policy prefers the highest score (the most used node).
    """
    gpus = list(gpus)
    score = 0.0
    for used, total in ((sum(g.used for g in gpus), sum(g.device.split_count for g in gpus)),
                        (sum(g.used_cores for g in gpus), sum(g.device.cores for g in gpus)),
                        (sum(g.used_mem for g in gpus), sum(g.device.memory_mib for g in gpus))):
        if total > 0:
            score += used / total
    return score


#: kube-scheduler filter failures (``pkg/scheduler/framework/plugins``), in the order the default plugins run.
_UNSCHEDULABLE_NODE = "node(s) were unschedulable"  # NodeUnschedulable
_WRONG_NODE_NAME = "node(s) didn't match the requested node name"  # NodeName
_NO_SELECTOR_MATCH = "node(s) didn't match Pod's node affinity/selector"  # NodeAffinity (nodeSelector)
#: HAMi extender answers for nodes it refuses (``FailedNodes``): no register annotation, or no fit.
HAMI_UNREGISTERED = "node unregistered"
HAMI_UNFIT = "NodeUnfitPod"
PREEMPTION_USELESS = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"


def node_filter_failure(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> str | None:
    """The kube-scheduler reason a node is filtered out for a pod, or None (taints are not emulated beyond Ready)."""
    name = node["metadata"]["name"]
    if (node.get("spec") or {}).get("unschedulable"):
        return _UNSCHEDULABLE_NODE
    if pod_spec.get("nodeName") and pod_spec["nodeName"] != name:
        return _WRONG_NODE_NAME
    ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or []
                  if c.get("type") == "Ready"), None)
    if ready != "True":  # the node lifecycle controller taints it; no toleration is checked here
        key = "node.kubernetes.io/not-ready" if ready == "False" else "node.kubernetes.io/unreachable"
        return f"node(s) had untolerated taint {{{key}: }}"
    labels = node["metadata"].get("labels") or {}
    if not all(labels.get(k) == v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return _NO_SELECTOR_MATCH
    return None


def fit_error(total: int, failures: Mapping[str, tuple[str, bool]]) -> str:
    """kube-scheduler's ``FitError`` message (``0/3 nodes are available: ... preemption: ...``).

    Args:
        total: number of nodes.
        failures: per node ``(reason, preemption_could_help)``; filter-plugin failures are unresolvable
            (``Preemption is not helpful for scheduling``), extender failures are not (``No preemption victims
            found for incoming pod``: the emulator has no lower-priority pods to evict).
    """
    if total == 0:
        return "no nodes available to schedule pods"

    def histogram(reasons: Iterable[str]) -> str:
        return ", ".join(sorted(f"{count} {reason}" for reason, count in collections.Counter(reasons).items()))

    filters = histogram(reason for reason, _ in failures.values())
    preemption = histogram(_NO_VICTIMS if helps else PREEMPTION_USELESS for _, helps in failures.values())
    return (f"0/{total} nodes are available: {filters}. "
            f"preemption: 0/{total} nodes are available: {preemption}.")


@dataclass(frozen=True)
class Placement:
    node: dict[str, Any]
    devices: list[list[GpuAllocation]] | None  # None: the pod asks for no GPU
