"""The exact Helm releases and values attach_cluster installs, checked against the real charts' values layouts
(tests/fixtures/hami/helm-values.kubeScheduler.*.yaml) and real apiserver versions and democratic-csi values."""

from __future__ import annotations

import json

import pytest
import yaml

from attach import checks, releases
from tests.helpers import FIXTURES


def version_of(name: str) -> str:
    return json.loads((FIXTURES / "k8s-objects" / name).read_text())["gitVersion"]


@pytest.mark.parametrize(("fixture", "tag"), [
    ("version.kubeadm-v1.32.3-arm64.json", "v1.32.3"),
    ("version.k3s-v1.34.1+k3s1.json", "v1.34.1"),
    ("version.eks-v1.21.12.json", "v1.21.12"),
])
def test_kube_scheduler_tag_keeps_only_major_minor_patch(fixture, tag):
    assert releases.kube_scheduler_tag(version_of(fixture)) == tag


def test_a_version_that_is_not_semver_is_refused():
    with pytest.raises(releases.AttachInputError, match="not vX.Y.Z"):
        releases.kube_scheduler_tag("1.32")


def _has_path(tree: dict, path: list[str]) -> bool:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True


def _paths(tree: dict, prefix=()) -> list[list[str]]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _paths(value, (*prefix, key))
        else:
            out.append([*prefix, key])
    return out


@pytest.mark.parametrize(("chart_version", "fixture"), [
    ("2.4.0", "helm-values.kubeScheduler.v2.4.0.yaml"),
    ("2.5.0", "helm-values.kubeScheduler.v2.5.0.yaml"),
    ("2.10.0", "helm-values.kubeScheduler.v2.10.0.yaml"),
])
def test_hami_values_set_the_key_the_chart_version_really_has(chart_version, fixture):
    chart_values = {"scheduler": yaml.safe_load((FIXTURES / "hami" / fixture).read_text())}
    values = releases.hami_scheduler_values(chart_version, "v1.34.1+k3s1")
    [path] = _paths(values)
    assert _has_path(chart_values, path), f"{'.'.join(path)} is not a key of HAMi {chart_version}'s values"
    assert path[-1] in ("imageTag", "tag")
    leaf = values
    for key in path:
        leaf = leaf[key]
    assert leaf == "v1.34.1"


def test_hami_2_4_1_cannot_be_pinned_and_is_refused():
    chart_values = {"scheduler": yaml.safe_load((FIXTURES / "hami/helm-values.kubeScheduler.v2.4.1.yaml").read_text())}
    assert not _has_path(chart_values, ["scheduler", "kubeScheduler", "imageTag"])
    with pytest.raises(releases.AttachInputError, match="2.4.1"):
        releases.hami_scheduler_values("2.4.1", "v1.32.3")


def test_the_releases_a_real_cluster_would_get(settings):
    settings.GSHARE_ATTACH_HAMI_REPO = "https://project-hami.github.io/HAMi/"
    settings.GSHARE_ATTACH_HAMI_CHART_VERSION = "2.7.1"
    settings.GSHARE_ATTACH_INGRESS_NGINX_REPO = "https://kubernetes.github.io/ingress-nginx"
    settings.GSHARE_ATTACH_INGRESS_NGINX_CHART_VERSION = "4.13.3"
    hami = releases.hami_release(version_of("version.kubeadm-v1.32.3-arm64.json"))
    assert (hami.release, hami.namespace, hami.chart, hami.repo_url, hami.version) == (
        "hami", "kube-system", "hami", "https://project-hami.github.io/HAMi/", "2.7.1")
    assert hami.values == {"scheduler": {"kubeScheduler": {"image": {"tag": "v1.32.3"}}}}
    ingress = releases.ingress_nginx_release("lab-c1-cp-01")
    assert (ingress.release, ingress.namespace, ingress.chart, ingress.repo_url, ingress.version) == (
        "ingress-nginx", "ingress-nginx", "ingress-nginx", "https://kubernetes.github.io/ingress-nginx", "4.13.3")
    assert ingress.values["controller"]["nodeSelector"]["kubernetes.io/hostname"] == "lab-c1-cp-01"
    assert ingress.values["controller"]["hostNetwork"] is True
    assert ingress.values["controller"]["ingressClassResource"] == {"name": "nginx", "default": True}
    operator = releases.operator_release(cluster_id="clu_abc", control_plane_url="https://gshare.example.org",
                                         image="ghcr.io/gshare/gshare:0.2.0", storage_class="nfs")
    assert (operator.release, operator.namespace, operator.repo_url) == ("gshare-operator", "gshare-system", "")
    assert operator.chart.endswith("charts/gshare-operator")
    assert operator.values == {"clusterId": "clu_abc", "controlPlaneUrl": "https://gshare.example.org",
                               "volumeStorageClass": "nfs", "image": {"repository": "ghcr.io/gshare/gshare", "tag": "0.2.0"},
                               "tokenSecretName": "gshare-operator-internal-jwt"}


