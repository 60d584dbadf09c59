"""The inventory's CPU and memory figures end to end: lab-c1's operator reads its emulated nodes' ``status.allocatable`` and
the requests of their pods that are not sessions, reports them over HTTP to the control plane on a live server, and the
control plane stores them on ``clusters.Node`` (``clusters.inventory``); a snapshot without them (an older operator)
leaves the node without a CPU or memory limit."""

from __future__ import annotations

import kubernetes
import pytest

from clusters import services
from clusters.models import Node
from contract import SESSION_ID_LABEL
from contract.quantity import quantity_decimal
from operator_agent.config import OperatorConfig, kubernetes_api_client
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.reporters.inventory import report_inventory
from tests.helpers import registered

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tick(fleet_cluster, live_server, tmp_path):
    """``(cluster, core_v1, run)``: ``run()`` runs one full inventory tick of lab-c1's operator."""
    cluster, _, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1")
    config = OperatorConfig(cluster_id=cluster.public_id, control_plane_url=live_server.url, token_file=str(token_path), http_timeout=10.0)
    core_v1 = kubernetes.client.CoreV1Api(kubernetes_api_client({"KUBECONFIG": str(kubeconfig_path)}))
    client = ControlPlaneClient(config, max_attempts=1)

    def run() -> None:
        assert report_inventory(core_v1, client, config)

    return cluster, core_v1, run


def pod(name: str, node: str, *, cpu: str, memory: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox",
                                                        "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}


def test_allocatable_and_non_session_requests_reach_the_nodes(tick):
    cluster, core_v1, run = tick
    run()
    gpu_node = core_v1.list_node(label_selector="gpu=on").items[0]
    name = gpu_node.metadata.name
    stored = Node.objects.get(cluster=cluster, name=name)
    allocatable = gpu_node.status.allocatable
    assert stored.cpu_allocatable_millicores == int(quantity_decimal(allocatable["cpu"]) * 1000)
    assert stored.memory_allocatable_mib == int(quantity_decimal(allocatable["memory"]) // 2**20)
    before = (stored.cpu_requested_millicores, stored.memory_requested_mib)

    core_v1.create_namespaced_pod("default", pod("etl", name, cpu="1500m", memory="2Gi"))
    core_v1.create_namespaced_pod("default", pod("ses-x", name, cpu="8", memory="64Gi", labels={SESSION_ID_LABEL: "ses_x"}))
    run()
    stored.refresh_from_db()
    # The session pod is not counted: the control plane counts its sessions itself.
    assert (stored.cpu_requested_millicores, stored.memory_requested_mib) == (before[0] + 1500, before[1] + 2048)


def test_a_snapshot_without_the_figures_leaves_the_node_unlimited(tick):
    cluster, _, run = tick
    run()
    node = Node.objects.filter(cluster=cluster, cpu_allocatable_millicores__isnull=False).first()
    assert node is not None
    # An operator that predates the figures: the same nodes without them.
    nodes = [{"name": n.name, "labels": n.labels, "ready": n.ready, "devices": [
        {"uuid": d.uuid, "index": d.index, "model": d.model, "memory_mib": d.memory_mib, "split_count": d.split_count,
         "cores": d.cores, "health": d.health, "mode": d.mode or None} for d in n.devices.all()]}
        for n in Node.objects.filter(cluster=cluster).prefetch_related("devices")]
    services.inventory_apply(cluster=cluster, nodes=nodes)
    node.refresh_from_db()
    assert (node.cpu_allocatable_millicores, node.memory_allocatable_mib, node.cpu_requested_millicores) == (None, None, 0)
