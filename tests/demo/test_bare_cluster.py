"""The demo's bare cluster (``demo.bare_cluster``) and chart repository (``demo.charts``): a cluster with GPU nodes and
nothing installed, over TLS, its host facts changeable through ``hosts.json``; the charts attach installs served on
loopback; the attach command the demo prints; and ``manage.py demo --bare-cluster`` listing it in the state file."""

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import kubernetes
import psutil
import pytest
import requests
import yaml

from demo import bare_cluster, fleet
from demo.bare_demo import BareClusters, attach_command
from demo.charts import ChartRepository, chart_versions
from demo.ingress_nginx import ClusterApi
from operator_agent.hami import decode_node_register

ROOT = Path(__file__).resolve().parents[2]


def api_client(kubeconfig: Path) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=config)
    return kubernetes.client.ApiClient(config)


def assert_bare(kubeconfig: Path) -> list:
    """The cluster behind ``kubeconfig`` has GPU nodes (NVIDIA PCI devices) and nothing attach installs; its nodes."""
    with api_client(kubeconfig) as api:
        nodes = kubernetes.client.CoreV1Api(api).list_node().items
        gpu_nodes = [n.metadata.name for n in nodes if n.metadata.labels.get("feature.node.kubernetes.io/pci-10de.present") == "true"]
        assert sorted(gpu_nodes) == ["gpu-h20-01", "gpu-t4-01"]
        assert all("gpu" not in n.metadata.labels and "nvidia.com/gpu" not in (n.status.capacity or {}) for n in nodes)
        assert kubernetes.client.NodeV1Api(api).list_runtime_class().items == []
        assert kubernetes.client.AppsV1Api(api).list_daemon_set_for_all_namespaces().items == []
        assert kubernetes.client.AppsV1Api(api).list_deployment_for_all_namespaces().items == []
        namespaces = sorted(ns.metadata.name for ns in kubernetes.client.CoreV1Api(api).list_namespace().items)
        assert namespaces == ["default", "kube-system"]
    return nodes


@pytest.fixture
def running(tmp_path):
    bare = bare_cluster.BareCluster("lab-c3", tmp_path / "lab-c3").start()
    yield bare
    bare.stop()


def test_a_bare_cluster_has_gpu_nodes_and_nothing_installed_over_tls(running):
    config = yaml.safe_load(running.kubeconfig_path.read_text())
    assert running.kubeconfig_path.stat().st_mode & 0o777 == 0o600
    assert config["clusters"][0]["cluster"]["server"].startswith("https://127.0.0.1:")
    assert config["clusters"][0]["cluster"]["certificate-authority-data"] and config["users"][0]["user"]["token"]
    nodes = assert_bare(running.kubeconfig_path)
    assert [n.metadata.name for n in nodes if "node-role.kubernetes.io/control-plane" in n.metadata.labels] == [
        bare_cluster.ingress_node("lab-c3")] == ["lab-c3-server-01"]
    assert running.ready_info()["nodes"] == ["lab-c3-server-01", "gpu-t4-01", "gpu-h20-01"]


def test_the_demo_ingress_reads_it_over_verified_tls(running):
    api = ClusterApi.from_kubeconfig(running.kubeconfig_path)
    assert api.server.startswith("https://") and Path(api.ca_file).read_bytes() == running.cluster.ca_pem
    assert len(api.get("/api/v1/nodes")["items"]) == 3
    assert api.get("/apis/networking.k8s.io/v1/ingresses")["items"] == []


def test_its_identity_and_gpus_are_its_own_next_to_the_fleet():
    uid = {o["metadata"]["name"]: o["metadata"]["uid"] for o in bare_cluster.cluster_objects("lab-c3") if o["kind"] == "Namespace"}
    template = {o["metadata"]["name"]: o["metadata"]["uid"] for o in fleet.bare_cluster_objects("lab-c2") if o["kind"] == "Namespace"}
    other = {o["metadata"]["name"]: o["metadata"]["uid"] for o in bare_cluster.cluster_objects("lab-c4") if o["kind"] == "Namespace"}
    assert len({uid["kube-system"], template["kube-system"], other["kube-system"]}) == 3
    hosts = bare_cluster.prepared_hosts("lab-c3")
    devices = {node: decode_node_register(facts["hami_register"]) for node, facts in hosts.items() if facts.get("hami_register")}
    assert {node: len(d) for node, d in devices.items()} == {"gpu-t4-01": 1, "gpu-h20-01": 8}
    uuids = [d.uuid for node_devices in devices.values() for d in node_devices]
    assert len(set(uuids)) == 9 and not set(uuids) & set(fleet.fleet_gpu_uuids())
    assert all(u in hosts[node]["nvidia_smi"] for node, node_devices in devices.items() for u in (d.uuid for d in node_devices))
    assert bare_cluster.cluster_objects("lab-c3") == bare_cluster.cluster_objects("lab-c3")  # stable between runs


