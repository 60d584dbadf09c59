"""charts/gshare's metrics: the api in prometheus-client's multiprocess mode, the optional ServiceMonitor and the
example alerting rules, rendered with the real Helm engine; the rules checked and unit-tested with promtool."""

from __future__ import annotations

import importlib
import subprocess

import pytest
import yaml
from django.urls import resolve

from tests.charts.rendering import (
    CONTROL_PLANE_VALUES,
    env_of,
    expect_render_error,
    merged,
    of_kind,
    render_control_plane,
    workload,
)
from tests.metrics.promtool import check, promtool

ENABLED = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                       "prometheusRule": {"enabled": True}}}
WITH_TOKEN = merged(ENABLED, {"metrics": {"token": {"existingSecret": "gshare-metrics"}}})


def api_container(objects) -> dict:
    return workload(objects, "api")["spec"]["template"]["spec"]["containers"][0]


def test_off_by_default_and_the_api_runs_in_multiprocess_mode():
    objects = render_control_plane(CONTROL_PLANE_VALUES)
    assert of_kind(objects, "ServiceMonitor") == [] and of_kind(objects, "PrometheusRule") == []
    api = api_container(objects)
    directory = env_of(api)["PROMETHEUS_MULTIPROC_DIR"]["value"]
    assert any(directory.startswith(m["mountPath"] + "/") for m in api["volumeMounts"]), "the directory must be writable (an emptyDir)"
    hooks = [a.split("python:", 1)[1] for a in api["command"] if a.startswith("--config=python:")]
    assert hooks == ["gshare.gunicorn_hooks"]
    module = importlib.import_module(hooks[0])
    assert callable(module.on_starting) and callable(module.child_exit)
    assert "GSHARE_METRICS_TOKEN" not in env_of(api)
    for component in ("worker", "beat"):
        container = workload(objects, component)["spec"]["template"]["spec"]["containers"][0]
        assert "PROMETHEUS_MULTIPROC_DIR" not in env_of(container)