@pytest.mark.parametrize(("image", "split"), [
    ("ghcr.io/gshare/gshare:0.2.0", {"repository": "ghcr.io/gshare/gshare", "tag": "0.2.0"}),
    ("registry.local:5000/gshare", {"repository": "registry.local:5000/gshare", "tag": "latest"}),
    ("gshare:dev", {"repository": "gshare", "tag": "dev"}),
])
def test_operator_image_splits_into_repository_and_tag(image, split):
    assert releases.split_image(image) == split


@pytest.mark.parametrize("image", ["", "a b:1", "ghcr.io/gshare/gshare@sha256:" + "0" * 64])
def test_unusable_operator_images_are_refused(image):
    with pytest.raises(releases.AttachInputError):
        releases.split_image(image)


@pytest.mark.parametrize(("fixture", "storage_class"), [
    ("zfs-generic-nfs.values.yaml", "zfs-generic-nfs-csi"),
    ("freenas-nfs.values.yaml", "freenas-nfs-csi"),
])
def test_storage_plan_from_real_democratic_csi_values(fixture, storage_class):
    values = yaml.safe_load((FIXTURES / "k8s-objects/democratic-csi" / fixture).read_text())
    values["driver"]["config"]["nfs"]["shareHost"] = "nas.lab.example.org"
    plan = releases.storage_plan(values)
    assert plan.storage_class == storage_class
    assert (plan.server, plan.nfs_version, plan.ports) == ("nas.lab.example.org", 3, (2049, 111, 20048))
    assert plan.release.values["csiDriver"]["storageCapacity"] is True
    assert plan.release.values["csiDriver"]["name"] == values["csiDriver"]["name"]  # the user's values are kept
    assert plan.release.values["driver"] == values["driver"]
    assert plan.release.secret_values


def test_the_examples_placeholder_server_is_refused_without_quoting_secrets():
    values = yaml.safe_load((FIXTURES / "k8s-objects/democratic-csi/zfs-generic-nfs.values.yaml").read_text())
    with pytest.raises(releases.AttachInputError, match="shareHost") as caught:
        releases.storage_plan(values)
    assert "privateKey" not in str(caught.value) and "BEGIN" not in str(caught.value)


def test_helm_error_messages_are_redacted_for_secret_values():
    from attach.helm import redact

    values = yaml.safe_load((FIXTURES / "k8s-objects/democratic-csi/zfs-generic-nfs.values.yaml").read_text())
    values["driver"]["config"]["nfs"]["shareHost"] = "nas.lab.example.org"
    values["driver"]["config"]["sshConnection"]["password"] = "hunter2-secret"
    plan = releases.storage_plan(values)
    assert "hunter2-secret" not in redact("template: error near 'hunter2-secret'", plan.release)


def test_check_log_grammar():
    report = checks.parse_check_log(
        "gshare-check nvidia-pci found 2\ngshare-check nvidia-smi ok\nGPU 0: Tesla V100-PCIE-32GB (UUID: GPU-1)\n"
        "GPU 1: Tesla V100-PCIE-32GB (UUID: GPU-2)\ngshare-check nvidia-ctk missing\n"
        "gshare-check containerd-nvidia-runtime ok /etc/containerd/config.toml\ngshare-check tcp nas:2049 unreachable\n"
        "gshare-check done\n")
    assert report.complete and checks.gpu_count(report) == 2
    assert report.items["nvidia-smi"].output == ["GPU 0: Tesla V100-PCIE-32GB (UUID: GPU-1)", "GPU 1: Tesla V100-PCIE-32GB (UUID: GPU-2)"]
    assert report.status("nvidia-ctk") == "missing"
    assert report.items["containerd-nvidia-runtime"].detail == "/etc/containerd/config.toml"
    assert report.status("tcp nas:2049") == "unreachable"
    assert not checks.parse_check_log("gshare-check nvidia-pci found 1\n").complete


