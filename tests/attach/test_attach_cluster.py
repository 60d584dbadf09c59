"""``manage.py attach_cluster`` end to end against an emulated cluster: fresh, re-run, each prerequisite missing.

The cluster is a demo-fleet cluster as it is before attach (tests/attach/conftest.py): its check pods
are completed by the emulator with the output real nodes print, its charts come from a Helm chart repository on
loopback and are installed by the real Helm engine, and its operator Deployment is run as a real operator
process that reports to the live server.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from cryptography import x509
from django.core.management import CommandError, call_command

from attach.fixes import INVOKED_AS_ENV, rerun_environment, shell_line
from attach.steps import reach
from clusters.models import Cluster
from demo import fleet
from tests.helpers import FIXTURES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
RETIREMENT = ("WARNING: ingress-nginx is retired upstream: no releases and no security patches since 2026-03-24 (Kubernetes SIG "
              "Network and the Security Response Committee).")


class Run(NamedTuple):
    """One run of the command: its output, its error, and the re-run line it must print (the command as run)."""

    out: str
    err: str
    error: CommandError | None
    rerun: str


@contextlib.contextmanager
def invoked(via: str, args: list[str]):
    """Make the process look as if the user ran the command from a shell, ``via`` ``manage`` (``python manage.py
    attach_cluster ...``) or ``hack`` (``hack/attach-cluster.sh ...``, which execs manage.py with
    GSHARE_ATTACH_INVOKED_AS set); yields the re-run line that invocation must get."""
    saved = sys.argv, sys.orig_argv, os.environ.get(INVOKED_AS_ENV)
    if via == "manage":
        sys.argv, sys.orig_argv = ["manage.py", "attach_cluster", *args], ["python", "manage.py", "attach_cluster", *args]
        os.environ.pop(INVOKED_AS_ENV, None)
        expected = ["python", "manage.py", "attach_cluster", *args]
    else:
        manage = str(ROOT / "manage.py")
        sys.argv, sys.orig_argv = [manage, "attach_cluster", *args], [sys.executable, manage, "attach_cluster", *args]
        os.environ[INVOKED_AS_ENV] = "hack/attach-cluster.sh"
        expected = ["hack/attach-cluster.sh", *args]
    try:
        yield shell_line([*rerun_environment(os.environ), *expected])
    finally:
        sys.argv, sys.orig_argv = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop(INVOKED_AS_ENV, None)
        else:
            os.environ[INVOKED_AS_ENV] = saved[2]


def run_command(args: list[str], via: str = "manage") -> Run:
    out, err = io.StringIO(), io.StringIO()
    with invoked(via, args) as rerun:
        try:
            call_command("attach_cluster", *args, stdout=out, stderr=err)
            error = None
        except CommandError as exc:
            error = exc
    return Run(out.getvalue(), err.getvalue(), error, rerun)


def attach(kubeconfig_path, live_server, *extra, name="lab-c1", ingress_node="lab-c1-cp-01", session_domain=None, via="manage") -> Run:
    """Run the command as ``via`` (``manage`` or ``hack``) would."""
    return run_command(["--kubeconfig", str(kubeconfig_path), "--name", name, "--control-plane", live_server.url,
                        "--session-domain", session_domain or f"{name}.gpu.localhost", "--ingress-node", ingress_node, *extra], via)


def fix_of(run: Run) -> str:
    """The fix a stopped run printed; asserts exit code 1 and that the fix is followed by the re-run line of the
    command exactly as it was run."""
    assert run.error is not None and run.error.returncode == 1, run.out + run.err
    head = "The attach stopped. To fix it:\n"
    assert head in run.err, run.err
    fix, separator, rest = run.err.split(head, 1)[1].partition("\nthen re-run: ")
    assert separator and rest.splitlines()[0] == run.rerun, run.err
    return fix


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


def gateway_api_objects(emulated) -> dict:
    """The Gateway API objects of the cluster: ``{"gatewayclasses": {name: obj}, "gateways": {ns/name: obj}}``."""
    return {plural: {"/".join(filter(None, (o["metadata"].get("namespace"), o["metadata"]["name"]))): o
                     for o in emulated.objects_of(plural, "gateway.networking.k8s.io", "v1")}
            for plural in ("gatewayclasses", "gateways")}


@pytest.mark.parametrize("routing", ["default", "ingress-nginx"])
def test_fresh_attach_then_rerun_reaches_the_same_end_state(attach_settings, bare_cluster, operator_kubelet, live_server, routing):
    emulated, kubeconfig_path = bare_cluster("lab-c1", ingress_class=False)
    kubelet = operator_kubelet(emulated, kubeconfig_path)
    flags = [] if routing == "default" else ["--routing", routing]

    out, err, error, _ = attach(kubeconfig_path, live_server, *flags)
    assert error is None, out + err
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] + "]" for line in lines] == [f"[{n}/10" + "]" for n in range(1, 11)]
    assert all("... ok" in line or "... skipped" in line for line in lines), out
    assert "skipped (no --storage-values)" in lines[8]

    cluster = Cluster.objects.get(name="lab-c1")
    assert cluster.status == Cluster.Status.CONNECTED
    assert cluster.session_domain == "lab-c1.gpu.localhost" and cluster.ingress_node == "lab-c1-cp-01"
    expected = fleet.expected_inventory("lab-c1")
    assert cluster.nodes.count() == expected["nodes"]
    assert cluster.operator_token_expires_at is not None
    # Step 6: the stored credential is the control plane's ServiceAccount, not the admin kubeconfig given.
    stored = yaml.safe_load(cluster.kubeconfig)
    assert stored["users"][0]["name"] == "gshare-control-plane"
    assert stored["users"][0]["user"]["token"] != emulated.token
    assert cluster.last_connection_test["checks"]["credential_least_privilege"] is True

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
    deployments = {d["metadata"]["name"]: d for d in emulated.objects_of("deployments", "apps")}
    if routing == "ingress-nginx":
        # Step 5: ingress-nginx on the ingress node, on the host network, with the retirement warning.
        pod_spec = deployments["ingress-nginx-controller"]["spec"]["template"]["spec"]
        assert pod_spec["nodeSelector"]["kubernetes.io/hostname"] == "lab-c1-cp-01" and pod_spec["hostNetwork"] is True
        assert RETIREMENT in out and "--routing gateway-api" in out
        assert "envoy-gateway" not in deployments and not gateway_api_objects(emulated)["gateways"]
        assert (cluster.routing, sorted(helm_releases(emulated))) == ("ingress-nginx", ["gshare-operator", "hami", "ingress-nginx"])
    else:
        # Step 5: Envoy Gateway (Backend API on, Envoy on the ingress node's host network), its GatewayClass, and the
        # session Gateway with an HTTPS listener for the session domain, Programmed at the ingress node's address.
        assert "ingress-nginx-controller" not in deployments and RETIREMENT not in out
        assert deployments["envoy-gateway"]["metadata"]["namespace"] == "envoy-gateway-system"
        config_map = next(c for c in emulated.objects_of("configmaps") if c["metadata"]["name"] == "envoy-gateway-config")
        config = yaml.safe_load(config_map["data"]["envoy-gateway.yaml"])
        assert config["extensionApis"] == {"enableBackend": True}
        assert config["gateway"]["controllerName"] == "gateway.envoyproxy.io/gatewayclass-controller"
        envoy = config["envoyProxy"]["provider"]["kubernetes"]
        assert envoy["envoyDeployment"]["pod"]["nodeSelector"]["kubernetes.io/hostname"] == "lab-c1-cp-01"
        assert envoy["envoyDeployment"]["patch"]["value"]["spec"]["template"]["spec"]["hostNetwork"] is True
        found = gateway_api_objects(emulated)
        assert found["gatewayclasses"]["gshare-envoy-gateway"]["spec"]["controllerName"] == "gateway.envoyproxy.io/gatewayclass-controller"
        gateway = found["gateways"]["gshare-system/gshare-sessions"]
        (listener,) = gateway["spec"]["listeners"]
        assert (listener["protocol"], listener["port"], listener["hostname"]) == ("HTTPS", 443, "lab-c1.gpu.localhost")
        assert listener["tls"]["certificateRefs"] == [{"group": "", "kind": "Secret", "name": "gshare-sessions-tls"}]
        assert listener["allowedRoutes"]["namespaces"]["selector"]["matchLabels"] == {"kubernetes.io/metadata.name": "gshare-sessions"}
        tls = next(s for s in emulated.objects_of("secrets") if s["metadata"]["name"] == "gshare-sessions-tls")
        certificate = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
        assert certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName) == ["lab-c1.gpu.localhost"]
        ingress_ip = next(a["address"] for n in emulated.objects_of("nodes") if n["metadata"]["name"] == "lab-c1-cp-01"
                          for a in n["status"]["addresses"] if a["type"] == "InternalIP")
        assert gateway["status"]["addresses"] == [{"type": "IPAddress", "value": ingress_ip}]
        assert (f"[5/10] session routing ... ok: Envoy Gateway v1.9.0 on lab-c1-cp-01: release eg installed (revision 1); GatewayClass "
                "gshare-envoy-gateway; Gateway gshare-system/gshare-sessions created (self-signed certificate Secret gshare-sessions-tls "
                f"for lab-c1.gpu.localhost created (put a real one there: docs/attach.md#routing)), Programmed at {ingress_ip}") in out
        assert (cluster.routing, cluster.gateway_name, cluster.gateway_namespace) == ("gateway-api", "gshare-sessions", "gshare-system")
    # Step 7: the operator chart with this cluster's id and the control plane's URL, and its token Secret.
    assert kubelet.env["GSHARE_CLUSTER_ID"] == cluster.public_id
    assert kubelet.env["GSHARE_CONTROL_PLANE_URL"] == live_server.url
    assert ("gshare-system", "gshare-operator-internal-jwt") in names(emulated, "secrets")
    assert {name: [r["version"] for r in revs] for name, revs in helm_releases(emulated).items()} == {
        "hami": ["1"], "ingress-nginx" if routing == "ingress-nginx" else "eg": ["1"], "gshare-operator": ["1"]}
    # Check pods are gone.
    assert not [p for p in emulated.objects_of("pods") if p["metadata"]["name"].startswith("gshare-check-")]

    before = {plural: names(emulated, plural, group, version) for plural, group, version in (
        ("deployments", "apps", "v1"), ("daemonsets", "apps", "v1"), ("runtimeclasses", "node.k8s.io", "v1"),
        ("namespaces", "", "v1"), ("secrets", "", "v1"), ("customresourcedefinitions", "apiextensions.k8s.io", "v1"))}

    gateways_before = gateway_api_objects(emulated)
    # The same command again (for ingress-nginx without --routing: a cluster that runs it keeps it).
    out2, err2, error2, _ = attach(kubeconfig_path, live_server, via="hack")
    assert error2 is None, out2 + err2
    assert "already registered as " + cluster.public_id in out2
    assert "0 node(s) labelled" in out2 and "RuntimeClass nvidia present" in out2
    assert out2.count("unchanged (revision 1)") == 3, out2  # hami, Envoy Gateway or ingress-nginx, the operator
    if routing == "ingress-nginx":
        assert ("[5/10] session routing ... ok: ingress-nginx kept (the cluster runs it: IngressClass nginx; --routing gateway-api "
                "moves it); ingress-nginx 4.13.3 on lab-c1-cp-01: release ingress-nginx unchanged (revision 1)") in out2
        assert RETIREMENT in out2 and Cluster.objects.get(name="lab-c1").routing == "ingress-nginx"
    else:
        assert "Gateway gshare-system/gshare-sessions applied (self-signed certificate Secret gshare-sessions-tls kept" in out2
        after_gateways = gateway_api_objects(emulated)
        assert {key: (o["metadata"]["generation"], o["spec"]) for key, o in after_gateways["gateways"].items()} == {
            key: (o["metadata"]["generation"], o["spec"]) for key, o in gateways_before["gateways"].items()}
    after = {plural: names(emulated, plural, group, version) for plural, group, version in (
        ("deployments", "apps", "v1"), ("daemonsets", "apps", "v1"), ("runtimeclasses", "node.k8s.io", "v1"),
        ("namespaces", "", "v1"), ("secrets", "", "v1"), ("customresourcedefinitions", "apiextensions.k8s.io", "v1"))}
    assert after == before
    tls_after = [s["data"] for s in emulated.objects_of("secrets") if s["metadata"]["name"] == "gshare-sessions-tls"]
    assert tls_after == ([] if routing == "ingress-nginx" else [tls["data"]])
    assert Cluster.objects.filter(name="lab-c1").count() == 1
    assert Cluster.objects.get(name="lab-c1").public_id == cluster.public_id


def test_rerun_rolls_the_operator_forward_to_a_new_image(attach_settings, bare_cluster, operator_kubelet, live_server):
    emulated, kubeconfig_path = bare_cluster("lab-c2")
    operator_kubelet(emulated, kubeconfig_path)
    out, err, error, _ = attach(kubeconfig_path, live_server, "--skip-ingress", name="lab-c2", ingress_node="lab-c2-server-01")
    assert error is None, out + err
    # --skip-ingress finds the IngressClass of ingress-nginx the cluster runs, and registers the cluster so.
    assert "[5/10] session routing ... skipped (--skip-ingress): ingress-nginx found (IngressClass nginx)" in out and RETIREMENT in out
    assert Cluster.objects.get(name="lab-c2").routing == "ingress-nginx"
    # k3s reports v1.34.1+k3s1: the kube-scheduler tag drops the +k3s1 suffix.
    scheduler = next(d for d in emulated.objects_of("deployments", "apps") if d["metadata"]["name"] == "hami-scheduler")
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v1.34.1")
    out2, err2, error2, _ = attach(kubeconfig_path, live_server, "--skip-ingress", "--operator-image", "ghcr.io/gshare/gshare:9.9.9",
                                name="lab-c2", ingress_node="lab-c2-server-01")
    assert error2 is None, out2 + err2
    assert "gShare operator: release gshare-operator upgraded (revision 2)" in out2
    deployment = next(d for d in emulated.objects_of("deployments", "apps") if d["metadata"]["name"] == "gshare-operator")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/gshare/gshare:9.9.9"
    assert "ingress-nginx" not in helm_releases(emulated)


DRIVER_FIX = ("install the NVIDIA driver (Ubuntu: sudo ubuntu-drivers install --gpgpu; RHEL: sudo dnf module install "
              "nvidia-driver:latest-dkms), then reboot the node")
RUNTIME_FIX = "sudo nvidia-ctk runtime configure --runtime=containerd && sudo systemctl restart containerd"


@pytest.mark.parametrize(("facts", "problem", "fix", "wrong"), [
    ({"nvidia_smi": None}, "the NVIDIA driver is not installed", DRIVER_FIX, ["nvidia-container-toolkit", "nvidia-ctk"]),
    ({"nvidia_smi_error": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
                          "the latest NVIDIA driver is installed and running."},
     "the NVIDIA driver is not working", DRIVER_FIX, ["nvidia-container-toolkit", "nvidia-ctk"]),
    ({"nvidia_ctk": None}, "the NVIDIA Container Toolkit is not installed", "install nvidia-container-toolkit", ["NVIDIA driver", "reboot"]),
    ({"containerd_nvidia_runtime": None}, "containerd has no nvidia runtime registered", RUNTIME_FIX,
     ["NVIDIA driver", "install nvidia-container-toolkit", "reboot"]),
], ids=["driver-missing", "driver-broken", "toolkit-missing", "runtime-missing"])
def test_a_missing_prerequisite_stops_at_step_2_with_its_fix(attach_settings, bare_cluster, live_server, facts, problem, fix, wrong):
    emulated, kubeconfig_path = bare_cluster("lab-c1", **{"gpu-v100-01": facts})
    run = attach(kubeconfig_path, live_server)
    out, error = run.out, run.error
    assert error is not None and error.returncode == 1
    assert f"gpu-v100-01: {problem}" in str(error)
    assert "[2/10] GPU node prerequisites ... FAILED" in out
    assert "[3/10]" not in out
    (line,) = fix_of(run).splitlines()  # one problem, one fix: this one, for that node
    assert line.startswith(f"on gpu-v100-01: {fix}") and not [w for w in wrong if w in line], line
    if fix == "install nvidia-container-toolkit":  # then registered with containerd, which needs the toolkit
        assert line.endswith(f"then: {RUNTIME_FIX}")
    assert "gpu-h100-01" not in str(error)  # the prepared node is not blamed
    assert not Cluster.objects.exists()
    assert emulated.objects_of("runtimeclasses", "node.k8s.io") == []
    assert not [p for p in emulated.objects_of("pods") if p["metadata"]["name"].startswith("gshare-check-")]

    # Fix the node and run again: the attach goes past step 2 (and stops at step 10: no operator runs here).
    attach_settings.GSHARE_ATTACH_INVENTORY_TIMEOUT = 0.5
    emulated.set_host("gpu-v100-01", fleet.cluster_hosts("lab-c1")["gpu-v100-01"])
    run = attach(kubeconfig_path, live_server, "--skip-ingress", via="hack")
    assert "[2/10] GPU node prerequisites ... ok" in run.out, run.out + run.err
    assert "[10/10] connection test and first inventory ... FAILED: the operator has sent no inventory" in run.out
    assert fix_of(run) == f"see why: kubectl -n gshare-system logs deploy/gshare-operator (it must reach {live_server.url})"


def test_a_chart_that_cannot_be_fetched_stops_at_step_4_with_the_helm_check(attach_settings, bare_cluster, live_server, chart_repo):
    attach_settings.GSHARE_ATTACH_HAMI_CHART_VERSION = "2.7.99"  # not in the repository
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    run = attach(kubeconfig_path, live_server, "--skip-ingress")
    assert "[4/10] HAMi ... FAILED: Helm could not install" in run.out, run.out + run.err
    assert fix_of(run) == f"check the chart can be fetched and rendered: helm template hami hami --repo {chart_repo} --version 2.7.99"


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
    out, err, error, _ = attach(kubeconfig_path, live_server, "--skip-ingress", "--storage-values", values_path)
    assert error is None, out + err
    assert "NFSv3 server reachable from 3 node(s)" in out
    drivers = emulated.objects_of("csidrivers", "storage.k8s.io")
    assert [(d["metadata"]["name"], d["spec"]["storageCapacity"]) for d in drivers] == [("org.democratic-csi.nfs", True)]
    assert [sc["metadata"]["name"] for sc in emulated.objects_of("storageclasses", "storage.k8s.io")] == ["zfs-generic-nfs-csi"]
    assert kubelet.env["GSHARE_VOLUME_STORAGE_CLASS"] == "zfs-generic-nfs-csi"
    assert Cluster.objects.get(name="lab-c1").volume_storage_class == "zfs-generic-nfs-csi"
    assert secret.strip()[:20] not in out + err  # the values file's secrets are never printed


@pytest.mark.parametrize(("facts", "problem", "fix", "other_fix", "via"), [
    ({"mount_nfs": None, "reachable": ["nas.lab.example.org:2049", "nas.lab.example.org:111", "nas.lab.example.org:20048"]},
     "no NFS client (mount.nfs missing)", "on gpu-h100-01: sudo apt-get install -y nfs-common", "open TCP", "manage"),
    ({"reachable": ["nas.lab.example.org:2049"]}, "cannot reach nas.lab.example.org:111, nas.lab.example.org:20048",
     "open TCP 2049, 111, 20048 on nas.lab.example.org to gpu-h100-01", "nfs-common", "hack"),
], ids=["no-nfs-client", "nfsv3-ports-closed"])
def test_storage_prerequisites_stop_at_step_8(attach_settings, bare_cluster, live_server, tmp_path, facts, problem, fix, other_fix, via):
    emulated, kubeconfig_path = bare_cluster("lab-c1", **{"gpu-h100-01": facts, "gpu-v100-01": {"reachable": facts["reachable"]},
                                                          "lab-c1-cp-01": {"reachable": facts["reachable"]}})
    run = attach(kubeconfig_path, live_server, "--skip-ingress", "--storage-values", storage_values(tmp_path), via=via)
    error = run.error
    assert error is not None
    assert f"gpu-h100-01: {problem}" in str(error)
    assert "[9/10] storage ... FAILED" in run.out
    lines = fix_of(run).splitlines()  # one per node with a problem, each the fix of its own problem
    assert fix in lines[0] and not [line for line in lines if other_fix in line], lines
    assert len(lines) == str(error).count(problem.split(",")[0])
    assert "democratic-csi" not in json.dumps(helm_releases(emulated))


def test_nfsv4_needs_only_port_2049(attach_settings, bare_cluster, operator_kubelet, live_server, tmp_path):
    emulated, kubeconfig_path = bare_cluster("lab-c1", **{n.name: {"reachable": ["nas.lab.example.org:2049"]}
                                                          for n in fleet.cluster_spec("lab-c1").nodes})
    operator_kubelet(emulated, kubeconfig_path)
    out, err, error, _ = attach(kubeconfig_path, live_server, "--skip-ingress", "--storage-values", storage_values(tmp_path, nfsvers3=False))
    assert error is None, out + err
    assert "NFSv4 server reachable" in out


def kubeconfig_fixture(tmp_path, name: str) -> Path:
    path = tmp_path / "cluster.kubeconfig"
    path.write_text((FIXTURES / "kubeconfig" / name).read_text())
    return path


def test_a_loopback_kubeconfig_is_refused_at_step_1_like_registration(settings, tmp_path, live_server):
    path = kubeconfig_fixture(tmp_path, "k3s.yaml")  # server https://127.0.0.1:6443, cluster entry "default"
    run = attach(path, live_server)
    assert run.error is not None and "kubeconfig_localhost" in str(run.error)
    assert "[1/10] check the flags and reach the cluster ... FAILED" in run.out
    fix = fix_of(run)
    # The fix changes the server address (what was wrong), in the file the command reads; exporting the same
    # kubeconfig again (`kubectl config view --flatten`) would keep 127.0.0.1.
    assert f"kubectl --kubeconfig {path} config set-cluster default --server=https://<reachable-host>:6443" in fix.splitlines()
    assert f"sed 's/127.0.0.1/<server-node-address>/' > {path}" in fix and "/etc/rancher/k3s/k3s.yaml" in fix
    assert "--flatten" not in fix and "view" not in fix


@pytest.mark.parametrize(("fixture", "code", "fix_lines", "wrong"), [
    ("eks-exec-aws-eks-get-token.yaml", "kubeconfig_exec_forbidden", [
        "kubectl -n kube-system create serviceaccount gshare-attach",
        "kubectl create clusterrolebinding gshare-attach --clusterrole=cluster-admin --serviceaccount=kube-system:gshare-attach",
        "kubectl --kubeconfig {path} config set-context --current --user=gshare-attach",
    ], ["--flatten", "--server="]),
    ("oidc-auth-provider.yaml", "kubeconfig_exec_forbidden", [
        "kubectl --kubeconfig {path} config set-credentials gshare-attach --token=\"$(kubectl -n kube-system get secret gshare-attach-token "
        "-o jsonpath='{{.data.token}}' | base64 -d)\"",
    ], ["--flatten", "--server="]),
    ("ca-file-paths-minikube.yaml", "kubeconfig_local_file", [
        "kubectl --kubeconfig {path} config view --raw --minify --flatten > {path}.inline && mv {path}.inline {path}",
    ], ["serviceaccount", "--server="]),
    ("kubectl-config-view-redacted.yaml", "kubeconfig_invalid", [
        "kubectl config view --raw --minify --flatten > {path}",
    ], ["serviceaccount", "--server=", "use-context"]),
    ("multi-context-empty-current-context.yaml", "kubeconfig_invalid", [
        "kubectl --kubeconfig {path} config get-contexts", "kubectl --kubeconfig {path} config use-context <context>",
    ], ["serviceaccount", "--server=", "--flatten"]),
], ids=["exec", "auth-provider", "file-paths", "redacted", "no-current-context"])
def test_each_refused_kubeconfig_gets_the_fix_for_its_problem(tmp_path, live_server, fixture, code, fix_lines, wrong):
    path = kubeconfig_fixture(tmp_path, fixture)
    run = attach(path, live_server, via="hack")
    assert run.error is not None and f"(code {code})" in str(run.error)
    fix = fix_of(run)
    for line in fix_lines:
        assert line.format(path=path) in fix.splitlines(), fix
    assert not [w for w in wrong if w in fix], fix


def test_a_token_file_is_replaced_by_the_token_itself(tmp_path, live_server):
    config = yaml.safe_load((FIXTURES / "kubeconfig" / "token-auth.yaml").read_text())
    user = config["users"][0]
    user["user"] = {"tokenFile": "/var/run/secrets/token"}
    path = tmp_path / "cluster.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    run = attach(path, live_server)
    assert "(code kubeconfig_local_file)" in str(run.error)
    assert fix_of(run).splitlines()[1:] == [
        f"kubectl --kubeconfig {path} config set-credentials {user['name']} --token=\"$(cat /var/run/secrets/token)\"",
        f"kubectl --kubeconfig {path} config unset users.{user['name']}.tokenFile",
    ]


def test_an_apiserver_that_never_answers_stops_at_step_1(settings, tmp_path, live_server, silent_listener):
    from tests.helpers import silent_kubeconfig

    settings.GSHARE_PROBE_TIMEOUT = 1.0
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(silent_kubeconfig(silent_listener)))
    run = attach(path, live_server, via="hack")
    assert run.error is not None and "did not answer" in str(run.error)
    assert fix_of(run) == f"check it is reachable from the control plane: curl -k --max-time 10 http://{silent_listener}/version"
    assert not Cluster.objects.exists()


def mutations(emulated) -> list[dict]:
    return [r for r in emulated.requests_seen() if r["method"] not in ("GET",)]


@pytest.mark.parametrize(("flag", "value", "problem", "fix", "via"), [
    ("--name", "Bad_Name!", "--name 'Bad_Name!' is not a lowercase DNS name",
     "pass a valid --name: it must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit, e.g. gpu-a", "manage"),
    ("--session-domain", "BAD DOMAIN", "--session-domain 'BAD DOMAIN' is not a lowercase DNS name",
     "pass a valid --session-domain: it must be a lowercase DNS name (RFC 1123), e.g. gpu-a.example.com", "hack"),
    ("--control-plane", "javascript:alert(1)", "is not an http(s) URL",
     "pass the control plane's URL as the cluster's pods reach it, e.g. https://gshare.example.org", "manage"),
    ("--operator-image", "UPPER/Case:tag!!", "is not an image reference",
     "pass --operator-image as registry/repository:tag, e.g. ghcr.io/gshare/gshare:0.2.0", "hack"),
    ("--gateway", "gshare-sessions", "--gateway 'gshare-sessions' is not NAMESPACE/NAME",
     "pass --gateway NAMESPACE/NAME, or leave it out for gshare-system/gshare-sessions", "manage"),
])
def test_malformed_flags_are_refused_before_anything_touches_the_cluster(attach_settings, bare_cluster, live_server, flag, value, problem,
                                                                          fix, via):
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    args = {"--name": "lab-c1", "--control-plane": live_server.url, "--session-domain": "lab-c1.gpu.localhost",
            "--ingress-node": "lab-c1-cp-01", "--kubeconfig": str(kubeconfig_path), flag: value}
    run = run_command([part for item in args.items() for part in item], via)
    assert run.error is not None and problem in str(run.error)
    assert "[1/10] check the flags and reach the cluster ... FAILED" in run.out
    assert fix_of(run) == fix
    assert mutations(emulated) == [] and not Cluster.objects.exists()


def test_an_ingress_node_that_is_not_a_node_is_answered_with_the_nodes(attach_settings, bare_cluster, live_server):
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    run = attach(kubeconfig_path, live_server, ingress_node="gpu-a-cp-01")
    assert "--ingress-node gpu-a-cp-01 is not a node of this cluster" in str(run.error)
    nodes = ", ".join(sorted(n.name for n in fleet.cluster_spec("lab-c1").nodes))
    assert fix_of(run) == f"pass one of its nodes as --ingress-node (the one the session domain's DNS points at): {nodes}"


@pytest.mark.parametrize(("content", "problem", "fix"), [
    (b"\xff\xfe\x00not utf-8", "not UTF-8 text", "save the values as UTF-8 text: iconv -f <its encoding> -t UTF-8 {p} > {p}.utf8 && mv {p}.utf8 {p}"),
    (b"a: [unclosed", "not valid YAML (line 1)",
     "correct the YAML at line 1 of {p} (democratic-csi's examples/*-nfs.yaml layout, see docs/attach.md#storage)"),
    (b"x" * (1024 * 1024 + 10), "larger than 1024 KiB", "pass only democratic-csi's values in {p} (its examples/*-nfs.yaml are a few KiB)"),
    (None, "No such file or directory",
     "pass the path of a file this user can read (a relative path is read from the directory the command runs in): ls -l {p}"),
], ids=["not-utf8", "not-yaml", "too-large", "missing"])
def test_unusable_storage_values_files_stop_at_step_1(attach_settings, bare_cluster, live_server, tmp_path, content, problem, fix):
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    path = tmp_path / "values.yaml"
    if content is not None:
        path.write_bytes(content)
    run = attach(kubeconfig_path, live_server, "--storage-values", str(path), via="hack")
    assert run.error is not None and problem in str(run.error)
    assert "[1/10]" in run.out and mutations(emulated) == []
    assert fix_of(run) == fix.format(p=path)


@pytest.mark.parametrize(("content", "problem", "fix"), [
    (b"\xff\xfe\x00", "not UTF-8 text", "export the kubeconfig as text: kubectl config view --raw --minify --flatten > {p}"),
    (b"x" * (256 * 1024 + 1), "larger than 256 KiB", "export only this cluster's context: kubectl config view --raw --minify --flatten > {p}"),
], ids=["not-utf8", "too-large"])
def test_an_unusable_kubeconfig_file_stops_at_step_1(live_server, tmp_path, content, problem, fix):
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    run = attach(path, live_server)
    assert run.error is not None and problem in str(run.error)
    assert fix_of(run) == fix.format(p=path)


def test_rerun_replaces_an_admin_credential_with_the_service_accounts(attach_settings, bare_cluster, operator_kubelet, live_server,
                                                                       tmp_path):
    emulated, kubeconfig_path = bare_cluster("lab-c1")
    operator_kubelet(emulated, kubeconfig_path)
    # Registered before attach made a credential: the admin kubeconfig itself is stored.
    out, err, error, _ = attach(kubeconfig_path, live_server, "--skip-ingress")
    assert error is None, out + err
    cluster = Cluster.objects.get(name="lab-c1")
    least, generation = cluster.kubeconfig, cluster.credential_generation
    Cluster.objects.filter(pk=cluster.pk).update(kubeconfig=yaml.safe_dump(yaml.safe_load(kubeconfig_path.read_text())))
    out, err, error, _ = attach(kubeconfig_path, live_server, "--skip-ingress")
    assert error is None, out + err
    assert f"already registered as {cluster.public_id} (kept; credential checked)" in out
    cluster.refresh_from_db()
    assert cluster.kubeconfig == least and "gshare-control-plane" in cluster.kubeconfig
    assert cluster.last_connection_test["checks"]["credential_least_privilege"] is True

    # A rotated admin credential changes nothing stored: the ServiceAccount's token is kept.
    config = yaml.safe_load(kubeconfig_path.read_text())
    config["users"][0]["name"] = config["contexts"][0]["context"]["user"] = "rotated-admin"
    config["contexts"][0]["name"] = config["current-context"] = "rotated@lab-c1"
    rotated = tmp_path / "rotated.kubeconfig"
    rotated.write_text(yaml.safe_dump(config))
    out, err, error, _ = attach(rotated, live_server, "--skip-ingress")
    assert error is None, out + err
    assert f"already registered as {cluster.public_id} (kept; credential checked)" in out
    cluster.refresh_from_db()
    assert cluster.kubeconfig == least
    # Revoking the token (deleting its Secret) and re-running registers a new one, same cluster id.
    emulated.call(_delete_token_secret, emulated)
    out, err, error, _ = attach(rotated, live_server, "--skip-ingress")
    assert error is None, out + err
    assert f"already registered as {cluster.public_id} (kept; credential checked)" in out
    cluster.refresh_from_db()
    assert cluster.kubeconfig != least and cluster.credential_generation == generation  # the operator's tokens stay valid


async def _delete_token_secret(emulated) -> None:
    api = emulated.emulator
    async with api._lock:
        await api.delete_object(api.served("", "v1", "secrets"), "gshare-system", "gshare-control-plane-token", dry_run=False)


def test_the_same_name_for_another_cluster_is_refused_at_step_7(attach_settings, bare_cluster, operator_kubelet, live_server):
    first, first_path = bare_cluster("lab-c1")
    operator_kubelet(first, first_path)
    out, err, error, _ = attach(first_path, live_server, "--skip-ingress")
    assert error is None, out + err
    registered = Cluster.objects.get(name="lab-c1")
    other, other_path = bare_cluster("lab-c2")
    run = attach(other_path, live_server, "--skip-ingress", name="lab-c1", ingress_node="lab-c2-server-01", via="hack")
    assert run.error is not None and "the name lab-c1 is registered for another cluster" in str(run.error)
    assert "[7/10] register with the control plane ... FAILED" in run.out
    assert fix_of(run) == f"pick another --name, or deregister the other one: DELETE /api/v1/clusters/{registered.public_id}"


def test_registration_refusals_at_step_7_name_their_fix(attach_settings, bare_cluster, live_server):
    from tests.factories import ClusterFactory, SessionFactory

    attach_settings.GSHARE_ATTACH_INVENTORY_TIMEOUT = 0.5  # no operator runs here: each successful run stops at step 10
    emulated, path = bare_cluster("lab-c1")

    # Another cluster serves sessions at the hostname.
    holder = ClusterFactory(name="holder", session_domain="lab-c1.gpu.localhost")
    run = attach(path, live_server, "--skip-ingress")
    assert "[7/10] register with the control plane ... FAILED" in run.out and "(code session_domain_taken)" in str(run.error)
    assert fix_of(run) == (
        f"cluster holder ({holder.public_id}) serves sessions at that hostname: pass another --session-domain (its DNS name must "
        f"point at --ingress-node), or first give the other cluster another one: PATCH /api/v1/clusters/{holder.public_id} "
        '{"session_domain": "<hostname>"}')
    assert not Cluster.objects.filter(name="lab-c1").exists()

    # Registered at another hostname; then the same cluster under another name is refused, naming the registration.
    run = attach(path, live_server, "--skip-ingress", session_domain="lab-c1.other.example.org")
    assert "[7/10] register with the control plane ... ok: registered as" in run.out, run.out + run.err
    cluster = Cluster.objects.get(name="lab-c1")
    run = attach(path, live_server, "--skip-ingress", name="lab-c1-copy", session_domain="copy.example.org", via="hack")
    assert "[7/10] register with the control plane ... FAILED" in run.out and "(code cluster_already_registered)" in str(run.error)
    assert fix_of(run).splitlines() == [
        f"this cluster is already registered as lab-c1 ({cluster.public_id}). To repair or update that registration, run:",
        run.rerun.replace("--name lab-c1-copy", "--name lab-c1"),
        f"or, to register it under the new name, deregister it first: DELETE /api/v1/clusters/{cluster.public_id} (staff API token)",
    ]
    assert list(Cluster.objects.values_list("name", flat=True).order_by("name")) == ["holder", "lab-c1"]

    # A new --session-domain while a session lives there: the update is refused, naming the session.
    session = SessionFactory(cluster=cluster)
    run = attach(path, live_server, "--skip-ingress", session_domain="lab-c1.new.example.org")
    assert "(code cluster_has_live_sessions)" in str(run.error) and session.public_id in str(run.error)
    assert fix_of(run).splitlines() == [
        f"stop the cluster's live sessions first (DELETE /api/v1/sessions/<id> for each of: {session.public_id}), or wait until they end",
        "or keep the current session domain: " + run.rerun.replace("lab-c1.new.example.org", "lab-c1.other.example.org"),
    ]
    cluster.refresh_from_db()
    assert cluster.session_domain == "lab-c1.other.example.org"


@pytest.mark.parametrize("via", ["manage.py", "hack/attach-cluster.sh"])
def test_the_rerun_line_is_the_command_the_user_ran(tmp_path, via):
    """A real process started the way a user starts it (no call_command): the re-run line is what was typed."""
    import subprocess

    path = kubeconfig_fixture(tmp_path, "k3s.yaml")
    flags = ["--kubeconfig", str(path), "--name", "lab-c1", "--control-plane", "https://gshare.example.org",
             "--session-domain", "lab-c1.gpu.localhost", "--ingress-node", "lab-c1-cp-01"]
    argv = [sys.executable, "manage.py", "attach_cluster", *flags] if via == "manage.py" else ["hack/attach-cluster.sh", *flags]
    # The first run's GSHARE_* variables are part of what the user ran; the token's value is never printed.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSHARE_")} | {
        "PYTHON": sys.executable, "GSHARE_NETGUARD": "1", "GSHARE_LOOPBACK_ALLOWLIST": "127.0.0.2:1,[::1]:2",
        "GSHARE_API_TOKEN": "gsh_abcd1234_not-to-be-printed"}
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(code kubeconfig_localhost)" in result.stdout
    assert "not-to-be-printed" not in result.stdout + result.stderr
    fix, _, rest = result.stderr.split("The attach stopped. To fix it:\n", 1)[1].partition("\nthen re-run: ")
    line = rest.splitlines()[0]
    assert line == ("GSHARE_API_TOKEN=\"$GSHARE_API_TOKEN\" GSHARE_LOOPBACK_ALLOWLIST='127.0.0.2:1,[::1]:2' GSHARE_NETGUARD=1 "
                    + shlex.join(argv))
    # The printed line, run by a shell that holds the token, is the same run: the same stop, the same line.
    again = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
                           env={k: v for k, v in env.items() if k in ("PATH", "HOME", "PYTHON", "PYTHONPATH", "GSHARE_API_TOKEN")})
    assert again.returncode == 1 and "(code kubeconfig_localhost)" in again.stdout, again.stdout + again.stderr
    assert again.stderr.split("\nthen re-run: ", 1)[1].splitlines()[0] == line
    assert f"kubectl --kubeconfig {path} config set-cluster default --server=https://<reachable-host>:6443" in fix
    if via != "manage.py":
        assert "manage.py" not in rest.splitlines()[0]


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
        run = attach(path, live_server, "--skip-ingress")
        assert run.error is not None and "FAILED" in run.out and ("stopped answering" in str(run.error) or "did not answer" in str(run.error))
        assert fix_of(run) == f"check it is reachable from the control plane: curl -k --max-time 10 https://127.0.0.1:{proxy.port}/version"
    finally:
        proxy.close()


def test_attach_from_a_laptop_reaches_the_control_plane_only_through_its_api(
        attach_settings, bare_cluster, operator_kubelet, live_server, attach_api_token, tmp_path):
    """hack/attach-cluster.sh as a user runs it on a laptop: no DATABASE_URL, no REDIS_URL, the token in a file. It starts
    no local PostgreSQL or Redis, and the cluster ends up registered, its operator token pushed by the control plane."""
    import subprocess

    emulated, kubeconfig_path = bare_cluster("lab-c1")
    operator_kubelet(emulated, kubeconfig_path)
    laptop = tmp_path / "laptop"
    token_file = tmp_path / "token"
    token_file.write_text(attach_api_token + "\n")
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "GSHARE_TEST_DATABASE", "GSHARE_API_TOKEN")}
    env.update({
        "GSHARE_HOME": str(laptop), "GSHARE_LOOPBACK_ALLOWLIST": ",".join(attach_settings.GSHARE_LOOPBACK_ALLOWLIST),
        **{f"GSHARE_ATTACH_{key}": str(getattr(attach_settings, f"GSHARE_ATTACH_{key}")) for key in (
            "HAMI_REPO", "HAMI_CHART_VERSION", "INGRESS_NGINX_REPO", "INGRESS_NGINX_CHART_VERSION", "CHECK_TIMEOUT", "GPU_TIMEOUT",
            "INVENTORY_TIMEOUT")},
        "GSHARE_PROBE_TIMEOUT": str(attach_settings.GSHARE_PROBE_TIMEOUT),
    })
    run = subprocess.run(
        [str(ROOT / "hack" / "attach-cluster.sh"), "--kubeconfig", str(kubeconfig_path), "--name", "lab-c1", "--control-plane", live_server.url,
         "--session-domain", "lab-c1.gpu.localhost", "--ingress-node", "lab-c1-cp-01", "--skip-ingress", "--token-file", str(token_file)],
        env=env, capture_output=True, text=True, timeout=170, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Cluster lab-c1 is attached as clu_" in run.stdout
    assert "by the control plane" in run.stdout and attach_api_token not in run.stdout + run.stderr
    cluster = Cluster.objects.get(name="lab-c1")
    assert cluster.status == Cluster.Status.CONNECTED and cluster.operator_token_rotated_at is not None
    assert not any((laptop / name).exists() for name in ("postgres", "redis", "encryption.key")), sorted(p.name for p in laptop.iterdir())


@pytest.mark.parametrize("case", ["no token", "wrong token", "researcher token", "not gshare", "down"])
def test_the_control_plane_is_checked_before_anything_touches_the_cluster(case, attach_settings, bare_cluster, live_server, monkeypatch,
                                                                          plain_user, tmp_path):
    from tests.conftest import _token_for

    emulated, kubeconfig_path = bare_cluster("lab-c1")
    url = live_server.url
    if case == "no token":
        monkeypatch.delenv("GSHARE_API_TOKEN")
    elif case == "wrong token":
        monkeypatch.setenv("GSHARE_API_TOKEN", "gsh_not-a-token")
    elif case == "researcher token":
        monkeypatch.setenv("GSHARE_API_TOKEN", _token_for(plain_user))
    elif case == "not gshare":
        url = emulated.url  # an HTTPS server that is not gShare (the emulator's apiserver)
    else:
        url = "http://127.0.0.1:9"
    before = len(emulated.objects_of("namespaces"))
    run = run_command(["--kubeconfig", str(kubeconfig_path), "--name", "lab-c1", "--control-plane", url,
                       "--session-domain", "lab-c1.gpu.example.org", "--ingress-node", "lab-c1-cp-01"])
    fix = fix_of(run)
    expected = {"no token": ("no API token", "GSHARE_API_TOKEN"),
                "wrong token": ("refused the API token", "manage.py create_api_token"),
                "researcher token": ("'alice', who is not a staff user", "use a staff user's token"),
                "not gshare": ("did not answer as gShare's API", url),
                "down": ("connection refused", "curl -sS http://127.0.0.1:9/healthz")}[case]
    assert "[1/10] check the flags and reach the cluster ... FAILED" in run.out and expected[0] in str(run.error), run.out + run.err
    assert expected[1] in fix
    assert len(emulated.objects_of("namespaces")) == before and not emulated.objects_of("pods")
    assert not Cluster.objects.exists()


def test_a_control_plane_of_another_release_is_refused_with_the_checkout_to_use(attach_settings, bare_cluster, live_server, monkeypatch):
    from core.version import GSHARE_VERSION

    emulated, kubeconfig_path = bare_cluster("lab-c1")
    monkeypatch.setattr(reach, "GSHARE_VERSION", "0.9.1")  # this checkout, as if it were another release
    run = attach(kubeconfig_path, live_server)
    assert f"the control plane runs gShare {GSHARE_VERSION}" in str(run.error) and "this checkout is 0.9.1" in str(run.error)
    assert fix_of(run) == f"run the attach from a checkout of the control plane's release: git checkout v{GSHARE_VERSION}"
    assert not emulated.objects_of("pods")
