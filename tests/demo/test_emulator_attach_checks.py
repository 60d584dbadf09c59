"""The emulator's side of ``manage.py attach_cluster``: host facts, check pods, ``pods/log`` and HAMi's device plugin.

Driven over HTTP with the official ``kubernetes`` client against ``EmulatedCluster``; host facts are built from
the real fixtures in ``tests/fixtures`` (``nvidia-smi -L`` capture, HAMi register annotations). No Django, no
database.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import kubernetes
import pytest
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from demo import fleet
from demo.emulator import EmulatedCluster, go_time_string
from operator_agent.hami import decode_node_register
from tests.helpers import serve_seed, wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TOKEN = "attach-check-token"
NAMESPACE = "gshare-system"

#: ``nvidia-smi -L`` on a 1x H100 80GB HBM3 host with MIG enabled (real capture, see tests/fixtures/nvidia-smi).
NVIDIA_SMI_L = (FIXTURES / "nvidia-smi" / "h100-80gb-hbm3-mig.list-L.txt").read_text(encoding="utf-8")
#: ``nvidia-ctk --version`` of the NVIDIA Container Toolkit 1.17.8 release (NVIDIA/nvidia-container-toolkit v1.17.8:
#: "NVIDIA Container Toolkit CLI version <version>" then "commit: <git commit>").
NVIDIA_CTK = "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d"
#: What ``nvidia-smi`` prints when the kernel driver is not loaded.
NVIDIA_SMI_ERROR = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
                    "the latest NVIDIA driver is installed and running.")
#: HAMi v2.10 register annotation of 8x H100 80GB HBM3, split count 10 each (tests/fixtures/hami).
HAMI_H100X8 = (FIXTURES / "hami" / "node-nvidia-register.v2.10.json.h100x8.derived.json").read_text(encoding="utf-8")
#: HAMi v2.4 register annotation of 1x Tesla T4, split count 10 (REAL, HAMi issue #602).
HAMI_T4 = (FIXTURES / "hami" / "node-nvidia-register.v2.4.legacy7.t4x1.txt").read_text(encoding="utf-8")
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
NFS_TARGET = "nfs.lab.internal:2049"
OTHER_TARGET = "10.20.0.9:2049"

#: A GPU host with everything attach_cluster wants.
GPU_HOST = {
    "nvidia_pci": 1, "nvidia_smi": NVIDIA_SMI_L, "nvidia_smi_error": None, "nvidia_ctk": NVIDIA_CTK,
    "containerd_nvidia_runtime": CONTAINERD_CONFIG, "mount_nfs": "/usr/sbin/mount.nfs", "reachable": [NFS_TARGET],
    "hami_register": None,
}
#: What the node check prints on ``GPU_HOST``.
GPU_HOST_LOG = (
    "gshare-check nvidia-pci found 1\n"
    "gshare-check nvidia-smi ok\n"
    + NVIDIA_SMI_L
    + "gshare-check nvidia-ctk ok\n"
    + NVIDIA_CTK + "\n"
    + f"gshare-check containerd-nvidia-runtime ok {CONTAINERD_CONFIG}\n"
    "gshare-check done\n"
)
#: ``Reported `` + Go ``time.Time.String()`` of a UTC clock with its monotonic reading.
HANDSHAKE = re.compile(r"Reported \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{0,8}[1-9])? \+0000 UTC m=\+\d+\.\d{9}")


def _namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}}


def _node(name: str, labels: dict, address: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "InternalIP", "address": address}],
                   "capacity": {"cpu": "16", "memory": "65536Mi"}, "allocatable": {"cpu": "16", "memory": "65536Mi"}},
    }


def seed() -> list[dict]:
    """``gpu-a`` (gpu=on), ``gpu-b`` (a GPU host not labelled yet), ``cpu-c`` (gpu=on by mistake, no GPU)."""
    return [
        _namespace("default"), _namespace("kube-system"), _namespace(NAMESPACE),
        _node("gpu-a", {"gpu": "on"}, "10.0.0.11"),
        _node("gpu-b", {}, "10.0.0.12"),
        _node("cpu-c", {"gpu": "on"}, "10.0.0.13"),
    ]


def check_pod(kind: str, node: str, name: str | None = None, targets: list[str] | None = None) -> dict:
    """A check pod shaped like ``attach/checks.py`` ``check_pod`` makes them."""
    env = [{"name": "GSHARE_CHECK_TARGETS", "value": " ".join(targets or [])}] if kind == "nfs" else []
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name or f"gshare-check-{kind}-{node}",
                     "labels": {"app.kubernetes.io/name": "gshare-attach-check", "gshare.io/check": kind}},
        "spec": {"nodeName": node, "restartPolicy": "Never", "hostNetwork": True, "hostPID": True,
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "check", "image": "busybox:1.36", "command": ["/bin/sh", "-c", "..."],
                                 "env": env, "securityContext": {"privileged": True}}]},
    }


def hami_daemonset(labels_on_template_only: bool = False) -> dict:
    """HAMi's device-plugin DaemonSet as its chart creates it (``demo.fleet.hami_device_plugin_daemonset``)."""
    daemonset = fleet.hami_device_plugin_daemonset(fleet.cluster_spec("lab-c1"))
    for key in ("uid", "annotations"):
        daemonset["metadata"].pop(key)
    daemonset.pop("status")
    if labels_on_template_only:
        daemonset["metadata"]["labels"] = {"app": "hami"}
    return daemonset