def test_check_pods_are_bound_privileged_and_named_stably():
    pod = checks.check_pod("nfs", "Node_With.Odd-Name", "gshare-system", targets=["nas:2049"])
    assert len(pod["metadata"]["name"]) <= 63 and pod["metadata"]["name"] == checks.check_pod_name("nfs", "Node_With.Odd-Name")
    spec = pod["spec"]
    assert spec["nodeName"] == "Node_With.Odd-Name" and spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["securityContext"] == {"privileged": True}
    assert spec["containers"][0]["env"] == [{"name": "GSHARE_CHECK_TARGETS", "value": "nas:2049"}]
    assert spec["volumes"] == [{"name": "host", "hostPath": {"path": "/"}}]


def test_redaction_covers_short_escaped_and_multiline_credentials_but_keeps_other_values():
    from attach.helm import redact

    values = yaml.safe_load((FIXTURES / "k8s-objects/democratic-csi/zfs-generic-nfs.values.yaml").read_text())
    values["driver"]["config"]["nfs"]["shareHost"] = "nas.lab.example.org"
    values["driver"]["config"]["sshConnection"]["privateKey"] = (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEabcdefSECRETLINE\n-----END RSA PRIVATE KEY-----\n")
    values["driver"]["config"]["sshConnection"]["password"] = "pw1"
    plan = releases.storage_plan(values)
    message = ('Secret "gshare-nfs-democratic-csi-driver-config" is invalid: stringData: Invalid value: '
               '"sshConnection:\\n  privateKey: |\\n    -----BEGIN RSA PRIVATE KEY-----\\n    MIIEabcdefSECRETLINE\\n" '
               'password: pw1; storageClass zfs-generic-nfs-csi reclaimPolicy Delete')
    redacted = redact(message, plan.release)
    assert "MIIEabcdefSECRETLINE" not in redacted and "pw1" not in redacted
    assert "zfs-generic-nfs-csi" in redacted and "Delete" in redacted


@pytest.mark.parametrize("image", ["UPPER/Case:tag", "ghcr.io/gshare/gshare:tag!!", "ghcr.io//gshare", ":tag"])
def test_image_references_outside_the_docker_grammar_are_refused(image):
    with pytest.raises(releases.AttachInputError):
        releases.split_image(image)


def test_the_envoy_gateway_release_a_real_cluster_would_get(settings):
    settings.GSHARE_ATTACH_ENVOY_GATEWAY_REPO = "oci://docker.io/envoyproxy"
    settings.GSHARE_ATTACH_ENVOY_GATEWAY_CHART_VERSION = "v1.9.0"
    eg = releases.envoy_gateway_release("lab-c1-cp-01")
    assert (eg.release, eg.namespace, eg.chart_ref, eg.version) == (
        "eg", "envoy-gateway-system", "oci://docker.io/envoyproxy/gateway-helm", "v1.9.0")
    config = eg.values["config"]["envoyGateway"]
    # charts/gateway-helm/values.tmpl.yaml (v1.9.0): the chart's own controllerName and provider, and the Backend API.
    assert config["gateway"] == {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"}
    assert config["provider"] == {"type": "Kubernetes"} and config["extensionApis"] == {"enableBackend": True}
    kubernetes = config["envoyProxy"]["provider"]["kubernetes"]
    assert kubernetes["envoyDeployment"]["pod"]["nodeSelector"]["kubernetes.io/hostname"] == "lab-c1-cp-01"
    assert kubernetes["useListenerPortAsContainerPort"] is True and kubernetes["envoyService"] == {"type": "ClusterIP"}
    assert kubernetes["envoyDeployment"]["container"]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    plain = releases.ChartRelease(release="x", namespace="y", chart="gateway-helm", repo_url="http://127.0.0.1:1", version="v1.9.0")
    assert plain.chart_ref == "gateway-helm"
