"""The demo fleet (``demo.fleet``): real fixture data, consistent objects, seeds that serve.

No Django here: run with ``pytest -p no:django tests/demo``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import kubernetes
import kubernetes_validate
import pytest
import requests

from contract import (
    GATEWAY_NAME_DEFAULT,
    GATEWAY_NAMESPACE_DEFAULT,
    ROUTING_GATEWAY_API,
    ROUTING_INGRESS_NGINX,
)
from demo import fleet
from demo.emulator import EmulatedCluster
from tests.helpers import serve_seed

ROOT = Path(__file__).resolve().parents[2]
NAMES = [spec.name for spec in fleet.FLEET]
GATEWAY_GROUPS = {"gateway.networking.k8s.io", "gateway.envoyproxy.io"}


def gpu_nodes(name: str) -> list[dict]:
    return [o for o in fleet.cluster_objects(name)
            if o["kind"] == "Node" and o["metadata"]["labels"].get("gpu") == "on"]


def test_fleet_has_two_clusters():
    assert NAMES == ["lab-c1", "lab-c2"]


def test_gpu_uuids_are_unique_fleet_wide():
    uuids = fleet.fleet_gpu_uuids()
    assert len(uuids) == 19
    assert len(set(uuids)) == len(uuids)
    annotations = [node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
                   for name in NAMES for node in gpu_nodes(name)]
    from_objects = [d["uuid"] for value in annotations for d in fleet.decode_hami_register(value)]
    assert sorted(from_objects) == sorted(uuids)


def test_models_hami_versions_and_kubernetes_differ_between_clusters():
    c1, c2 = (fleet.expected_inventory(name) for name in NAMES)
    assert c1["models"] == ["NVIDIA H100 80GB HBM3", "Tesla V100-PCIE-32GB"]
    assert c2["models"] == ["NVIDIA H20-3e", "Tesla T4"]
    assert not set(c1["models"]) & set(c2["models"])
    assert (c1["hami_chart_version"], c2["hami_chart_version"]) == ("2.10.0", "2.7.1")
    assert (c1["kubernetes_version"], c2["kubernetes_version"]) == ("v1.32.3", "v1.34.1+k3s1")
    formats = {name: {node["metadata"]["annotations"]["hami.io/node-nvidia-register"][0] for node in gpu_nodes(name)}
               for name in NAMES}
    assert formats == {"lab-c1": {"["}, "lab-c2": {"G"}}  # JSON (v2.8+) vs legacy strings (<= v2.7)


def test_expected_inventory_counts():
    assert {k: fleet.expected_inventory("lab-c1")[k] for k in ("nodes", "gpus", "vgpus")} == {
        "nodes": 2, "gpus": 10, "vgpus": 100}
    assert {k: fleet.expected_inventory("lab-c2")[k] for k in ("nodes", "gpus", "vgpus")} == {
        "nodes": 2, "gpus": 9, "vgpus": 90}


@pytest.mark.parametrize("name", NAMES)
def test_gpu_nodes_carry_labels_annotations_and_capacity(name):
    spec = fleet.cluster_spec(name)
    nodes = {n["metadata"]["name"]: n for n in gpu_nodes(name)}
    assert sorted(nodes) == sorted(n.name for n in spec.gpu_nodes)
    for node_spec in spec.gpu_nodes:
        node = nodes[node_spec.name]
        labels, annotations = node["metadata"]["labels"], node["metadata"]["annotations"]
        assert labels["gpu"] == "on"
        assert labels["kubernetes.io/hostname"] == node_spec.name
        assert labels["gshare.io/gpu-mode"] == node_spec.gpu_mode and node_spec.gpu_mode in ("hami-core", "mig")
        register = annotations["hami.io/node-nvidia-register"]
        assert register == (fleet.DATA_DIR / node_spec.hami_file).read_text()  # byte for byte from the fixture
        devices = fleet.decode_hami_register(register)
        assert labels["nvidia.com/gpu.count"] == str(len(devices))
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["nvidia.com/gpu.product"] == devices[0]["model"].replace(" ", "-")
        assert node["status"]["capacity"]["nvidia.com/gpu"] == str(sum(d["split_count"] for d in devices))
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == node["status"]["capacity"]["nvidia.com/gpu"]
        assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
        assert annotations["hami.io/node-handshake"]
    control_plane = [o for o in fleet.cluster_objects(name)
                     if o["kind"] == "Node" and "gpu" not in o["metadata"]["labels"]]
    assert [n["metadata"]["name"] for n in control_plane] == [spec.ingress_node]


def test_mig_node_and_mode_labels():
    modes = {n["metadata"]["name"]: n["metadata"]["labels"]["gshare.io/gpu-mode"]
             for name in NAMES for n in gpu_nodes(name)}
    assert modes == {"gpu-h100-01": "hami-core", "gpu-v100-01": "hami-core", "gpu-t4-01": "hami-core",
                     "gpu-h20-01": "mig"}
    h20 = next(d for d in fleet.expected_inventory("lab-c2")["snapshot"]["nodes"] if d["name"] == "gpu-h20-01")
    assert {d["mode"] for d in h20["devices"]} == {"mig"}
    assert {d["memory_mib"] for d in h20["devices"]} == {258787}  # registered (x1.8 scaled) memory


def test_gfd_labels_come_from_the_nvidia_smi_captures():
    t4 = fleet.read_nvidia_smi_xml(fleet.DATA_DIR / "nvidia-smi/tesla-t4.q-x.xml")
    assert (t4.product_name, t4.memory_mib, t4.driver_version, t4.cuda_version, t4.architecture, t4.mig_capable) == (
        "Tesla T4", 15360, "515.105.01", "11.7", "Turing", False)
    h100 = fleet.read_nvidia_smi_csv(fleet.DATA_DIR / "nvidia-smi/h100-80gb-hbm3-mig.query-gpu.load.csv")
    assert (h100.product_name, h100.memory_mib, h100.driver_version, h100.compute_capability, h100.mig_capable) == (
        "NVIDIA H100 80GB HBM3", 81559, "590.48.01", "9.0", True)
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for name in NAMES for n in gpu_nodes(name)}
    assert labels["gpu-t4-01"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["gpu-t4-01"]["nvidia.com/gpu.memory"] == "15360"
    assert labels["gpu-t4-01"]["nvidia.com/cuda.driver-version.full"] == "515.105.01"
    assert labels["gpu-t4-01"]["nvidia.com/gpu.family"] == "turing"
    assert labels["gpu-h100-01"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["gpu-h100-01"]["nvidia.com/gpu.memory"] == "81559"
    assert (labels["gpu-h100-01"]["nvidia.com/gpu.compute.major"], labels["gpu-h100-01"]["nvidia.com/gpu.family"]) == (
        "9", "hopper")
    # No capture for these models: product and memory only, from the HAMi annotation (H20: physical memory).
    assert labels["gpu-v100-01"]["nvidia.com/gpu.product"] == "Tesla-V100-PCIE-32GB"
    assert labels["gpu-h20-01"]["nvidia.com/gpu.memory"] == "143771"
    assert "nvidia.com/cuda.driver-version.full" not in labels["gpu-h20-01"]


def test_hami_daemonset_runtime_class_namespaces_and_version():
    for spec in fleet.FLEET:
        objects = fleet.cluster_objects(spec.name)
        kinds = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
        assert ("RuntimeClass", None, "nvidia") in kinds
        namespaces = ("default", "kube-system", "gshare-system", "gshare-sessions")
        assert {("Namespace", None, ns) for ns in namespaces} <= set(kinds)
        daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
        assert (daemonset["metadata"]["namespace"], daemonset["metadata"]["name"]) == (
            "kube-system", "hami-device-plugin")
        labels = daemonset["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == "hami-device-plugin"
        assert labels["app.kubernetes.io/name"] == "hami"
        assert labels["helm.sh/chart"] == f"hami-{spec.hami_chart_version}"
        assert daemonset["status"]["desiredNumberScheduled"] == len(spec.gpu_nodes)
        version = fleet.cluster_version(spec.name)
        assert version == json.loads((fleet.DATA_DIR / spec.version_file).read_text())
    assert fleet.cluster_version("lab-c2")["emulationMinor"] == "34"


@pytest.mark.parametrize("name", NAMES)
def test_objects_validate_against_the_kubernetes_schema(name):
    minor = fleet.cluster_version(name)["minor"]
    for obj in fleet.cluster_objects(name):
        if obj["apiVersion"].split("/")[0] in GATEWAY_GROUPS:
            continue  # custom resources: their CRDs' schemas judge them (the emulator's seed check, below)
        kubernetes_validate.validate(obj, f"1.{minor}", strict=True)


def test_expected_snapshot_matches_the_operator_decoder():
    inventory = pytest.importorskip("operator_agent.reporters.inventory")
    for name in NAMES:
        snapshot = sorted((inventory.node_to_snapshot(node) for node in gpu_nodes(name)), key=lambda n: n["name"])
        assert snapshot == fleet.expected_inventory(name)["snapshot"]["nodes"]


def test_every_data_file_has_provenance_in_the_readme():
    readme = (fleet.DATA_DIR / "README.md").read_text()
    charts = fleet.DATA_DIR / "charts"  # the stand-in charts: their own README names each chart
    files = [p for p in fleet.DATA_DIR.rglob("*") if p.is_file() and p.name != "README.md" and not p.is_relative_to(charts)]
    assert len(files) == 16
    crds = sorted((charts / "gateway-helm" / "crds").glob("*.yaml"))  # upstream files the demo seeds: provenance here too
    assert len(crds) == 6
    for path in [*files, *crds]:
        assert f"`{path.name}`" in readme, path.name
    assert "`charts/`" in readme
    charts_readme = (charts / "README.md").read_text()
    for chart in sorted(p.name for p in charts.iterdir() if p.is_dir()):
        assert f"| `{chart}` |" in charts_readme, chart


@pytest.mark.parametrize("name", NAMES)
def test_emulated_cluster_serves_the_fleet_to_the_official_client(name):
    with EmulatedCluster(fleet.cluster_objects(name), version=fleet.cluster_version(name), token="t") as cluster:
        api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig(name))
        core = kubernetes.client.CoreV1Api(api)
        nodes = core.list_node(label_selector="gpu=on").items
        assert sorted(n.metadata.name for n in nodes) == sorted(n.name for n in fleet.cluster_spec(name).gpu_nodes)
        assert kubernetes.client.NodeV1Api(api).read_runtime_class("nvidia").handler == "nvidia"
        daemonsets = kubernetes.client.AppsV1Api(api).list_daemon_set_for_all_namespaces().items
        assert [d.metadata.name for d in daemonsets] == ["hami-device-plugin"]
        namespaces = sorted(n.metadata.name for n in core.list_namespace().items)
        gateway = ["envoy-gateway-system"] if name == fleet.GATEWAY_CLUSTER_DEFAULT else []
        assert namespaces == sorted(["default", "democratic-csi", "gshare-sessions", "gshare-system", "kube-system",
                                     *gateway])
        assert kubernetes.client.VersionApi(api).get_code().git_version == fleet.cluster_version(name)["gitVersion"]
        api.close()


@pytest.mark.parametrize("name", NAMES)
def test_seed_round_trips_through_the_cli(tmp_path, name):
    seed = fleet.write_seed(name, tmp_path / "seed.json")
    written = json.loads(seed.read_text())
    assert written["version"] == fleet.cluster_version(name) and written["objects"] == fleet.cluster_objects(name)
    assert written["podStartupSeconds"] == fleet.DEMO_POD_STARTUP_SECONDS == 1.0
    (tmp_path / "token").write_text("seed-token")
    process, info = serve_seed(tmp_path, seed, "--token-file", str(tmp_path / "token"))
    try:
        url = info["url"]
        config = {"apiVersion": "v1", "kind": "Config", "current-context": name,
                  "clusters": [{"name": name, "cluster": {"server": url}}],
                  "users": [{"name": name, "user": {"token": "seed-token"}}],
                  "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}
        api = kubernetes.config.new_client_from_config_dict(config)
        served = api.sanitize_for_serialization(kubernetes.client.CoreV1Api(api).list_node().items)
        seeded = {o["metadata"]["name"]: o for o in written["objects"] if o["kind"] == "Node"}
        assert sorted(n["metadata"]["name"] for n in served) == sorted(seeded)
        for node in served:
            original = seeded[node["metadata"]["name"]]
            assert node["metadata"]["labels"] == original["metadata"]["labels"]
            assert node["metadata"]["annotations"] == original["metadata"]["annotations"]
            assert node["metadata"]["uid"] == original["metadata"]["uid"]
            assert node["status"]["capacity"] == original["status"]["capacity"]
        assert kubernetes.client.VersionApi(api).get_code().git_version == written["version"]["gitVersion"]
        api.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_every_cluster_can_host_gshare_sessions():
    """The session namespace and the operator chart's GShareSession CRD are seeded and served."""
    crd_file = ROOT / "charts/gshare-operator/crds/gsharesessions.gshare.io.yaml"
    assert fleet.SESSION_CRD_FILE == crd_file and crd_file.is_file()
    for name in NAMES:
        crds = [o for o in fleet.cluster_objects(name, routing=ROUTING_INGRESS_NGINX)
                if o["kind"] == "CustomResourceDefinition"]
        assert [c["metadata"]["name"] for c in crds] == ["gsharesessions.gshare.io"]
        assert crds[0]["spec"] == fleet.session_crd(name)["spec"]
        assert not [o for o in fleet.cluster_objects(name, with_session_crd=False, routing=ROUTING_INGRESS_NGINX)
                    if o["kind"] == "CustomResourceDefinition"]
    objects = fleet.cluster_objects("lab-c1")
    with EmulatedCluster(objects, version=fleet.cluster_version("lab-c1")) as cluster:
        api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
        custom = kubernetes.client.CustomObjectsApi(api)
        session = {
            "apiVersion": "gshare.io/v1alpha1", "kind": "GShareSession",
            "metadata": {"name": "ses-ab12", "namespace": "gshare-sessions",
                         "labels": {"gshare.io/session-id": "ses_ab12"}},
            "spec": {"sessionId": "ses_ab12", "owner": "alice", "image": "quay.io/jupyter/base-notebook:2024-12-02",
                     "gpus": 1, "port": 8888, "host": "lab-c1.gshare.localhost", "path": "/s/ses_ab12/",
                     "authUrl": "https://gshare.example.com/internal/connect/verify"},
        }
        custom.create_namespaced_custom_object("gshare.io", "v1alpha1", "gshare-sessions", "gsharesessions", session)
        listed = custom.list_namespaced_custom_object("gshare.io", "v1alpha1", "gshare-sessions", "gsharesessions")
        assert [i["metadata"]["name"] for i in listed["items"]] == ["ses-ab12"]
        api.close()


