"""charts/gshare-operator: the environment contract, the token Secret's least-privilege Role, required values."""

from __future__ import annotations

import pytest

from contract import (
    DEFAULT_TOKEN_FILE,
    HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT,
    HAMI_MONITOR_PORT_DEFAULT,
    OPERATOR_TOKEN_SECRET_KEY,
    OPERATOR_TOKEN_SECRET_NAME,
)
from operator_agent.config import OperatorConfig
from tests.charts.rendering import (
    OPERATOR_CHART,
    OPERATOR_NAMESPACE,
    OPERATOR_VALUES,
    chart_defaults,
    env_of,
    expect_render_error,
    merged,
    of_kind,
    one,
    render_operator,
    without,
)

CUSTOM = merged(OPERATOR_VALUES, {"tokenSecretName": "cluster-a-operator-token", "volumeStorageClass": "gshare-nfs"})


def operator_container(objects) -> dict:
    [container] = one(objects, "Deployment", "gshare-operator")["spec"]["template"]["spec"]["containers"]
    return container


def secret_rules(objects) -> list[tuple[str, dict]]:
    """``(Role or ClusterRole name, rule)`` of every rule in the chart that grants anything on Secrets."""
    return [
        (f"{role['kind']}/{role['metadata']['name']}", rule)
        for role in [*of_kind(objects, "Role"), *of_kind(objects, "ClusterRole")]
        for rule in role.get("rules", [])
        if "" in rule.get("apiGroups", []) and ({"secrets", "*"} & set(rule.get("resources", [])))
    ]


def test_defaults_match_the_operator_contract():
    defaults = chart_defaults(OPERATOR_CHART)
    assert defaults["tokenSecretName"] == OPERATOR_TOKEN_SECRET_NAME
    assert defaults["volumeStorageClass"] == ""


