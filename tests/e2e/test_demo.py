"""``manage.py demo``: it comes up with both clusters' inventories, and Ctrl-C stops every process it started."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from demo import fleet

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_and_ctrl_c_stops_everything(tmp_path):
    state_file = tmp_path / "state.json"
    env = {**os.environ, "GSHARE_HOME": str(tmp_path / "home"), "DJANGO_SETTINGS_MODULE": "gshare.settings"}
    log = open(tmp_path / "demo.log", "wb")  # noqa: SIM115
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--port", "0", "--state-file", str(state_file), "--inventory-interval", "2"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 150
        while not state_file.exists() and time.monotonic() < deadline:
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
            time.sleep(0.5)
        state = json.loads(state_file.read_text())
        assert [c["name"] for c in state["clusters"]] == [spec.name for spec in fleet.FLEET]
        for cluster in state["clusters"]:
            expected = fleet.expected_inventory(cluster["name"])
            assert (cluster["nodes"], cluster["gpus"]) == (expected["nodes"], expected["gpus"])
            assert cluster["id"].startswith("clu_") and Path(cluster["kubeconfig_path"]).exists()
        headers = {"Authorization": f"Bearer {state['api_token']}"}
        gpus = requests.get(f"{state['url']}/api/v1/gpus?limit=500", headers=headers, timeout=10).json()
        assert gpus["count"] == sum(c["gpus"] for c in state["clusters"])
        # The shared NFS pool: its capacity comes from the clusters' CSIStorageCapacity objects (largest, not summed).
        summary = requests.get(f"{state['url']}/api/v1/storage/summary", headers=headers, timeout=10).json()
        assert state["storage_pool"]["source"] == "csi" and summary["source"] == "csi"
        assert summary["capacity_bytes"] == state["storage_pool"]["capacity_bytes"] == 1643124 * 2**20
        for cluster in state["clusters"]:
            scoped = requests.get(f"{state['url']}/api/v1/storage/summary", params={"cluster": cluster["id"]},
                                  headers=headers, timeout=10).json()
            assert [p["name"] for p in scoped["pools"]] == ["lab-nfs"]
            assert scoped["shared_across_clusters"] is (cluster["name"] != "lab-c1")
        login = requests.get(f"{state['url']}/login/", timeout=10)
        assert login.status_code == 200 and "gShare console" in login.text

        children = psutil.Process(demo.pid).children(recursive=True)
        assert len(children) >= 2 + 3 + len(fleet.FLEET)  # emulators, web, worker, beat, operators
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 0
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if demo.poll() is None:
            demo.kill()
        log.close()
