"""The text HAMi's vGPU monitor (``vGPUmonitor``) answers at ``/metrics``, in its two naming schemes.

Where each name, HELP string, type and label set comes from (``Project-HAMi/HAMi`` ``cmd/vGPUmonitor/metrics.go``):

* ``current`` (``SCHEME_CURRENT``): the descriptors of v2.10.0 (tags v2.9.0 and v2.10.0; the v2.8.x tags still have
  only the legacy names), every series with the ``zone="vGPU"`` label the collector is registered under
  (``NewClusterManager("vGPU", ...)`` wraps its registerer with ``prometheus.Labels{"zone": zone}``, so the current
  names carry it too). Per container and GPU: ``hami_vgpu_memory_used_bytes``, ``hami_vgpu_memory_limit_bytes``,
  ``hami_container_device_memory_bytes``, ``hami_container_device_utilization_ratio``,
  ``hami_vgpu_memory_{context,module,buffer}_bytes`` and ``hami_container_last_kernel_elapsed_seconds`` (labels
  ``namespace, pod, container, vdevice_index, device_uuid``); per GPU of the host ``hami_host_gpu_memory_used_bytes``
  and ``hami_host_gpu_utilization_ratio`` (``node, device_index, device_uuid, device_type``) and
  ``hami_host_gpu_memory_controller_utilization_ratio`` (``device_index, device_uuid, device_type``). All gauges.
* ``legacy`` (``SCHEME_LEGACY``): the names HAMi v2.4.x-v2.7.0 serve, exactly as in the two fixtures copied in
  ``demo/data/hami/vgpu-monitor/`` (also the v2.7.0 descriptors, typo included: ``Container device meory
  description``; ``Device_memory_desc_of_container`` is a counter there and carries the memory breakdown as labels
  ``context, module, data, offset``; the host series have only ``deviceidx, deviceuuid``). v2.7.1 added a
  ``devicetype`` label to the host series and fixed the typo; v2.9+ keep these names only behind
  ``--legacy-metrics``, next to the current ones, with a ``nodeid`` label on the host series: neither variant is
  served here.

Layout as client_golang's text encoder writes it: families sorted by name, each with its ``# HELP`` and ``# TYPE``
line, series sorted by label values, labels sorted by name, values in Go's shortest ``%g`` form (``go_float``).
``hami_build_info`` (current scheme, a separate collector with build labels) is not served. ``CONTENT_TYPE`` is what
promhttp of client_golang 1.23/1.24 (HAMi v2.7/v2.10's ``go.mod``) answers a request without an ``Accept`` header.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Iterable
from dataclasses import dataclass

SCHEME_CURRENT = "current"
SCHEME_LEGACY = "legacy"
SCHEMES = (SCHEME_CURRENT, SCHEME_LEGACY)
ZONE = "vGPU"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"

_CONTAINER = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
_HOST = ("node", "device_index", "device_uuid", "device_type")
_LEGACY_CONTAINER = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
_LEGACY_HOST = ("deviceidx", "deviceuuid")


@dataclass(frozen=True)
class ContainerGpu:
    """One (container, GPU) reading of the monitor.

    Attributes:
        namespace, pod, container: whose it is.
        vdevice_index: the GPU's position in the container's device list (0, 1, ...).
        device_uuid: the GPU's UUID.
        memory_used: vGPU memory used, bytes (context + module + buffer).
        memory_limit: vGPU memory limit, bytes (HAMi's allocation in MiB x 2**20).
        memory_context, memory_module, memory_buffer: the parts of ``memory_used``, bytes.
        utilization: SM utilization, percent 0-100.
        last_kernel_seconds: seconds since the container last launched a kernel on it, or None (never: HAMi then
            sends no last-kernel series).
    """

    namespace: str
    pod: str
    container: str
    vdevice_index: int
    device_uuid: str
    memory_used: int
    memory_limit: int
    memory_context: int
    memory_module: int
    memory_buffer: int
    utilization: int
    last_kernel_seconds: int | None


@dataclass(frozen=True)
class HostGpu:
    """One physical GPU of the node, as NVML shows it to the monitor.

    Attributes:
        index: NVML index.
        uuid: GPU UUID.
        name: NVML name (``NVIDIA H100 80GB HBM3``); the series carry ``NVIDIA-<name>`` as HAMi writes it.
        memory_used: device memory used, bytes.
        utilization: GPU core utilization, percent.
        memory_utilization: memory controller utilization, percent.
    """

    index: int
    uuid: str
    name: str
    memory_used: int
    utilization: int
    memory_utilization: int


def go_float(value: float) -> str:
    """A sample value as client_golang writes it (``strconv.AppendFloat(f, 'g', -1, 64)``): the shortest digits,
    exponent form from 1e+06 on or below 1e-04 (``287244288`` -> ``2.87244288e+08``, ``80450`` -> ``80450``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign, digits, exponent = decimal.Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    point = len(text) + exponent  # the decimal point's place counted from the first digit
    prefix = "-" if sign else ""
    power = point - 1
    if power < -4 or power >= 6:  # Go: %e when the exponent is < -4 or >= 6 (the shortest form's precision)
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{'+' if power >= 0 else '-'}{abs(power):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{text}"
    if point >= len(text):
        return prefix + text + "0" * (point - len(text))
    return f"{prefix}{text[:point]}.{text[point:]}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Families:
    """Metric families being written: ``add`` a series, ``text`` renders them."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[tuple[tuple[tuple[str, str], ...], float]]]] = {}

    def declare(self, name: str, help_text: str, kind: str) -> None:
        self._families.setdefault(name, (help_text, kind, []))

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        self._families[name][2].append((tuple(sorted({**labels, "zone": ZONE}.items())), value))

    def text(self) -> str:
        lines = []
        for name in sorted(self._families):
            help_text, kind, series = self._families[name]
            if not series:  # client_golang sends no family without a metric
                continue
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for labels, value in sorted(series, key=lambda item: [v for _, v in item[0]]):
                rendered = ",".join(f'{key}="{_escape(val)}"' for key, val in labels)
                lines.append(f"{name}{{{rendered}}} {go_float(value)}")
        return "\n".join(lines) + "\n" if lines else ""


def _current(families: _Families, node: str, containers: Iterable[ContainerGpu], hosts: Iterable[HostGpu]) -> None:
    for name, help_text in (
        ("hami_host_gpu_memory_used_bytes", "GPU device memory usage in bytes"),
        ("hami_host_gpu_utilization_ratio", "GPU core utilization ratio (0-100)"),
        ("hami_host_gpu_memory_controller_utilization_ratio", "GPU memory controller utilization ratio (0-100)"),
        ("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes"),
        ("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes"),
        ("hami_container_device_memory_bytes", "Container device memory usage in bytes"),
        ("hami_container_device_utilization_ratio", "Container device SM utilization ratio"),
        ("hami_container_last_kernel_elapsed_seconds", "Seconds since last kernel execution in container"),
        ("hami_vgpu_memory_context_bytes", "Container device memory context size in bytes"),
        ("hami_vgpu_memory_module_bytes", "Container device memory module size in bytes"),
        ("hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes"),
    ):
        families.declare(name, help_text, "gauge")
    for gpu in hosts:
        device = {"device_index": str(gpu.index), "device_uuid": gpu.uuid, "device_type": f"NVIDIA-{gpu.name}"}
        families.add("hami_host_gpu_memory_used_bytes", {"node": node, **device}, gpu.memory_used)
        families.add("hami_host_gpu_utilization_ratio", {"node": node, **device}, gpu.utilization)
        families.add("hami_host_gpu_memory_controller_utilization_ratio", device, gpu.memory_utilization)
    for ctr in containers:
        labels = dict(zip(_CONTAINER, (ctr.namespace, ctr.pod, ctr.container, str(ctr.vdevice_index),
                                       ctr.device_uuid), strict=True))
        families.add("hami_vgpu_memory_used_bytes", labels, ctr.memory_used)
        families.add("hami_vgpu_memory_limit_bytes", labels, ctr.memory_limit)
        families.add("hami_container_device_memory_bytes", labels, ctr.memory_used)
        families.add("hami_container_device_utilization_ratio", labels, ctr.utilization)
        families.add("hami_vgpu_memory_context_bytes", labels, ctr.memory_context)
        families.add("hami_vgpu_memory_module_bytes", labels, ctr.memory_module)
        families.add("hami_vgpu_memory_buffer_bytes", labels, ctr.memory_buffer)
        if ctr.last_kernel_seconds is not None:
            families.add("hami_container_last_kernel_elapsed_seconds", labels, ctr.last_kernel_seconds)


def _legacy(families: _Families, containers: Iterable[ContainerGpu], hosts: Iterable[HostGpu]) -> None:
    families.declare("HostGPUMemoryUsage", "GPU device memory usage", "gauge")
    families.declare("HostCoreUtilization", "GPU core utilization", "gauge")
    families.declare("vGPU_device_memory_usage_in_bytes", "vGPU device usage", "gauge")
    families.declare("vGPU_device_memory_limit_in_bytes", "vGPU device limit", "gauge")
    families.declare("Device_memory_desc_of_container", "Container device meory description", "counter")
    families.declare("Device_utilization_desc_of_container", "Container device utilization description", "gauge")
    families.declare("Device_last_kernel_of_container", "Container device last kernel description", "gauge")
    for gpu in hosts:
        device = dict(zip(_LEGACY_HOST, (str(gpu.index), gpu.uuid), strict=True))
        families.add("HostGPUMemoryUsage", device, gpu.memory_used)
        families.add("HostCoreUtilization", device, gpu.utilization)
    for ctr in containers:
        labels = dict(zip(_LEGACY_CONTAINER, (ctr.namespace, ctr.pod, ctr.container, str(ctr.vdevice_index),
                                              ctr.device_uuid), strict=True))
        families.add("vGPU_device_memory_usage_in_bytes", labels, ctr.memory_used)
        families.add("vGPU_device_memory_limit_in_bytes", labels, ctr.memory_limit)
        offset = ctr.memory_used - ctr.memory_context - ctr.memory_module - ctr.memory_buffer
        families.add("Device_memory_desc_of_container", {
            **labels, "context": str(ctr.memory_context), "module": str(ctr.memory_module),
            "data": str(ctr.memory_buffer), "offset": str(offset)}, ctr.memory_used)
        families.add("Device_utilization_desc_of_container", labels, ctr.utilization)
        if ctr.last_kernel_seconds is not None:
            families.add("Device_last_kernel_of_container", labels, ctr.last_kernel_seconds)


def render_metrics(scheme: str, node: str, containers: Iterable[ContainerGpu], hosts: Iterable[HostGpu]) -> str:
    """The monitor's ``/metrics`` text (Prometheus exposition format 0.0.4) for one node.

    Args:
        scheme: ``current`` or ``legacy`` (see the module docstring).
        node: the node name (``NODE_NAME`` of the monitor container; the current host series' ``node`` label).
        containers: the (container, GPU) readings of the GPU pods on the node.
        hosts: the node's GPUs.

    Raises:
        ValueError: an unknown scheme.
    """
    families = _Families()
    if scheme == SCHEME_CURRENT:
        _current(families, node, containers, hosts)
    elif scheme == SCHEME_LEGACY:
        _legacy(families, containers, hosts)
    else:
        raise ValueError(f"unknown HAMi monitor scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    return families.text()