@pytest.mark.parametrize("values", [OPERATOR_VALUES, CUSTOM], ids=["default", "custom"])
def test_environment_contract(values):
    merged_values = merged(chart_defaults(OPERATOR_CHART), values)
    env = env_of(operator_container(render_operator(values)))
    assert env["GSHARE_CLUSTER_ID"]["value"] == values["clusterId"]
    assert env["GSHARE_CONTROL_PLANE_URL"]["value"] == values["controlPlaneUrl"]
    assert env["GSHARE_TOKEN_SECRET_NAME"] == {"name": "GSHARE_TOKEN_SECRET_NAME", "value": merged_values["tokenSecretName"]}
    assert env["GSHARE_OPERATOR_NAMESPACE"] == {"name": "GSHARE_OPERATOR_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    assert env["GSHARE_VOLUME_STORAGE_CLASS"] == {"name": "GSHARE_VOLUME_STORAGE_CLASS", "value": merged_values["volumeStorageClass"]}
    assert env["GSHARE_SESSION_NAMESPACE"]["value"] == merged_values["sessionNamespace"]


@pytest.mark.parametrize("values", [OPERATOR_VALUES, CUSTOM], ids=["default", "custom"])
def test_the_token_file_is_the_mounted_key_of_the_token_secret(values):
    objects = render_operator(values)
    container = operator_container(objects)
    token_file = env_of(container)["GSHARE_TOKEN_FILE"]["value"]
    assert token_file == DEFAULT_TOKEN_FILE
    volumes = {v["name"]: v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    [mount] = [m for m in container["volumeMounts"] if token_file == f"{m['mountPath']}/{OPERATOR_TOKEN_SECRET_KEY}"]
    assert "subPath" not in mount, "a subPath mount is never refreshed when the Secret changes"
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == env_of(container)["GSHARE_TOKEN_SECRET_NAME"]["value"]


@pytest.mark.parametrize("values", [OPERATOR_VALUES, CUSTOM], ids=["default", "custom"])
def test_the_only_access_to_secrets_is_get_update_patch_of_the_token_secret(values):
    objects = render_operator(values)
    token_secret = env_of(operator_container(objects))["GSHARE_TOKEN_SECRET_NAME"]["value"]
    [(where, rule)] = secret_rules(objects)
    assert where == "Role/gshare-operator-token"
    assert sorted(rule["verbs"]) == ["get", "patch", "update"]
    assert rule["resources"] == ["secrets"]
    assert rule["resourceNames"] == [token_secret]
    role = one(objects, "Role", "gshare-operator-token")
    assert role["metadata"]["namespace"] == OPERATOR_NAMESPACE
    assert role["rules"] == [rule]


def test_the_token_role_is_bound_to_the_operator_service_account():
    objects = render_operator()
    service_account = one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert one(objects, "ServiceAccount")["metadata"]["name"] == service_account
    [binding] = [b for b in of_kind(objects, "RoleBinding") if b["roleRef"]["name"] == "gshare-operator-token"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gshare-operator-token"}
    assert binding["metadata"]["namespace"] == OPERATOR_NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": service_account, "namespace": OPERATOR_NAMESPACE}]


def test_no_wildcards_in_any_rule():
    for role in [*of_kind(render_operator(), "Role"), *of_kind(render_operator(), "ClusterRole")]:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: {field}"


def test_pod_security():
    spec = one(render_operator(), "Deployment")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    tmp = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    assert any(m["mountPath"] == "/tmp" and m["name"] in tmp for m in container["volumeMounts"])


def test_the_chart_does_not_create_the_token_secret_and_keeps_the_crd_out_of_templates():
    objects = render_operator(CUSTOM)
    assert of_kind(objects, "Secret") == []
    assert of_kind(objects, "CustomResourceDefinition") == []


@pytest.mark.parametrize("missing", ["clusterId", "controlPlaneUrl"])
def test_a_missing_required_value_fails_with_a_message_naming_it(missing):
    assert f"set {missing}" in expect_render_error(render_operator, without(OPERATOR_VALUES, missing))


def test_an_empty_token_secret_name_fails():
    message = expect_render_error(render_operator, merged(OPERATOR_VALUES, {"tokenSecretName": ""}))
    assert "tokenSecretName is required" in message


def rules_of(objects, kind: str, name: str) -> list[dict]:
    return one(objects, kind, name)["rules"]


def grants(rules: list[dict], group: str, resource: str) -> set[str]:
    """Verbs the rules grant on ``group``/``resource`` (no resourceNames restriction)."""
    return {verb for rule in rules if group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
            and not rule.get("resourceNames") for verb in rule["verbs"]}


def test_volume_sync_rbac_is_least_privilege():
    objects = render_operator(CUSTOM)
    cluster = rules_of(objects, "ClusterRole", "gshare-operator")
    assert grants(cluster, "storage.k8s.io", "csistoragecapacities") == {"get", "list", "watch"}
    assert grants(cluster, "storage.k8s.io", "storageclasses") == {"get", "list"}
    assert grants(cluster, "", "nodes") == {"get", "list", "watch"}
    assert grants(cluster, "", "persistentvolumeclaims") == set()  # PVCs only in the session namespace
    assert grants(cluster, "", "persistentvolumes") == set()
    sessions = rules_of(objects, "Role", "gshare-operator-sessions")
    # Create-if-absent only: an existing PVC (pre-bound after a move) is never changed or deleted by the operator.
    assert grants(sessions, "", "persistentvolumeclaims") == {"get", "list", "watch", "create"}
    assert grants(sessions, "", "events") == {"create", "list", "watch"}
    role = one(objects, "Role", "gshare-operator-sessions")
    assert role["metadata"]["namespace"] == merged(chart_defaults(OPERATOR_CHART), CUSTOM)["sessionNamespace"]


def test_routing_objects_are_granted_in_the_session_namespace_only():
    objects = render_operator(CUSTOM)
    cluster = rules_of(objects, "ClusterRole", "gshare-operator")
    sessions = rules_of(objects, "Role", "gshare-operator-sessions")
    written = {"get", "create", "patch", "delete"}  # server-side apply, and delete when the routing mode changes
    assert grants(sessions, "gateway.networking.k8s.io", "httproutes") == written
    for resource in ("backends", "securitypolicies", "backendtrafficpolicies"):
        assert grants(sessions, "gateway.envoyproxy.io", resource) == written
        assert grants(cluster, "gateway.envoyproxy.io", resource) == set()
    assert grants(cluster, "gateway.networking.k8s.io", "httproutes") == set()
    assert grants(sessions, "gateway.networking.k8s.io", "gateways") == set()  # the Gateway is attach's, not ours
    assert {r["apiGroups"][0] for r in cluster} <= {"", "storage.k8s.io"}


def test_volume_sync_interval_is_passed_to_the_operator():
    env = env_of(operator_container(render_operator(merged(OPERATOR_VALUES, {"volumeSyncIntervalSeconds": 15}))))
    assert env["GSHARE_VOLUME_SYNC_INTERVAL"]["value"] == "15"
    defaults = chart_defaults(OPERATOR_CHART)
    assert defaults["volumeSyncIntervalSeconds"] == 60
    assert env_of(operator_container(render_operator()))["GSHARE_VOLUME_SYNC_INTERVAL"]["value"] == "60"


def test_activity_settings_reach_the_operator():
    defaults = chart_defaults(OPERATOR_CHART)
    env = env_of(operator_container(render_operator()))
    assert {name: env[name]["value"] for name in (
        "GSHARE_ACTIVITY_INTERVAL", "GSHARE_HAMI_MONITOR_NAMESPACE", "GSHARE_HAMI_MONITOR_SELECTOR",
        "GSHARE_HAMI_MONITOR_PORT", "GSHARE_HAMI_MONITOR_TIMEOUT", "GSHARE_METRICS_PORT")} == {
        "GSHARE_ACTIVITY_INTERVAL": str(defaults["activityIntervalSeconds"]),
        "GSHARE_HAMI_MONITOR_NAMESPACE": defaults["hamiMonitor"]["namespace"],
        "GSHARE_HAMI_MONITOR_SELECTOR": defaults["hamiMonitor"]["selector"],
        "GSHARE_HAMI_MONITOR_PORT": str(defaults["hamiMonitor"]["port"]),
        "GSHARE_HAMI_MONITOR_TIMEOUT": str(defaults["hamiMonitor"]["timeoutSeconds"]),
        "GSHARE_METRICS_PORT": str(defaults["metrics"]["port"]),
    }
    # the chart's defaults are the operator's own
    assert OperatorConfig.from_environ({
        "GSHARE_CLUSTER_ID": "clu_x", "GSHARE_CONTROL_PLANE_URL": "https://cp.example.com",
        **{name: value["value"] for name, value in env.items() if "value" in value and name.startswith("GSHARE_")},
    }).hami_monitor_port == HAMI_MONITOR_PORT_DEFAULT
    assert defaults["hamiMonitor"]["selector"] == HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT


def test_the_metrics_port_is_declared_and_zero_turns_it_off():
    container = operator_container(render_operator())
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    off = operator_container(render_operator(merged(OPERATOR_VALUES, {"metrics": {"port": 0}})))
    assert "ports" not in off and env_of(off)["GSHARE_METRICS_PORT"]["value"] == "0"


def test_the_hami_monitor_is_read_with_a_role_in_hamis_namespace_only():
    objects = render_operator(merged(OPERATOR_VALUES, {"hamiMonitor": {"namespace": "hami-system"}}))
    role = one(objects, "Role", "gshare-operator-hami-monitor")
    assert role["metadata"]["namespace"] == "hami-system"
    assert grants(role["rules"], "", "pods") == {"list"} and grants(role["rules"], "", "pods/proxy") == {"get"}
    binding = one(objects, "RoleBinding", "gshare-operator-hami-monitor")
    assert binding["metadata"]["namespace"] == "hami-system"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gshare-operator", "namespace": OPERATOR_NAMESPACE}]
    cluster = rules_of(objects, "ClusterRole", "gshare-operator")
    # Pods are listed cluster-wide for the inventory's CPU and memory requests; the monitor's proxy stays in HAMi's namespace.
    assert grants(cluster, "", "pods") == {"list"} and grants(cluster, "", "pods/proxy") == set()
    sessions = rules_of(objects, "Role", "gshare-operator-sessions")
    assert grants(sessions, "", "pods/proxy") == set()


def test_an_empty_hami_namespace_grants_the_monitor_reads_cluster_wide():
    objects = render_operator(merged(OPERATOR_VALUES, {"hamiMonitor": {"namespace": ""}}))
    cluster = rules_of(objects, "ClusterRole", "gshare-operator")
    assert grants(cluster, "", "pods") == {"list"} and grants(cluster, "", "pods/proxy") == {"get"}
    assert [r for r in of_kind(objects, "Role") if r["metadata"]["name"] == "gshare-operator-hami-monitor"] == []


def test_the_pod_monitor_is_off_by_default_and_scrapes_the_metrics_port():
    assert of_kind(render_operator(), "PodMonitor") == []
    objects = render_operator(merged(OPERATOR_VALUES, {"metrics": {"podMonitor": {
        "enabled": True, "labels": {"release": "kube-prometheus-stack"}}}}))
    monitor = one(objects, "PodMonitor", "gshare-operator")
    assert monitor["metadata"]["namespace"] == OPERATOR_NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    pod_labels = one(objects, "Deployment", "gshare-operator")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_a_pod_monitor_without_a_metrics_port_fails():
    message = expect_render_error(render_operator, merged(OPERATOR_VALUES, {
        "metrics": {"port": 0, "podMonitor": {"enabled": True}}}))
    assert "metrics.podMonitor.enabled needs metrics.port" in message


def test_the_fallback_route_for_s_is_granted_in_both_modes():
    """Every object ``operator_agent.manifests.routing.fallback`` writes (applied, and deleted when the mode changes) is
    granted in the session namespace: so the cluster's stopped-session URLs get gShare's page in either mode."""
    from contract import ROUTING_MODES
    from operator_agent.manifests.routing.fallback import fallback_objects

    sessions = rules_of(render_operator(CUSTOM), "Role", "gshare-operator-sessions")
    gss = {"metadata": {"name": "ses-x", "namespace": "gshare-sessions"},
           "spec": {"host": "lab-c1.example.org", "authUrl": "https://cp.example.org/internal/connect/verify",
                    "extAuthUrl": "https://cp.example.org/internal/connect/ext-authz"}}
    plurals = {"Service": "services", "Ingress": "ingresses", "HTTPRoute": "httproutes", "Backend": "backends"}
    for mode in ROUTING_MODES:
        for obj in fallback_objects(gss, mode):
            group = obj["apiVersion"].rpartition("/")[0]
            assert {"create", "patch", "delete"} <= grants(sessions, group, plurals[obj["kind"]]), (mode, obj["kind"])
