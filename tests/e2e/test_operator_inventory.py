"""End to end: a real operator process, an emulated apiserver with the demo fleet's real HAMi data,
and the control plane on a live HTTP server. Token rotation through the token file, and the 401
line once the cluster is deregistered."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusters import services
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_tokens import operator_token_mint
from demo import fleet
from tests.conftest import kubeconfig_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def operator_process(tmp_path, live_server):
    """Start ``python -m operator_agent`` for a cluster; returns ``start(cluster, kubeconfig_path)``."""
    processes = []

    def start(cluster: Cluster, kubeconfig_path: Path, token_path: Path):
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


def registered(fleet_cluster, tmp_path, name: str, token: bool = True):
    """Register the emulated fleet cluster ``name``; return ``(cluster, emulated, kubeconfig_path, token_path)``."""
    emulated = fleet_cluster(name)
    cluster = services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated), session_domain=f"{name}.example.com")
    kubeconfig_path = tmp_path / "kubeconfig.yaml"
    kubeconfig_path.write_text(kubeconfig_text(emulated))
    token_path = tmp_path / "internal-jwt"
    token_path.write_text(operator_token_mint(cluster_id=cluster.public_id) if token else "not-a-valid-token")
    return cluster, emulated, kubeconfig_path, token_path


@pytest.mark.parametrize("fleet_name", [spec.name for spec in fleet.FLEET])
def test_operator_reports_real_hami_inventory(fleet_cluster, operator_process, tmp_path, fleet_name):
    cluster, _, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, fleet_name)
    process, log = operator_process(cluster, kubeconfig_path, token_path)

    expected = fleet.expected_inventory(fleet_name)
    wait_for(lambda: GpuDevice.objects.filter(cluster=cluster).count() == expected["gpus"], what=f"{expected['gpus']} GPUs")
    assert Node.objects.filter(cluster=cluster).count() == expected["nodes"]
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.CONNECTED
    models = set(GpuDevice.objects.filter(cluster=cluster).values_list("model", flat=True))
    assert models == set(expected["models"])
    assert all(not m.startswith("NVIDIA-") for m in models)
    assert "inventory reported" in log.read_text()


def test_token_rotation_without_restart_and_401_after_deregistration(fleet_cluster, operator_process, tmp_path):
    cluster, _, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c2", token=False)
    process, log = operator_process(cluster, kubeconfig_path, token_path)

    wait_for(lambda: "operator token expired or revoked: rotate it" in log.read_text(), what="the 401 log line")
    assert Node.objects.filter(cluster=cluster).count() == 0
    token = operator_token_mint(cluster_id=cluster.public_id)
    token_path.write_text(token)  # rotation: the operator re-reads the file on its next attempt
    wait_for(lambda: Node.objects.filter(cluster=cluster).exists(), what="inventory after rotation")
    assert process.poll() is None
    assert token not in log.read_text()  # never logged

    services.cluster_deregister(cluster=cluster)
    mark = len(log.read_text())
    wait_for(lambda: "operator token expired or revoked: rotate it" in log.read_text()[mark:], what="401 after deregistration")
    assert Node.objects.filter(cluster=cluster).count() == 0


def test_inventory_follows_the_cluster(fleet_cluster, operator_process, tmp_path):
    """A GPU node that disappears from the apiserver disappears from the control plane."""
    cluster, emulated, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1")
    operator_process(cluster, kubeconfig_path, token_path)
    expected = fleet.expected_inventory("lab-c1")
    wait_for(lambda: Node.objects.filter(cluster=cluster).count() == expected["nodes"], what="all nodes")

    import kubernetes

    api = kubernetes.config.new_client_from_config_dict(yaml.safe_load(kubeconfig_text(emulated)))
    core = kubernetes.client.CoreV1Api(api)
    victim = core.list_node(label_selector="gpu=on").items[0].metadata.name
    core.patch_node(victim, {"metadata": {"labels": {"gpu": "off"}}})
    wait_for(lambda: not Node.objects.filter(cluster=cluster, name=victim).exists(), what="node removal")
    assert Node.objects.filter(cluster=cluster).count() == expected["nodes"] - 1