@pytest.fixture
def cluster():
    hosts = {"gpu-a": GPU_HOST, "gpu-b": {**GPU_HOST, "nvidia_pci": 8, "hami_register": HAMI_H100X8}}
    with EmulatedCluster(seed(), token=TOKEN, hosts=hosts) as running:
        yield running


@pytest.fixture
def api(cluster):
    client = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("attach"))
    yield client
    client.close()


@pytest.fixture
def core(api):
    return kubernetes.client.CoreV1Api(api)


@pytest.fixture
def apps(api):
    return kubernetes.client.AppsV1Api(api)


def run_check(core, pod: dict) -> tuple[object, str]:
    """Create a check pod, wait until it has ``Succeeded``; return ``(pod, log)``."""
    name = pod["metadata"]["name"]
    core.create_namespaced_pod(NAMESPACE, pod)
    wait_for(lambda: core.read_namespaced_pod(name, NAMESPACE).status.phase == "Succeeded")
    return core.read_namespaced_pod(name, NAMESPACE), core.read_namespaced_pod_log(name, NAMESPACE)


# --------------------------------------------------------------------------- node check


@pytest.mark.parametrize("pod_startup_seconds", [None, 0.05])
def test_node_check_on_a_complete_gpu_host(pod_startup_seconds):
    with EmulatedCluster(seed(), token=TOKEN, hosts={"gpu-a": GPU_HOST},
                         pod_startup_seconds=pod_startup_seconds) as running:
        api = kubernetes.config.new_client_from_config_dict(running.kubeconfig("attach"))
        core = kubernetes.client.CoreV1Api(api)
        watch = kubernetes.watch.Watch()
        events: list = []

        def collect():
            try:
                for event in watch.stream(core.list_namespaced_pod, NAMESPACE, timeout_seconds=10,
                                          label_selector="app.kubernetes.io/name=gshare-attach-check"):
                    events.append((event["type"], event["object"].status.phase))
                    if event["object"].status.phase == "Succeeded":
                        return
            except (urllib3.exceptions.HTTPError, OSError):
                pass

        thread = threading.Thread(target=collect, daemon=True)
        thread.start()
        wait_for(lambda: any(r["path"].endswith("/pods") and r["query"].get("watch") for r in running.requests_seen()))
        pod, log = run_check(core, check_pod("node", "gpu-a"))
        thread.join(10)
        watch.stop()
        api.close()
    assert log == GPU_HOST_LOG
    assert pod.spec.node_name == "gpu-a" and pod.status.phase == "Succeeded"
    assert pod.status.pod_ip == pod.status.host_ip == "10.0.0.11"  # hostNetwork
    (status,) = pod.status.container_statuses
    assert status.name == "check" and not status.ready
    terminated = status.state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed") and terminated.finished_at
    conditions = {c.type: (c.status, c.reason) for c in pod.status.conditions}
    assert conditions["Ready"] == ("False", "PodCompleted") and conditions["PodScheduled"][0] == "True"
    assert events[0] == ("ADDED", "Pending") and events[-1] == ("MODIFIED", "Succeeded")
    assert ("MODIFIED", "Running") in events


@pytest.mark.parametrize(("change", "expected"), [
    ({"nvidia_smi": None},
     f"gshare-check nvidia-smi missing\ngshare-check nvidia-ctk ok\n{NVIDIA_CTK}\n"),
    ({"nvidia_smi_error": NVIDIA_SMI_ERROR},
     f"gshare-check nvidia-smi failed\n{NVIDIA_SMI_ERROR}\ngshare-check nvidia-ctk ok\n{NVIDIA_CTK}\n"),
    ({"nvidia_ctk": None},
     f"gshare-check nvidia-smi ok\n{NVIDIA_SMI_L}gshare-check nvidia-ctk missing\n"),
], ids=["no-nvidia-smi", "driver-not-loaded", "no-toolkit"])
def test_node_check_reports_the_missing_tool(cluster, core, change, expected):
    cluster.set_host("gpu-a", {**GPU_HOST, **change})
    _, log = run_check(core, check_pod("node", "gpu-a"))
    assert log == (f"gshare-check nvidia-pci found 1\n{expected}"
                   f"gshare-check containerd-nvidia-runtime ok {CONTAINERD_CONFIG}\ngshare-check done\n")


