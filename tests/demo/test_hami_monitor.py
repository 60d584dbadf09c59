"""HAMi's vGPU monitor in the emulator (``demo.emulator.controllers.hami_monitor``): the device-plugin DaemonSet's pods,
the pod proxy subresource that reaches their ``vgpu-monitor`` container, the metrics it answers in both naming schemes,
busy/idle per pod and failing monitors per node, all over HTTP with the official ``kubernetes`` client.

No Django here: run with ``pytest -p no:django tests/demo``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import kubernetes
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from contract import HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT, HAMI_MONITOR_PORT_DEFAULT
from demo import fleet
from demo.emulator import EmulatedCluster, serve
from demo.emulator.controllers.hami_metrics import ContainerGpu, HostGpu, render_metrics
from tests.helpers import ROOT, serve_seed, wait_for

NS = "gshare-sessions"
PLUGIN_NS = "kube-system"
ADMIN = "admin-token"
MIB = 1024 * 1024
FIXTURES = fleet.DATA_DIR / "hami/vgpu-monitor"
POD_NAME = re.compile(r"hami-device-plugin-[a-z0-9]{5}")

# The current scheme as HAMi v2.10.0 declares it (cmd/vGPUmonitor/metrics.go: prometheus.NewDesc(name, help, labels)),
# written out here from that source; every series also carries zone="vGPU" (NewClusterManager's wrapping registerer).
_CTR = {"namespace", "pod", "container", "vdevice_index", "device_uuid", "zone"}
CURRENT = {
    "hami_host_gpu_memory_used_bytes": ("GPU device memory usage in bytes",
                                        {"node", "device_index", "device_uuid", "device_type", "zone"}),
    "hami_host_gpu_utilization_ratio": ("GPU core utilization ratio (0-100)",
                                        {"node", "device_index", "device_uuid", "device_type", "zone"}),
    "hami_host_gpu_memory_controller_utilization_ratio": ("GPU memory controller utilization ratio (0-100)",
                                                          {"device_index", "device_uuid", "device_type", "zone"}),
    "hami_vgpu_memory_used_bytes": ("vGPU device memory usage in bytes", _CTR),
    "hami_vgpu_memory_limit_bytes": ("vGPU device memory limit in bytes", _CTR),
    "hami_container_device_memory_bytes": ("Container device memory usage in bytes", _CTR),
    "hami_container_device_utilization_ratio": ("Container device SM utilization ratio", _CTR),
    "hami_container_last_kernel_elapsed_seconds": ("Seconds since last kernel execution in container", _CTR),
    "hami_vgpu_memory_context_bytes": ("Container device memory context size in bytes", _CTR),
    "hami_vgpu_memory_module_bytes": ("Container device memory module size in bytes", _CTR),
    "hami_vgpu_memory_buffer_bytes": ("Container device memory buffer size in bytes", _CTR),
}
# What the operator reads, per scheme: (last kernel, utilization, memory used, memory limit), and the label names.
READ = {
    "current": (("hami_container_last_kernel_elapsed_seconds", "hami_container_device_utilization_ratio",
                 "hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes"), ("namespace", "pod", "device_uuid")),
    "legacy": (("Device_last_kernel_of_container", "Device_utilization_desc_of_container",
                "vGPU_device_memory_usage_in_bytes", "vGPU_device_memory_limit_in_bytes"),
               ("podnamespace", "podname", "deviceuuid")),
}


def shape(text: str) -> dict[str, tuple[str, str, set[frozenset[str]]]]:
    """name -> (type, HELP, label-name sets of its series), parsed by prometheus_client."""
    return {family.name: (family.type, family.documentation, {frozenset(s.labels) for s in family.samples})
            for family in text_string_to_metric_families(text)}


def session_pod(name: str, memory: int = 8192, gpus: int = 1) -> dict:
    limits = {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(memory)}
    return {"metadata": {"name": name}, "spec": {"nodeSelector": {"gpu": "on"}, "containers": [
        {"name": "sidecar", "image": "busybox"},
        {"name": "jupyter", "image": "quay.io/jupyter/base-notebook:2024-12-02", "resources": {"limits": limits}}]}}


class Lab:
    """A started lab-c1 (admin token ``ADMIN``) with a CoreV1Api and helpers."""

    def __init__(self, cluster: EmulatedCluster) -> None:
        self.cluster = cluster
        self.api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab"))
        self.core = kubernetes.client.CoreV1Api(self.api)

    def monitor_pods(self) -> dict[str, dict]:
        """node -> the device-plugin pod on it."""
        found = self.core.list_namespaced_pod(PLUGIN_NS, label_selector=HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT).items
        return {p.spec.node_name: p for p in found}

    def running(self, name: str):
        return wait_for(lambda: (p := self.core.read_namespaced_pod(name, NS)).status.phase == "Running" and p,
                        what=f"{name} Running")

    def scrape(self, pod_name: str, target: str | None = None, **options) -> str:
        return self.core.connect_get_namespaced_pod_proxy_with_path(target or f"{pod_name}:{HAMI_MONITOR_PORT_DEFAULT}",
                                                                    PLUGIN_NS, "metrics", **options)

    def monitor(self, node: str) -> str:
        """The name of the device-plugin pod on ``node`` (once the DaemonSet controller stand-in made it)."""
        return wait_for(lambda: self.monitor_pods().get(node), what=f"monitor on {node}").metadata.name

    def node_metrics(self, node: str) -> str:
        return self.scrape(self.monitor(node))

    def control(self, path: str, body: dict | None = None, token: str | None = ADMIN) -> tuple[int, dict]:
        request = urllib.request.Request(self.cluster.url + "/emulator/v1/gpu-activity" + path, method="GET" if body is None else "PUT",
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture(params=["current", "legacy"])
def scheme(request):
    return request.param


@pytest.fixture
def lab(scheme):
    with EmulatedCluster(fleet.cluster_objects("lab-c1"), version=fleet.cluster_version("lab-c1"), token=ADMIN,
                         pod_startup_seconds=0.1, hami_monitor_scheme=scheme) as cluster:
        running = Lab(cluster)
        yield running
        running.api.close()


def series(text: str, scheme: str, pod: str) -> dict[str, dict[str, float]]:
    """device_uuid -> {metric name: value} of one pod's series."""
    names, (ns_label, pod_label, uuid_label) = READ[scheme]
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names and sample.labels.get(ns_label) == NS and sample.labels.get(pod_label) == pod:
                found.setdefault(sample.labels[uuid_label], {})[sample.name] = sample.value
    return found


