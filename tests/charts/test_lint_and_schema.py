"""Both charts lint cleanly and every object they render (and every CRD they ship) is valid Kubernetes."""

from __future__ import annotations

import helm_python as helm
import kubernetes_validate
import pytest

from tests.charts.rendering import (
    CONTROL_PLANE_CHART,
    CONTROL_PLANE_FULL_VALUES,
    CONTROL_PLANE_VALUES,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    OPERATOR_CHART,
    OPERATOR_NAMESPACE,
    OPERATOR_VALUES,
    chart_crds,
    containers,
    merged,
    render_control_plane,
    render_operator,
)

HELM_WARNING = 2  # lint severities: 0 unknown, 1 info, 2 warning, 3 error

#: name -> (render the chart, the release namespace)
RENDERINGS = {
    "control-plane-minimal": (lambda: render_control_plane(CONTROL_PLANE_VALUES), NAMESPACE),
    "control-plane-full": (lambda: render_control_plane(CONTROL_PLANE_FULL_VALUES), NAMESPACE),
    "control-plane-no-ingress": (lambda: render_control_plane(merged(CONTROL_PLANE_VALUES, {"ingress": {"enabled": False}})), NAMESPACE),
    "operator-default": (lambda: render_operator(OPERATOR_VALUES), OPERATOR_NAMESPACE),
    "operator-custom": (lambda: render_operator(merged(OPERATOR_VALUES, {
        "tokenSecretName": "my-operator-token", "volumeStorageClass": "gshare-nfs", "createSessionNamespace": False,
        "sessionNamespace": "gpu-sessions", "image": {"repository": "registry.example.com/gshare/gshare", "tag": "9.9.9"},
    })), OPERATOR_NAMESPACE),
    "operator-hami-cluster-wide": (lambda: render_operator(merged(OPERATOR_VALUES, {
        "hamiMonitor": {"namespace": ""}, "metrics": {"port": 0}})), OPERATOR_NAMESPACE),
}


def rendered(name: str) -> list[dict]:
    """The objects of one of RENDERINGS."""
    return RENDERINGS[name][0]()


@pytest.mark.parametrize("kube_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("chart", "values"), [
    (CONTROL_PLANE_CHART, CONTROL_PLANE_VALUES),
    (CONTROL_PLANE_CHART, CONTROL_PLANE_FULL_VALUES),
    (OPERATOR_CHART, OPERATOR_VALUES),
], ids=["control-plane", "control-plane-full", "operator"])
def test_lint_reports_no_warning_or_error(chart, values, kube_version):
    report = helm.lint(chart, values, strict=True, kube_version=f"v{kube_version}.0")
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= HELM_WARNING] == []


@pytest.mark.parametrize("kube_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("rendering", RENDERINGS, ids=str)
def test_every_rendered_object_is_valid(rendering, kube_version):
    objects = rendered(rendering)
    assert objects, "the chart rendered nothing"
    for obj in objects:
        template = obj.pop("__template__")
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{template}: {obj['kind']} {obj['metadata'].get('name')}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("kube_version", KUBERNETES_VERSIONS)
def test_operator_crds_are_valid(kube_version):
    crds = chart_crds(OPERATOR_CHART)
    assert {crd["spec"]["names"]["kind"] for crd in crds} == {"GShareSession"}
    for crd in crds:
        kubernetes_validate.validate(crd, kube_version, strict=True)


@pytest.mark.parametrize("rendering", RENDERINGS, ids=str)
def test_objects_are_namespaced_in_the_release_namespace_or_cluster_scoped(rendering):
    """Everything lives in the release namespace, except the operator's Roles and RoleBindings in the session namespace
    and in HAMi's."""
    objects = rendered(rendering)
    release_namespace = RENDERINGS[rendering][1]
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "Namespace"}
    for obj in objects:
        where = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"], where
        elif obj["metadata"]["name"] in ("gshare-operator-sessions", "gshare-operator-hami-monitor"):
            assert obj["metadata"]["namespace"] not in (release_namespace, None), where
        else:
            assert obj["metadata"]["namespace"] == release_namespace, where


@pytest.mark.parametrize("rendering", RENDERINGS, ids=str)
def test_no_chart_creates_a_secret(rendering):
    """Credentials are never values: both charts only reference Secrets created outside them."""
    assert [o["metadata"]["name"] for o in rendered(rendering) if o["kind"] == "Secret"] == []


@pytest.mark.parametrize("rendering", RENDERINGS, ids=str)
def test_environment_names_are_unique_per_container(rendering):
    for _, container in containers(rendered(rendering)):
        names = [entry["name"] for entry in container.get("env", [])]
        assert len(names) == len(set(names)), f"{container['name']}: duplicate env {sorted(n for n in names if names.count(n) > 1)}"


@pytest.mark.parametrize("rendering", RENDERINGS, ids=str)
def test_every_object_carries_the_standard_labels(rendering):
    objects = rendered(rendering)
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
                    "app.kubernetes.io/version", "app.kubernetes.io/part-of", "helm.sh/chart"):
            assert labels.get(key), f"{obj['kind']} {obj['metadata']['name']} has no {key} label"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
