"""Pure parts of the inventory snapshot, on the Node fixtures of tests/fixtures/k8s-objects/.

Listing nodes from an apiserver (``collect_inventory``) is tested against the Kubernetes API
emulator, not here.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import kubernetes.client
import pytest

from operator_agent.hami import decode_node_register
from operator_agent.reporters.inventory import device_to_snapshot, node_to_snapshot, pod_requests, snapshot_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s-objects"
NODE_FILES = ["node.gpu-8xh100.hami-v2.10.json", "node.gpu-8xh100.hami-v2.5-v2.7.json"]
DEVICE_KEYS = {"uuid", "index", "model", "memory_mib", "split_count", "cores", "health", "mode", "numa"}
H100_BY_INDEX = [
    "GPU-d5ce9128-646c-649e-3008-e1eaf764f229",
    "GPU-31518e05-67f8-316e-6bce-e010baa1cc88",
    "GPU-994fe2ef-c8c0-a723-e6f9-67dcc3ca7164",
    "GPU-084020d3-3b49-b252-c6dd-9351a72bc7b1",
    "GPU-a3efefa9-8d9e-fcd7-eb38-dee51143d163",
    "GPU-33b5739b-85b3-4279-071b-380e4f936328",
    "GPU-c3699744-0b88-6a13-641d-4f12bed5c1e0",
    "GPU-f33046e8-f8ce-e356-9bd5-dc371cd3440c",
]


def load_node(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def as_v1node(node: dict) -> kubernetes.client.V1Node:
    """Deserialize Node JSON the way the Kubernetes client does for an API response."""
    client = kubernetes.client.ApiClient()
    text = json.dumps(node)
    try:  # kubernetes >= 35: deserialize(response_text, response_type, content_type)
        return client.deserialize(text, "V1Node", "application/json")
    except TypeError:  # older clients: deserialize(response, response_type)

        class Response:
            data = text

        return client.deserialize(Response(), "V1Node")


def set_condition(node: dict, ctype: str, status: str) -> dict:
    node = copy.deepcopy(node)
    for condition in node["status"]["conditions"]:
        if condition["type"] == ctype:
            condition["status"] = status
    return node


@pytest.mark.parametrize("name", NODE_FILES)
def test_node_snapshot_from_fixture(name):
    node = load_node(name)
    entry = node_to_snapshot(node)

    assert set(entry) == {"name", "labels", "ready", "devices", "cpu_allocatable_millicores", "memory_allocatable_mib"}
    # status.allocatable: cpu "160", memory "2113340180Ki" (rounded down to MiB)
    assert (entry["cpu_allocatable_millicores"], entry["memory_allocatable_mib"]) == (160_000, 2113340180 // 1024)
    assert entry["name"] == "gpu-node-01"
    assert entry["labels"] == node["metadata"]["labels"]
    assert entry["labels"]["gpu"] == "on"
    assert entry["ready"] is True
    assert [d["uuid"] for d in entry["devices"]] == H100_BY_INDEX  # sorted by NVML index
    assert [d["index"] for d in entry["devices"]] == list(range(8))
    for device in entry["devices"]:
        assert set(device) == DEVICE_KEYS
        assert device["model"] == "NVIDIA H100 80GB HBM3"
        assert device["memory_mib"] == 81559
        assert device["split_count"] == 10
        assert device["cores"] == 100
        assert device["health"] is True
        assert device["mode"] == "hami-core"
        assert device["numa"] == 0
    json.dumps(entry)  # the snapshot is plain JSON


def test_hami_upgrade_does_not_change_the_snapshot():
    """v2.5–v2.7 legacy string and v2.10 JSON describe the same node: the snapshots are identical."""
    before, after = (node_to_snapshot(load_node(name)) for name in NODE_FILES)
    assert before == after


@pytest.mark.parametrize("name", NODE_FILES)
def test_v1node_and_json_give_the_same_snapshot(name):
    node = load_node(name)
    assert node_to_snapshot(as_v1node(node)) == node_to_snapshot(node)


@pytest.mark.parametrize("status", ["False", "Unknown"])
def test_not_ready_node(status):
    node = set_condition(load_node(NODE_FILES[0]), "Ready", status)
    assert node_to_snapshot(node)["ready"] is False
    assert node_to_snapshot(as_v1node(node))["ready"] is False


def test_node_without_conditions_is_not_ready():
    node = load_node(NODE_FILES[0])
    del node["status"]["conditions"]
    assert node_to_snapshot(node)["ready"] is False
    assert node_to_snapshot(as_v1node(node))["ready"] is False


def test_other_condition_true_is_not_ready():
    node = set_condition(set_condition(load_node(NODE_FILES[0]), "Ready", "False"), "DiskPressure", "True")
    assert node_to_snapshot(node)["ready"] is False


def test_node_without_hami_annotation_has_no_devices():
    node = load_node(NODE_FILES[0])
    del node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    entry = node_to_snapshot(node)
    assert entry["devices"] == []
    assert "hami_error" not in entry
    assert node_to_snapshot(as_v1node(node)) == entry


def test_legacy_4pd_annotation_key_is_read():
    node = load_node(NODE_FILES[1])
    annotations = node["metadata"]["annotations"]
    annotations["4pd.io/node-nvidia-register"] = annotations.pop("hami.io/node-nvidia-register")
    assert len(node_to_snapshot(node)["devices"]) == 8


def test_undecodable_annotation_is_reported_with_error(caplog):
    node = load_node(NODE_FILES[1])
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "GPU-x,10,1,100,NVIDIA-T4,0,true,3:"

    with caplog.at_level(logging.WARNING, logger="operator_agent.reporters.inventory"):
        entry = node_to_snapshot(node)

    assert entry["name"] == "gpu-node-01"
    assert entry["ready"] is True
    assert entry["devices"] == []
    assert "8-field" in entry["hami_error"] and "GPU-x" in entry["hami_error"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "gpu-node-01" in warnings[0].getMessage()
    assert entry["hami_error"] in warnings[0].getMessage()


def test_minimal_node_dict():
    entry = node_to_snapshot({"metadata": {"name": "n1"}})
    assert entry == {"name": "n1", "labels": {}, "ready": False, "devices": []}


def test_snapshot_counts():
    snapshot = {"nodes": [node_to_snapshot(load_node(name)) for name in NODE_FILES] + [{"name": "x", "devices": []}]}
    assert snapshot_counts(snapshot) == (3, 16)
    assert snapshot_counts({"nodes": []}) == (0, 0)


def test_device_to_snapshot_keys():
    (device,) = decode_node_register('[{"id":"GPU-0","count":7,"devmem":40960,"devcore":100,"type":"X","mode":"mig"}]')
    assert device_to_snapshot(device) == {
        "uuid": "GPU-0",
        "index": 0,
        "model": "X",
        "memory_mib": 40960,
        "split_count": 7,
        "cores": 100,
        "health": False,
        "mode": "mig",
        "numa": 0,
    }


# --------------------------------------------------------------------------- CPU and memory


@pytest.mark.parametrize(("allocatable", "expected"), [
    ({"cpu": "7500m", "memory": "1Gi"}, {"cpu_allocatable_millicores": 7500, "memory_allocatable_mib": 1024}),
    ({"cpu": "0.0005", "memory": "1048575"}, {"cpu_allocatable_millicores": 0, "memory_allocatable_mib": 0}),  # rounded down
    ({"cpu": "8"}, {}),
    ({"memory": "1Gi"}, {}),
    ({"cpu": "NaN", "memory": "1Gi"}, {}),
    ({"cpu": "8", "memory": "1e99999999"}, {}),
    ({"cpu": "-1", "memory": "1Gi"}, {}),
])
def test_allocatable_figures_are_both_or_none(allocatable, expected):
    entry = node_to_snapshot({"metadata": {"name": "n1"}, "status": {"allocatable": allocatable}})
    assert {k: v for k, v in entry.items() if k.endswith(("_millicores", "_mib"))} == expected
    assert node_to_snapshot(as_v1node({"metadata": {"name": "n1"}, "status": {"allocatable": allocatable}})) == entry


def as_v1pod(pod: dict) -> kubernetes.client.V1Pod:
    client = kubernetes.client.ApiClient()
    text = json.dumps(pod)
    try:
        return client.deserialize(text, "V1Pod", "application/json")
    except TypeError:

        class Response:
            data = text

        return client.deserialize(Response(), "V1Pod")


def container(name: str, **requests: str) -> dict:
    return {"name": name, "image": "x", "resources": {"requests": requests}}


def test_pod_requests_count_as_the_scheduler_does():
    pod = {"metadata": {"name": "p"}, "spec": {
        "containers": [container("a", cpu="250m", memory="100Mi"), container("b", cpu="1"), {"name": "c", "image": "x"}],
        "initContainers": [container("i", cpu="2", memory="10Mi")],
        "overhead": {"cpu": "100m", "memory": "1Mi"},
    }}
    # cpu: max(1250m, 2000m) + 100m; memory: max(100Mi, 10Mi) + 1Mi, in bytes
    assert pod_requests(as_v1pod(pod)) == (2100, 101 * 1024 * 1024)
    assert pod_requests(as_v1pod({"metadata": {"name": "p"}, "spec": {"containers": [container("a", cpu="1m", memory="garbage")]}})) == (1, 0)