def test_node_check_without_the_containerd_runtime(cluster, core):
    cluster.set_host("gpu-a", {**GPU_HOST, "containerd_nvidia_runtime": None})
    _, log = run_check(core, check_pod("node", "gpu-a"))
    assert log.splitlines()[-2:] == ["gshare-check containerd-nvidia-runtime missing", "gshare-check done"]
    assert log.startswith("gshare-check nvidia-pci found 1\ngshare-check nvidia-smi ok\nGPU 0: NVIDIA H100 80GB HBM3")


def test_node_check_on_a_host_with_nothing_installed(cluster, core):
    cluster.set_host("gpu-a", {"nvidia_pci": 2})
    _, log = run_check(core, check_pod("node", "gpu-a"))
    assert log == ("gshare-check nvidia-pci found 2\ngshare-check nvidia-smi missing\ngshare-check nvidia-ctk missing\n"
                   "gshare-check containerd-nvidia-runtime missing\ngshare-check done\n")


def test_node_check_on_cpu_nodes(cluster, core):
    cluster.set_host("gpu-b", {**GPU_HOST, "nvidia_pci": 0})  # tools installed, no GPU: nothing more is printed
    _, with_facts = run_check(core, check_pod("node", "gpu-b"))
    _, without_facts = run_check(core, check_pod("node", "cpu-c"))  # no facts: nothing installed
    assert with_facts == without_facts == "gshare-check nvidia-pci none\ngshare-check done\n"


# --------------------------------------------------------------------------- nfs check


def test_nfs_check_with_reachable_and_unreachable_targets(core):
    _, log = run_check(core, check_pod("nfs", "gpu-a", targets=[NFS_TARGET, OTHER_TARGET]))
    assert log == ("gshare-check mount.nfs ok /usr/sbin/mount.nfs\n"
                   f"gshare-check tcp {NFS_TARGET} ok\n"
                   f"gshare-check tcp {OTHER_TARGET} unreachable\n"
                   "gshare-check done\n")


def test_nfs_check_without_an_nfs_client_or_targets(cluster, core):
    cluster.set_host("gpu-a", {**GPU_HOST, "mount_nfs": None})
    _, log = run_check(core, check_pod("nfs", "gpu-a", targets=[OTHER_TARGET, NFS_TARGET]))
    assert log == ("gshare-check mount.nfs missing\n"
                   f"gshare-check tcp {OTHER_TARGET} unreachable\n"
                   f"gshare-check tcp {NFS_TARGET} ok\n"
                   "gshare-check done\n")
    _, bare = run_check(core, check_pod("nfs", "cpu-c", targets=[NFS_TARGET]))  # no facts: nothing reachable
    assert bare == f"gshare-check mount.nfs missing\ngshare-check tcp {NFS_TARGET} unreachable\ngshare-check done\n"
    _, no_targets = run_check(core, check_pod("nfs", "gpu-b", name="no-targets"))
    assert no_targets == "gshare-check mount.nfs ok /usr/sbin/mount.nfs\ngshare-check done\n"


# --------------------------------------------------------------------------- pods/log


