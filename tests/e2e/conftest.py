"""Fixtures for end-to-end tests: real operator processes against emulated clusters and the live server."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusters import services
from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_mint
from tests.conftest import kubeconfig_text

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def operator_process(tmp_path, live_server):
    """Start ``python -m operator_agent`` for a cluster; returns ``start(cluster, kubeconfig_path, token_path, env=None)``
    (``env``: more environment variables for the operator)."""
    processes = []

    def start(cluster: Cluster, kubeconfig_path: Path, token_path: Path, env: dict | None = None):
        extra = env or {}
        log = tmp_path / f"operator-{cluster.name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_", "GSHARE_"))}
        env.update({
            "GSHARE_CLUSTER_ID": cluster.public_id,
            "GSHARE_CONTROL_PLANE_URL": live_server.url,
            "GSHARE_TOKEN_FILE": str(token_path),
            "GSHARE_INVENTORY_INTERVAL": "1",
            "GSHARE_BACKOFF_MAX": "1",
            "KUBECONFIG": str(kubeconfig_path),
            "PYTHONUNBUFFERED": "1",
            **extra,
        })
        handle = open(log, "wb")  # noqa: SIM115
        process = subprocess.Popen([sys.executable, "-m", "operator_agent"], env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
        processes.append((process, handle))
        return process, log

    yield start
    for process, handle in processes:
        process.terminate()
        try:
            assert process.wait(15) == 0  # SIGTERM is a clean stop
        finally:
            handle.close()


def registered(fleet_cluster, tmp_path, name: str, token: bool = True, **emulator_options):
    """Register the emulated fleet cluster ``name``; return ``(cluster, emulated, kubeconfig_path, token_path)``."""
    emulated = fleet_cluster(name, **emulator_options)
    cluster = services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated), session_domain=f"{name}.example.com")
    kubeconfig_path = tmp_path / "kubeconfig.yaml"
    kubeconfig_path.write_text(kubeconfig_text(emulated))
    token_path = tmp_path / "internal-jwt"
    token_path.write_text(operator_token_mint(cluster_id=cluster.public_id) if token else "not-a-valid-token")
    return cluster, emulated, kubeconfig_path, token_path