# --------------------------------------------------------------------------- the DaemonSet's pods


def test_the_fleet_template_runs_the_monitor_on_its_port():
    template = fleet.hami_device_plugin_daemonset(fleet.cluster_spec("lab-c1"))["spec"]["template"]["spec"]
    [monitor] = [c for c in template["containers"] if c["name"] == "vgpu-monitor"]
    assert monitor["command"] == ["vGPUmonitor"]
    assert monitor["ports"] == [{"name": "metrics", "containerPort": HAMI_MONITOR_PORT_DEFAULT, "protocol": "TCP"}]
    assert fleet.hami_monitor_scheme("lab-c1") == "current" and fleet.hami_monitor_scheme("lab-c2") == "legacy"


@pytest.mark.parametrize("scheme", ["current"])
def test_pods_follow_the_daemonset_and_the_registered_nodes(lab):
    apps = kubernetes.client.AppsV1Api(lab.api)
    daemonset = apps.read_namespaced_daemon_set("hami-device-plugin", PLUGIN_NS)
    gpu_nodes = {n.name for n in fleet.cluster_spec("lab-c1").gpu_nodes}
    pods = wait_for(lambda: (found := lab.monitor_pods()).keys() == gpu_nodes and found, what="a pod per GPU node")
    for node, pod in pods.items():
        assert POD_NAME.fullmatch(pod.metadata.name), pod.metadata.name
        assert pod.metadata.labels.items() >= daemonset.spec.template.metadata.labels.items()
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller) == ("DaemonSet", "hami-device-plugin",
                                                                         daemonset.metadata.uid, True)
        assert pod.spec.node_name == node and pod.status.phase == "Running"
        assert [c.name for c in pod.spec.containers] == [c.name for c in daemonset.spec.template.spec.containers]
        node_ip = next(a.address for a in lab.core.read_node(node).status.addresses if a.type == "InternalIP")
        assert pod.status.pod_ip == node_ip  # hostNetwork: true, as the chart's pod

    # a deleted pod is replaced; a node no longer selected loses its pod; a deleted node too
    lab.core.delete_namespaced_pod(pods["gpu-h100-01"].metadata.name, PLUGIN_NS)
    replaced = wait_for(lambda: (p := lab.monitor_pods().get("gpu-h100-01")) and
                        p.metadata.name != pods["gpu-h100-01"].metadata.name and p, what="pod re-created")
    assert POD_NAME.fullmatch(replaced.metadata.name)
    lab.core.patch_node("gpu-v100-01", {"metadata": {"labels": {"gpu": "off"}}})
    wait_for(lambda: lab.monitor_pods().keys() == {"gpu-h100-01"}, what="the unselected node's pod gone")
    lab.core.patch_node("gpu-v100-01", {"metadata": {"labels": {"gpu": "on"}}})
    wait_for(lambda: lab.monitor_pods().keys() == gpu_nodes, what="the pod back on the selected node")
    lab.core.delete_node("gpu-v100-01")
    wait_for(lambda: lab.monitor_pods().keys() == {"gpu-h100-01"}, what="the deleted node's pod gone")

    apps.delete_namespaced_daemon_set("hami-device-plugin", PLUGIN_NS)
    assert lab.monitor_pods() == {}  # the owner cascade, at once
    body = lab.api.sanitize_for_serialization(daemonset)
    body["metadata"] = {"name": "hami-device-plugin", "labels": daemonset.metadata.labels}
    body.pop("status", None)
    apps.create_namespaced_daemon_set(PLUGIN_NS, body)
    wait_for(lambda: lab.monitor_pods().keys() == {"gpu-h100-01"}, what="pods of the new DaemonSet")