def test_the_gateway_cluster_serves_envoy_gateway_and_the_session_gateway():
    """lab-c2 (gateway-api by default): the upstream CRDs copied unchanged, Envoy Gateway's Deployment, the GatewayClass
    and the Gateway, all accepted by the emulator's schema check; a session's HTTPRoute as the operator writes it is
    accepted; lab-c1 has none of it, and lab-c2 neither with ``routing=ingress-nginx``."""
    assert fleet.GATEWAY_CLUSTER_DEFAULT == "lab-c2"
    assert [s.routing for s in fleet.FLEET] == [ROUTING_INGRESS_NGINX, ROUTING_GATEWAY_API]
    for path in sorted((fleet.DATA_DIR / "crds").glob("*.yaml")):
        assert path.read_bytes() == (ROOT / "tests/fixtures/crds" / path.name).read_bytes(), path.name
    for objects in (fleet.cluster_objects("lab-c1"), fleet.cluster_objects("lab-c2", routing=ROUTING_INGRESS_NGINX)):
        assert not [o for o in objects if o["apiVersion"].split("/")[0] in GATEWAY_GROUPS]
    objects = fleet.cluster_objects("lab-c2")
    with EmulatedCluster(objects, version=fleet.cluster_version("lab-c2")) as cluster:
        get = lambda path: requests.get(cluster.url + path, timeout=10).json()  # noqa: E731
        gateways = get("/apis/gateway.networking.k8s.io/v1/gateways")["items"]
        assert [(g["metadata"]["namespace"], g["metadata"]["name"]) for g in gateways] == [
            (GATEWAY_NAMESPACE_DEFAULT, GATEWAY_NAME_DEFAULT)]
        listener = gateways[0]["spec"]["listeners"][0]
        assert (listener["hostname"], listener["protocol"]) == ("lab-c2.gshare.localhost", "HTTP")
        classes = get("/apis/gateway.networking.k8s.io/v1/gatewayclasses")["items"]
        assert classes[0]["spec"]["controllerName"] == "gateway.envoyproxy.io/gatewayclass-controller"
        assert get("/apis/apps/v1/namespaces/envoy-gateway-system/deployments/envoy-gateway")["status"][
            "availableReplicas"] == 1
        route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                 "metadata": {"name": "ses-ab12", "namespace": "gshare-sessions"},
                 "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                          "name": GATEWAY_NAME_DEFAULT, "namespace": GATEWAY_NAMESPACE_DEFAULT}],
                          "hostnames": ["lab-c2.gshare.localhost"],
                          "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/s/ses_ab12/"}}],
                                     "backendRefs": [{"name": "ses-ab12", "port": 8888}]}]}}
        answer = requests.post(cluster.url + "/apis/gateway.networking.k8s.io/v1/namespaces/gshare-sessions/httproutes",
                               json=route, timeout=10)
        assert answer.status_code == 201, answer.text
