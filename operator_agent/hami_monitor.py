"""Reader of HAMi's vGPU monitor: per-container GPU activity from its Prometheus text.

HAMi's ``vGPUmonitor`` (a container of the ``hami-device-plugin`` DaemonSet, ``/metrics`` on port 9394) reads the
shared-memory regions HAMi's in-container ``libvgpu.so`` writes, so it reports each container's own slice of a shared
GPU. Source: ``Project-HAMi/HAMi`` ``cmd/vGPUmonitor/metrics.go`` (``ClusterManagerCollector``): the descriptors
``ctrDeviceLastKernelDesc``, ``ctrDeviceUtilizationdesc``, ``ctrvGPUdesc`` and ``ctrvGPUlimitdesc`` carry the current
names below with labels ``namespace, pod, container, vdevice_index, device_uuid``; ``initLegacyDescriptors`` (only
with ``--legacy-metrics``) adds the same values under the names every HAMi up to 2.7 served, with labels
``podnamespace, podname, ctrname, vdeviceid, deviceuuid``. Each collector is registered with a constant label
``zone="vGPU"``, ignored here. Real legacy outputs are in ``tests/fixtures/hami/vgpu-monitor/`` (README there).

=================================== ============================================== ==================================
reading                             current name                                   legacy name
=================================== ============================================== ==================================
seconds since the last kernel       ``hami_container_last_kernel_elapsed_seconds`` ``Device_last_kernel_of_container``
SM utilization, percent 0-100       ``hami_container_device_utilization_ratio``    ``Device_utilization_desc_of_container``
vGPU memory used, bytes             ``hami_vgpu_memory_used_bytes``                ``vGPU_device_memory_usage_in_bytes``
vGPU memory limit, bytes            ``hami_vgpu_memory_limit_bytes``               ``vGPU_device_memory_limit_in_bytes``
=================================== ============================================== ==================================

HAMi emits the last-kernel series only once the container has launched a kernel (``if lastKernelTime > 0``), so a
container that never ran CUDA work has no such series: its ``last_kernel_seconds`` stays ``None``, never 0.

How series are combined into one reading per ``(namespace, pod, container, device_uuid)``:

* a monitor serving both schemes (``--legacy-metrics``) sends every value twice; only the current scheme is read then
  (adding both would double the memory);
* one container holding two vGPUs of the same physical GPU (two ``vdevice_index`` values, one ``device_uuid``):
  memory used and limit are **summed**, the last kernel is the **smallest** number of seconds (the most recent
  kernel), the utilization the **largest**;
* across the containers of one pod (``MonitorReadings.for_pod``, and two containers sharing a GPU) the same rules
  apply: the pod is busy on a GPU when any of its containers is.

A value that is not a finite number within the contract's range (negative, NaN, a utilization above 100) is dropped
(``None``): the report says "no reading", never a made-up one. Parsing uses ``prometheus_client``'s text parser.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "MAX_EXPOSITION_BYTES",
    "MAX_SERIES",
    "ContainerReading",
    "GpuReading",
    "MonitorParseError",
    "MonitorReadings",
    "combine",
    "parse_monitor",
]

MAX_EXPOSITION_BYTES = 4 * 1024 * 1024
"""Largest monitor answer read (bytes). A node of 8 GPUs shared by 100 containers serves about 150 KiB."""

MAX_SERIES = 100_000
"""Most samples read from one answer; more is refused as not a vGPU monitor."""

CURRENT = "current"
LEGACY = "legacy"

# reading -> metric name, per scheme
_NAMES = {
    CURRENT: {
        "last_kernel_seconds": "hami_container_last_kernel_elapsed_seconds",
        "utilization_percent": "hami_container_device_utilization_ratio",
        "memory_used_bytes": "hami_vgpu_memory_used_bytes",
        "memory_limit_bytes": "hami_vgpu_memory_limit_bytes",
    },
    LEGACY: {
        "last_kernel_seconds": "Device_last_kernel_of_container",
        "utilization_percent": "Device_utilization_desc_of_container",
        "memory_used_bytes": "vGPU_device_memory_usage_in_bytes",
        "memory_limit_bytes": "vGPU_device_memory_limit_in_bytes",
    },
}
# (namespace, pod, container, device uuid) label names, per scheme
_LABELS = {
    CURRENT: ("namespace", "pod", "container", "device_uuid"),
    LEGACY: ("podnamespace", "podname", "ctrname", "deviceuuid"),
}
# Families only HAMi's monitor serves (both schemes, host-level ones included): an answer with none of them is not it.
_HAMI_FAMILIES = frozenset(
    [name for scheme in _NAMES.values() for name in scheme.values()]
    + ["hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio", "hami_container_device_memory_bytes",
       "HostGPUMemoryUsage", "HostCoreUtilization", "Device_memory_desc_of_container"]
)
_READING_OF = {scheme: {name: reading for reading, name in names.items()} for scheme, names in _NAMES.items()}
_MAX_SECONDS = 1e12  # the contract's bound of last_kernel_seconds
_MAX_BYTES = 2**63 - 1


class MonitorParseError(ValueError):
    """The answer is not HAMi's vGPU monitor text: too large, not UTF-8, not Prometheus text, or no HAMi metric."""