def test_log_of_a_missing_pod_is_404_and_of_a_pod_without_log_is_empty(cluster, core):
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("nope", NAMESPACE)
    body = json.loads(exc.value.body)
    assert (exc.value.status, body["kind"], body["reason"]) == (404, "Status", "NotFound")
    assert body["message"] == 'pods "nope" not found'
    core.create_namespaced_pod(NAMESPACE, {"metadata": {"name": "plain"},
                                           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert core.read_namespaced_pod_log("plain", NAMESPACE) == ""
    core.create_namespaced_pod(NAMESPACE, check_pod("node", "no-such-node"))
    time.sleep(0.5)
    stuck = core.read_namespaced_pod("gshare-check-node-no-such-node", NAMESPACE)
    assert stuck.status.phase == "Pending"
    assert core.read_namespaced_pod_log("gshare-check-node-no-such-node", NAMESPACE) == ""
    assert cluster.pod_log(NAMESPACE, "gshare-check-node-no-such-node") == ""
    assert cluster.pod_log(NAMESPACE, "nope") is None


def test_log_parameters_and_other_subresources(cluster, core):
    run_check(core, check_pod("nfs", "gpu-a", targets=[NFS_TARGET]))
    name = "gshare-check-nfs-gpu-a"
    assert core.read_namespaced_pod_log(name, NAMESPACE, container="check", tail_lines=1) == "gshare-check done\n"
    assert core.read_namespaced_pod_log(name, NAMESPACE, limit_bytes=12) == "gshare-check"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log(name, NAMESPACE, container="other")
    assert exc.value.status == 400
    headers = {"Authorization": f"Bearer {TOKEN}"}
    http = urllib3.PoolManager()
    base = f"{cluster.url}/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    answer = http.request("GET", base + "/log", headers=headers)
    assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
    assert answer.data.decode().endswith("gshare-check done\n")
    # Reads of the pod itself stay JSON after a text/plain log answer.
    assert core.read_namespaced_pod(name, NAMESPACE).status.phase == "Succeeded"
    answer = http.request("GET", base, headers=headers)
    assert answer.headers["Content-Type"].startswith("application/json") and json.loads(answer.data)["kind"] == "Pod"
    assert http.request("GET", base + "/exec", headers=headers).status == 404
    assert http.request("GET", f"{cluster.url}/api/v1/nodes/gpu-a/log", headers=headers).status == 404
    assert http.request("POST", base + "/log", headers=headers).status == 405
    assert http.request("GET", base + "/log").status == 401


def test_a_recreated_check_pod_runs_again_with_the_current_facts(cluster, core):
    cluster.set_host("gpu-a", {**GPU_HOST, "nvidia_smi": None, "nvidia_ctk": None})
    first, log = run_check(core, check_pod("node", "gpu-a"))
    assert "gshare-check nvidia-smi missing\ngshare-check nvidia-ctk missing\n" in log
    core.delete_namespaced_pod("gshare-check-node-gpu-a", NAMESPACE)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("gshare-check-node-gpu-a", NAMESPACE)
    assert exc.value.status == 404
    cluster.set_host("gpu-a", GPU_HOST)  # the admin installs the driver and the toolkit
    assert cluster.hosts["gpu-a"] == GPU_HOST
    second, log = run_check(core, check_pod("node", "gpu-a"))
    assert second.metadata.uid != first.metadata.uid
    assert log == GPU_HOST_LOG


def test_host_facts_are_checked():
    with pytest.raises(ValueError, match="unknown key"):
        EmulatedCluster([], hosts={"gpu-a": {"nvidia_smi_l": "GPU 0: ..."}})
    with pytest.raises(ValueError, match="nvidia_pci"):
        EmulatedCluster([], hosts={"gpu-a": {"nvidia_pci": "1"}})
    with pytest.raises(ValueError, match="reachable"):
        EmulatedCluster([], hosts={"gpu-a": {"reachable": NFS_TARGET}})
    cluster = EmulatedCluster([], hosts={"gpu-a": GPU_HOST})
    with pytest.raises(ValueError, match="nvidia_ctk"):
        cluster.set_host("gpu-a", {"nvidia_ctk": 1})
    cluster.set_host("gpu-a", None)
    assert cluster.hosts == {}


# --------------------------------------------------------------------------- HAMi's device plugin


def _registered(core, name: str) -> bool:
    return "hami.io/node-nvidia-register" in (core.read_node(name).metadata.annotations or {})


def test_go_time_string_matches_the_handshake_values_seen_on_real_nodes():
    assert go_time_string(1743071653547080338, 5494154355430) == \
        "2025-03-27 10:34:13.547080338 +0000 UTC m=+5494.154355430"
    assert go_time_string(1743071653500000000) == "2025-03-27 10:34:13.5 +0000 UTC"
    assert go_time_string(1743071653000000000, 7) == "2025-03-27 10:34:13 +0000 UTC m=+0.000000007"
    observed = yaml.safe_load((ROOT / "demo/data/hami/node-handshake.observed-values.yaml").read_text(encoding="utf-8"))
    reported = [item["value"] for item in observed
                if item["key"] == "hami.io/node-handshake" and item["value"].startswith("Reported")]
    assert reported and all(HANDSHAKE.fullmatch(value) for value in reported)


@pytest.mark.parametrize("how", ["create", "apply", "replace", "template-labels"])
def test_hami_daemonset_registers_the_selected_nodes_with_host_facts(cluster, core, apps, how):
    cluster.set_host("gpu-a", {**GPU_HOST, "hami_register": HAMI_T4})
    daemonset = hami_daemonset(labels_on_template_only=how == "template-labels")
    watch = kubernetes.watch.Watch()
    events: list = []

    def collect():
        try:
            for event in watch.stream(core.list_node, timeout_seconds=10, resource_version="0"):
                events.append((event["type"], event["object"].metadata.name))
        except (urllib3.exceptions.HTTPError, OSError):
            pass

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    if how == "apply":
        apps.patch_namespaced_daemon_set("hami-device-plugin", "kube-system", daemonset, field_manager="helm",
                                         _content_type="application/apply-patch+yaml")
    elif how == "replace":  # an unrelated DaemonSet of that name, then replaced by the chart's
        apps.create_namespaced_daemon_set("kube-system", {**daemonset, "metadata": {"name": "hami-device-plugin"},
                                                          "spec": {**daemonset["spec"], "template": {
                                                              "metadata": {"labels": {"app": "x"}},
                                                              "spec": daemonset["spec"]["template"]["spec"]}}})
        time.sleep(0.4)
        assert not _registered(core, "gpu-a")
        current = apps.read_namespaced_daemon_set("hami-device-plugin", "kube-system")
        daemonset["metadata"]["resourceVersion"] = current.metadata.resource_version
        apps.replace_namespaced_daemon_set("hami-device-plugin", "kube-system", daemonset)
    else:
        apps.create_namespaced_daemon_set("kube-system", daemonset)
    wait_for(lambda: _registered(core, "gpu-a"))
    node = core.read_node("gpu-a")
    annotations = node.metadata.annotations
    assert annotations["hami.io/node-nvidia-register"] == HAMI_T4
    assert HANDSHAKE.fullmatch(annotations["hami.io/node-handshake"]), annotations["hami.io/node-handshake"]
    vgpus = str(sum(d.split_count for d in decode_node_register(HAMI_T4)))
    assert vgpus == "10"
    assert node.status.capacity["nvidia.com/gpu"] == node.status.allocatable["nvidia.com/gpu"] == vgpus
    assert node.status.capacity["cpu"] == "16"  # the rest of the status is kept
    time.sleep(0.4)
    assert not _registered(core, "gpu-b")  # has hami_register but no gpu=on: not selected
    assert not _registered(core, "cpu-c")  # selected, but no GPU on the host
    watch.stop()
    thread.join(10)
    assert ("MODIFIED", "gpu-a") in events
    apps.delete_namespaced_daemon_set("hami-device-plugin", "kube-system")
    time.sleep(0.3)
    assert core.read_node("gpu-a").metadata.annotations["hami.io/node-nvidia-register"] == HAMI_T4


def test_a_node_labelled_later_or_fixed_later_is_registered(cluster, core, apps):
    apps.create_namespaced_daemon_set("kube-system", hami_daemonset())
    time.sleep(0.4)
    assert not _registered(core, "gpu-b")
    core.patch_node("gpu-b", {"metadata": {"labels": {"gpu": "on"}}})
    wait_for(lambda: _registered(core, "gpu-b"))
    node = core.read_node("gpu-b")
    assert node.metadata.annotations["hami.io/node-nvidia-register"] == HAMI_H100X8
    assert node.status.allocatable["nvidia.com/gpu"] == "80"  # 8 GPUs x split count 10
    first_handshake = node.metadata.annotations["hami.io/node-handshake"]
    # gpu-a is selected but its host has no driver yet, so the plugin cannot register it; the admin fixes it.
    assert not _registered(core, "gpu-a")
    cluster.set_host("gpu-a", {**GPU_HOST, "hami_register": HAMI_T4})
    wait_for(lambda: _registered(core, "gpu-a"))
    assert core.read_node("gpu-a").status.capacity["nvidia.com/gpu"] == "10"
    # Re-installing the chart (a re-attach) does not rewrite nodes already registered with the same value.
    revision = core.read_node("gpu-b").metadata.resource_version
    daemonset = hami_daemonset()
    daemonset["metadata"]["labels"]["helm.sh/chart"] = "hami-2.10.1"
    apps.patch_namespaced_daemon_set("hami-device-plugin", "kube-system", daemonset, field_manager="helm",
                                     _content_type="application/apply-patch+yaml")
    time.sleep(0.4)
    again = core.read_node("gpu-b")
    assert again.metadata.resource_version == revision
    assert again.metadata.annotations["hami.io/node-handshake"] == first_handshake


def test_seeded_hami_annotations_are_left_alone():
    objects = fleet.cluster_objects("lab-c1")
    gpu_nodes = [o["metadata"]["name"] for o in objects
                 if o["kind"] == "Node" and o["metadata"]["labels"].get("gpu") == "on"]
    assert gpu_nodes  # the seed has HAMi's DaemonSet and registered GPU nodes
    hosts = {name: {**GPU_HOST, "hami_register": HAMI_T4} for name in gpu_nodes}
    with EmulatedCluster(objects, version=fleet.cluster_version("lab-c1"), hosts=hosts) as running:
        before = running.objects_of("nodes")
        time.sleep(0.4)
        api = kubernetes.config.new_client_from_config_dict(running.kubeconfig("fleet"))
        apps = kubernetes.client.AppsV1Api(api)
        daemonset = hami_daemonset()
        apps.patch_namespaced_daemon_set("hami-device-plugin", "kube-system", daemonset, field_manager="helm",
                                         _content_type="application/apply-patch+yaml")
        kubernetes.client.CoreV1Api(api).patch_node(gpu_nodes[0], {"metadata": {"labels": {"team": "a"}}})
        time.sleep(0.4)
        after = {n["metadata"]["name"]: n for n in running.objects_of("nodes")}
        api.close()
    for node in before:
        name = node["metadata"]["name"]
        assert after[name]["metadata"].get("annotations") == node["metadata"].get("annotations")
        assert after[name]["status"] == node["status"]


# --------------------------------------------------------------------------- command line


def test_cli_seed_hosts_key(tmp_path):
    seed_path = tmp_path / "seed.json"
    seed_path.write_text(json.dumps({"objects": seed(), "hosts": {"gpu-a": GPU_HOST}}))
    process, info = serve_seed(tmp_path, seed_path)
    try:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "cli",
                  "clusters": [{"name": "cli", "cluster": {"server": info["url"]}}],
                  "users": [{"name": "cli", "user": {}}],
                  "contexts": [{"name": "cli", "context": {"cluster": "cli", "user": "cli"}}]}
        api = kubernetes.config.new_client_from_config_dict(config)
        _, log = run_check(kubernetes.client.CoreV1Api(api), check_pod("node", "gpu-a"))
        api.close()
        assert log == GPU_HOST_LOG
    finally:
        process.terminate()
        process.wait(15)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"objects": [], "hosts": {"gpu-a": {"nvidia_pci": -1}}}))
    result = subprocess.run([sys.executable, "-m", "demo.emulator", "--seed", str(bad), "--port", "0"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "nvidia_pci must be an integer >= 0" in result.stderr


# --------------------------------------------------------------------------- Envoy Gateway's stand-in controller

GATEWAY_GROUP = "gateway.networking.k8s.io"
EG_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
EG_CONFIG = """apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway: {controllerName: gateway.envoyproxy.io/gatewayclass-controller}
extensionApis: {enableBackend: true}
envoyProxy:
  provider:
    type: Kubernetes
    kubernetes:
      envoyDeployment:
        pod: {nodeSelector: {kubernetes.io/hostname: gpu-a}}
"""


def gateway_seed(*, running: bool = True, pinned: bool = True) -> list[dict]:
    """``seed()`` plus the upstream Gateway API / Envoy Gateway CRDs (tests/fixtures/crds), the session namespace, and
    (``running``) Envoy Gateway's Deployment and config (``pinned``: its default envoyProxy pins Envoy to gpu-a)."""
    crds = [yaml.safe_load(path.read_text()) for path in sorted((FIXTURES / "crds").glob("*.yaml"))]
    objects = [*seed(), *crds, _namespace("gshare-sessions"), _namespace("other"), _namespace("envoy-gateway-system")]
    if running:
        objects.append({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": "envoy-gateway", "namespace": "envoy-gateway-system"},
                        "spec": {"selector": {"matchLabels": {"app": "eg"}},
                                 "template": {"metadata": {"labels": {"app": "eg"}},
                                              "spec": {"containers": [{"name": "envoy-gateway", "image": "envoyproxy/gateway:v1.9.0"}]}}}})
        config = EG_CONFIG if pinned else EG_CONFIG.split("envoyProxy:")[0]
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "envoy-gateway-config", "namespace": "envoy-gateway-system"},
                        "data": {"envoy-gateway.yaml": config}})
    return objects


