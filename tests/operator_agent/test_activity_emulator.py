"""GPU activity against the Kubernetes API emulator: its HAMi device-plugin pods, the pod proxy to their vGPU monitor
(both naming schemes), busy and idle pods, and monitors that refuse or hang (``demo.emulator``,
``controllers.hami_monitor``). The control plane is the loopback stub of ``test_activity``.
"""

from __future__ import annotations

import kubernetes
import pytest

from demo import fleet
from demo.emulator import EmulatedCluster
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.reporters.activity import ActivityReporter
from tests import contract
from tests.helpers import serving, wait_for
from tests.operator_agent.test_activity import NS, StubControlPlane, by_session

ADMIN = "admin-token"


def gpu_pod(session_id: str, node: str) -> dict:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}
    return {"metadata": {"name": session_id.replace("_", "-"), "labels": {"gshare.io/session-id": session_id}},
            "spec": {"nodeSelector": {"gpu": "on", "kubernetes.io/hostname": node}, "containers": [
                {"name": "sidecar", "image": "busybox"},
                {"name": "jupyter", "image": "quay.io/jupyter/base-notebook", "resources": {"limits": limits}}]}}


@pytest.mark.parametrize("scheme", ["current", "legacy"])
def test_busy_idle_and_a_hung_monitor_through_the_emulators_pod_proxy(scheme, tmp_path):
    stub = StubControlPlane()
    with EmulatedCluster(fleet.cluster_objects("lab-c1"), version=fleet.cluster_version("lab-c1"), token=ADMIN,
                         pod_startup_seconds=0.1, hami_monitor_scheme=scheme) as cluster, \
            serving(stub.handler()) as control_plane:
        api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab"))
        core = kubernetes.client.CoreV1Api(api)
        for session, node in (("ses_busy", "gpu-h100-01"), ("ses_idle", "gpu-h100-01"), ("ses_hung", "gpu-v100-01")):
            core.create_namespaced_pod(NS, gpu_pod(session, node))
        for name in ("ses-busy", "ses-idle", "ses-hung"):
            wait_for(lambda name=name: core.read_namespaced_pod(name, NS).status.phase == "Running", what=name)
        wait_for(lambda: len(core.list_namespaced_pod("kube-system", label_selector=(
            "app.kubernetes.io/component=hami-device-plugin")).items) == 2, what="a monitor pod per GPU node")
        cluster.set_gpu_activity(NS, "ses-busy", "busy")
        cluster.set_hami_monitor("gpu-v100-01", "hang")
        token = tmp_path / "internal-jwt"
        token.write_text("operator-token")
        config = OperatorConfig(cluster_id="clu_emu", control_plane_url=control_plane, token_file=str(token),
                                hami_monitor_namespace="kube-system", hami_monitor_timeout=1.0)
        client = ControlPlaneClient(config, sleep=lambda _: None, max_attempts=1)
        reporter = ActivityReporter(api, client, config)
        try:
            # The emulator holds the hung monitor's request for its hami_monitor_hang_seconds (60 s), then answers 503
            # "i/o timeout": a reason in the operator's own words of its 1 s deadline shows the tick gave up first.
            assert reporter.tick() is True
            cluster.set_hami_monitor("gpu-v100-01", "down")
            assert reporter.tick() is True
        finally:
            reporter.close()
            client.session.close()
            api.close()
    first, second = (by_session(body) for body in stub.bodies)
    for body in stub.bodies:
        assert contract.problems(contract.ACTIVITY, body) == []
    busy, idle = first["ses_busy"], first["ses_idle"]
    assert (busy["state"], idle["state"]) == ("ok", "ok")
    [busy_gpu], [idle_gpu] = busy["gpus"], idle["gpus"]
    assert busy_gpu["utilization_percent"] > 0 and idle_gpu["utilization_percent"] == 0
    assert busy_gpu["memory_limit_bytes"] == 8192 * 1024 * 1024
    hung = first["ses_hung"]
    assert hung["state"] == "unknown" and "within 1 s" in hung["reason"], hung
    assert "503" not in hung["reason"] and "i/o timeout" not in hung["reason"], hung
    assert second["ses_hung"]["state"] == "unknown" and "503" in second["ses_hung"]["reason"]