# --------------------------------------------------------------------------- the proxy and the metrics


def test_the_monitor_answers_the_metrics_of_the_gpu_pods_on_its_node(lab, scheme):
    lab.core.create_namespaced_pod(NS, session_pod("s1", memory=8192))
    pod = lab.running("s1")
    text = lab.node_metrics(pod.spec.node_name)
    [allocated] = [seg for seg in pod.metadata.annotations["hami.io/vgpu-devices-allocated"].split(";") if seg]
    uuid = allocated.split(",")[0]
    found = series(text, scheme, "s1")
    last, utilization, used, limit = READ[scheme][0]
    assert list(found) == [uuid]
    assert found[uuid][limit] == 8192 * MIB
    assert found[uuid][utilization] == 0  # idle since it started
    assert 0 <= found[uuid][last] <= 5
    assert 0 < found[uuid][used] < found[uuid][limit]
    container_label = "container" if scheme == "current" else "ctrname"
    containers = {s.labels[container_label] for f in text_string_to_metric_families(text) for s in f.samples
                  if container_label in s.labels}
    assert containers == {"jupyter"}  # the sidecar holds no GPU: no series
    raw = lab.scrape(lab.monitor(pod.spec.node_name), _preload_content=False)
    assert raw.status == 200
    assert raw.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"
    other_node = next(n for n in lab.monitor_pods() if n != pod.spec.node_name)
    assert series(lab.node_metrics(other_node), scheme, "s1") == {}  # each monitor sees its own node only


