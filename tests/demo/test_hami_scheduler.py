"""The emulator's scheduler/HAMi/kubelet stand-in (``pod_startup_seconds``) on the demo fleet.

GPU pods are created with the official ``kubernetes`` client against ``EmulatedCluster(fleet.cluster_objects(...))``
and must end up as HAMi leaves them on a real cluster: bound to a node with room (HAMi's sharing rules on the
GPUs of the node's ``hami.io/node-nvidia-register`` annotation), with the pod annotations HAMi's scheduler and
device plugin write, in the format of ``demo/data/hami/pod-annotations.observed.yaml``.

No Django here: run with ``pytest -p no:django tests/demo``.
"""

from __future__ import annotations

import ipaddress
import re
import signal
import subprocess
import time
from pathlib import Path

import kubernetes
import pytest
import yaml

from demo import emulator, fleet
from demo.emulator import EmulatedCluster
from operator_agent.hami import decode_node_register
from operator_agent.hami_pods import decode_pod_devices
from tests.helpers import serve_seed, wait_for

ROOT = Path(__file__).resolve().parents[2]
NS = "gshare-sessions"
OBSERVED = yaml.safe_load((fleet.DATA_DIR / "hami/pod-annotations.observed.yaml").read_text(encoding="utf-8"))

# One container segment of hami.io/vgpu-devices-allocated: `<uuid>,<type>,<usedmem MiB>,<usedcores %>:` per device
# (hami/README.md section 3). Written here from the grammar, independently of demo.emulator's encoder.
_DEVICE = r"(GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}),(NVIDIA),([0-9]+),([0-9]+):"
ALLOCATED_RE = re.compile(rf"(?:(?:{_DEVICE})*;)+")
EMPTIED_RE = re.compile(r";+")
UNIX_SECONDS_RE = re.compile(r"[0-9]{10}")


def decode_allocated(value: str) -> list[list[tuple[str, str, int, int]]]:
    """A test-side decoder: per container, ``(uuid, type, usedmem MiB, usedcores %)`` per device.

    Also checks that the operator's decoder (``operator_agent.hami_pods``, which the operator reports session
    devices with and the emulator keeps its books with) reads the same thing.
    """
    assert ALLOCATED_RE.fullmatch(value), value
    decoded = [[(u, t, int(m), int(c)) for u, t, m, c in re.findall(_DEVICE, segment)]
               for segment in value.split(";")[:-1]]
    assert [[(d["uuid"], d["type"], d["memory_mib"], d["cores"]) for d in ctr]
            for ctr in decode_pod_devices(value)] == decoded
    return decoded


def node_gpus(cluster: str, node: str) -> dict[str, object]:
    """uuid -> HamiDevice of a fleet node, from its register annotation (the operator's decoder)."""
    spec = next(n for n in fleet.cluster_spec(cluster).nodes if n.name == node)
    return {d.uuid: d for d in decode_node_register(spec.register_annotation())}


def gpu_pod(name: str, gpus: int | None = 1, memory: int | None = None, cores: int | None = None, *,
            selector: dict | None = None, annotations: dict | None = None, extra_containers: list | None = None,
            init_containers: list | None = None) -> dict:
    """A session-like pod: nodeSelector gpu=on, HAMi limits as strings (the client sends them as quantities)."""
    limits = {}
    if gpus is not None:
        limits["nvidia.com/gpu"] = str(gpus)
    if memory is not None:
        limits["nvidia.com/gpumem"] = str(memory)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    main = {"name": "jupyter", "image": "quay.io/jupyter/base-notebook:2024-12-02", "resources": {"limits": limits}}
    spec = {"nodeSelector": selector if selector is not None else {"gpu": "on"},
            "containers": list(extra_containers or []) + [main]}
    if init_containers:
        spec["initContainers"] = init_containers
    return {"metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}


class Lab:
    """A started lab cluster and a CoreV1Api on it."""

    def __init__(self, cluster: EmulatedCluster, core: kubernetes.client.CoreV1Api) -> None:
        self.cluster = cluster
        self.core = core

    def create(self, body: dict) -> None:
        self.core.create_namespaced_pod(NS, body)

    def read(self, name: str):
        return self.core.read_namespaced_pod(name, NS)

    def running(self, name: str):
        return wait_for(lambda: (pod := self.read(name)).status.phase == "Running" and pod)

    def unschedulable(self, name: str):
        def check():
            pod = self.read(name)
            scheduled = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
            return scheduled and scheduled[0].status == "False" and pod
        return wait_for(check)

    def devices(self, name: str) -> list[list[tuple[str, str, int, int]]]:
        return decode_allocated(self.running(name).metadata.annotations["hami.io/vgpu-devices-allocated"])

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, NS)


