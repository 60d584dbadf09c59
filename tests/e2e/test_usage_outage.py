"""End to end: usage samples survive a control-plane outage and an operator restart, and arrive exactly once.

A session runs on an emulated cluster under the real operator process, which reaches the control plane (the live
server, real ``POST /internal/v1/usage``, PostgreSQL) through a loopback proxy this test owns: closing the proxy's
port is the outage (connection refused), since the live server itself cannot be stopped. While the control plane is
away samples pile up in the operator's on-disk queue; the operator is then stopped (SIGTERM), left down for a while,
and started again on the same queue file; then the control plane comes back. Every sample must reach the database
once, and the windows of each GPU must join end to start with neither gap nor overlap across the outage and the
restart.
"""

from __future__ import annotations

import http.server
import json
import re
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import requests
from django.db.models import Count

from billing.models import UsageSample
from contract import USAGE_PATH
from operator_agent.reporters.usage import MAX_WINDOW_MS
from tests.helpers import registered, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate"}


class ControlPlaneProxy:
    """A loopback HTTP proxy to ``target``: the control plane as the operator sees it. ``close()`` is an outage
    (nothing listens on the port: connection refused), ``open()`` brings it back on the same port.

    ``delivered`` holds the ``sample_id`` of every usage sample the control plane answered 200 for.
    """

    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.port = 0
        self.delivered: list[str] = []
        self.lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):  # HTTP/1.0: one request per connection, no keep-alive
            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                try:
                    upstream = requests.request(self.command, proxy.target + self.path, data=body, headers=headers,
                                                timeout=30, allow_redirects=False)
                except requests.RequestException:
                    self.send_error(502)
                    return
                if self.command == "POST" and self.path == USAGE_PATH and upstream.status_code == 200:
                    with proxy.lock:
                        proxy.delivered += [s["sample_id"] for s in json.loads(body)["samples"]]
                self.send_response(upstream.status_code)
                for key, value in upstream.headers.items():
                    if key.lower() not in _HOP_BY_HOP and key.lower() not in ("date", "server"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(upstream.content)))
                self.end_headers()
                self.wfile.write(upstream.content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = forward  # noqa: N815 - http.server's naming

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)  # SO_REUSEADDR: same port
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def proxy(live_server):
    control_plane = ControlPlaneProxy(live_server.url)
    control_plane.open()
    yield control_plane
    control_plane.close()


def queued(path: Path) -> int:
    """Samples waiting in the operator's queue file (read while the operator writes it: WAL allows it)."""
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        try:
            return db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        except sqlite3.OperationalError:  # not created yet
            return 0


def stored(cluster, session_id: str) -> list[UsageSample]:
    return list(UsageSample.objects.filter(cluster=cluster, session__public_id=session_id).order_by("device_uuid", "start"))


def test_usage_survives_an_outage_and_a_restart_and_arrives_once(http, fleet_cluster, operator_process, tmp_path,
                                                                   settings, live_server, proxy):
    settings.GSHARE_CONTROL_PLANE_URL = live_server.url
    cluster, emulated, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1", pod_startup_seconds=0.2)
    queue_path = tmp_path / "usage-queue.sqlite3"
    env = {"GSHARE_CONTROL_PLANE_URL": proxy.url, "GSHARE_USAGE_INTERVAL": "1", "GSHARE_USAGE_QUEUE_PATH": str(queue_path),
           "GSHARE_RECONCILE_INTERVAL": "0.5", "GSHARE_HTTP_TIMEOUT": "5"}
    first, first_log = operator_process(cluster, kubeconfig_path, token_path, env=env)
    wait_for(lambda: http.get(f"/api/v1/gpus?cluster={cluster.public_id}").json()["count"] > 0, what="inventory")

    created = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 2, "gpu_memory_mib": 4096,
                                                  "gpu_cores": 25})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    running = wait_for(lambda: (b := http.get(f"/api/v1/sessions/{session_id}").json())["phase"] == "Running" and b,
                       what="Running")
    devices = set(running["devices"])
    assert len(devices) == 2

    # Usage flows while the control plane is there.
    wait_for(lambda: len(stored(cluster, session_id)) >= 4, what="usage samples delivered live", timeout=30)

    # Outage: samples pile up on disk.
    proxy.close()
    outage_started = time.time()
    wait_for(lambda: queued(queue_path) >= 4, what="samples queued during the outage", timeout=30)

    # Operator restart during the outage: SIGTERM is a clean stop, the queue stays on disk.
    first.terminate()
    assert first.wait(30) == 0, first_log.read_text()
    at_stop = queued(queue_path)
    assert at_stop >= 4
    time.sleep(3)  # down: this time must be metered by the next operator, once

    second, second_log = operator_process(cluster, kubeconfig_path, token_path, env=env)
    reopened_with = wait_for(lambda: re.search(r"usage sampled every 1s into \S+ \((\d+) samples queued",
                                               second_log.read_text()), what="the restarted operator's queue", timeout=60)
    assert int(reopened_with[1]) == at_stop  # the queue survived the restart
    wait_for(lambda: queued(queue_path) > at_stop, what="the restarted operator sampling into the same queue", timeout=60)

    # The control plane comes back: the backlog drains, oldest first, and nothing is charged twice.
    reopened = time.time()
    proxy.open()
    wait_for(lambda: queued(queue_path) == 0 and max(_ms(s.end) for s in stored(cluster, session_id)) > reopened * 1000,
             what="the backlog delivered", timeout=90)

    with proxy.lock:
        delivered = list(proxy.delivered)
    samples = stored(cluster, session_id)
    by_id = {s.sample_id: s for s in samples}
    assert set(delivered) <= set(by_id), "a sample the control plane accepted is missing from the database"
    counts = UsageSample.objects.filter(cluster=cluster).values("sample_id").annotate(n=Count("id"))
    assert {row["n"] for row in counts} == {1}
    assert {s.device_uuid for s in samples} == devices
    for device in devices:
        windows = [(_ms(s.start), _ms(s.end)) for s in samples if s.device_uuid == device]
        for (_, end), (start, _) in zip(windows, windows[1:], strict=False):
            assert start == end, f"{device}: gap or overlap between a window ending {end} and one starting {start}"
        assert all(0 < end - start <= MAX_WINDOW_MS for start, end in windows)
        # one unbroken run from before the outage, across the restart, to after the control plane came back
        assert windows[0][0] < outage_started * 1000 < reopened * 1000 < windows[-1][1]
    assert set(by_id) == {f"{session_id}:{s.device_uuid}:{_ms(s.end)}" for s in samples}  # the operator's id scheme


def _ms(moment) -> int:
    return round(moment.timestamp() * 1000)