def _gateway_objects(custom, core, *, secret: bool = True, route_namespace: str = "gshare-sessions",
                     host: str = "lab.gpu.example.org", service: bool = True) -> None:
    custom.create_cluster_custom_object(GATEWAY_GROUP, "v1", "gatewayclasses", {
        "apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "GatewayClass", "metadata": {"name": "gshare-envoy-gateway"},
        "spec": {"controllerName": EG_CONTROLLER}})
    custom.create_cluster_custom_object(GATEWAY_GROUP, "v1", "gatewayclasses", {
        "apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "GatewayClass", "metadata": {"name": "istio"},
        "spec": {"controllerName": "istio.io/gateway-controller"}})
    if secret:
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "gshare-sessions-tls"}, "type": "kubernetes.io/tls",
                                                  "data": {"tls.crt": "", "tls.key": ""}})
    custom.create_namespaced_custom_object(GATEWAY_GROUP, "v1", NAMESPACE, "gateways", {
        "apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "Gateway", "metadata": {"name": "gshare-sessions"},
        "spec": {"gatewayClassName": "gshare-envoy-gateway", "listeners": [{
            "name": "https", "protocol": "HTTPS", "port": 443, "hostname": "lab.gpu.example.org",
            "tls": {"mode": "Terminate", "certificateRefs": [{"group": "", "kind": "Secret", "name": "gshare-sessions-tls"}]},
            "allowedRoutes": {"namespaces": {"from": "Selector", "selector": {"matchLabels": {"kubernetes.io/metadata.name": "gshare-sessions"}}},
                              "kinds": [{"group": GATEWAY_GROUP, "kind": "HTTPRoute"}]}}]}})
    if service:
        core.create_namespaced_service(route_namespace, {"metadata": {"name": "s-1"}, "spec": {"ports": [{"port": 8888}]}})
    custom.create_namespaced_custom_object(GATEWAY_GROUP, "v1", route_namespace, "httproutes", {
        "apiVersion": f"{GATEWAY_GROUP}/v1", "kind": "HTTPRoute", "metadata": {"name": "s-1"},
        "spec": {"parentRefs": [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": "gshare-sessions", "namespace": NAMESPACE}],
                 "hostnames": [host],
                 "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/s/s-1/"}}], "backendRefs": [{"name": "s-1", "port": 8888}]}]}})