@pytest.mark.parametrize("scheme", ["legacy"])
def test_the_legacy_scheme_is_the_fixtures(lab):
    lab.core.create_namespaced_pod(NS, session_pod("s1"))
    busy = lab.running("s1")
    lab.cluster.set_gpu_activity(NS, "s1", "busy")
    served = shape(lab.node_metrics(busy.spec.node_name))
    for fixture in ("metrics.legacy.volcano-vgpu-device-plugin-readme.txt", "metrics.legacy.idle-container.txt"):
        assert served == shape((FIXTURES / fixture).read_text(encoding="utf-8")), fixture


def test_the_legacy_text_is_written_as_hami_writes_it():
    """The fixtures' readings, rendered, give the fixtures byte for byte (order, label order, Go's number format)."""
    busy = ContainerGpu(namespace="default", pod="hami-device", container="cuda-container", vdevice_index=0,
                        device_uuid="GPU-xxxx", memory_used=2109867008, memory_limit=3145728000, memory_context=331350016,
                        memory_module=0, memory_buffer=1778516992, utilization=99, last_kernel_seconds=0)
    hosts = [HostGpu(index=0, uuid="GPU-xxxx", name="A", memory_used=56366661632, utilization=0, memory_utilization=0),
             HostGpu(index=1, uuid="GPU-xxxx", name="A", memory_used=58484457472, utilization=100, memory_utilization=0)]
    assert render_metrics("legacy", "node-1", [busy], hosts) == (
        FIXTURES / "metrics.legacy.volcano-vgpu-device-plugin-readme.txt").read_text(encoding="utf-8")
    uuid = "GPU-59ab1128-3130-b95a-9870-4bd748926e97"
    idle = ContainerGpu(namespace="default", pod="gpu-cxeyttpu-5bc96fc469-8q2zb", container="gpu-cxeyttpu",
                        vdevice_index=0, device_uuid=uuid, memory_used=0, memory_limit=314572800, memory_context=0,
                        memory_module=0, memory_buffer=0, utilization=0, last_kernel_seconds=80450)
    host = HostGpu(index=0, uuid=uuid, name="A", memory_used=287244288, utilization=0, memory_utilization=0)
    assert render_metrics("legacy", "node-1", [idle], [host]) == (
        FIXTURES / "metrics.legacy.idle-container.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("scheme", ["current"])
def test_the_current_scheme_is_hamis_source(lab):
    lab.core.create_namespaced_pod(NS, session_pod("s1"))
    pod = lab.running("s1")
    served = shape(lab.node_metrics(pod.spec.node_name))
    assert served == {name: ("gauge", help_text, {frozenset(labels)}) for name, (help_text, labels) in CURRENT.items()}


@pytest.mark.parametrize("scheme", ["current"])
def test_the_proxy_answers_as_the_apiserver_does(lab):
    lab.core.create_namespaced_pod(NS, session_pod("s1"))
    pod = lab.running("s1")
    monitor = lab.monitor(pod.spec.node_name)
    assert "# TYPE " in lab.scrape(monitor, monitor)  # no port: the pod's first containerPort, 9394
    assert "# TYPE " in lab.scrape(monitor, f"http:{monitor}:9394")

    def refused(target: str, path: str = "metrics", namespace: str = PLUGIN_NS) -> tuple[int, dict | str]:
        with pytest.raises(ApiException) as exc:
            lab.core.connect_get_namespaced_pod_proxy_with_path(target, namespace, path)
        body = exc.value.body
        return exc.value.status, (json.loads(body) if body.startswith("{") else body)

    status, body = refused(f"{monitor}:8080")
    assert status == 503 and body["reason"] == "ServiceUnavailable"
    assert body["message"] == f"error trying to reach service: dial tcp {pod_ip(lab, monitor)}:8080: connect: connection refused"
    status, body = refused(f"s1:{HAMI_MONITOR_PORT_DEFAULT}", namespace=NS)  # a session pod: nothing listens
    assert status == 503 and "connection refused" in body["message"]
    assert refused(f"{monitor}:9394", "healthz") == (404, "404 page not found\n")
    status, body = refused(f"https:{monitor}:9394")
    assert status == 503 and "tls: first record does not look like a TLS handshake" in body["message"]
    status, body = refused("no-such-pod:9394")
    assert (status, body["reason"], body["message"]) == (404, "NotFound", 'pods "no-such-pod" not found')
    status, body = refused(f"ftp:{monitor}:9394")
    assert (status, body["message"]) == (400, f'invalid pod request "ftp:{monitor}:9394"')
    lab.core.create_namespaced_pod(NS, session_pod("too-big", memory=10_000_000))  # Pending: no pod IP
    status, body = refused("too-big:9394", namespace=NS)
    assert (status, body["message"]) == (400, "address not allowed")


def pod_ip(lab: Lab, name: str) -> str:
    return lab.core.read_namespaced_pod(name, PLUGIN_NS).status.pod_ip


# --------------------------------------------------------------------------- RBAC


def service_account_token(lab: Lab, name: str, rules: list[dict] | None) -> str:
    lab.core.create_namespaced_service_account(PLUGIN_NS, {"metadata": {"name": name}})
    if rules is not None:
        rbac = kubernetes.client.RbacAuthorizationV1Api(lab.api)
        rbac.create_namespaced_role(PLUGIN_NS, {"metadata": {"name": name}, "rules": rules})
        rbac.create_namespaced_role_binding(PLUGIN_NS, {
            "metadata": {"name": name}, "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": PLUGIN_NS}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})
    lab.core.create_namespaced_secret(PLUGIN_NS, {
        "metadata": {"name": f"{name}-token", "annotations": {"kubernetes.io/service-account.name": name}},
        "type": "kubernetes.io/service-account-token"})
    secret = wait_for(lambda: (s := lab.core.read_namespaced_secret(f"{name}-token", PLUGIN_NS)).data and
                      s.data.get("token") and s)
    return base64.b64decode(secret.data["token"]).decode()


