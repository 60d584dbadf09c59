"""The operator's activity report as the control plane takes it: ActivityReporter -> POST /internal/v1/activity.

The apiserver is the loopback stand-in of ``test_activity`` (session Pods, HAMi's device-plugin Pods, the pod
proxy); the control plane is the real one (``live_server``), with a minted operator token. What the control plane
stored is read back from its tables.
"""

from __future__ import annotations

import kubernetes.client
import pytest

from clusters.operator_token.tokens import operator_token_mint
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.reporters.activity import ActivityReporter
from sessions.models import SessionActivity
from tests.factories import ClusterFactory, SessionFactory
from tests.helpers import serving
from tests.operator_agent.hami_exposition import Series, exposition
from tests.operator_agent.test_activity import NS, FakeApiserver, monitor_pod, proxy_error, session_pod, text

pytestmark = pytest.mark.django_db(transaction=True)

GPU_A = "GPU-c15bf6bc-3faf-3140-4788-0e1dcb7af8c2"
GPU_B = "GPU-9b9030a3-d81f-7d9f-5d2b-fd98cdc57b2d"


def test_the_control_plane_stores_what_the_operator_read(live_server, tmp_path):
    cluster = ClusterFactory()
    busy = SessionFactory(cluster=cluster, gpus=2, devices=[GPU_A, GPU_B])
    dark = SessionFactory(cluster=cluster, gpus=1, devices=[GPU_B])
    fake = FakeApiserver()
    fake.session_pods = [session_pod(busy.public_id, "node-a", (GPU_A, GPU_B)),
                         session_pod(dark.public_id, "node-b", (GPU_B,))]
    fake.monitor_pods = [monitor_pod("node-a"), monitor_pod("node-b")]
    fake.proxy = {
        "hami-device-plugin-node-a": text(exposition([
            Series(NS, busy.public_id.replace("_", "-"), "main", 0, GPU_A, used=2 << 30, limit=8 << 30, util=64,
                   last_kernel=12),
        ], host_uuids=(GPU_A, GPU_B))),
        "hami-device-plugin-node-b": proxy_error(503, "error trying to reach service: connection refused"),
    }
    token = tmp_path / "internal-jwt"
    token.write_text(operator_token_mint(cluster_id=cluster.public_id))
    config = OperatorConfig(cluster_id=cluster.public_id, control_plane_url=live_server.url, token_file=str(token),
                            http_timeout=10, backoff_max=0.01, hami_monitor_timeout=2)
    with serving(fake.handler()) as apiserver:
        api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=apiserver))
        client = ControlPlaneClient(config, sleep=lambda _: None, max_attempts=1)
        reporter = ActivityReporter(api, client, config)
        try:
            assert reporter.tick() is True
        finally:
            reporter.close()
            api.close()
            client.session.close()
    stored = SessionActivity.objects.get(session=busy)
    assert stored.state == "ok" and stored.reason == ""
    assert [(g["device_uuid"], g["last_kernel_seconds"], g["utilization_percent"]) for g in stored.gpus] == [
        (GPU_A, 12.0, 64.0), (GPU_B, None, None)]
    assert stored.last_kernel_at is not None
    unknown = SessionActivity.objects.get(session=dark)
    assert unknown.state == "unknown" and "503" in unknown.reason and unknown.gpus == []
