"""Current-scheme HAMi vGPU monitor text built with ``prometheus_client``'s own registry and exposition.

The names and label sets are those of ``Project-HAMi/HAMi`` ``cmd/vGPUmonitor/metrics.go`` (``ctrvGPUdesc``,
``ctrvGPUlimitdesc``, ``ctrDeviceUtilizationdesc``, ``ctrDeviceLastKernelDesc``, ``hostGPUdesc``, and the legacy
descriptors of ``initLegacyDescriptors``); HAMi registers its collector with the constant label ``zone="vGPU"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge, generate_latest

CONTAINER_LABELS = ["namespace", "pod", "container", "vdevice_index", "device_uuid"]
LEGACY_LABELS = ["podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"]


@dataclass
class Series:
    """One container's vGPU, as HAMi's collector emits it (``last_kernel`` None: no kernel yet, no series)."""

    namespace: str
    pod: str
    container: str
    vdevice: int
    uuid: str
    used: int
    limit: int
    util: float
    last_kernel: float | None


def exposition(series: list[Series], *, legacy_too: bool = False, host_uuids: tuple[str, ...] = ()) -> bytes:
    """The monitor's ``/metrics`` body for ``series`` (current names; with ``legacy_too`` also the legacy ones)."""
    registry = CollectorRegistry()
    const = {"zone": "vGPU"}
    host = Gauge("hami_host_gpu_memory_used_bytes", "GPU device memory usage in bytes",
                 ["node", "device_index", "device_uuid", "device_type"], registry=registry)
    for index, uuid in enumerate(host_uuids):
        host.labels("gpu-node-1", str(index), uuid, "NVIDIA-NVIDIA H100").set(1 << 30)
    schemes = [("hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes", "hami_container_device_utilization_ratio",
                "hami_container_last_kernel_elapsed_seconds", CONTAINER_LABELS)]
    if legacy_too:
        schemes.append(("vGPU_device_memory_usage_in_bytes", "vGPU_device_memory_limit_in_bytes",
                        "Device_utilization_desc_of_container", "Device_last_kernel_of_container", LEGACY_LABELS))
    for used_name, limit_name, util_name, kernel_name, labels in schemes:
        used = Gauge(used_name, "vGPU device memory usage in bytes", labels + ["zone"], registry=registry)
        limit = Gauge(limit_name, "vGPU device memory limit in bytes", labels + ["zone"], registry=registry)
        util = Gauge(util_name, "Container device SM utilization ratio", labels + ["zone"], registry=registry)
        kernel = Gauge(kernel_name, "Seconds since last kernel execution in container", labels + ["zone"],
                       registry=registry)
        for s in series:
            values = [s.namespace, s.pod, s.container, str(s.vdevice), s.uuid, const["zone"]]
            used.labels(*values).set(s.used)
            limit.labels(*values).set(s.limit)
            util.labels(*values).set(s.util)
            if s.last_kernel is not None:
                kernel.labels(*values).set(s.last_kernel)
    return generate_latest(registry)