def test_one_node_starts_without_containerds_nvidia_runtime_and_fix_node_prepares_it(running):
    hosts = json.loads(running.hosts_path.read_text())
    assert hosts[bare_cluster.UNPREPARED_NODE]["containerd_nvidia_runtime"] is None
    assert running.cluster.hosts[bare_cluster.UNPREPARED_NODE].get("containerd_nvidia_runtime") is None
    assert running.cluster.hosts["gpu-h20-01"]["containerd_nvidia_runtime"] == "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    assert running.sync_hosts() == []  # unchanged file

    fixed = bare_cluster.fix_node("lab-c3", "gpu-t4-01", running.folder)

    assert running.sync_hosts() == ["gpu-t4-01"]
    assert running.cluster.hosts["gpu-t4-01"] == fixed == bare_cluster.prepared_hosts("lab-c3")["gpu-t4-01"]
    assert fixed["containerd_nvidia_runtime"] == "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"


def test_an_unusable_hosts_file_keeps_the_facts_and_a_bad_node_is_refused(running):
    before = running.cluster.hosts
    running.hosts_path.write_text('{"gpu-t4-01": {"nvidia_pci": "many"}}')
    assert running.sync_hosts() == []
    assert running.cluster.hosts == before
    with pytest.raises(ValueError, match="has no node 'gpu-a100-01'; its nodes: gpu-h20-01, gpu-t4-01, lab-c3-server-01"):
        bare_cluster.fix_node("lab-c3", "gpu-a100-01", running.folder)


