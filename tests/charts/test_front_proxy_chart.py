"""charts/gshare: the api pod serves through nginx (container ``proxy``) in front of gunicorn, configured with the text
``gshare.front_proxy`` renders for the demo and the slow-client tests, from the chart's values."""

from __future__ import annotations

import subprocess

import pytest

from gshare.front_proxy import ProxySettings, render_nginx_conf
from tests.charts.rendering import CONTROL_PLANE_CHART, CONTROL_PLANE_VALUES, chart_defaults, merged, of_kind, render_control_plane, workload
from tests.e2e.gunicorn import free_port
from tests.e2e.nginx import nginx_binary

CUSTOM = {"api": {"timeout": 120, "proxy": {"clientHeaderTimeout": 7, "clientBodyTimeout": 11, "sendTimeout": 13,
                                            "keepaliveTimeout": 3, "maxBodyBytes": 104857600, "workerConnections": 10000,
                                            "workerProcesses": 2}}}


def proxy_conf(objects) -> str:
    (config,) = [c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-api-proxy")]
    return config["data"]["nginx.conf"]


def expected(values: dict) -> str:
    api = merged(chart_defaults(CONTROL_PLANE_CHART)["api"], values.get("api", {}))
    proxy = api["proxy"]
    return render_nginx_conf(ProxySettings(
        listen="0.0.0.0:8000", upstream="127.0.0.1:8001", prefix="/tmp",
        client_header_timeout=proxy["clientHeaderTimeout"], client_body_timeout=proxy["clientBodyTimeout"],
        send_timeout=proxy["sendTimeout"], keepalive_timeout=proxy["keepaliveTimeout"], upstream_timeout=api["timeout"] + 5,
        max_body_bytes=proxy["maxBodyBytes"], worker_connections=proxy["workerConnections"], worker_processes=proxy["workerProcesses"],
    ))


@pytest.mark.parametrize("values", [{}, CUSTOM], ids=["defaults", "custom"])
def test_the_charts_nginx_conf_is_what_gshare_front_proxy_renders(values):
    assert proxy_conf(render_control_plane(merged(CONTROL_PLANE_VALUES, values))).strip() == expected(values).strip()


def test_gunicorn_listens_on_loopback_only_and_the_service_reaches_nginx():
    objects = render_control_plane()
    pod = workload(objects, "api")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert "--bind=127.0.0.1:8001" in containers["api"]["command"] and "ports" not in containers["api"]
    proxy = containers["proxy"]
    assert proxy["image"] == containers["api"]["image"]
    assert proxy["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    config_path = proxy["command"][proxy["command"].index("-c") + 1]
    mounts = {m["name"]: m["mountPath"] for m in proxy["volumeMounts"]}
    assert config_path == mounts["proxy-config"] + "/nginx.conf" and mounts["tmp"] == "/tmp"
    volume = next(v for v in pod["volumes"] if v["name"] == "proxy-config")
    assert volume["configMap"]["name"] == "gshare-api-proxy"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # through the proxy: both must answer
        assert containers["api"][probe]["httpGet"]["port"] == "http"
    assert proxy["securityContext"] == containers["api"]["securityContext"]


def test_a_change_of_the_proxy_settings_rolls_the_api_pods():
    def checksum(values):
        return workload(render_control_plane(merged(CONTROL_PLANE_VALUES, values)), "api")["spec"]["template"]["metadata"][
            "annotations"]["checksum/proxy-config"]
    assert checksum({}) != checksum(CUSTOM)


@pytest.mark.parametrize("values", [{}, CUSTOM], ids=["defaults", "custom"])
def test_real_nginx_accepts_the_charts_configuration(values, tmp_path):
    """``nginx -t`` on the rendered text, its paths moved under ``tmp_path`` and its port to a free one."""
    text = proxy_conf(render_control_plane(merged(CONTROL_PLANE_VALUES, values)))
    text = text.replace("/tmp/", f"{tmp_path}/").replace("0.0.0.0:8000", f"127.0.0.1:{free_port()}")
    (tmp_path / "nginx.conf").write_text(text)
    result = subprocess.run([nginx_binary(), "-t", "-e", "stderr", "-p", f"{tmp_path}/", "-c", str(tmp_path / "nginx.conf")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