@pytest.mark.parametrize("scheme", ["current"])
def test_rbac_needs_get_on_pods_proxy(lab):
    monitor = lab.monitor("gpu-h100-01")
    reader = service_account_token(lab, "pod-reader", [{"apiGroups": [""], "resources": ["pods"],
                                                        "verbs": ["get", "list"]}])
    scraper = service_account_token(lab, "scraper", [{"apiGroups": [""], "resources": ["pods", "pods/proxy"],
                                                      "verbs": ["get", "list"]}])

    def as_account(token: str) -> kubernetes.client.CoreV1Api:
        config = lab.cluster.kubeconfig("sa")
        config["users"][0]["user"] = {"token": token}
        return kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config_dict(config))

    with pytest.raises(ApiException) as exc:
        as_account(reader).connect_get_namespaced_pod_proxy_with_path(f"{monitor}:9394", PLUGIN_NS, "metrics")
    body = json.loads(exc.value.body)
    assert (exc.value.status, body["reason"]) == (403, "Forbidden")
    assert body["message"] == (f'pods "{monitor}:9394" is forbidden: User "system:serviceaccount:kube-system:pod-reader" '
                               'cannot get resource "pods/proxy" in API group "" in the namespace "kube-system"')
    assert "hami_host_gpu_memory_used_bytes" in as_account(scraper).connect_get_namespaced_pod_proxy_with_path(
        f"{monitor}:9394", PLUGIN_NS, "metrics")
    # the control API is the admin's only, whatever RBAC grants
    everything = service_account_token(lab, "everything", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
    rbac = kubernetes.client.RbacAuthorizationV1Api(lab.api)
    rbac.create_cluster_role({"metadata": {"name": "urls"}, "rules": [{"nonResourceURLs": ["*"], "verbs": ["*"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": "urls"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "urls"},
        "subjects": [{"kind": "ServiceAccount", "name": "everything", "namespace": PLUGIN_NS}]})
    status, body = lab.control("/nodes/gpu-h100-01", {"monitor": "down"}, token=everything)
    assert (status, body["reason"]) == (403, "Forbidden")
    assert body["message"] == ('forbidden: User "system:serviceaccount:kube-system:everything" cannot put path '
                               '"/emulator/v1/gpu-activity/nodes/gpu-h100-01"')
    assert lab.control("/nodes/gpu-h100-01", {"monitor": "down"}, token=None)[0] == 401
    assert lab.control("/nodes/gpu-h100-01")[1]["monitor"] == "ok"


# --------------------------------------------------------------------------- busy / idle


def test_busy_and_idle_change_what_the_monitor_reads(lab, scheme):
    lab.core.create_namespaced_pod(NS, session_pod("s1", memory=4096))
    pod = lab.running("s1")
    last, utilization, used, limit = READ[scheme][0]

    def reading() -> dict[str, float]:
        [values] = series(lab.node_metrics(pod.spec.node_name), scheme, "s1").values()
        return values

    status, busy = lab.control(f"/namespaces/{NS}/pods/s1", {"state": "busy"})
    assert status == 200 and busy["state"] == "busy" and busy["node"] == pod.spec.node_name
    [gpu] = busy["gpus"]
    now = reading()
    assert now[last] == 0 and 60 <= now[utilization] <= 99 and now[limit] == 4096 * MIB
    assert 0.5 * now[limit] <= now[used] < 0.95 * now[limit]
    assert (now[utilization], now[used], now[limit]) == (gpu["utilization_percent"], gpu["memory_used_bytes"],
                                                         gpu["memory_limit_bytes"])
    assert reading() == now  # deterministic while busy

    status, idle = lab.control(f"/namespaces/{NS}/pods/s1", {"state": "idle"})
    assert status == 200 and idle["state"] == "idle"
    first = reading()
    assert first[utilization] == 0 and first[last] <= 1 and first[used] < now[used]
    time.sleep(2.1)
    assert reading()[last] >= first[last] + 2  # the idle clock runs from the moment idle was set
    assert lab.control(f"/namespaces/{NS}/pods/s1")[1]["state"] == "idle"


@pytest.mark.parametrize("scheme", ["current"])
def test_the_control_api_refuses_what_it_does_not_know(lab):
    status, body = lab.control(f"/namespaces/{NS}/pods/nobody", {"state": "busy"})
    assert (status, body["reason"], body["message"]) == (404, "NotFound", 'pods "nobody" not found')
    assert lab.control("/nodes/no-such-node", {"monitor": "down"})[0] == 404
    assert lab.control("/nodes/gpu-h100-01", {"monitor": "broken"})[0] == 400
    assert lab.control("/nodes/gpu-h100-01", {"state": "busy"})[0] == 400
    assert lab.control("/elsewhere", {"monitor": "down"})[0] == 404
    with pytest.raises(KeyError):
        lab.cluster.set_gpu_activity(NS, "nobody", "busy")
    with pytest.raises(ValueError, match="busy, idle"):
        lab.cluster.set_gpu_activity(PLUGIN_NS, lab.monitor("gpu-h100-01"), "sleepy")


# --------------------------------------------------------------------------- failing monitors


@pytest.mark.parametrize("scheme", ["current"])
def test_a_node_monitor_can_refuse_or_hang(lab):
    monitors = wait_for(lambda: (found := lab.monitor_pods()).keys() == {"gpu-h100-01", "gpu-v100-01"} and found)
    h100 = monitors["gpu-h100-01"].metadata.name
    status, body = lab.control("/nodes/gpu-h100-01", {"monitor": "down"})
    assert status == 200 and body == {"node": "gpu-h100-01", "monitor": "down",
                                      "pods": [{"namespace": PLUGIN_NS, "name": h100}]}
    with pytest.raises(ApiException) as exc:
        lab.scrape(h100)
    assert exc.value.status == 503 and "connect: connection refused" in json.loads(exc.value.body)["message"]
    assert "# TYPE" in lab.scrape(monitors["gpu-v100-01"].metadata.name)  # the other node's monitor answers

    lab.cluster.set_hami_monitor("gpu-h100-01", "hang")
    with pytest.raises(urllib3.exceptions.HTTPError, match="Read timed out"):  # after the client's own retries
        lab.scrape(h100, _request_timeout=0.5)
    answered: list[str] = []
    waiting = threading.Thread(target=lambda: answered.append(lab.scrape(h100, _request_timeout=20)))
    waiting.start()
    time.sleep(0.3)
    assert not answered
    lab.cluster.set_hami_monitor("gpu-h100-01", "ok")  # the hung request is answered now
    waiting.join(10)
    assert answered and "# TYPE" in answered[0]


def test_a_hung_monitor_answers_the_apiservers_503_after_the_hang():
    async def scenario() -> tuple[int, dict]:
        async with serve(fleet.cluster_objects("lab-c1"), pod_startup_seconds=0.1,
                         hami_monitor_hang_seconds=0.3) as (emulator, url):
            emulator.set_hami_monitor("gpu-v100-01", "hang")
            api = kubernetes.config.new_client_from_config_dict({
                "apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": url}}], "users": [{"name": "c", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "c"}}]})
            core = kubernetes.client.CoreV1Api(api)

            def scrape() -> tuple[int, dict]:
                pods = wait_for(lambda: core.list_namespaced_pod(PLUGIN_NS, field_selector="spec.nodeName=gpu-v100-01").items)
                try:
                    core.connect_get_namespaced_pod_proxy_with_path(f"{pods[0].metadata.name}:9394", PLUGIN_NS, "metrics")
                except ApiException as exc:
                    return exc.status, json.loads(exc.body) | {"ip": pods[0].status.pod_ip}
                return 200, {}

            try:
                return await asyncio.to_thread(scrape)
            finally:
                api.close()

    # In a thread of its own: a browser test earlier on this worker may leave an event loop marked running here.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        status, body = pool.submit(asyncio.run, scenario()).result(timeout=120)
    assert (status, body["reason"]) == (503, "ServiceUnavailable")
    assert body["message"] == f"error trying to reach service: dial tcp {body['ip']}:9394: i/o timeout"