@pytest.fixture(params=["lab-c1"])
def lab(request):
    name = request.param
    with EmulatedCluster(fleet.cluster_objects(name), version=fleet.cluster_version(name),
                         pod_startup_seconds=0.1) as cluster:
        api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig(name))
        yield Lab(cluster, kubernetes.client.CoreV1Api(api))
        api.close()


@pytest.fixture
def lab_c2():
    with EmulatedCluster(fleet.cluster_objects("lab-c2"), version=fleet.cluster_version("lab-c2"),
                         pod_startup_seconds=0.1) as cluster:
        api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c2"))
        yield Lab(cluster, kubernetes.client.CoreV1Api(api))
        api.close()


# --------------------------------------------------------------------------- format


def test_the_test_grammar_matches_the_observed_real_values():
    """The regex the tests check against accepts every well-formed value seen on real pods."""
    values = [item["annotations"] for item in OBSERVED]
    allocated = [a["hami.io/vgpu-devices-allocated"] for a in values if "hami.io/vgpu-devices-allocated" in a]
    well_formed = [v for v in allocated if ",,0,0:" not in v]  # issue #991's bug value is the only exception
    assert len(well_formed) == len(allocated) - 1 >= 6
    for value in well_formed:
        assert ALLOCATED_RE.fullmatch(value), value
        assert {t for ctr in decode_allocated(value) for _, t, _, _ in ctr} == {"NVIDIA"}
    for a in values:
        for key in ("hami.io/vgpu-time", "hami.io/bind-time"):
            if key in a:
                assert UNIX_SECONDS_RE.fullmatch(a[key])
        if a.get("hami.io/bind-phase") == "success" and "hami.io/vgpu-devices-to-allocate" in a:
            assert EMPTIED_RE.fullmatch(a["hami.io/vgpu-devices-to-allocate"]) or \
                a["hami.io/vgpu-devices-to-allocate"] == a["hami.io/vgpu-devices-allocated"]  # issue #987


def test_resource_names_are_the_hami_charts():
    values = yaml.safe_load((fleet.DATA_DIR / "hami/helm-values.resource-names.v2.10.0.yaml").read_text())
    assert (emulator.HAMI_RESOURCE_COUNT, emulator.HAMI_RESOURCE_MEMORY, emulator.HAMI_RESOURCE_MEMORY_PERCENTAGE,
            emulator.HAMI_RESOURCE_CORES) == (values["resourceName"], values["resourceMem"],
                                               values["resourceMemPercentage"], values["resourceCores"])


def test_encoder_matches_the_documented_example():
    # HAMi docs/develop/protocol.md (v2.10.0): 2 containers sharing one V100 of lab-c1's gpu-v100-01.
    doc = next(i for i in OBSERVED if "2 containers on one GPU" in i["source"])["annotations"]
    value = doc["hami.io/vgpu-devices-to-allocate"]
    uuid = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
    containers = [[emulator.GpuAllocation(uuid, 3000, 0)], [emulator.GpuAllocation(uuid, 5000, 0)]]
    assert emulator.encode_pod_devices(containers) == value
    assert decode_allocated(value) == [[(uuid, "NVIDIA", 3000, 0)], [(uuid, "NVIDIA", 5000, 0)]]
    # issue #1932: container 0 without GPU
    assert emulator.encode_pod_devices([[], [emulator.GpuAllocation(uuid, 6144, 30)]]) == f";{uuid},NVIDIA,6144,30:;"


@pytest.mark.parametrize(("text", "value"), [("1", 1), (2, 2), ("8192", 8192), ("20k", 20000), ("1Ki", 1024),
                                             ("500m", 1), ("1e3", 1000), ("0.5", 1)])
def test_quantities_round_up_like_quantity_value(text, value):
    assert emulator.parse_quantity(text) == value