def _conditions(obj: dict | None) -> dict[str, dict]:
    """Conditions by type of an object's status, or of a route's ``status.parents[]`` entry."""
    found = (obj or {}).get("conditions") if "parentRef" in (obj or {}) else ((obj or {}).get("status") or {}).get("conditions")
    return {c["type"]: c for c in found or []}


def _unjudged(obj: dict) -> bool:
    """Only the CRD's default status (Gateway API v1.6.1 defaults ``Accepted``/``Programmed`` to ``Unknown``,
    ``Pending``, "Waiting for controller" on create, as a real apiserver does): no controller has judged it."""
    return all((c["status"], c["reason"]) == ("Unknown", "Pending") for c in _conditions(obj).values())


def _read(custom, plural: str, name: str, namespace: str | None = None) -> dict:
    if namespace is None:
        return custom.get_cluster_custom_object(GATEWAY_GROUP, "v1", plural, name)
    return custom.get_namespaced_custom_object(GATEWAY_GROUP, "v1", namespace, plural, name)


def test_envoy_gateway_stand_in_accepts_its_class_programs_the_gateway_and_accepts_the_route():
    with EmulatedCluster(gateway_seed(), token=TOKEN) as running:
        client = kubernetes.config.new_client_from_config_dict(running.kubeconfig("attach"))
        custom, core = kubernetes.client.CustomObjectsApi(client), kubernetes.client.CoreV1Api(client)
        _gateway_objects(custom, core)
        wait_for(lambda: _conditions(_read(custom, "gateways", "gshare-sessions", NAMESPACE)).get("Programmed", {}).get("status") == "True")
        accepted = _conditions(_read(custom, "gatewayclasses", "gshare-envoy-gateway"))["Accepted"]
        assert (accepted["status"], accepted["reason"], accepted["message"], accepted["observedGeneration"]) == (
            "True", "Accepted", "Valid GatewayClass", 1)
        assert _unjudged(_read(custom, "gatewayclasses", "istio"))  # another controller's class
        gateway = _read(custom, "gateways", "gshare-sessions", NAMESPACE)
        conditions = _conditions(gateway)
        assert (conditions["Accepted"]["reason"], conditions["Accepted"]["message"]) == (
            "Accepted", "The Gateway has been scheduled by Envoy Gateway")
        assert conditions["Programmed"]["message"] == "Address assigned to the Gateway, 1/1 envoy replicas available"
        assert all(c["observedGeneration"] == gateway["metadata"]["generation"] for c in conditions.values())
        assert gateway["status"]["addresses"] == [{"type": "IPAddress", "value": "10.0.0.11"}]  # gpu-a, where Envoy is pinned
        (listener,) = gateway["status"]["listeners"]
        wait_for(lambda: _read(custom, "gateways", "gshare-sessions", NAMESPACE)["status"]["listeners"][0]["attachedRoutes"] == 1)
        assert listener["supportedKinds"] == [{"group": GATEWAY_GROUP, "kind": "HTTPRoute"}]
        assert {c["type"]: c["status"] for c in listener["conditions"]} == {"Programmed": "True", "Accepted": "True", "ResolvedRefs": "True"}
        route = _read(custom, "httproutes", "s-1", "gshare-sessions")
        (parent,) = route["status"]["parents"]
        assert parent["controllerName"] == EG_CONTROLLER and parent["parentRef"]["name"] == "gshare-sessions"
        assert {t: (c["status"], c["reason"], c["message"]) for t, c in _conditions(parent).items()} == {
            "Accepted": ("True", "Accepted", "Route is accepted"),
            "ResolvedRefs": ("True", "ResolvedRefs", "Resolved all the Object references for the Route")}
        stamp = conditions["Programmed"]["lastTransitionTime"]
        # A spec change: judged again for the new generation, the unchanged verdict keeps its transition time.
        custom.patch_namespaced_custom_object(GATEWAY_GROUP, "v1", NAMESPACE, "gateways", "gshare-sessions",
                                              {"metadata": {"labels": {"x": "y"}}, "spec": {"listeners": [{
                                                  **gateway["spec"]["listeners"][0], "port": 8443}]}})
        wait_for(lambda: _conditions(_read(custom, "gateways", "gshare-sessions", NAMESPACE))["Programmed"]["observedGeneration"] == 2)
        assert _conditions(_read(custom, "gateways", "gshare-sessions", NAMESPACE))["Programmed"]["lastTransitionTime"] == stamp
        client.close()


