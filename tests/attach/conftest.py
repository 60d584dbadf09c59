"""Fixtures for the attach tests: the demo's Helm chart repository on loopback (``demo.charts``), a cluster before
attach, and the demo's stand-in kubelet that runs the operator Deployment the attach command installs as a real
operator process (``demo.operator_kubelet``)."""

from __future__ import annotations

import pytest

from demo import fleet
from demo.charts import ChartRepository
from demo.operator_kubelet import OperatorKubelet
from tests.helpers import kubeconfig_text


@pytest.fixture(scope="session")
def chart_repo(tmp_path_factory):
    """The stand-in charts of ``demo/data/charts`` served as a Helm chart repository on 127.0.0.1; yields its URL."""
    repository = ChartRepository(tmp_path_factory.mktemp("chart-repo")).start()
    yield repository.url
    repository.stop()


@pytest.fixture(autouse=True)
def attach_api_token(request, monkeypatch):
    """Tests that use the database run the attach with a staff API token in ``GSHARE_API_TOKEN`` (as a user does); yields
    the token, or None for tests without the database."""
    if request.node.get_closest_marker("django_db") is None:
        yield None
        return
    token = request.getfixturevalue("staff_token")
    monkeypatch.setenv("GSHARE_API_TOKEN", token)
    yield token


@pytest.fixture
def attach_settings(settings, chart_repo, tmp_path, monkeypatch, live_server):
    """Point attach_cluster at the loopback chart repository, with short waits; keep Helm's cache in tmp_path.

    The session Ingresses' auth-url is the live server's, so the operator's ``verify_reachable`` check passes (the
    session domains are under ``.localhost``, which resolves to the loopback address the fleet gives each ingress
    node: ``session_domain_resolves`` passes too, and a re-run's connection test finds nothing to stop on).
    """
    settings.GSHARE_CONTROL_PLANE_URL = live_server.url
    for key in ("HAMI", "INGRESS_NGINX", "ENVOY_GATEWAY", "DEMOCRATIC_CSI"):
        setattr(settings, f"GSHARE_ATTACH_{key}_REPO", chart_repo)
    settings.GSHARE_ATTACH_HAMI_CHART_VERSION = "2.7.1"
    settings.GSHARE_ATTACH_INGRESS_NGINX_CHART_VERSION = "4.13.3"
    settings.GSHARE_ATTACH_ENVOY_GATEWAY_CHART_VERSION = "v1.9.0"
    settings.GSHARE_ATTACH_GATEWAY_TIMEOUT = 20.0
    settings.GSHARE_ATTACH_DEMOCRATIC_CSI_CHART_VERSION = "0.15.0"
    settings.GSHARE_ATTACH_CHECK_TIMEOUT = 20.0
    settings.GSHARE_ATTACH_GPU_TIMEOUT = 20.0
    settings.GSHARE_ATTACH_INVENTORY_TIMEOUT = 60.0
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "helm" / var.lower()))
    return settings


@pytest.fixture
def bare_cluster(fleet_cluster, tmp_path):
    """Factory: ``start(name, ingress_class=True, **host_overrides)`` -> ``(EmulatedCluster, kubeconfig path)`` of a demo
    cluster before attach (no gShare labels, HAMi, RuntimeClass or CRD), its hosts prepared unless overridden.

    ``ingress_class``: the cluster already runs ingress-nginx as the guide's flow has it (its IngressClass ``nginx``), so
    ``--skip-ingress`` finds it; False: no routing controller at all."""

    def start(name: str = "lab-c1", ingress_class: bool = True, **overrides):
        objects = fleet.bare_cluster_objects(name)
        if ingress_class:
            objects.append({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "nginx"},
                            "spec": {"controller": "k8s.io/ingress-nginx"}})
        # TLS: client-go (so Helm) sends the kubeconfig's bearer token only over TLS, as against a real apiserver.
        emulated = fleet_cluster(name, objects=objects, hosts=fleet.cluster_hosts(name, **overrides), tls=True)
        path = tmp_path / f"{name}.kubeconfig"
        path.write_text(kubeconfig_text(emulated))
        return emulated, path

    return start


@pytest.fixture
def operator_kubelet(tmp_path, live_server):
    """Factory: ``start(emulated, kubeconfig_path) -> OperatorKubelet``; stopped at teardown."""
    started = []

    def start(emulated, kubeconfig_path):
        workdir = tmp_path / f"kubelet-{len(started)}"
        workdir.mkdir()
        kubelet = OperatorKubelet(emulated, kubeconfig_path, workdir)
        started.append(kubelet)
        return kubelet

    yield start
    for kubelet in started:
        kubelet.stop()