def test_the_service_monitor_scrapes_the_api_service_on_metrics():
    objects = render_control_plane(merged(CONTROL_PLANE_VALUES, ENABLED))
    (monitor,) = of_kind(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    services = [s for s in of_kind(objects, "Service")
                if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in services] == ["gshare-api"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
    assert resolve(endpoint["path"]).url_name == "metrics"
    assert "authorization" not in endpoint
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [monitor["metadata"]["namespace"]]


def test_the_token_comes_from_a_secret_for_the_api_and_the_service_monitor():
    objects = render_control_plane(merged(CONTROL_PLANE_VALUES, WITH_TOKEN))
    ref = env_of(api_container(objects))["GSHARE_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "gshare-metrics", "key": "metrics-token"}
    (endpoint,) = of_kind(objects, "ServiceMonitor")[0]["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": ref}


def test_the_token_is_refused_as_a_plain_setting():
    message = expect_render_error(render_control_plane, merged(CONTROL_PLANE_VALUES, {"settings": {"GSHARE_METRICS_TOKEN": "x"}}))
    assert "settings.GSHARE_METRICS_TOKEN is refused" in message


def rules_file(tmp_path, values=ENABLED):
    (rule,) = of_kind(render_control_plane(merged(CONTROL_PLANE_VALUES, values)), "PrometheusRule")
    path = tmp_path / "gshare-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path, rule


def test_promtool_accepts_the_rules(tmp_path):
    path, rule = rules_file(tmp_path)
    result = check("rules", str(path))
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {"GShareClusterNotReporting", "GShareOperatorTokenExpiring", "GShareOperatorCallbacksRefused",
                      "GShareUsageNotArriving", "GShareUsageRefused", "GShareGpusMostlyReserved", "GShareIdleGpus"}


#: promtool unit tests of the rules: each alert fires on the series that should raise it, and not before.
RULE_TESTS = {
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                {"series": 'gshare_cluster_heartbeat_age_seconds{cluster="alpha"}', "values": "400+60x10"},
                {"series": 'gshare_cluster_heartbeat_age_seconds{cluster="beta"}', "values": "10x10"},
                {"series": 'gshare_cluster_operator_token_expires_in_seconds{cluster="alpha"}', "values": "100000-60x90"},
                {"series": 'gshare_cluster_gpus{cluster="alpha",model="H100"}', "values": "10x90"},
                {"series": 'gshare_cluster_gpus_reserved{cluster="alpha",model="H100",kind="whole"}', "values": "6x40"},
                {"series": 'gshare_cluster_gpus_reserved{cluster="alpha",model="H100",kind="shared"}', "values": "4x40"},
                {"series": 'gshare_cluster_sessions{cluster="alpha",phase="Running"}', "values": "2x60"},
                {"series": 'gshare_cluster_idle_gpus{cluster="alpha"}', "values": "1x10 4x80"},
                {"series": 'gshare_usage_samples_total{cluster="alpha",outcome="accepted"}', "values": "5x60"},
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "GShareClusterNotReporting", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "GShareClusterNotReporting", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "cluster": "alpha"},
                     "exp_annotations": {
                         "summary": "Cluster alpha stopped reporting",
                         "description": "The operator of cluster alpha last reported 11m 40s ago: no inventory, session status or "
                                        "usage arrives. Check its operator pod (kubectl -n gshare-system logs deploy/gshare-operator).",
                     }},
                ]},
                {"eval_time": "30m", "alertname": "GShareOperatorTokenExpiring", "exp_alerts": []},
                {"eval_time": "90m", "alertname": "GShareOperatorTokenExpiring", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "cluster": "alpha"},
                     "exp_annotations": {
                         "summary": "Operator token of cluster alpha expires soon",
                         "description": "The newest operator token of cluster alpha expires in 1d 2h 16m 40s and the daily rotation "
                                        "has not renewed it. See operator_token.last_rotation_error of GET /api/v1/clusters/{id} "
                                        "and docs/rotation.md.",
                     }},
                ]},
                {"eval_time": "20m", "alertname": "GShareGpusMostlyReserved", "exp_alerts": []},
                {"eval_time": "35m", "alertname": "GShareGpusMostlyReserved", "exp_alerts": [
                    {"exp_labels": {"severity": "info", "cluster": "alpha"},
                     "exp_annotations": {
                         "summary": "Cluster alpha has 100% of its GPUs reserved",
                         "description": "More than 90% of the GPUs of cluster alpha hold a reservation; new sessions may be refused "
                                        "with no_capacity.",
                     }},
                ]},
                # 1 of 10 GPUs idle for 10 minutes, then 4: above the 25 % share for an hour from minute 11.
                {"eval_time": "60m", "alertname": "GShareIdleGpus", "exp_alerts": []},
                {"eval_time": "75m", "alertname": "GShareIdleGpus", "exp_alerts": [
                    {"exp_labels": {"severity": "info", "cluster": "alpha"},
                     "exp_annotations": {
                         "summary": "40% of the GPUs of cluster alpha are held by idle sessions",
                         "description": "More than 25% of the GPUs of cluster alpha are held by sessions that ran no GPU kernel and "
                                        "had no connection for 15 minutes. The idle policy stops them after its timeout "
                                        "(docs/idle.md); lower idle_timeout_minutes if this persists.",
                     }},
                ]},
                # Running sessions, a flat accepted counter: no usage arrives.
                {"eval_time": "20m", "alertname": "GShareUsageNotArriving", "exp_alerts": []},
                {"eval_time": "59m", "alertname": "GShareUsageNotArriving", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "cluster": "alpha"},
                     "exp_annotations": {
                         "summary": "No usage from cluster alpha",
                         "description": "Cluster alpha has running sessions but none of its usage samples was accepted in 30 minutes: "
                                        "its operator's usage queue is backing up, or its batches are refused. Running sessions are "
                                        "not charged meanwhile.",
                     }},
                ]},
            ],
        },
    ],
}


def test_the_alerts_fire_on_what_they_describe(tmp_path):
    path, _ = rules_file(tmp_path)
    tests = tmp_path / "gshare-rules-test.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [path.name], **RULE_TESTS}, width=1000))
    result = subprocess.run([promtool(), "test", "rules", tests.name], cwd=tmp_path, capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


@pytest.mark.parametrize(("value", "expected"), [({"heartbeatAgeSeconds": 900}, "> 900"), ({"tokenExpiresWithinSeconds": 3600}, "< 3600")])
def test_thresholds_come_from_values(tmp_path, value, expected):
    _, rule = rules_file(tmp_path, merged(ENABLED, {"metrics": {"prometheusRule": value}}))
    assert any(expected in r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