def test_requests_read_limits_then_requests_init_containers_first():
    spec = {"initContainers": [{"name": "init", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
            "containers": [{"name": "side"},
                           {"name": "main", "resources": {"limits": {"nvidia.com/gpumem": "3000",
                                                                     "nvidia.com/gpumem-percentage": "150",
                                                                     "nvidia.com/gpucores": "130"}}}]}
    init, side, main = emulator.pod_gpu_requests(spec)
    assert init == emulator.GpuRequest(1) and init.exclusive
    assert side is None
    assert main == emulator.GpuRequest(1, memory_mib=3000, memory_percent=100, cores_percent=100)
    assert not main.exclusive and main.memory_for(81559) == 3000
    assert emulator.GpuRequest(1).memory_for(81559) == 81559  # HAMi default: 100 % of the GPU's memory
    assert emulator.GpuRequest(1, memory_percent=50).memory_for(81559) == 40779


# --------------------------------------------------------------------------- scheduling on lab-c1


def test_whole_gpu_pod_runs_with_real_format_annotations(lab):
    before = int(time.time())
    lab.create(gpu_pod("whole"))
    pod = lab.running("whole")
    after = int(time.time())
    node = pod.spec.node_name
    assert node == "gpu-h100-01"  # both GPU nodes idle: binpack ties break by name
    annotations = pod.metadata.annotations
    assert annotations["hami.io/vgpu-node"] == node
    assert annotations["hami.io/bind-phase"] == "success"
    assert annotations["hami.io/vgpu-devices-to-allocate"] == ";"
    for key in ("hami.io/vgpu-time", "hami.io/bind-time"):
        assert UNIX_SECONDS_RE.fullmatch(annotations[key]) and before <= int(annotations[key]) <= after
    [[(uuid, kind, memory, cores)]] = decode_allocated(annotations["hami.io/vgpu-devices-allocated"])
    gpus = node_gpus("lab-c1", node)
    assert uuid in gpus and gpus[uuid].index == 0
    assert (kind, memory, cores) == ("NVIDIA", gpus[uuid].memory_mib, 0)  # 100 % memory, no core limit
    node_obj = lab.core.read_node(node)
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(node_obj.spec.pod_cidr)
    assert pod.status.host_ip == "10.0.0.11"
    assert pod.status.container_statuses[0].state.running is not None
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"


def test_bound_pod_shows_the_allocating_phase_before_it_runs():
    with EmulatedCluster(fleet.cluster_objects("lab-c1"), pod_startup_seconds=30) as cluster:
        api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespaced_pod(NS, gpu_pod("slow", 1, 4096, 25))
        pod = wait_for(lambda: (p := core.read_namespaced_pod("slow", NS)).spec.node_name and p)
        annotations = pod.metadata.annotations
        assert pod.status.phase == "Pending"
        assert {c.type: c.status for c in pod.status.conditions} == {"PodScheduled": "True"}
        assert annotations["hami.io/bind-phase"] == "allocating"
        assert annotations["hami.io/vgpu-devices-to-allocate"] == annotations["hami.io/vgpu-devices-allocated"]
        assert decode_allocated(annotations["hami.io/vgpu-devices-allocated"])[0][0][1:] == ("NVIDIA", 4096, 25)
        api.close()


def test_whole_gpus_are_exclusive_and_deleting_a_pod_frees_its_gpu(lab):
    uuids = set(node_gpus("lab-c1", "gpu-h100-01")) | set(node_gpus("lab-c1", "gpu-v100-01"))
    for i in range(10):  # lab-c1 has 8 + 2 GPUs
        lab.create(gpu_pod(f"whole-{i}"))
    held = {f"whole-{i}": lab.devices(f"whole-{i}")[0][0][0] for i in range(10)}
    assert set(held.values()) == uuids
    lab.create(gpu_pod("one-too-many"))
    stuck = lab.unschedulable("one-too-many")
    condition = next(c for c in stuck.status.conditions if c.type == "PodScheduled")
    assert stuck.status.phase == "Pending" and stuck.spec.node_name is None
    assert condition.reason == "Unschedulable"
    assert condition.message == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 NodeUnfitPod. "
        "preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, "
        "2 No preemption victims found for incoming pod.")
    lab.create(gpu_pod("shared-too", 1, 1024, 10))  # a shared request does not fit on a held GPU either
    lab.unschedulable("shared-too")
    deleted_at = time.monotonic()
    lab.delete("whole-3")
    assert lab.devices("one-too-many")[0][0][0] == held["whole-3"]
    assert time.monotonic() - deleted_at < 3  # retried on the delete, not after the 10 s periodic retry


def test_shared_requests_pack_onto_one_gpu_up_to_the_split_count(lab):
    gpus = node_gpus("lab-c1", "gpu-h100-01")
    first = next(u for u, d in gpus.items() if d.index == 0)
    second = next(u for u, d in gpus.items() if d.index == 1)
    assert gpus[first].split_count == 10
    for i in range(11):
        lab.create(gpu_pod(f"small-{i}", 1, 1000, 5))
    placed = [lab.devices(f"small-{i}")[0][0] for i in range(11)]
    assert [d[0] for d in placed[:10]] == [first] * 10  # 10 vGPUs share GPU 0 (split count)
    assert placed[10][0] == second  # the 11th goes to the next GPU by index
    assert {lab.read(f"small-{i}").spec.node_name for i in range(11)} == {"gpu-h100-01"}
    assert {(d[2], d[3]) for d in placed} == {(1000, 5)}


def test_shared_requests_never_overcommit_memory_or_cores(lab):
    gpus = node_gpus("lab-c1", "gpu-h100-01")
    by_index = {d.index: u for u, d in gpus.items()}
    for i in range(3):  # 2 x 40000 MiB fit in 81559 MiB, a third does not
        lab.create(gpu_pod(f"mem-{i}", 1, 40000))
    assert [lab.devices(f"mem-{i}")[0][0][0] for i in range(3)] == [by_index[0], by_index[0], by_index[1]]
    assert lab.devices("mem-0")[0][0][3] == 0  # no gpucores: no core limit
    # GPU 0 keeps 1559 MiB (too little for 2000); on GPU 1, 60 + 40 cores fill its 100 %: a third 40 % goes on,
    # and so does a request without core limit (HAMi: no core-less job on a GPU whose cores are all taken)
    for i, cores in enumerate((60, 40, 40, None)):
        lab.create(gpu_pod(f"core-{i}", 1, 2000, cores))
    assert [lab.devices(f"core-{i}")[0][0][0] for i in range(4)] == [by_index[1], by_index[1], by_index[2],
                                                                     by_index[2]]


def test_shared_and_whole_requests_keep_out_of_each_others_gpus(lab):
    gpus = node_gpus("lab-c1", "gpu-h100-01")
    by_index = {d.index: u for u, d in gpus.items()}
    lab.create(gpu_pod("shared", 1, 2048, 20))
    assert lab.devices("shared")[0][0][0] == by_index[0]
    lab.create(gpu_pod("whole"))
    assert lab.devices("whole")[0][0][0] == by_index[1]  # GPU 0 is in use: not exclusive any more
    lab.create(gpu_pod("shared-2", 1, 2048, 20))
    assert lab.devices("shared-2")[0][0][0] == by_index[0]  # GPU 1 is held whole


def test_multi_gpu_pods_get_distinct_gpus_of_one_node(lab):
    lab.create(gpu_pod("quad", 4))
    [devices] = lab.devices("quad")
    uuids = [d[0] for d in devices]
    assert len(set(uuids)) == 4 and set(uuids) <= set(node_gpus("lab-c1", "gpu-h100-01"))
    lab.create(gpu_pod("shared-pair", 2, 1024, 10))
    [pair] = lab.devices("shared-pair")
    assert len({d[0] for d in pair}) == 2
    lab.create(gpu_pod("v100-pair", 2, selector={"kubernetes.io/hostname": "gpu-v100-01"}))
    [v100] = lab.devices("v100-pair")
    assert {d[0] for d in v100} == set(node_gpus("lab-c1", "gpu-v100-01"))
    lab.create(gpu_pod("nine", 9))  # more vGPUs than any node has GPUs
    assert "2 NodeUnfitPod" in next(c.message for c in lab.unschedulable("nine").status.conditions)


def test_binpack_prefers_the_most_used_node(lab):
    lab.create(gpu_pod("on-v100", 1, selector={"kubernetes.io/hostname": "gpu-v100-01"}))
    lab.running("on-v100")
    lab.create(gpu_pod("next"))
    assert lab.running("next").spec.node_name == "gpu-v100-01"


def test_containers_without_gpus_get_empty_segments(lab):
    init = [{"name": "fetch", "image": "busybox"}]
    side = [{"name": "proxy", "image": "nginx"}]
    lab.create(gpu_pod("multi", 1, 6144, 30, extra_containers=side, init_containers=init))
    pod = lab.running("multi")
    annotations = pod.metadata.annotations
    assert decode_allocated(annotations["hami.io/vgpu-devices-allocated"])[:2] == [[], []]
    assert re.fullmatch(rf";;{_DEVICE};", annotations["hami.io/vgpu-devices-allocated"])
    assert annotations["hami.io/vgpu-devices-to-allocate"] == ";;;"
    assert [c.name for c in pod.status.container_statuses] == ["proxy", "jupyter"]


def test_impossible_and_misplaced_requests_explain_themselves(lab):
    lab.create(gpu_pod("huge", 1, 100000))  # more memory than any GPU registers
    lab.create(gpu_pod("nowhere", selector={"gpu": "off"}))
    lab.create(gpu_pod("control-plane", selector={"kubernetes.io/hostname": "lab-c1-cp-01"}))
    lab.create(gpu_pod("h20", annotations={"nvidia.com/use-gputype": "H20"}))  # lab-c1 has H100 and V100
    messages = {name: next(c.message for c in lab.unschedulable(name).status.conditions)
                for name in ("huge", "nowhere", "control-plane", "h20")}
    assert messages["nowhere"] == (
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
    assert messages["control-plane"] == (
        "0/3 nodes are available: 1 node unregistered, 2 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, "
        "2 Preemption is not helpful for scheduling.")
    assert messages["huge"] == messages["h20"]
    time.sleep(0.3)
    for name in messages:
        pod = lab.read(name)
        assert pod.status.phase == "Pending" and pod.spec.node_name is None
        assert "hami.io/vgpu-devices-allocated" not in (pod.metadata.annotations or {})


def test_pods_without_gpus_are_scheduled_without_hami_annotations(lab):
    lab.core.create_namespaced_pod(NS, {"metadata": {"name": "web"},
                                        "spec": {"containers": [{"name": "web", "image": "nginx"}]}})
    pod = lab.running("web")
    assert pod.spec.node_name == "gpu-h100-01"  # the first node that passes the filters, by name
    assert not any(k.startswith("hami.io/") for k in pod.metadata.annotations or {})


def test_finished_pods_free_their_gpus(lab):
    lab.create(gpu_pod("batch", 4, selector={"kubernetes.io/hostname": "gpu-h100-01"}))
    lab.create(gpu_pod("batch-2", 5, selector={"kubernetes.io/hostname": "gpu-h100-01"}))
    lab.running("batch")
    lab.unschedulable("batch-2")
    lab.core.patch_namespaced_pod_status("batch", NS, {"status": {"phase": "Succeeded"}})
    assert len(lab.devices("batch-2")[0]) == 5


# --------------------------------------------------------------------------- lab-c2 (legacy annotations)


def test_lab_c2_reads_legacy_register_annotations(lab_c2):
    lab_c2.create(gpu_pod("t4", 1, 2000, annotations={"nvidia.com/use-gputype": "T4"}))
    pod = lab_c2.running("t4")
    assert pod.spec.node_name == "gpu-t4-01"
    assert lab_c2.devices("t4") == [[("GPU-9a3603f4-f66e-d48b-11ea-13e327064cca", "NVIDIA", 2000, 0)]]
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network("10.42.1.0/24")  # k3s pod CIDR
    lab_c2.create(gpu_pod("h20", 2, 100000, 250, annotations={"nvidia.com/use-gputype": "H20"}))
    devices = lab_c2.devices("h20")[0]
    assert {d[0] for d in devices} <= set(node_gpus("lab-c2", "gpu-h20-01")) and len({d[0] for d in devices}) == 2


# --------------------------------------------------------------------------- the demo's CLI path


def _serve_seed(tmp_path: Path, seed: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    process, info = serve_seed(tmp_path, seed, *extra)
    return process, info["url"]


def _client(url: str) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": url}}], "users": [{"name": "c", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "c"}}]})


@pytest.mark.parametrize("extra", [(), ("--pod-startup-seconds", "off")])
def test_the_demo_seed_runs_gpu_pods(tmp_path, extra):
    seed = fleet.write_seed("lab-c1", tmp_path / "seed.json")
    process, url = _serve_seed(tmp_path, seed, *extra)
    try:
        api = _client(url)
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespaced_pod(NS, gpu_pod("session", 1, 8192, 30))
        if extra:
            time.sleep(1.5)
            assert core.read_namespaced_pod("session", NS).status.phase == "Pending"
        else:
            pod = wait_for(lambda: (p := core.read_namespaced_pod("session", NS)).status.phase == "Running" and p)
            assert decode_allocated(pod.metadata.annotations["hami.io/vgpu-devices-allocated"])[0][0][1:] == (
                "NVIDIA", 8192, 30)
        api.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