def test_fix_node_from_the_command_line_needs_a_running_cluster(tmp_path):
    done = subprocess.run([sys.executable, "-m", "demo.bare_cluster", "fix-node", "lab-c3", "gpu-t4-01", "--folder",
                           str(tmp_path / "lab-c3")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "start the demo with --bare-cluster lab-c3 first" in done.stderr


@pytest.mark.parametrize(("name", "problem"), [
    ("lab-c1", "is a cluster the demo attaches itself"), ("Lab_C3", "a DNS label"), ("", "a DNS label"),
    ("x" * 41, "a DNS label"),
])
def test_names_it_refuses(name, problem):
    with pytest.raises(ValueError, match=problem):
        bare_cluster.check_name(name)


def test_the_chart_repository_serves_an_index_and_the_charts_it_names(tmp_path):
    repository = ChartRepository(tmp_path / "repo").start()
    try:
        index = yaml.safe_load(requests.get(f"{repository.url}/index.yaml", timeout=10).text)
        assert sorted(index["entries"]) == ["democratic-csi", "gateway-helm", "hami", "ingress-nginx"]
        assert {name: entries[0]["version"] for name, entries in index["entries"].items()} == chart_versions() == {
            "democratic-csi": "0.15.0", "gateway-helm": "v1.9.0", "hami": "2.7.1", "ingress-nginx": "4.13.3"}
        for entries in index["entries"].values():
            archive = requests.get(f"{repository.url}/{entries[0]['urls'][0]}", timeout=10)
            assert archive.status_code == 200 and hashlib.sha256(archive.content).hexdigest() == entries[0]["digest"]
        assert repository.attach_environment() == {
            "GSHARE_ATTACH_HAMI_REPO": repository.url, "GSHARE_ATTACH_HAMI_CHART_VERSION": "2.7.1",
            "GSHARE_ATTACH_INGRESS_NGINX_REPO": repository.url, "GSHARE_ATTACH_INGRESS_NGINX_CHART_VERSION": "4.13.3",
            "GSHARE_ATTACH_ENVOY_GATEWAY_REPO": repository.url, "GSHARE_ATTACH_ENVOY_GATEWAY_CHART_VERSION": "v1.9.0",
            "GSHARE_ATTACH_DEMOCRATIC_CSI_REPO": repository.url, "GSHARE_ATTACH_DEMOCRATIC_CSI_CHART_VERSION": "0.15.0",
        }
    finally:
        repository.stop()


def test_a_new_run_removes_every_earlier_bare_cluster_and_nothing_else(tmp_path):
    for folder, marker in (("lab-c3", "hosts.json"), ("lab-old", "hosts.json"), ("lab-c1", "kubeconfig.yaml"),
                           ("chart-repo", "index.yaml")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / marker).write_text("{}")
    BareClusters.wipe(tmp_path, ["lab-c3", "lab-new"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lab-c1"]


def test_the_attach_command_is_one_shell_line_with_the_token_and_chart_settings():
    command = attach_command(name="lab-c3", kubeconfig=".gshare/demo/lab-c3/admin.kubeconfig", control_plane="http://127.0.0.1:8000",
                             session_domain="lab-c3.gshare.localhost", ingress_node="lab-c3-server-01", api_token="gsk_a'b",
                             attach_env={"GSHARE_ATTACH_HAMI_REPO": "http://127.0.0.1:9000"})
    assert shlex.split(command) == [
        "GSHARE_API_TOKEN=gsk_a'b", "GSHARE_ATTACH_HAMI_REPO=http://127.0.0.1:9000", "hack/attach-cluster.sh",
        "--kubeconfig", ".gshare/demo/lab-c3/admin.kubeconfig", "--name", "lab-c3", "--control-plane", "http://127.0.0.1:8000",
        "--session-domain", "lab-c3.gshare.localhost", "--ingress-node", "lab-c3-server-01",
    ]


@pytest.fixture(scope="module")
def demo_with_bare(tmp_path_factory):
    """``manage.py demo --bare-cluster lab-c3`` (not smoke) in its own GSHARE_HOME; yields ``(state, home, log path)``
    once the state file is written; Ctrl-C at teardown, which must stop every process it started."""
    tmp = tmp_path_factory.mktemp("bare-demo")
    state_file, log_path, home = tmp / "state.json", tmp / "demo.log", tmp / "home"
    env = {**os.environ, "GSHARE_HOME": str(home), "DJANGO_SETTINGS_MODULE": "gshare.settings"}
    with open(log_path, "wb") as log:
        demo = subprocess.Popen([sys.executable, "manage.py", "demo", "--port", "0", "--state-file", str(state_file),
                                 "--inventory-interval", "2", "--bare-cluster", "lab-c3"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 150
        while not state_file.exists() and time.monotonic() < deadline:
            if demo.poll() is not None:
                pytest.fail(log_path.read_text()[-3000:], pytrace=False)
            time.sleep(0.5)
        yield json.loads(state_file.read_text()), home, log_path
    finally:
        children = psutil.Process(demo.pid).children(recursive=True)
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 0
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, [p.cmdline() for p in alive]


def split_command(command: str) -> tuple[dict[str, str], dict[str, str]]:
    """``(environment, flags)`` of a printed attach command."""
    words = shlex.split(command)
    script = words.index("hack/attach-cluster.sh")
    return dict(w.split("=", 1) for w in words[:script]), dict(zip(words[script + 1::2], words[script + 2::2], strict=True))


@pytest.mark.e2e
@pytest.mark.xdist_group("demo")  # the demo uses one fixed database name
def test_the_demo_lists_its_bare_cluster_and_serves_what_attach_needs(demo_with_bare):
    state, home, log_path = demo_with_bare
    [bare] = state["bare_clusters"]
    kubeconfig = home / "demo" / "lab-c3" / "admin.kubeconfig"
    assert bare["name"] == "lab-c3" and bare["admin_kubeconfig"] == str(kubeconfig.resolve())
    assert kubeconfig.stat().st_mode & 0o777 == 0o600
    assert_bare(kubeconfig)
    settings, flags = split_command(bare["attach_command"])
    assert settings["GSHARE_API_TOKEN"] == state["api_token"]
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    assert settings["GSHARE_LOOPBACK_ALLOWLIST"] == server.removeprefix("https://")
    assert flags == {"--kubeconfig": str(kubeconfig.resolve()), "--name": "lab-c3", "--control-plane": state["internal_url"],
                     "--session-domain": "lab-c3.gshare.localhost", "--ingress-node": "lab-c3-server-01"}
    index = yaml.safe_load(requests.get(f"{settings['GSHARE_ATTACH_HAMI_REPO']}/index.yaml", timeout=10).text)
    assert index["entries"]["hami"][0]["version"] == settings["GSHARE_ATTACH_HAMI_CHART_VERSION"] == "2.7.1"
    # The token is staff's: the API answers it, and only the demo's own clusters are registered yet.
    clusters = requests.get(f"{state['url']}/api/v1/clusters", headers={"Authorization": f"Bearer {state['api_token']}"},
                            timeout=10).json()
    assert [spec.name for spec in fleet.FLEET] == sorted(c["name"] for c in clusters["results"])
    assert bare["attach_command"] in log_path.read_text()


def attach_shell_env(tmp_path: Path) -> dict[str, str]:
    """The environment of the other shell the walkthrough runs the printed command in: nothing of the control plane's
    (no ``DATABASE_URL``, ``REDIS_URL``, ``GSHARE_*`` or ``DJANGO_*``); Helm's cache in ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GSHARE_", "DJANGO_", "DATABASE_", "REDIS_"))}
    env.update({var: str(tmp_path / "helm" / var.lower()) for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")})
    return env


@pytest.mark.e2e
@pytest.mark.xdist_group("demo")
def test_the_walkthrough_fails_on_the_unprepared_node_then_attaches_after_fix_node(demo_with_bare, tmp_path):
    state, _, _ = demo_with_bare
    [bare] = state["bare_clusters"]
    env = attach_shell_env(tmp_path)

    def shell(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    first = shell(bare["attach_command"])
    assert first.returncode == 1, first.stdout + first.stderr
    assert "[2/10] GPU node prerequisites ... FAILED: gpu-t4-01: containerd has no nvidia runtime registered" in first.stdout
    assert ("on gpu-t4-01: sudo nvidia-ctk runtime configure --runtime=containerd && sudo systemctl restart containerd"
            in first.stderr)
    assert "[3/10]" not in first.stdout

    fixed = shell(bare["fix_command"])
    assert fixed.returncode == 0 and "node gpu-t4-01 prepared" in fixed.stdout, fixed.stderr
    time.sleep(1.5)  # the bare cluster reads hosts.json every 0.5 s

    second = shell(bare["attach_command"])
    assert second.returncode == 0, second.stdout + second.stderr
    assert "[2/10] GPU node prerequisites ... ok: gpu-h20-01 (8 GPUs), gpu-t4-01 (1 GPU)" in second.stdout
    assert "Cluster lab-c3 is attached as clu_" in second.stdout

    # In the console's API: connected with its 9 GPUs, and a session on it opens through the demo's ingress.
    headers = {"Authorization": f"Bearer {state['api_token']}"}
    [cluster] = [c for c in requests.get(f"{state['url']}/api/v1/clusters", headers=headers, timeout=10).json()["results"]
                 if c["name"] == "lab-c3"]
    assert cluster["status"] == "connected" and cluster["session_domain"] == "lab-c3.gshare.localhost"
    gpus = requests.get(f"{state['url']}/api/v1/gpus", params={"cluster": cluster["id"], "limit": 100}, headers=headers,
                        timeout=10).json()
    assert sorted({g["model"] for g in gpus["results"] if g["cluster"] == cluster["id"]}) == fleet.expected_inventory("lab-c2")["models"]
    session = requests.post(f"{state['url']}/api/v1/sessions", headers=headers, timeout=30, json={
        "name": "try-lab-c3", "image": "quay.io/jupyter/base-notebook:2024-12-02", "gpus": 1, "gpu_memory_mib": 2048,
        "gpu_cores": 20, "cluster": cluster["id"]}).json()
    deadline = time.monotonic() + 60
    while (body := requests.get(f"{state['url']}/api/v1/sessions/{session['id']}", headers=headers, timeout=10).json())["phase"] != "Running":
        assert time.monotonic() < deadline and body["phase"] != "Failed", body
        time.sleep(0.5)
    assert body["node"] in ("gpu-t4-01", "gpu-h20-01")
    link = urlsplit(requests.post(f"{state['url']}/api/v1/sessions/{session['id']}/connect", headers=headers, timeout=10).json()["url"])
    assert link.hostname == "lab-c3.gshare.localhost"
    deadline = time.monotonic() + 30
    while (page := requests.get(f"{state['ingress']['url']}{link.path}?{link.query}", headers={"Host": link.netloc},
                                timeout=10, allow_redirects=False)).status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.5)  # the ingress lists the cluster's routes every second
    # Attached with the default routing (gateway-api): Envoy's ext_authz answers the link with a 307 that sets the
    # cookie and drops the token; the cookie then opens the page.
    assert cluster["routing"] == "gateway-api"
    assert page.status_code == 307 and page.headers["Server"] == "envoy" and "token=" not in page.headers["Location"], page.text
    cookie = page.headers["Set-Cookie"].split(";", 1)[0]
    page = requests.get(f"{state['ingress']['url']}{urljoin(link.path, page.headers['Location'])}",
                        headers={"Host": link.netloc, "Cookie": cookie}, timeout=10, allow_redirects=False)
    assert page.status_code == 200 and session["id"] in page.text
