"""HAMi vGPU monitor text (operator_agent.hami_monitor): both naming schemes, combining, bounds and garbage.

Legacy inputs are the real outputs in ``tests/fixtures/hami/vgpu-monitor/`` (README there); current-scheme inputs are
built with ``prometheus_client``'s registry from HAMi's names and labels (``tests/operator_agent/hami_exposition``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from operator_agent.hami_monitor import (
    MAX_EXPOSITION_BYTES,
    GpuReading,
    MonitorParseError,
    combine,
    parse_monitor,
)
from tests.operator_agent.hami_exposition import Series, exposition

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hami" / "vgpu-monitor"
GPU_A = "GPU-59ab1128-3130-b95a-9870-4bd748926e97"
GPU_B = "GPU-c15bf6bc-3faf-3140-4788-0e1dcb7af8c2"


def test_the_busy_legacy_container_of_the_volcano_readme():
    parsed = parse_monitor((FIXTURES / "metrics.legacy.volcano-vgpu-device-plugin-readme.txt").read_bytes())
    assert parsed.scheme == "legacy"
    assert list(parsed.containers) == [("default", "hami-device", "cuda-container", "GPU-xxxx")]
    # README: 99 % SM, last kernel 0 s ago, 2.1 GB of a 3.1 GB limit; host-level series are not a container's
    assert parsed.for_pod("default", "hami-device") == {"GPU-xxxx": GpuReading(
        last_kernel_seconds=0.0, utilization_percent=99.0, memory_used_bytes=2_109_867_008,
        memory_limit_bytes=3_145_728_000)}


def test_the_idle_legacy_container_of_w7panel():
    parsed = parse_monitor((FIXTURES / "metrics.legacy.idle-container.txt").read_text())
    reading = parsed.for_pod("default", "gpu-cxeyttpu-5bc96fc469-8q2zb")[GPU_A]
    assert reading == GpuReading(last_kernel_seconds=80_450.0, utilization_percent=0.0, memory_used_bytes=0,
                                 memory_limit_bytes=314_572_800)
    assert parsed.for_pod("default", "another-pod") == {}


def test_the_current_scheme_as_prometheus_client_writes_it():
    body = exposition([
        Series("gshare-sessions", "ses-a", "main", 0, GPU_A, used=512 << 20, limit=4 << 30, util=37.5, last_kernel=3),
        Series("gshare-sessions", "ses-a", "main", 1, GPU_B, used=0, limit=4 << 30, util=0, last_kernel=None),
    ], host_uuids=(GPU_A, GPU_B))
    parsed = parse_monitor(body)
    assert parsed.scheme == "current"
    assert parsed.for_pod("gshare-sessions", "ses-a") == {
        GPU_A: GpuReading(3.0, 37.5, 512 << 20, 4 << 30),
        # HAMi sends no last-kernel series before the first kernel: None, not 0
        GPU_B: GpuReading(None, 0.0, 0, 4 << 30),
    }


def test_a_monitor_serving_both_schemes_is_read_once():
    body = exposition([Series("ns", "p", "c", 0, GPU_A, used=100, limit=1000, util=10, last_kernel=7)], legacy_too=True)
    assert b"vGPU_device_memory_usage_in_bytes" in body  # both are there
    parsed = parse_monitor(body)
    assert parsed.scheme == "current"
    assert parsed.for_pod("ns", "p")[GPU_A].memory_used_bytes == 100  # not 200


def test_containers_and_vgpus_of_one_gpu_are_combined():
    body = exposition([
        Series("ns", "p", "trainer", 0, GPU_A, used=100, limit=1000, util=80, last_kernel=120),
        Series("ns", "p", "trainer", 1, GPU_A, used=50, limit=500, util=20, last_kernel=120),  # 2nd vGPU, same GPU
        Series("ns", "p", "sidecar", 0, GPU_A, used=7, limit=300, util=5, last_kernel=2),
        Series("ns", "p", "sidecar", 1, GPU_B, used=1, limit=10, util=0, last_kernel=None),
        Series("ns", "other", "c", 0, GPU_A, used=999, limit=999, util=100, last_kernel=0),
    ])
    parsed = parse_monitor(body)
    assert parsed.containers[("ns", "p", "trainer", GPU_A)].gpu == GpuReading(120.0, 80.0, 150, 1500)
    assert parsed.for_pod("ns", "p") == {
        GPU_A: GpuReading(last_kernel_seconds=2.0, utilization_percent=80.0, memory_used_bytes=157,
                          memory_limit_bytes=1800),
        GPU_B: GpuReading(None, 0.0, 1, 10),
    }


def test_combine_keeps_none_when_nothing_is_known():
    assert combine([GpuReading(), GpuReading(utilization_percent=4.0)]) == GpuReading(utilization_percent=4.0)
    assert combine([]) == GpuReading()


def test_values_outside_the_contract_are_dropped_not_invented():
    text = "\n".join([
        '# TYPE hami_container_device_utilization_ratio gauge',
        'hami_container_device_utilization_ratio{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="G1"} 150',
        'hami_container_device_utilization_ratio{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="G2"} NaN',
        '# TYPE hami_vgpu_memory_used_bytes gauge',
        'hami_vgpu_memory_used_bytes{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="G1"} -5',
        'hami_vgpu_memory_used_bytes{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="G2"} +Inf',
        '# TYPE hami_container_last_kernel_elapsed_seconds gauge',
        'hami_container_last_kernel_elapsed_seconds{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="G2"} 9',
        # no pod label: cannot be attributed to anyone
        'hami_container_last_kernel_elapsed_seconds{namespace="ns",container="c",vdevice_index="0",device_uuid="G3"} 1',
        "",
    ])
    parsed = parse_monitor(text)
    assert parsed.for_pod("ns", "p") == {"G1": GpuReading(), "G2": GpuReading(last_kernel_seconds=9.0)}
    assert all(not math.isnan(v) for r in parsed.containers.values() for v in vars(r.gpu).values() if v is not None)


def test_an_answer_with_no_container_yet_is_a_reading_of_nothing():
    parsed = parse_monitor(exposition([], host_uuids=(GPU_A,)))
    assert parsed.containers == {} and parsed.for_pod("ns", "p") == {}


def test_an_answer_over_the_size_cap_is_refused():
    one = exposition([Series("ns", "p", "c", 0, GPU_A, used=1, limit=2, util=3, last_kernel=4)])
    padding = b"# HELP padding " + b"x" * MAX_EXPOSITION_BYTES + b"\n"
    with pytest.raises(MonitorParseError, match="more than the"):
        parse_monitor(one + padding)
    parse_monitor(one)  # the same answer within the cap is read


@pytest.mark.parametrize(("body", "says"), [
    (b"<html><body><h1>502 Bad Gateway</h1></body></html>\n", "not Prometheus text"),
    (b'{"kind": "Status", "code": 503}', "not Prometheus text"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"metric\x00 1\n", "NUL"),
    (b"hello world\n", "not Prometheus text"),
    # well-formed, but another exporter: the port or the selector points at the wrong server
    (b"# TYPE node_load1 gauge\nnode_load1 0.5\n", "none of HAMi's"),
    (b"", "none of HAMi's"),
])
def test_garbage_is_refused_with_a_clear_error(body, says):
    with pytest.raises(MonitorParseError, match=says):
        parse_monitor(body)