@dataclass(frozen=True)
class GpuReading:
    """What the monitor says of one GPU (of a container, or combined over a pod's containers).

    Attributes:
        last_kernel_seconds: seconds since the last kernel launch, ``None`` when no kernel was ever launched.
        utilization_percent: SM utilization, 0-100, ``None`` when not reported.
        memory_used_bytes: vGPU memory in use, bytes, ``None`` when not reported.
        memory_limit_bytes: vGPU memory limit, bytes, ``None`` when not reported.
    """

    last_kernel_seconds: float | None = None
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_limit_bytes: int | None = None


@dataclass(frozen=True)
class ContainerReading:
    """One container's reading of one physical GPU (``device_uuid``), its vGPUs of that GPU combined."""

    namespace: str
    pod: str
    container: str
    device_uuid: str
    gpu: GpuReading


def combine(readings: Iterable[GpuReading]) -> GpuReading:
    """Combine readings of one GPU: smallest last-kernel seconds, largest utilization, memory summed.

    ``None`` values are skipped; a value stays ``None`` when every reading lacks it.
    """
    last, util, used, limit = [], [], [], []
    for reading in readings:
        if reading.last_kernel_seconds is not None:
            last.append(reading.last_kernel_seconds)
        if reading.utilization_percent is not None:
            util.append(reading.utilization_percent)
        if reading.memory_used_bytes is not None:
            used.append(reading.memory_used_bytes)
        if reading.memory_limit_bytes is not None:
            limit.append(reading.memory_limit_bytes)
    return GpuReading(
        last_kernel_seconds=min(last) if last else None,
        utilization_percent=max(util) if util else None,
        memory_used_bytes=min(sum(used), _MAX_BYTES) if used else None,
        memory_limit_bytes=min(sum(limit), _MAX_BYTES) if limit else None,
    )


@dataclass(frozen=True)
class MonitorReadings:
    """A parsed monitor answer.

    Attributes:
        scheme: ``"current"`` or ``"legacy"``: the names the readings came from (``"current"`` when there were none).
        containers: one reading per ``(namespace, pod, container, device_uuid)``.
    """

    scheme: str
    containers: Mapping[tuple[str, str, str, str], ContainerReading]

    def for_pod(self, namespace: str, pod: str) -> dict[str, GpuReading]:
        """Per GPU UUID, the pod's containers' readings combined (see the module docstring); ``{}`` when none."""
        by_gpu: dict[str, list[GpuReading]] = {}
        for reading in self.containers.values():
            if reading.namespace == namespace and reading.pod == pod:
                by_gpu.setdefault(reading.device_uuid, []).append(reading.gpu)
        return {uuid: combine(gpus) for uuid, gpus in by_gpu.items()}


