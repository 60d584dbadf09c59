"""HAMi's pod allocation annotation (operator_agent.hami_pods) on real values (tests/fixtures/hami/, see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from operator_agent.hami import HamiDecodeError
from operator_agent.hami_pods import (
    HAMI_POD_DEVICES_ALLOCATED_ANNOTATION,
    allocated_device_uuids,
    decode_pod_devices,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hami" / "pod-annotations.observed.yaml"
OBSERVED = yaml.safe_load(FIXTURE.read_text(encoding="utf-8"))


def observed(source_fragment: str) -> dict:
    (entry,) = [e for e in OBSERVED if source_fragment in e["source"]]
    return entry["annotations"]


def pod(annotations: dict) -> dict:
    return {"metadata": {"name": "p", "annotations": annotations}}


def test_single_container_one_gpu():
    value = observed("issue #1417")[HAMI_POD_DEVICES_ALLOCATED_ANNOTATION]
    assert decode_pod_devices(value) == [
        [{"uuid": "GPU-c15bf6bc-3faf-3140-4788-0e1dcb7af8c2", "type": "NVIDIA", "memory_mib": 5000, "cores": 0}]
    ]


def test_cores_are_percent():
    value = observed("issue #1932, normal pod")[HAMI_POD_DEVICES_ALLOCATED_ANNOTATION]
    ((device,),) = decode_pod_devices(value)
    assert (device["memory_mib"], device["cores"]) == (24576, 100)


def test_leading_container_without_gpu():
    value = observed("extra (non-GPU) container first")[HAMI_POD_DEVICES_ALLOCATED_ANNOTATION]
    assert decode_pod_devices(value) == [
        [],
        [{"uuid": "GPU-9b9030a3-d81f-7d9f-5d2b-fd98cdc57b2d", "type": "NVIDIA", "memory_mib": 6144, "cores": 30}],
    ]


def test_empty_records_of_hami_v25_are_dropped():
    value = observed("issue #991")[HAMI_POD_DEVICES_ALLOCATED_ANNOTATION]
    containers = decode_pod_devices(value)
    assert len(containers) == 5
    assert [len(c) for c in containers] == [1, 0, 0, 0, 0]
    assert containers[0][0]["uuid"] == "GPU-0aa6b97c-d386-26ba-a94a-b9d27c2e3a71"


def test_every_observed_value_decodes():
    for entry in OBSERVED:
        for key in (HAMI_POD_DEVICES_ALLOCATED_ANNOTATION, "hami.io/vgpu-devices-to-allocate"):
            value = entry["annotations"].get(key)
            if value is not None:
                containers = decode_pod_devices(value)
                assert all(d["uuid"].startswith("GPU-") for c in containers for d in c), entry["source"]


def test_done_to_allocate_values_have_no_devices():
    assert decode_pod_devices(";") == [[]]
    assert decode_pod_devices(";;;") == [[], [], []]
    assert decode_pod_devices("") == []


def test_two_containers_sharing_one_gpu():
    entry = observed("2 containers on one GPU")
    value = entry["hami.io/vgpu-devices-to-allocate"]
    assert [[d["memory_mib"] for d in c] for c in decode_pod_devices(value)] == [[3000], [5000]]
    # The same GPU in two containers is one device of the pod.
    assert allocated_device_uuids(pod({HAMI_POD_DEVICES_ALLOCATED_ANNOTATION: value})) == [
        "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
    ]


def test_missing_final_terminator_is_tolerated():
    assert decode_pod_devices("GPU-a,NVIDIA,1000,0:;GPU-b,NVIDIA,2000,50:") == [
        [{"uuid": "GPU-a", "type": "NVIDIA", "memory_mib": 1000, "cores": 0}],
        [{"uuid": "GPU-b", "type": "NVIDIA", "memory_mib": 2000, "cores": 50}],
    ]


def test_several_gpus_in_one_container_keep_order():
    value = "GPU-b,NVIDIA,80000,100:GPU-a,NVIDIA,80000,100:;"
    assert allocated_device_uuids(pod({HAMI_POD_DEVICES_ALLOCATED_ANNOTATION: value})) == ["GPU-b", "GPU-a"]


def test_allocated_device_uuids_of_real_pods():
    for entry in OBSERVED:
        annotations = entry["annotations"]
        uuids = allocated_device_uuids(pod(annotations))
        if HAMI_POD_DEVICES_ALLOCATED_ANNOTATION in annotations:
            assert len(uuids) == 1, entry["source"]
        else:
            assert uuids == []


def test_pod_without_annotation_or_metadata():
    assert allocated_device_uuids({}) == []
    assert allocated_device_uuids(pod({})) == []
    assert allocated_device_uuids({"metadata": {"annotations": None}}) == []


def test_v1pod_objects_are_accepted():
    import kubernetes.client

    v1pod = kubernetes.client.V1Pod(
        metadata=kubernetes.client.V1ObjectMeta(annotations={HAMI_POD_DEVICES_ALLOCATED_ANNOTATION: "GPU-x,NVIDIA,1,0:;"})
    )
    assert allocated_device_uuids(v1pod) == ["GPU-x"]
    assert allocated_device_uuids(kubernetes.client.V1Pod()) == []


@pytest.mark.parametrize(
    "value",
    [
        "GPU-a,NVIDIA,1000:;",  # 3 fields
        "GPU-a,NVIDIA,1000,0,extra:;",  # 5 fields
        "GPU-a,NVIDIA,lots,0:;",  # memory not a number
        "GPU-a,NVIDIA,1000,-5:;",  # negative
        "GPU-a,NVIDIA,99999999999,0:;",  # beyond int32
    ],
)
def test_malformed_values_are_refused(value):
    with pytest.raises(HamiDecodeError, match="container 0"):
        decode_pod_devices(value)
