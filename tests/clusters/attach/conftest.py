"""Fixtures for the attach tests: a Helm chart repository on loopback, a cluster before attach, and a stand-in
kubelet that runs the operator Deployment the attach command installs as a real operator process."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import helm_python as helm
import kubernetes
import pytest
import yaml

from demo import fleet
from tests.helpers import FIXTURES, kubeconfig_text

ROOT = Path(__file__).resolve().parents[3]
CHARTS = FIXTURES / "charts"


@pytest.fixture(scope="session")
def chart_repo(tmp_path_factory):
    """Package tests/fixtures/charts/* and serve them as a Helm chart repository on 127.0.0.1; yields its URL."""
    root = tmp_path_factory.mktemp("chart-repo")
    entries = {}
    for chart_dir in sorted(p for p in CHARTS.iterdir() if (p / "Chart.yaml").exists()):
        archive = Path(helm.package(chart_dir, destination=root))
        meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
        entries[meta["name"]] = [{
            **meta, "urls": [archive.name], "created": "2026-11-01T00:00:00Z",
            "digest": hashlib.sha256(archive.read_bytes()).hexdigest(),
        }]
    (root / "index.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "entries": entries,
                                                     "generated": "2026-11-01T00:00:00Z"}))
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass


@pytest.fixture
def attach_settings(settings, chart_repo, tmp_path, monkeypatch, live_server):
    """Point attach_cluster at the loopback chart repository, with short waits; keep Helm's cache in tmp_path.

    The session Ingresses' auth-url is the live server's, so the operator's ``verify_reachable`` check passes (the
    session domains are under ``.localhost``, which resolves to the loopback address the fleet gives each ingress
    node: ``session_domain_resolves`` passes too, and a re-run's connection test finds nothing to stop on).
    """
    settings.GSHARE_CONTROL_PLANE_URL = live_server.url
    for key in ("HAMI", "INGRESS_NGINX", "DEMOCRATIC_CSI"):
        setattr(settings, f"GSHARE_ATTACH_{key}_REPO", chart_repo)
    settings.GSHARE_ATTACH_HAMI_CHART_VERSION = "2.7.1"
    settings.GSHARE_ATTACH_INGRESS_NGINX_CHART_VERSION = "4.13.3"
    settings.GSHARE_ATTACH_DEMOCRATIC_CSI_CHART_VERSION = "0.15.0"
    settings.GSHARE_ATTACH_CHECK_TIMEOUT = 20.0
    settings.GSHARE_ATTACH_GPU_TIMEOUT = 20.0
    settings.GSHARE_ATTACH_INVENTORY_TIMEOUT = 60.0
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "helm" / var.lower()))
    return settings


@pytest.fixture
def bare_cluster(fleet_cluster, tmp_path):
    """Factory: ``start(name, **host_overrides)`` -> ``(EmulatedCluster, kubeconfig path)`` of a demo cluster before
    attach (no gShare labels, HAMi, RuntimeClass or CRD), its hosts prepared unless overridden."""

    def start(name: str = "lab-c1", **overrides):
        # TLS: client-go (so Helm) sends the kubeconfig's bearer token only over TLS, as against a real apiserver.
        emulated = fleet_cluster(name, objects=fleet.bare_cluster_objects(name), hosts=fleet.cluster_hosts(name, **overrides),
                                 tls=True)
        path = tmp_path / f"{name}.kubeconfig"
        path.write_text(kubeconfig_text(emulated))
        return emulated, path

    return start


class OperatorKubelet:
    """Runs the ``gshare-system/gshare-operator`` Deployment of an emulated cluster as a local operator process.

    The emulator has no controllers or kubelet, so this stands in for both: once the Deployment and its token
    Secret exist, it starts ``python -m operator_agent`` with the Deployment's own environment (downward-API
    values filled in as the kubelet would), the Secret's ``internal-jwt`` in a file (the Secret volume), and a
    kubeconfig for the emulator (the in-cluster ServiceAccount).
    """

    def __init__(self, emulated, kubeconfig_path: Path, workdir: Path):
        self.emulated, self.kubeconfig_path, self.workdir = emulated, kubeconfig_path, workdir
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(self.kubeconfig_path), client_configuration=config)
        with kubernetes.client.ApiClient(config) as api:
            apps, core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)
            while not self._stop.is_set() and self.process is None:
                try:
                    deployment = apps.read_namespaced_deployment("gshare-operator", "gshare-system")
                    secret = core.read_namespaced_secret("gshare-operator-internal-jwt", "gshare-system")
                except kubernetes.client.ApiException:
                    time.sleep(0.2)
                    continue
                self._start(deployment, secret)

    def _start(self, deployment, secret) -> None:
        container = deployment.spec.template.spec.containers[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_", "GSHARE_"))}
        for var in container.env or []:
            if var.value is not None:
                env[var.name] = var.value
            elif var.value_from and var.value_from.field_ref and var.value_from.field_ref.field_path == "metadata.namespace":
                env[var.name] = "gshare-system"
        token_file = self.workdir / "internal-jwt"
        token_file.write_bytes(base64.b64decode(secret.data["internal-jwt"]))
        env.update(GSHARE_TOKEN_FILE=str(token_file), KUBECONFIG=str(self.kubeconfig_path), GSHARE_INVENTORY_INTERVAL="1",
                   GSHARE_BACKOFF_MAX="1", PYTHONUNBUFFERED="1")
        self.env = env
        self.log = open(self.workdir / "operator.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen([sys.executable, "-m", "operator_agent"], env=env, cwd=ROOT, stdout=self.log,
                                        stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.process is not None:
            self.process.terminate()
            self.process.wait(15)
            self.log.close()


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
