"""End to end: a real operator process, an emulated apiserver with the demo fleet's real HAMi data,
and the control plane on a live HTTP server. Token rotation through the token file, and the 401
line once the cluster is deregistered."""


import pytest
import yaml

from clusters import services
from clusters.diagnosis import clock_verdict
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_token.tokens import operator_token_mint
from demo import fleet
from tests.helpers import kubeconfig_text, registered, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


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
    # The operator logs the report once the control plane has answered, a moment after the rows are committed.
    assert wait_for(lambda: "inventory reported" in log.read_text(), timeout=10, what="the operator's 'inventory reported' line")
    # From its second report on, the operator sends the offset of its node's clock, learnt from the answers' server_time
    # (the same machine's clock here: in sync, so clock_synced passes).
    wait_for(lambda: Cluster.objects.get(pk=cluster.pk).clock_offset_seconds is not None, what="the clock offset")
    cluster.refresh_from_db()
    assert clock_verdict(cluster).ok is True and cluster.clock_offset_at is not None


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
