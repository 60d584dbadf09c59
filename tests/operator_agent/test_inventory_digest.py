"""The operator's inventory tick against the control plane on a live server and an emulated apiserver with the demo
fleet's real HAMi data: the full snapshot first, digest-only while nothing changes, the full snapshot again when the
control plane asks for it, when the cluster changed, and every ``FULL_SNAPSHOT_EVERY``."""

from __future__ import annotations

import logging

import kubernetes
import pytest

from clusters.models import Cluster, GpuDevice
from operator_agent.config import OperatorConfig, kubernetes_api_client
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.reporters.inventory import FULL_SNAPSHOT_EVERY, InventoryState, report_inventory
from tests.helpers import registered

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tick(fleet_cluster, live_server, tmp_path):
    """``(cluster, emulated apiserver, run)``: ``run()`` runs one inventory tick of lab-c1's operator, keeping its state."""
    cluster, emulated, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1")
    config = OperatorConfig(cluster_id=cluster.public_id, control_plane_url=live_server.url, token_file=str(token_path), http_timeout=10.0)
    core_v1 = kubernetes.client.CoreV1Api(kubernetes_api_client({"KUBECONFIG": str(kubeconfig_path)}))
    sent: list[dict] = []

    class RecordingClient(ControlPlaneClient):
        """The real client, keeping the bodies it sent to assert on what went over the wire."""

        def put_inventory(self, snapshot: dict) -> dict:
            sent.append(snapshot)
            return super().put_inventory(snapshot)

    client = RecordingClient(config, max_attempts=1)
    state = InventoryState()

    def run() -> list[dict]:
        sent.clear()
        assert report_inventory(core_v1, client, config, state=state)
        return list(sent)

    return cluster, core_v1, state, run


def test_the_full_snapshot_then_digest_only_while_nothing_changes(tick, caplog):
    cluster, _, state, run = tick
    (first,) = run()
    assert "nodes" in first and first["digest"].startswith("sha256:")
    assert state.digest == first["digest"]
    with caplog.at_level(logging.INFO, logger="operator_agent"):
        (second,) = run()
    # Digest-only: no node, only the digest and the clock offset learnt from the first answer.
    assert second == {"digest": first["digest"], "clock_offset_seconds": second["clock_offset_seconds"]}
    assert "(unchanged: digest only)" in caplog.text
    assert Cluster.objects.get(pk=cluster.pk).inventory_digest == first["digest"]


def test_a_control_plane_that_lost_the_digest_gets_the_full_snapshot_at_once(tick, caplog):
    cluster, _, state, run = tick
    run()
    Cluster.objects.filter(pk=cluster.pk).update(inventory_digest="")  # e.g. a snapshot since left GPUs missing
    with caplog.at_level(logging.DEBUG):
        digest_only, full = run()
    assert "nodes" not in digest_only and "nodes" in full
    assert "asks for the full inventory snapshot" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert Cluster.objects.get(pk=cluster.pk).inventory_digest == full["digest"]


def test_a_changed_cluster_sends_the_full_snapshot(tick):
    cluster, core_v1, _, run = tick
    run()
    node = core_v1.list_node(label_selector="gpu=on").items[0]
    core_v1.patch_node(node.metadata.name, {"metadata": {"labels": {"gshare.io/gpu-mode": "mig"}}})
    (report,) = run()
    assert "nodes" in report
    assert Cluster.objects.get(pk=cluster.pk).nodes.get(name=node.metadata.name).gpu_mode == "mig"
    assert GpuDevice.objects.filter(cluster=cluster).exists()


def test_the_full_snapshot_goes_again_after_full_snapshot_every(tick):
    _, _, state, run = tick
    run()
    state.full_at -= FULL_SNAPSHOT_EVERY + 1  # as if that long had passed since
    (report,) = run()
    assert "nodes" in report
