"""``manage.py attach_cluster`` end to end against an emulated cluster: fresh, re-run, each prerequisite missing.

The cluster is a demo-fleet cluster as it is before attach (tests/clusters/attach/conftest.py): its check pods
are completed by the emulator with the output real nodes print, its charts come from a Helm chart repository on
loopback and are installed by the real Helm engine, and its operator Deployment is run as a real operator
process that reports to the live server.
"""

from __future__ import annotations

import io
import json

import pytest
import yaml
from django.core.management import CommandError, call_command

from clusters.models import Cluster
from demo import fleet
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def attach(kubeconfig_path, live_server, *extra, name="lab-c1", ingress_node="lab-c1-cp-01"):
    """Run the command; returns (stdout, stderr, CommandError or None)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("attach_cluster", "--kubeconfig", str(kubeconfig_path), "--name", name, "--control-plane", live_server.url,
                     "--session-domain", f"{name}.gpu.example.org", "--ingress-node", ingress_node, *extra, stdout=out, stderr=err)
        error = None
    except CommandError as exc:
        error = exc
    return out.getvalue(), err.getvalue(), error


def helm_releases(emulated) -> dict[str, list[dict]]:
    """Helm's release records in the cluster: release name -> [{"version", "status"}] (Helm's Secret storage labels)."""
    releases: dict[str, list[dict]] = {}
    for secret in emulated.objects_of("secrets"):
        labels = secret["metadata"].get("labels") or {}
        if labels.get("owner") == "helm":
            releases.setdefault(labels["name"], []).append({"version": labels["version"], "status": labels["status"]})
    return releases


def names(emulated, plural, group="", version="v1"):
    return sorted((o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in emulated.objects_of(plural, group, version))


def test_fresh_attach_then_rerun_reaches_the_same_end_state(attach_settings, bare_cluster, operator_kubelet, live_server):
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    kubelet = operator_kubelet(emulated, kubeconfig_path)

    out, err, error = attach(kubeconfig_path, live_server)
    assert error is None, out + err
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] + "]" for line in lines] == [f"[{n}/9" + "]" for n in range(1, 10)]
    assert all("... ok" in line or "... skipped" in line for line in lines), out
    assert "skipped (no --storage-values)" in lines[7]

    cluster = Cluster.objects.get(name="lab-c1")
    assert cluster.status == Cluster.Status.CONNECTED
    assert cluster.session_domain == "lab-c1.gpu.example.org" and cluster.ingress_node == "lab-c1-cp-01"
    expected = fleet.expected_inventory("lab-c1")
    assert cluster.nodes.count() == expected["nodes"]
    assert cluster.operator_token_expires_at is not None

    # Step 3: RuntimeClass and labels on exactly the GPU nodes (told apart by the check pods' PCI scan).
    assert [rc["handler"] for rc in emulated.objects_of("runtimeclasses", "node.k8s.io")] == ["nvidia"]
    labelled = {n["metadata"]["name"]: n["metadata"]["labels"] for n in emulated.objects_of("nodes")}
    gpu_nodes = {n.name for n in fleet.cluster_spec("lab-c1").gpu_nodes}
    assert {name for name, labels in labelled.items() if labels.get("gpu") == "on"} == gpu_nodes
    assert all(labelled[name]["gshare.io/gpu-mode"] == "hami-core" for name in gpu_nodes)
    # Step 4: HAMi's kube-scheduler pinned to the cluster's own version (v1.32.3 from /version).
    scheduler = next(d for d in emulated.objects_of("deployments", "apps") if d["metadata"]["name"] == "hami-scheduler")
    images = [c["image"] for c in scheduler["spec"]["template"]["spec"]["containers"]]
    assert images[0] == "registry.cn-hangzhou.aliyuncs.com/google_containers/kube-scheduler:v1.32.3"
    # Step 5: ingress-nginx on the ingress node, on the host network.
    controller = next(d for d in emulated.objects_of("deployments", "apps") if d["metadata"]["name"] == "ingress-nginx-controller")
    pod_spec = controller["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"]["kubernetes.io/hostname"] == "lab-c1-cp-01" and pod_spec["hostNetwork"] is True
    # Step 7: the operator chart with this cluster's id and the control plane's URL, and its token Secret.
    assert kubelet.env["GSHARE_CLUSTER_ID"] == cluster.public_id
    assert kubelet.env["GSHARE_CONTROL_PLANE_URL"] == live_server.url
    assert ("gshare-system", "gshare-operator-internal-jwt") in names(emulated, "secrets")
    assert {name: [r["version"] for r in revs] for name, revs in helm_releases(emulated).items()} == {
        "hami": ["1"], "ingress-nginx": ["1"], "gshare-operator": ["1"]}
    # Check pods are gone.
    assert not [p for p in emulated.objects_of("pods") if p["metadata"]["name"].startswith("gshare-check-")]

    before = {plural: names(emulated, plural, group, version) for plural, group, version in (
        ("deployments", "apps", "v1"), ("daemonsets", "apps", "v1"), ("runtimeclasses", "node.k8s.io", "v1"),
        ("namespaces", "", "v1"), ("secrets", "", "v1"), ("customresourcedefinitions", "apiextensions.k8s.io", "v1"))}

    out2, err2, error2 = attach(kubeconfig_path, live_server)
    assert error2 is None, out2 + err2
    assert "already registered as " + cluster.public_id in out2
    assert "0 node(s) labelled" in out2 and "RuntimeClass nvidia present" in out2
    assert out2.count("unchanged (revision 1)") == 3, out2  # hami, ingress-nginx, the operator
    after = {plural: names(emulated, plural, group, version) for plural, group, version in (
        ("deployments", "apps", "v1"), ("daemonsets", "apps", "v1"), ("runtimeclasses", "node.k8s.io", "v1"),
        ("namespaces", "", "v1"), ("secrets", "", "v1"), ("customresourcedefinitions", "apiextensions.k8s.io", "v1"))}
    assert after == before
    assert Cluster.objects.filter(name="lab-c1").count() == 1
    assert Cluster.objects.get(name="lab-c1").public_id == cluster.public_id


def test_rerun_rolls_the_operator_forward_to_a_new_image(attach_settings, bare_cluster, operator_kubelet, live_server):
    emulated, kubeconfig_path = bare_cluster("lab-c2")
    operator_kubelet(emulated, kubeconfig_path)
    out, err, error = attach(kubeconfig_path, live_server, "--skip-ingress", name="lab-c2", ingress_node="lab-c2-server-01")
    assert error is None, out + err
    assert "skipped (--skip-ingress)" in out
    # k3s reports v1.34.1+k3s1: the kube-scheduler tag drops the +k3s1 suffix.
    scheduler = next(d for d in emulated.objects_of("deployments", "apps") if d["metadata"]["name"] == "hami-scheduler")
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v1.34.1")
    out2, err2, error2 = attach(kubeconfig_path, live_server, "--skip-ingress", "--operator-image", "ghcr.io/gshare/gshare:9.9.9",
                                name="lab-c2", ingress_node="lab-c2-server-01")
    assert error2 is None, out2 + err2
    assert "gShare operator: release gshare-operator upgraded (revision 2)" in out2
    deployment = next(d for d in emulated.objects_of("deployments", "apps") if d["metadata"]["name"] == "gshare-operator")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/gshare/gshare:9.9.9"
    assert "ingress-nginx" not in helm_releases(emulated)


@pytest.mark.parametrize(("facts", "problem", "fix"), [
    ({"nvidia_smi": None}, "the NVIDIA driver is not installed", "install the NVIDIA driver"),
    ({"nvidia_smi_error": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
                          "the latest NVIDIA driver is installed and running."},
     "the NVIDIA driver is not working", "then reboot the node"),
    ({"nvidia_ctk": None}, "the NVIDIA Container Toolkit is not installed", "install nvidia-container-toolkit"),
    ({"containerd_nvidia_runtime": None}, "containerd has no nvidia runtime registered",
     "sudo nvidia-ctk runtime configure --runtime=containerd && sudo systemctl restart containerd"),
], ids=["driver-missing", "driver-broken", "toolkit-missing", "runtime-missing"])
def test_a_missing_prerequisite_stops_at_step_2_with_its_fix(attach_settings, bare_cluster, live_server, facts, problem, fix):
    emulated, kubeconfig_path = bare_cluster("lab-c1", **{"gpu-v100-01": facts})
    out, err, error = attach(kubeconfig_path, live_server)
    assert error is not None and error.returncode == 1
    assert f"gpu-v100-01: {problem}" in str(error)
    assert "[2/9] GPU node prerequisites ... FAILED" in out
    assert "[3/9]" not in out
    assert fix in err and "then re-run:" in err
    assert "gpu-h100-01" not in str(error)  # the prepared node is not blamed
    assert not Cluster.objects.exists()
    assert emulated.objects_of("runtimeclasses", "node.k8s.io") == []
    assert not [p for p in emulated.objects_of("pods") if p["metadata"]["name"].startswith("gshare-check-")]

    # Fix the node and run again: the attach goes past step 2 (and stops at step 9: no operator runs here).
    attach_settings.GSHARE_ATTACH_INVENTORY_TIMEOUT = 0.5
    emulated.set_host("gpu-v100-01", fleet.cluster_hosts("lab-c1")["gpu-v100-01"])
    out, err, error = attach(kubeconfig_path, live_server, "--skip-ingress")
    assert "[2/9] GPU node prerequisites ... ok" in out, out + err
    assert "[9/9] connection test and first inventory ... FAILED: the operator has sent no inventory" in out
    assert "kubectl -n gshare-system logs deploy/gshare-operator" in err


def storage_values(tmp_path, server="nas.lab.example.org", nfsvers3=True) -> str:
    values = yaml.safe_load((FIXTURES / "k8s-objects/democratic-csi/zfs-generic-nfs.values.yaml").read_text())
    values["driver"]["config"]["nfs"]["shareHost"] = server
    if not nfsvers3:
        values["storageClasses"][0]["mountOptions"] = ["noatime"]
    path = tmp_path / "storage-values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_storage_values_install_democratic_csi_with_capacity_and_point_the_operator_at_its_class(
        attach_settings, bare_cluster, operator_kubelet, live_server, tmp_path):
    reachable = ["nas.lab.example.org:2049", "nas.lab.example.org:111", "nas.lab.example.org:20048"]
    emulated, kubeconfig_path = bare_cluster("lab-c1", **{n.name: {"reachable": reachable} for n in fleet.cluster_spec("lab-c1").nodes})
    kubelet = operator_kubelet(emulated, kubeconfig_path)
    values_path = storage_values(tmp_path)
    secret = yaml.safe_load(open(values_path))["driver"]["config"]["sshConnection"]["privateKey"]
    out, err, error = attach(kubeconfig_path, live_server, "--skip-ingress", "--storage-values", values_path)
    assert error is None, out + err
    assert "NFSv3 server reachable from 3 node(s)" in out
    drivers = emulated.objects_of("csidrivers", "storage.k8s.io")
    assert [(d["metadata"]["name"], d["spec"]["storageCapacity"]) for d in drivers] == [("org.democratic-csi.nfs", True)]
    assert [sc["metadata"]["name"] for sc in emulated.objects_of("storageclasses", "storage.k8s.io")] == ["zfs-generic-nfs-csi"]
    assert kubelet.env["GSHARE_VOLUME_STORAGE_CLASS"] == "zfs-generic-nfs-csi"
    assert Cluster.objects.get(name="lab-c1").volume_storage_class == "zfs-generic-nfs-csi"
    assert secret.strip()[:20] not in out + err  # the values file's secrets are never printed


@pytest.mark.parametrize(("facts", "problem", "fix"), [
    ({"mount_nfs": None, "reachable": ["nas.lab.example.org:2049", "nas.lab.example.org:111", "nas.lab.example.org:20048"]},
     "no NFS client (mount.nfs missing)", "nfs-common"),
    ({"reachable": ["nas.lab.example.org:2049"]}, "cannot reach nas.lab.example.org:111, nas.lab.example.org:20048",
     "open TCP 2049, 111, 20048 on nas.lab.example.org"),
], ids=["no-nfs-client", "nfsv3-ports-closed"])
def test_storage_prerequisites_stop_at_step_8(attach_settings, bare_cluster, live_server, tmp_path, facts, problem, fix):
    emulated, kubeconfig_path = bare_cluster("lab-c1", **{"gpu-h100-01": facts, "gpu-v100-01": {"reachable": facts["reachable"]},
                                                          "lab-c1-cp-01": {"reachable": facts["reachable"]}})
    out, err, error = attach(kubeconfig_path, live_server, "--skip-ingress", "--storage-values", storage_values(tmp_path))
    assert error is not None
    assert f"gpu-h100-01: {problem}" in str(error)
    assert "[8/9] storage ... FAILED" in out
    assert fix in err
    assert "democratic-csi" not in json.dumps(helm_releases(emulated))


def test_nfsv4_needs_only_port_2049(attach_settings, bare_cluster, operator_kubelet, live_server, tmp_path):
    emulated, kubeconfig_path = bare_cluster("lab-c1", **{n.name: {"reachable": ["nas.lab.example.org:2049"]}
                                                          for n in fleet.cluster_spec("lab-c1").nodes})
    operator_kubelet(emulated, kubeconfig_path)
    out, err, error = attach(kubeconfig_path, live_server, "--skip-ingress", "--storage-values", storage_values(tmp_path, nfsvers3=False))
    assert error is None, out + err
    assert "NFSv4 server reachable" in out


def test_a_loopback_kubeconfig_is_refused_at_step_1_like_registration(settings, tmp_path, live_server):
    path = tmp_path / "kubeconfig"
    path.write_text((FIXTURES / "kubeconfig/k3s.yaml").read_text())  # server https://127.0.0.1:6443
    out, err, error = attach(path, live_server)
    assert error is not None and "kubeconfig_localhost" in str(error)
    assert "[1/9] check the flags and reach the cluster ... FAILED" in out
    assert "kubectl config view --raw --minify --flatten" in err


def test_an_apiserver_that_never_answers_stops_at_step_1(settings, tmp_path, live_server, silent_listener):
    from tests.conftest import silent_kubeconfig

    settings.GSHARE_PROBE_TIMEOUT = 1.0
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(silent_kubeconfig(silent_listener)))
    out, err, error = attach(path, live_server)
    assert error is not None and "did not answer" in str(error)
    assert "curl -k --max-time 10" in err
    assert not Cluster.objects.exists()


def mutations(emulated) -> list[dict]:
    return [r for r in emulated.requests_seen() if r["method"] not in ("GET",)]


@pytest.mark.parametrize(("flag", "value", "problem"), [
    ("--name", "Bad_Name!", "--name 'Bad_Name!' is not a lowercase DNS name"),
    ("--session-domain", "BAD DOMAIN", "--session-domain 'BAD DOMAIN' is not a lowercase DNS name"),
    ("--control-plane", "javascript:alert(1)", "is not an http(s) URL"),
    ("--operator-image", "UPPER/Case:tag!!", "is not an image reference"),
])
def test_malformed_flags_are_refused_before_anything_touches_the_cluster(attach_settings, bare_cluster, live_server, flag, value, problem):
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    args = {"--name": "lab-c1", "--control-plane": live_server.url, "--session-domain": "lab-c1.gpu.example.org",
            "--ingress-node": "lab-c1-cp-01", "--kubeconfig": str(kubeconfig_path), flag: value}
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("attach_cluster", *[part for item in args.items() for part in item], stdout=out, stderr=err)
    assert problem in str(caught.value)
    assert "[1/9] check the flags and reach the cluster ... FAILED" in out.getvalue()
    assert mutations(emulated) == [] and not Cluster.objects.exists()


@pytest.mark.parametrize(("content", "problem"), [
    (b"\xff\xfe\x00not utf-8", "not UTF-8 text"),
    (b"a: [unclosed", "not valid YAML"),
    (b"x" * (1024 * 1024 + 10), "larger than 1024 KiB"),
])
def test_unusable_storage_values_files_stop_at_step_1(attach_settings, bare_cluster, live_server, tmp_path, content, problem):
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    path = tmp_path / "values.yaml"
    path.write_bytes(content)
    out, err, error = attach(kubeconfig_path, live_server, "--storage-values", str(path))
    assert error is not None and problem in str(error)
    assert "[1/9]" in out and mutations(emulated) == []


def test_a_non_utf8_kubeconfig_stops_at_step_1(live_server, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_bytes(b"\xff\xfe\x00")
    out, err, error = attach(path, live_server)
    assert error is not None and "not UTF-8 text" in str(error)


def test_rerun_with_a_rotated_credential_updates_the_stored_kubeconfig(attach_settings, bare_cluster, operator_kubelet, live_server, tmp_path):
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    operator_kubelet(emulated, kubeconfig_path)
    out, err, error = attach(kubeconfig_path, live_server, "--skip-ingress")
    assert error is None, out + err
    cluster = Cluster.objects.get(name="lab-c1")

    # A new credential for the same cluster (here: other user and context entries; a real rotation changes the token).
    config = yaml.safe_load(kubeconfig_path.read_text())
    config["users"][0]["name"] = config["contexts"][0]["context"]["user"] = "rotated-admin"
    config["contexts"][0]["name"] = config["current-context"] = "rotated@lab-c1"
    rotated = tmp_path / "rotated.kubeconfig"
    rotated.write_text(yaml.safe_dump(config))
    out, err, error = attach(rotated, live_server, "--skip-ingress")
    assert error is None, out + err
    assert f"already registered as {cluster.public_id} (kept, updated kubeconfig)" in out
    cluster.refresh_from_db()
    assert "rotated-admin" in cluster.kubeconfig and cluster.credential_generation == 1


def test_the_same_name_for_another_cluster_is_refused_at_step_6(attach_settings, bare_cluster, operator_kubelet, live_server):
    first, first_path = bare_cluster("lab-c1")
    operator_kubelet(first, first_path)
    out, err, error = attach(first_path, live_server, "--skip-ingress")
    assert error is None, out + err
    other, other_path = bare_cluster("lab-c2")
    out, err, error = attach(other_path, live_server, "--skip-ingress", name="lab-c1", ingress_node="lab-c2-server-01")
    assert error is not None and "the name lab-c1 is registered for another cluster" in str(error)
    assert "[6/9] register with the control plane ... FAILED" in out


class SilentAfter:
    """A TCP proxy to ``target`` that forwards for ``live`` seconds, then holds every connection without a byte."""

    def __init__(self, target: tuple[str, int], live: float):
        import socket
        import threading
        import time

        self.target, self.until, self.stopped = target, time.monotonic() + live, threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while not self.stopped.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a, b):
        import time

        a.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                data = a.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            while time.monotonic() > self.until and not self.stopped.is_set():
                time.sleep(0.1)
            try:
                b.sendall(data)
            except OSError:
                return

    def close(self):
        self.stopped.set()
        self.sock.close()


def test_an_apiserver_that_goes_silent_mid_attach_stops_it_with_a_fix(attach_settings, bare_cluster, live_server, tmp_path):
    import time

    emulated, kubeconfig_path = bare_cluster("lab-c1")
    host, port = emulated.url.split("://")[1].rsplit(":", 1)
    proxy = SilentAfter((host, int(port)), live=1.0)
    try:
        attach_settings.GSHARE_LOOPBACK_ALLOWLIST = [*attach_settings.GSHARE_LOOPBACK_ALLOWLIST, f"127.0.0.1:{proxy.port}"]
        attach_settings.GSHARE_PROBE_TIMEOUT = 2.0
        attach_settings.GSHARE_ATTACH_HELM_TIMEOUT = 5
        config = yaml.safe_load(kubeconfig_path.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        path = tmp_path / "proxied.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        started = time.monotonic()
        out, err, error = attach(path, live_server, "--skip-ingress")
        assert time.monotonic() - started < 30
        assert error is not None and "FAILED" in out and ("stopped answering" in str(error) or "did not answer" in str(error))
        assert "curl -k --max-time 10" in err
    finally:
        proxy.close()
