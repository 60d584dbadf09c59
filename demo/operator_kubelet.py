"""The kubelet's part for the operator chart: run an emulated cluster's operator Deployment as a local process.

The emulator runs no containers, so once ``attach_cluster`` has installed the operator chart (the Deployment
``gshare-system/gshare-operator`` and its token Secret), ``OperatorKubelet`` starts ``python -m operator_agent``
the way the kubelet would start its container. Used by the attach tests and by ``manage.py demo --bare-cluster``.

This module must not import Django.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
from pathlib import Path

import kubernetes

ROOT = Path(__file__).resolve().parents[1]

OPERATOR_NAMESPACE = "gshare-system"
OPERATOR_DEPLOYMENT = "gshare-operator"
OPERATOR_TOKEN_SECRET = "gshare-operator-internal-jwt"


class OperatorKubelet:
    """Runs the ``gshare-system/gshare-operator`` Deployment of an emulated cluster as a local operator process.

    Once the Deployment and its token Secret exist, it starts ``python -m operator_agent`` with the Deployment's
    own environment (downward-API values filled in as the kubelet would), the Secret's ``internal-jwt`` in a file
    (the Secret volume), and a kubeconfig for the emulator (the in-cluster ServiceAccount). It starts the process
    once; ``stop()`` terminates it.

    Args:
        emulated: the ``EmulatedCluster`` (kept for callers; the kubelet reads the cluster through the kubeconfig).
        kubeconfig_path: kubeconfig of the emulated cluster, read by the watcher and given to the operator.
        workdir: folder for the token file and ``operator.log``.
        extra_env: environment set last, e.g. ``{"GSHARE_INVENTORY_INTERVAL": "1"}`` (default: inventory every
            second, backoff at most one second, as the tests want). The operator's ``/metrics`` is always off
            (``GSHARE_METRICS_PORT=0``): the chart's port would listen on all interfaces of this machine, and several
            local operators would clash on it.
    """

    def __init__(self, emulated, kubeconfig_path: Path, workdir: Path, extra_env: dict[str, str] | None = None):
        self.emulated, self.kubeconfig_path, self.workdir = emulated, Path(kubeconfig_path), Path(workdir)
        self.extra_env = {"GSHARE_INVENTORY_INTERVAL": "1", "GSHARE_BACKOFF_MAX": "1"} if extra_env is None else extra_env
        self.extra_env = {**self.extra_env, "GSHARE_METRICS_PORT": "0"}
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="operator-kubelet", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(self.kubeconfig_path), client_configuration=config)
        with kubernetes.client.ApiClient(config) as api:
            apps, core = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api)
            while not self._stop.is_set() and self.process is None:
                try:
                    deployment = apps.read_namespaced_deployment(OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE)
                    secret = core.read_namespaced_secret(OPERATOR_TOKEN_SECRET, OPERATOR_NAMESPACE)
                except kubernetes.client.ApiException:
                    self._stop.wait(0.2)
                    continue
                except Exception:  # the apiserver went away (stopping): try again until stopped
                    self._stop.wait(1.0)
                    continue
                if not self._stop.is_set():
                    self._start(deployment, secret)

    def _start(self, deployment, secret) -> None:
        container = deployment.spec.template.spec.containers[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_", "GSHARE_"))}
        for var in container.env or []:
            if var.value is not None:
                env[var.name] = var.value
            elif var.value_from and var.value_from.field_ref and var.value_from.field_ref.field_path == "metadata.namespace":
                env[var.name] = OPERATOR_NAMESPACE
        token_file = self.workdir / "internal-jwt"
        token_file.write_bytes(base64.b64decode(secret.data["internal-jwt"]))
        token_file.chmod(0o600)
        env.update(GSHARE_TOKEN_FILE=str(token_file), KUBECONFIG=str(self.kubeconfig_path), PYTHONUNBUFFERED="1",
                   **self.extra_env)
        self.env = env
        self.log = open(self.workdir / "operator.log", "wb")  # noqa: SIM115 -- closed in stop()
        self.process = subprocess.Popen([sys.executable, "-m", "operator_agent"], env=env, cwd=ROOT, stdout=self.log,
                                        stderr=subprocess.STDOUT)

    def stop(self) -> None:
        """Stop watching and terminate the operator process (killed after 15 s)."""
        self._stop.set()
        self._thread.join(5)
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
            self.log.close()