# --------------------------------------------------------------------------- command lines


@pytest.mark.parametrize("scheme", ["current"])
def test_the_activity_command_line_calls_the_control_api(lab, tmp_path):
    lab.core.create_namespaced_pod(NS, session_pod("s1"))
    lab.running("s1")
    token_file = tmp_path / "token"
    token_file.write_text(ADMIN + "\n", encoding="utf-8")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "demo.emulator.activity", "--url", lab.cluster.url,
                               "--token-file", str(token_file), *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30)

    done = run("pod", f"{NS}/s1", "busy")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "busy"
    assert json.loads(run("pod", f"{NS}/s1").stdout)["state"] == "busy"
    done = run("node", "gpu-v100-01", "down")
    assert done.returncode == 0 and json.loads(done.stdout)["monitor"] == "down"
    missing = run("pod", f"{NS}/nobody", "idle")
    assert missing.returncode == 1 and json.loads(missing.stdout)["code"] == 404


def test_the_demo_seed_of_lab_c2_serves_the_legacy_names(tmp_path):
    seed = fleet.write_seed("lab-c2", tmp_path / "seed.json")
    assert json.loads(seed.read_text())["hamiMonitorScheme"] == "legacy"
    process, info = serve_seed(tmp_path, seed)
    try:
        api = kubernetes.config.new_client_from_config_dict({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": info["url"]}}], "users": [{"name": "c", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "c"}}]})
        core = kubernetes.client.CoreV1Api(api)
        pods = wait_for(lambda: core.list_namespaced_pod(PLUGIN_NS, label_selector=HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT).items)
        text = core.connect_get_namespaced_pod_proxy_with_path(f"{pods[0].metadata.name}:9394", PLUGIN_NS, "metrics")
        assert "HostGPUMemoryUsage" in shape(text) and "hami_host_gpu_memory_used_bytes" not in shape(text)
        api.close()
    finally:
        process.terminate()
        process.wait(15)