def test_envoy_gateway_stand_in_refuses_what_envoy_gateway_refuses():
    with EmulatedCluster(gateway_seed(pinned=False), token=TOKEN) as running:
        client = kubernetes.config.new_client_from_config_dict(running.kubeconfig("attach"))
        custom, core = kubernetes.client.CustomObjectsApi(client), kubernetes.client.CoreV1Api(client)
        _gateway_objects(custom, core, secret=False, route_namespace="other", service=False)
        wait_for(lambda: not _unjudged(_read(custom, "gateways", "gshare-sessions", NAMESPACE)))
        gateway = _read(custom, "gateways", "gshare-sessions", NAMESPACE)
        conditions = _conditions(gateway)
        # No Envoy placement: the LoadBalancer Service of a bare-metal cluster gets no address.
        assert (conditions["Programmed"]["status"], conditions["Programmed"]["reason"]) == ("False", "AddressNotAssigned")
        assert (conditions["Accepted"]["status"], conditions["Accepted"]["message"]) == ("False", "No listeners are valid: https")
        refs = {c["type"]: c for c in gateway["status"]["listeners"][0]["conditions"]}["ResolvedRefs"]
        assert (refs["reason"], refs["message"]) == ("InvalidCertificateRef", "Secret gshare-system/gshare-sessions-tls does not exist.")
        wait_for(lambda: (_read(custom, "httproutes", "s-1", "other").get("status") or {}).get("parents"))
        parent = _read(custom, "httproutes", "s-1", "other")["status"]["parents"][0]
        assert _conditions(parent)["Accepted"]["reason"] == "NotAllowedByListeners"  # namespace "other" is not selected
        assert _conditions(parent)["ResolvedRefs"]["message"] == (
            "Failed to process route rule 0 backendRef 0: service other/s-1 not found.")
        client.close()


def test_nothing_is_judged_while_envoy_gateway_does_not_run():
    with EmulatedCluster(gateway_seed(running=False), token=TOKEN) as running:
        client = kubernetes.config.new_client_from_config_dict(running.kubeconfig("attach"))
        custom, core, apps = (kubernetes.client.CustomObjectsApi(client), kubernetes.client.CoreV1Api(client),
                              kubernetes.client.AppsV1Api(client))
        _gateway_objects(custom, core)
        time.sleep(0.5)
        assert _unjudged(_read(custom, "gatewayclasses", "gshare-envoy-gateway"))
        assert _unjudged(_read(custom, "gateways", "gshare-sessions", NAMESPACE))
        seeded = gateway_seed()
        apps.create_namespaced_deployment("envoy-gateway-system", seeded[-2])
        core.create_namespaced_config_map("envoy-gateway-system", seeded[-1])
        wait_for(lambda: _conditions(_read(custom, "gateways", "gshare-sessions", NAMESPACE)).get("Programmed", {}).get("status") == "True")
        client.close()
