"""OperatorConfig.from_environ and the Kubernetes client factory."""

from __future__ import annotations

import pytest

from contract import DEFAULT_TOKEN_FILE
from operator_agent.config import ConfigError, OperatorConfig, kubernetes_api_client

REQUIRED = {"GSHARE_CLUSTER_ID": "c-7f3a", "GSHARE_CONTROL_PLANE_URL": "https://gshare.example.com/"}


def test_defaults():
    config = OperatorConfig.from_environ(REQUIRED)
    assert config == OperatorConfig(
        cluster_id="c-7f3a",
        control_plane_url="https://gshare.example.com",  # trailing slash removed
        token_file=DEFAULT_TOKEN_FILE,
        inventory_interval=30.0,
        http_timeout=10.0,
        backoff_max=60.0,
        log_level="INFO",
    )
    assert DEFAULT_TOKEN_FILE == "/var/run/secrets/gshare/internal-jwt"


def test_all_values():
    environ = {
        **REQUIRED,
        "GSHARE_TOKEN_FILE": "/tmp/token",
        "GSHARE_INVENTORY_INTERVAL": "5",
        "GSHARE_HTTP_TIMEOUT": "2.5",
        "GSHARE_BACKOFF_MAX": "120",
        "GSHARE_LOG_LEVEL": "debug",
    }
    config = OperatorConfig.from_environ(environ)
    assert (config.token_file, config.inventory_interval, config.http_timeout, config.backoff_max) == (
        "/tmp/token",
        5.0,
        2.5,
        120.0,
    )
    assert config.log_level == "DEBUG"
    assert config.log_level_number == 10


@pytest.mark.parametrize("missing", sorted(REQUIRED))
@pytest.mark.parametrize("value", [None, "", "   "])
def test_missing_required_value(missing, value):
    environ = dict(REQUIRED)
    if value is None:
        del environ[missing]
    else:
        environ[missing] = value
    with pytest.raises(ConfigError, match=f"{missing} is required"):
        OperatorConfig.from_environ(environ)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GSHARE_INVENTORY_INTERVAL", "thirty"),
        ("GSHARE_INVENTORY_INTERVAL", "0"),
        ("GSHARE_HTTP_TIMEOUT", "-1"),
        ("GSHARE_BACKOFF_MAX", "nan"),
        ("GSHARE_BACKOFF_MAX", "inf"),
        ("GSHARE_CONTROL_PLANE_URL", "gshare.example.com"),
        ("GSHARE_CONTROL_PLANE_URL", "ftp://gshare.example.com"),
        ("GSHARE_LOG_LEVEL", "loud"),
    ],
)
def test_malformed_value_names_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        OperatorConfig.from_environ({**REQUIRED, name: value})


def test_config_is_frozen():
    config = OperatorConfig.from_environ(REQUIRED)
    with pytest.raises(AttributeError):
        config.cluster_id = "other"  # type: ignore[misc]


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: emulated
  cluster:
    server: http://127.0.0.1:6443
contexts:
- name: emulated
  context:
    cluster: emulated
    user: operator
current-context: emulated
users:
- name: operator
  user:
    token: REDACTED
"""


def test_kubernetes_client_from_kubeconfig(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    client = kubernetes_api_client({"KUBECONFIG": str(path)})
    try:
        assert client.configuration.host == "http://127.0.0.1:6443"
    finally:
        client.close()


def test_kubernetes_client_missing_kubeconfig(tmp_path):
    with pytest.raises(ConfigError, match="KUBECONFIG"):
        kubernetes_api_client({"KUBECONFIG": str(tmp_path / "absent")})


def test_in_cluster_is_chosen_when_service_host_is_set(tmp_path):
    # Outside a pod the service-account files are missing: the in-cluster loader is what fails.
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBECONFIG": str(path)}
    with pytest.raises(ConfigError, match="in-cluster"):
        kubernetes_api_client(environ)


def test_volume_sync_settings():
    defaults = OperatorConfig.from_environ(REQUIRED)
    assert (defaults.volume_sync_interval, defaults.volume_storage_class) == (60.0, None)
    config = OperatorConfig.from_environ({**REQUIRED, "GSHARE_VOLUME_SYNC_INTERVAL": "15",
                                          "GSHARE_VOLUME_STORAGE_CLASS": " gshare-nfs "})
    assert (config.volume_sync_interval, config.volume_storage_class) == (15.0, "gshare-nfs")
    assert OperatorConfig.from_environ({**REQUIRED, "GSHARE_VOLUME_STORAGE_CLASS": ""}).volume_storage_class is None


@pytest.mark.parametrize(("name", "value"), [
    ("GSHARE_VOLUME_SYNC_INTERVAL", "0"), ("GSHARE_VOLUME_SYNC_INTERVAL", "soon"),
    ("GSHARE_VOLUME_STORAGE_CLASS", "NFS_Pool"),
])
def test_bad_volume_sync_settings_name_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        OperatorConfig.from_environ({**REQUIRED, name: value})


def test_activity_and_metrics_settings():
    defaults = OperatorConfig.from_environ(REQUIRED)
    assert (defaults.activity_interval, defaults.hami_monitor_selector, defaults.hami_monitor_port,
            defaults.hami_monitor_timeout, defaults.metrics_port) == (
        30.0, "app.kubernetes.io/component=hami-device-plugin", 9394, 5.0, 8080)
    config = OperatorConfig.from_environ({
        **REQUIRED, "GSHARE_ACTIVITY_INTERVAL": "10", "GSHARE_HAMI_MONITOR_SELECTOR": "app=hami-device-plugin,tier!=x",
        "GSHARE_HAMI_MONITOR_PORT": "19394", "GSHARE_HAMI_MONITOR_NAMESPACE": "kube-system", "GSHARE_HAMI_MONITOR_TIMEOUT": "2.5", "GSHARE_METRICS_PORT": "0"})
    assert (config.activity_interval, config.hami_monitor_selector, config.hami_monitor_port,
            config.hami_monitor_timeout, config.metrics_port) == (10.0, "app=hami-device-plugin,tier!=x", 19394, 2.5, 0)
    assert (defaults.hami_monitor_namespace, config.hami_monitor_namespace) == (None, "kube-system")
    assert defaults.metrics_address == "0.0.0.0"
    assert OperatorConfig.from_environ({**REQUIRED, "GSHARE_METRICS_ADDRESS": "127.0.0.1"}).metrics_address == "127.0.0.1"


@pytest.mark.parametrize(("name", "value"), [
    ("GSHARE_ACTIVITY_INTERVAL", "0"), ("GSHARE_HAMI_MONITOR_TIMEOUT", "-3"),
    ("GSHARE_HAMI_MONITOR_PORT", "0"), ("GSHARE_HAMI_MONITOR_PORT", "65536"), ("GSHARE_HAMI_MONITOR_PORT", "http"),
    ("GSHARE_METRICS_ADDRESS", "localhost"), ("GSHARE_METRICS_PORT", "-1"), ("GSHARE_METRICS_PORT", "8080.5"),
    ("GSHARE_HAMI_MONITOR_NAMESPACE", "Kube_System"), ("GSHARE_HAMI_MONITOR_SELECTOR", "app=hami\nx"), ("GSHARE_HAMI_MONITOR_SELECTOR", "app=hami;rm"),
])
def test_bad_activity_and_metrics_settings_name_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        OperatorConfig.from_environ({**REQUIRED, name: value})