def parse_monitor(text: str | bytes) -> MonitorReadings:
    """Parse one answer of HAMi's vGPU monitor (Prometheus text format, either naming scheme).

    Args:
        text: the body of ``GET /metrics``, at most ``MAX_EXPOSITION_BYTES`` (bytes must be UTF-8).

    Returns:
        The per-container readings (``MonitorReadings``).

    Raises:
        MonitorParseError: the body is larger than ``MAX_EXPOSITION_BYTES`` or holds more than ``MAX_SERIES`` samples,
            is not UTF-8, is not Prometheus text (``prometheus_client``'s parser refuses it), or holds none of HAMi's
            monitor metrics (another server answered).
    """
    size = len(text.encode() if isinstance(text, str) else text)
    if size > MAX_EXPOSITION_BYTES:
        raise MonitorParseError(f"the monitor's answer is {size} bytes, more than the {MAX_EXPOSITION_BYTES} read")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MonitorParseError(f"the monitor's answer is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if "\x00" in text:
        raise MonitorParseError("the monitor's answer holds NUL bytes: not Prometheus text")
    found: dict[str, list] = {CURRENT: [], LEGACY: []}
    hami = False
    count = 0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                count += 1
                if count > MAX_SERIES:
                    raise MonitorParseError(f"the monitor's answer holds more than {MAX_SERIES} samples")
                hami = hami or sample.name in _HAMI_FAMILIES or family.name in _HAMI_FAMILIES
                for scheme, readings in _READING_OF.items():
                    reading = readings.get(sample.name)
                    if reading is not None:
                        found[scheme].append((reading, sample.labels, sample.value))
    except MonitorParseError:
        raise
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise MonitorParseError(f"the monitor's answer is not Prometheus text: {_short(str(exc))}") from None
    if not hami:
        raise MonitorParseError("the answer holds none of HAMi's vGPU monitor metrics: another server answered "
                                "(check GSHARE_HAMI_MONITOR_PORT and GSHARE_HAMI_MONITOR_SELECTOR)")
    scheme = CURRENT if found[CURRENT] or not found[LEGACY] else LEGACY
    return MonitorReadings(scheme=scheme, containers=_containers(scheme, found[scheme]))


def _containers(scheme: str, samples: list[tuple[str, Mapping[str, str], float]]) -> dict:
    """Group samples into per-(namespace, pod, container, uuid) readings; several vGPUs of one GPU are combined."""
    labels = _LABELS[scheme]
    parts: dict[tuple[str, str, str, str], dict[str, dict[str, float | int]]] = {}
    for reading, sample_labels, value in samples:
        key = tuple(sample_labels.get(name, "") for name in labels)
        if not all(key):
            continue  # a series without its pod or GPU cannot be attributed
        checked = _checked(reading, value)
        vdevice = sample_labels.get("vdevice_index" if scheme == CURRENT else "vdeviceid", "")
        per_vdevice = parts.setdefault(key, {}).setdefault(vdevice, {})
        if checked is not None:
            per_vdevice[reading] = checked
    result = {}
    for key, vdevices in parts.items():
        gpu = combine(replace(GpuReading(), **values) for values in vdevices.values())
        result[key] = ContainerReading(*key, gpu=gpu)
    return result


def _checked(reading: str, value: float) -> float | int | None:
    """The value if it is within the contract's range for ``reading`` (memory as whole bytes), else ``None``."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    if reading == "utilization_percent":
        return float(value) if value <= 100 else None
    if reading == "last_kernel_seconds":
        return float(value) if value <= _MAX_SECONDS else None
    return int(value) if value <= _MAX_BYTES else None


def _short(text: str, limit: int = 200) -> str:
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[:limit] + "…"
