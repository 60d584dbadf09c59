"""``python -m operator_agent`` for real: a session with a volume on an emulated cluster whose GPU nodes have no NFS
client, and the volume-sync reports it sends to a loopback control plane (``POST /internal/v1/storage``).

The control plane's own ``POST /internal/v1/storage`` view is tested on the control-plane side; here a small
``http.server`` stands in for it and records what the operator sends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes
import pytest
import yaml

from contract import INVENTORY_PATH, STATUS_PATH, STORAGE_PATH
from demo import fleet
from demo.emulator import EmulatedCluster
from tests.helpers import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "lab-c1"
NAMESPACE = "gshare-sessions"
APISERVER_TOKEN = "emulator-token"
OPERATOR_TOKEN = "operator-token-value"
MI = 2**20


@pytest.fixture
def control_plane() -> Iterator[dict]:
    state: dict = {"requests": [], "lock": threading.Lock()}

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            with state["lock"]:
                state["requests"].append({"method": self.command, "path": self.path, "body": body,
                                          "authorization": self.headers.get("Authorization")})
            payload = b'{"server_time": "2026-11-29T16:00:00Z"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_POST = do_PUT = _record  # noqa: N815 - http.server's naming

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def storage_reports(state: dict) -> list[dict]:
    with state["lock"]:
        return [r["body"] for r in state["requests"] if (r["method"], r["path"]) == ("POST", STORAGE_PATH)]


def test_operator_reports_capacity_volumes_and_the_missing_nfs_client(tmp_path, control_plane):
    hosts = fleet.cluster_hosts(CLUSTER, **{"gpu-h100-01": {"mount_nfs": None}, "gpu-v100-01": {"mount_nfs": None}})
    with EmulatedCluster(fleet.cluster_objects(CLUSTER), version=fleet.cluster_version(CLUSTER), token=APISERVER_TOKEN,
                         pod_startup_seconds=0.1, hosts=hosts) as cluster:
        kubeconfig = tmp_path / "kubeconfig.yaml"
        kubeconfig.write_text(yaml.safe_dump(cluster.kubeconfig(CLUSTER)))
        token = tmp_path / "internal-jwt"
        token.write_text(OPERATOR_TOKEN)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GSHARE_", "KUBERNETES_SERVICE_", "DJANGO_"))}
        env.update({
            "KUBECONFIG": str(kubeconfig), "GSHARE_CLUSTER_ID": "clu_test", "GSHARE_CONTROL_PLANE_URL": control_plane["url"],
            "GSHARE_TOKEN_FILE": str(token), "GSHARE_INVENTORY_INTERVAL": "5", "GSHARE_VOLUME_SYNC_INTERVAL": "0.5",
            "GSHARE_VOLUME_STORAGE_CLASS": fleet.STORAGE_CLASS, "GSHARE_RECONCILE_INTERVAL": "0.5",
            "GSHARE_HTTP_TIMEOUT": "5", "GSHARE_BACKOFF_MAX": "1", "GSHARE_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1",
        })
        log = tmp_path / "operator.log"
        with open(log, "wb") as output:
            process = subprocess.Popen([sys.executable, "-m", "operator_agent"], cwd=REPO_ROOT, env=env, stdout=output,
                                       stderr=subprocess.STDOUT)
            try:
                first = wait_for(what="a first volume-sync report", check=lambda: storage_reports(control_plane))[0]
                assert first["storage_classes"] == [
                    {"storage_class": "gshare-nfs", "capacity_bytes": 1643124 * MI, "objects": 2}]  # largest, not sum
                assert first["volumes"] == []
                assert sorted(n["name"] for n in first["nodes"]) == sorted(n.name for n in fleet.cluster_spec(CLUSTER).nodes)
                assert all(isinstance(n["disk_bytes"], int) and n["disk_bytes"] > 0 for n in first["nodes"])

                session = {
                    "apiVersion": "gshare.io/v1alpha1", "kind": "GShareSession",
                    "metadata": {"name": "ses-vol000000000001", "namespace": NAMESPACE,
                                 "labels": {"gshare.io/session-id": "ses_vol000000000001"}},
                    "spec": {"sessionId": "ses_vol000000000001", "owner": "alice",
                             "image": "quay.io/jupyter/base-notebook:2024-12-02", "gpus": 1, "port": 8888,
                             "host": "lab-c1.gshare.localhost", "path": "/s/ses_vol000000000001/",
                             "authUrl": "https://gshare.example.com/internal/connect/verify",
                             "volumes": [{"volumeId": "vol_datasets01", "name": "datasets",
                                          "claimName": "gshare-vol-datasets01", "storageClassName": fleet.STORAGE_CLASS,
                                          "size": "100Gi", "mountPath": "/data/datasets"}]},
                }
                with kubernetes.config.new_client_from_config_dict(cluster.kubeconfig(CLUSTER)) as api:
                    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                        "gshare.io", "v1alpha1", NAMESPACE, "gsharesessions", session)

                def stuck() -> dict | None:
                    for report in storage_reports(control_plane):
                        for volume in report["volumes"]:
                            if volume["message"].startswith("MountVolume.MountDevice failed"):
                                return volume
                    return None

                volume = wait_for(what="the FailedMount message in a report", check=stuck)
                assert volume["volume_id"] == "vol_datasets01" and volume["claim_name"] == "gshare-vol-datasets01"
                assert volume["phase"] == "Bound" and volume["volume_name"].startswith("pvc-")
                assert "you might need a /sbin/mount.<type> helper program." in volume["message"]
                # the session itself is Pending (its pod waits in ContainerCreating)
                with control_plane["lock"]:
                    statuses = [r for r in control_plane["requests"] if r["path"] == STATUS_PATH]
                    inventory = [r for r in control_plane["requests"] if r["path"] == INVENTORY_PATH]
                assert statuses and statuses[-1]["body"]["reports"][-1]["phase"] == "Pending"
                assert inventory  # the inventory loop runs beside it
                with control_plane["lock"]:
                    assert {r["authorization"] for r in control_plane["requests"]} == {f"Bearer {OPERATOR_TOKEN}"}

                # NFS client installed on the node: the pod starts and the next report has no message
                cluster.set_host("gpu-h100-01", fleet.cluster_hosts(CLUSTER)["gpu-h100-01"])
                count = len(storage_reports(control_plane))
                wait_for(what="a clean report", check=lambda: [r for r in storage_reports(control_plane)[count:]
                                                    if r["volumes"] and r["volumes"][0]["message"] == ""])
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    assert process.wait(30) == 0
                finally:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
        text = log.read_text()
        assert "Traceback" not in text, text
        assert "volume sync reported" in text
