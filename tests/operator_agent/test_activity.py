"""GPU activity (operator_agent.reporters.activity): sessions, monitors, scraping through the pod proxy, the report.

The apiserver is a real HTTP server on 127.0.0.1 (``tests.helpers.serving``) answering the official client's calls: the
session Pods, HAMi's device-plugin Pods, and ``GET /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics``, the pod
proxy URL ``CoreV1Api.connect_get_namespaced_pod_proxy_with_path`` sends, with answers the emulator's monitor never gives
(garbage, a trickling body, a forbidden pod list; the emulator itself: ``test_activity_emulator``). The control
plane is another one taking ``POST /internal/v1/activity``. Every report is validated against
``contract.ACTIVITY_SCHEMA``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from contract import ACTIVITY_PATH, HAMI_MONITOR_PORT_DEFAULT, SESSION_ID_LABEL
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.hami_pods import HAMI_POD_DEVICES_ALLOCATED_ANNOTATION
from operator_agent.metrics import OperatorMetrics, serve_metrics
from operator_agent.reporters.activity import ActivityReporter, monitor_pods_by_node, running_targets
from tests import contract
from tests.helpers import send_json, serving
from tests.operator_agent.hami_exposition import Series, exposition

NS = "gshare-sessions"
HAMI_NS = "hami-system"
GPU_A = "GPU-c15bf6bc-3faf-3140-4788-0e1dcb7af8c2"
GPU_B = "GPU-9b9030a3-d81f-7d9f-5d2b-fd98cdc57b2d"
GPU_C = "GPU-59ab1128-3130-b95a-9870-4bd748926e97"


def session_pod(session_id: str, node: str, devices: tuple[str, ...], *, phase: str = "Running",
                deleting: bool = False) -> dict:
    metadata: dict[str, Any] = {"name": session_id.replace("_", "-"), "namespace": NS,
                                "labels": {SESSION_ID_LABEL: session_id}}
    if devices:
        metadata["annotations"] = {HAMI_POD_DEVICES_ALLOCATED_ANNOTATION:
                                   "".join(f"{d},NVIDIA,4096,25:" for d in devices) + ";"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    return {"metadata": metadata, "spec": {"nodeName": node, "containers": [{"name": "main", "image": "jupyter"}]},
            "status": {"phase": phase}}


def monitor_pod(node: str, *, name: str | None = None, ready: bool = True, phase: str = "Running",
                created: str = "2026-12-01T09:00:00Z") -> dict:
    return {"metadata": {"name": name or f"hami-device-plugin-{node}", "namespace": HAMI_NS,
                         "labels": {"app.kubernetes.io/component": "hami-device-plugin"}, "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": [{"name": "vgpu-monitor", "image": "hami"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class FakeApiserver:
    """What the fake apiserver serves; ``proxy[pod name]`` is a function of the handler answering the proxy call."""

    def __init__(self):
        self.session_pods: list[dict] = []
        self.monitor_pods: list[dict] = []
        self.monitor_list_status: int | None = None
        self.proxy: dict[str, Callable[[BaseHTTPRequestHandler], None]] = {}
        self.requests: list[str] = []
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                parts = urllib.parse.urlsplit(self.path)
                path = urllib.parse.unquote(parts.path)
                query = urllib.parse.parse_qs(parts.query)
                with fake.lock:
                    fake.requests.append(path)
                if path == f"/api/v1/namespaces/{NS}/pods":
                    assert query.get("labelSelector") == [SESSION_ID_LABEL]
                    return self.json(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                           "items": fake.session_pods})
                if path in ("/api/v1/pods", f"/api/v1/namespaces/{HAMI_NS}/pods"):
                    if fake.monitor_list_status:
                        return self.json(fake.monitor_list_status, {
                            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                            "code": fake.monitor_list_status,
                            "message": 'pods is forbidden: User "system:serviceaccount:gshare-system:gshare-operator" '
                                       'cannot list resource "pods" in API group "" at the cluster scope'})
                    assert query.get("labelSelector") == ["app.kubernetes.io/component=hami-device-plugin"]
                    return self.json(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                           "items": fake.monitor_pods})
                prefix = f"/api/v1/namespaces/{HAMI_NS}/pods/"
                suffix = f":{HAMI_MONITOR_PORT_DEFAULT}/proxy/metrics"
                if path.startswith(prefix) and path.endswith(suffix):
                    answer = fake.proxy.get(path[len(prefix):-len(suffix)])
                    if answer is not None:
                        return answer(self)
                return self.json(404, {"kind": "Status", "code": 404, "reason": "NotFound", "message": f"{path} not found"})

            def json(self, status: int, body: dict) -> None:
                send_json(self, status, body)

            def log_message(self, *args):
                pass

        return Handler


def text(body: bytes) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; version=0.0.4")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    return answer


def proxy_error(status: int, message: str) -> Callable[[BaseHTTPRequestHandler], None]:
    """The apiserver's answer when the proxied connection fails (e.g. 503 ``connection refused`` to the pod)."""
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.json(status, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status,
                              "reason": "ServiceUnavailable", "message": message})
    return answer


class Held:
    """A monitor answer that holds its peer until the test lets go (``release``), so a test proves the scrape gave up
    at its own deadline by what the peer saw, not by how long it took: ``finished`` is set only once the handler ends,
    ``peer_closed`` once it found the scraper's end of the connection closed. ``SAFETY`` only ends a handler of a scrape
    that never gives up (the test then fails on ``finished``), it measures nothing."""

    SAFETY = 60

    def __init__(self):
        self.release = threading.Event()
        self.finished = threading.Event()
        self.peer_closed = threading.Event()
        self.lines_sent = 0

    def hang(self) -> Callable[[BaseHTTPRequestHandler], None]:
        """No status line, no byte: the scrape's read timeout must give up."""
        def answer(handler: BaseHTTPRequestHandler) -> None:
            try:
                self.release.wait(self.SAFETY)
                handler.connection.settimeout(self.SAFETY)
                if handler.connection.recv(1) == b"":  # EOF: the scraper closed its end
                    self.peer_closed.set()
            except TimeoutError:
                pass  # the scraper still holds the connection open
            except OSError:  # reset: closed too
                self.peer_closed.set()
            finally:
                self.finished.set()
        return answer

    def trickle(self, interval: float, *, status: int = 200,
                part: bytes = b"# HELP x trickle\n") -> Callable[[BaseHTTPRequestHandler], None]:
        """Answers ``status`` at once, then ``part`` every ``interval`` s until released: a body that never ends in
        time, each part within the read timeout, so only the scrape's overall deadline can stop it."""
        def answer(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(status)
            handler.send_header("Content-Type", "text/plain")
            handler.end_headers()
            try:
                while not self.release.wait(interval) and self.lines_sent * interval < self.SAFETY:
                    handler.wfile.write(part)
                    handler.wfile.flush()
                    self.lines_sent += 1
                for _ in range(100):  # the scraper closed the connection: a write fails (at most once buffered)
                    handler.wfile.write(part)
                    handler.wfile.flush()
                    time.sleep(0.01)
            except OSError:
                self.peer_closed.set()
            finally:
                self.finished.set()
        return answer


class StubControlPlane:
    """Takes activity reports; ``status`` answers every one, ``foreign`` sessions make a report 403 (as the control
    plane refuses a report naming a session it does not know as this cluster's)."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.status = 200
        self.foreign: set[str] = set()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert self.path == ACTIVITY_PATH
                stub.bodies.append(body)
                status = stub.status
                if stub.foreign & {entry["session"] for entry in body["sessions"]}:
                    status = 403
                answer = ({"server_time": "2026-12-01T10:00:00Z", "accepted": len(body["sessions"]), "ignored": 0}
                          if status == 200 else {"code": "forbidden_cluster_scope", "detail": "not this cluster's"})
                send_json(self, status, answer)

            def log_message(self, *args):
                pass

        return Handler


class ManualClock:
    """Seconds since the epoch that move only when a test moves them (``now``)."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def metrics_clock() -> ManualClock:
    """The clock of the ``cluster`` fixture's ``OperatorMetrics`` (report ages)."""
    return ManualClock(1_000_000.0)


@pytest.fixture
def cluster(tmp_path, metrics_clock):
    fake, stub = FakeApiserver(), StubControlPlane()
    with serving(fake.handler()) as apiserver, serving(stub.handler()) as control_plane:
        token = tmp_path / "internal-jwt"
        token.write_text("operator-token")
        config = OperatorConfig(cluster_id="clu_act", control_plane_url=control_plane, token_file=str(token),
                                http_timeout=5, backoff_max=0.01, hami_monitor_timeout=1.0)
        api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=apiserver))
        metrics = OperatorMetrics(clock=metrics_clock)
        client = ControlPlaneClient(config, sleep=lambda _: None, max_attempts=1, on_success=metrics.report_succeeded)
        reporter = ActivityReporter(api, client, config, metrics=metrics)
        try:
            yield fake, stub, reporter, metrics
        finally:
            reporter.close()
            api.close()
            client.session.close()


def valid(body: dict) -> dict:
    assert contract.problems(contract.ACTIVITY, body) == []
    return body


def by_session(body: dict) -> dict[str, dict]:
    return {entry["session"]: entry for entry in body["sessions"]}


def scrape_metrics(metrics: OperatorMetrics) -> dict[tuple[str, tuple], float]:
    server, thread = serve_metrics(metrics, 0, addr="127.0.0.1")
    try:
        answer = requests.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert answer.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def test_ok_and_unknown_sessions_in_one_report(cluster, metrics_clock):
    fake, stub, reporter, metrics = cluster
    held = Held()
    fake.session_pods = [
        session_pod("ses_busy", "node-a", (GPU_A, GPU_B)),  # GPU_B never ran CUDA: no series of it
        session_pod("ses_neighbour", "node-a", (GPU_A,)),
        session_pod("ses_nomonitor", "node-b", (GPU_C,)),
        session_pod("ses_refused", "node-c", (GPU_C,)),
        session_pod("ses_hung", "node-d", (GPU_C,)),
        session_pod("ses_garbage", "node-e", (GPU_C,)),
    ]
    fake.monitor_pods = [monitor_pod(n) for n in ("node-a", "node-c", "node-d", "node-e")]
    fake.proxy = {
        "hami-device-plugin-node-a": text(exposition([
            Series(NS, "ses-busy", "main", 0, GPU_A, used=3 << 30, limit=8 << 30, util=91, last_kernel=0),
            Series(NS, "ses-neighbour", "main", 0, GPU_A, used=1 << 20, limit=8 << 30, util=0, last_kernel=5400),
        ], host_uuids=(GPU_A, GPU_B))),
        "hami-device-plugin-node-c": proxy_error(503, 'error trying to reach service: dial tcp 10.1.2.3:9394: connect: '
                                                      'connection refused'),
        "hami-device-plugin-node-d": held.hang(),
        "hami-device-plugin-node-e": text(b"<html><body>hello</body></html>\n"),
    }
    metrics_clock.now += 50
    try:
        assert reporter.tick() is True
        # The tick ended while the hung monitor still held its connection: it gave up at the scrape's deadline rather
        # than waiting for the peer, and closed its end (no thread or connection left behind).
        assert not held.finished.is_set()
    finally:
        held.release.set()
    assert held.finished.wait(Held.SAFETY) and held.peer_closed.is_set()
    [body] = stub.bodies
    entries = by_session(valid(body))
    busy = entries["ses_busy"]
    assert (busy["state"], busy["reason"], busy["node"]) == ("ok", "", "node-a")
    assert [g["device_uuid"] for g in busy["gpus"]] == [GPU_A, GPU_B]
    assert {k: busy["gpus"][0][k] for k in ("last_kernel_seconds", "utilization_percent", "memory_used_bytes",
                                             "memory_limit_bytes")} == {
        "last_kernel_seconds": 0.0, "utilization_percent": 91.0, "memory_used_bytes": 3 << 30,
        "memory_limit_bytes": 8 << 30}
    assert {k: v for k, v in busy["gpus"][1].items() if k not in ("device_uuid", "sampled_at")} == {
        "last_kernel_seconds": None, "utilization_percent": None, "memory_used_bytes": None, "memory_limit_bytes": None}
    assert entries["ses_neighbour"]["gpus"][0]["last_kernel_seconds"] == 5400.0  # its own series, not the busy one's
    for session, says in [("ses_nomonitor", "no Running HAMi device-plugin pod"), ("ses_refused", "503"),
                          ("ses_hung", "1 s"), ("ses_garbage", "not Prometheus text")]:
        entry = entries[session]
        assert (entry["state"], entry["gpus"]) == ("unknown", []), session
        assert says in entry["reason"], (session, entry["reason"])
    assert "connection refused" in entries["ses_refused"]["reason"]
    # one scrape per node, even with two sessions on node-a
    proxied = [p for p in fake.requests if p.endswith("/proxy/metrics")]
    assert sorted(proxied) == sorted(f"/api/v1/namespaces/{HAMI_NS}/pods/hami-device-plugin-{n}:9394/proxy/metrics"
                                     for n in ("node-a", "node-c", "node-d", "node-e"))

    seen = scrape_metrics(metrics)
    errors = {labels: value for (name, labels), value in seen.items()
              if name == "gshare_operator_hami_monitor_scrape_errors_total"}
    assert errors == {(("node", "node-b"), ("reason", "no_monitor_pod")): 1.0,
                      (("node", "node-c"), ("reason", "http_error")): 1.0,
                      (("node", "node-d"), ("reason", "timeout")): 1.0,
                      (("node", "node-e"), ("reason", "parse_error")): 1.0}
    durations = {dict(labels)["node"]: value for (name, labels), value in seen.items()
                 if name == "gshare_operator_hami_monitor_scrape_duration_seconds"}
    # the hung scrape waited out its own timeout (1 s) and no more than the tick above let it (the peer still held)
    assert set(durations) == {"node-a", "node-c", "node-d", "node-e"} and durations["node-d"] >= 0.9
    metrics_clock.now += 7
    assert seen[("gshare_operator_report_age_seconds", (("report", "activity"),))] == 0  # sent at the clock's "now"
    assert metrics.report_ages()["activity"] == 7 and metrics.report_ages()["inventory"] == 57  # never sent: since start


def test_only_running_sessions_are_reported_and_a_gpu_less_one_has_no_gpus(cluster):
    fake, stub, reporter, _ = cluster
    fake.session_pods = [
        session_pod("ses_run", "node-a", ()),
        session_pod("ses_pending", "node-a", (GPU_A,), phase="Pending"),
        session_pod("ses_done", "node-a", (GPU_A,), phase="Succeeded"),
        session_pod("ses_stopping", "node-a", (GPU_A,), deleting=True),
    ]
    fake.monitor_pods = [monitor_pod("node-a")]
    fake.proxy = {"hami-device-plugin-node-a": text(exposition([], host_uuids=(GPU_A,)))}
    assert reporter.tick() is True
    [body] = stub.bodies
    assert [(e["session"], e["state"], e["gpus"]) for e in valid(body)["sessions"]] == [("ses_run", "ok", [])]


def test_no_running_session_sends_nothing_and_scrapes_nothing(cluster):
    fake, stub, reporter, _ = cluster
    fake.session_pods = [session_pod("ses_pending", "node-a", (GPU_A,), phase="Pending")]
    fake.monitor_pods = [monitor_pod("node-a")]
    assert reporter.tick() is True
    assert stub.bodies == [] and not any(p.endswith("/proxy/metrics") for p in fake.requests)


def test_monitor_pods_that_cannot_be_listed_make_every_session_unknown(cluster):
    fake, stub, reporter, _ = cluster
    fake.session_pods = [session_pod("ses_a", "node-a", (GPU_A,)), session_pod("ses_b", "node-b", (GPU_B,))]
    fake.monitor_list_status = 403
    assert reporter.tick() is True
    [body] = stub.bodies
    for entry in valid(body)["sessions"]:
        assert entry["state"] == "unknown" and entry["gpus"] == []
        assert "cannot list HAMi's device-plugin pods" in entry["reason"] and "403" in entry["reason"]


def test_monitor_pods_are_looked_for_in_hamis_namespace_when_it_is_named(cluster):
    fake, stub, reporter, _ = cluster
    reporter.config = OperatorConfig(**{**vars(reporter.config), "hami_monitor_namespace": HAMI_NS})
    fake.session_pods = [session_pod("ses_a", "node-a", (GPU_A,))]
    fake.monitor_pods = [monitor_pod("node-a")]
    fake.proxy = {"hami-device-plugin-node-a": text(exposition([], host_uuids=(GPU_A,)))}
    assert reporter.tick() is True
    assert valid(stub.bodies[0])["sessions"][0]["state"] == "ok"
    assert f"/api/v1/namespaces/{HAMI_NS}/pods" in fake.requests and "/api/v1/pods" not in fake.requests


def test_a_trickling_monitor_is_cut_off_at_the_deadline(cluster):
    fake, stub, reporter, _ = cluster
    held = Held()
    fake.session_pods = [session_pod("ses_a", "node-a", (GPU_A,))]
    fake.monitor_pods = [monitor_pod("node-a")]
    fake.proxy = {"hami-device-plugin-node-a": held.trickle(0.3)}  # each line within the 1 s read timeout
    try:
        assert reporter.tick() is True
        # the body was still coming when the tick ended: the scrape's deadline cut it, not the end of the body
        assert not held.finished.is_set() and held.lines_sent >= 1
    finally:
        held.release.set()
    assert held.finished.wait(Held.SAFETY) and held.peer_closed.is_set()
    [entry] = valid(stub.bodies[0])["sessions"]
    assert entry["state"] == "unknown" and "did not finish its answer within 1 s" in entry["reason"]


def test_a_refused_report_is_not_an_error_of_the_loop(cluster, metrics_clock):
    fake, stub, reporter, metrics = cluster
    metrics_clock.now += 30
    fake.session_pods = [session_pod("ses_a", "node-a", (GPU_A,))]
    fake.monitor_pods = [monitor_pod("node-a")]
    fake.proxy = {"hami-device-plugin-node-a": text(exposition([], host_uuids=(GPU_A,)))}
    stub.status = 401
    assert reporter.tick() is False
    assert len(stub.bodies) == 1
    assert metrics.report_ages()["activity"] == metrics.report_ages()["inventory"] == 30  # never ok


def test_a_session_refused_as_foreign_is_found_by_halving_and_left_out(cluster, caplog):
    fake, stub, reporter, _ = cluster
    fake.session_pods = [session_pod(f"ses_{i:02d}", "node-a", (GPU_A,)) for i in range(8)]
    fake.monitor_pods = [monitor_pod("node-a")]
    fake.proxy = {"hami-device-plugin-node-a": text(exposition([], host_uuids=(GPU_A,)))}
    stub.foreign = {"ses_05"}
    assert reporter.tick() is True
    delivered = {e["session"] for body in stub.bodies for e in body["sessions"]
                 if "ses_05" not in {x["session"] for x in body["sessions"]}}
    assert delivered == {f"ses_{i:02d}" for i in range(8)} - {"ses_05"}
    assert len(stub.bodies) <= 1 + 2 * 3  # halving: at most two calls per level of 8 -> 1
    assert "activity of session ses_05 left out of the reports" in caplog.text
    stub.bodies.clear()
    assert reporter.tick() is True
    [body] = stub.bodies  # the next tick leaves it out at once
    assert len(body["sessions"]) == 7 and "ses_05" not in {e["session"] for e in body["sessions"]}


def test_the_monitor_pod_of_a_node_is_a_running_ready_newest_one():
    pods = [
        monitor_pod("n1", name="old", created="2026-01-01T00:00:00Z"),
        monitor_pod("n1", name="new", created="2026-02-01T00:00:00Z"),
        monitor_pod("n1", name="newest-not-ready", created="2026-03-01T00:00:00Z", ready=False),
        monitor_pod("n2", name="pending", phase="Pending"),
    ]
    assert monitor_pods_by_node(pods) == {"n1": (HAMI_NS, "new")}


def test_running_targets_read_the_session_label_node_and_hami_devices():
    pods = [session_pod("ses_b", "n2", (GPU_B, GPU_A)), session_pod("ses_a", "n1", (GPU_A,))]
    unlabelled = session_pod("ses_x", "n1", (GPU_A,))
    unlabelled["metadata"]["labels"] = {}
    broken = session_pod("ses_c", "n1", ())
    broken["metadata"]["annotations"] = {HAMI_POD_DEVICES_ALLOCATED_ANNOTATION: "not,an,allocation"}
    targets = running_targets([*pods, unlabelled, broken])
    assert [(t.session_id, t.pod, t.node, t.devices) for t in targets] == [
        ("ses_a", "ses-a", "n1", (GPU_A,)), ("ses_b", "ses-b", "n2", (GPU_B, GPU_A)), ("ses_c", "ses-c", "n1", ())]


def test_the_usage_queue_and_report_ages_on_the_operators_metrics(tmp_path: Path):
    from contract import INVENTORY_PATH, USAGE_PATH
    from operator_agent.reporters.usage import UsageQueue

    now = [1_764_432_600.0]
    metrics = OperatorMetrics(usage_queue_path=str(tmp_path / "q.sqlite3"), clock=lambda: now[0])
    assert ("gshare_operator_usage_queue_samples", ()) not in scrape_metrics(metrics)  # no file yet
    with UsageQueue(str(tmp_path / "q.sqlite3"), max_samples=100, cluster_id="clu_m", clock=lambda: 0) as queue:
        queue.record([{"sample_id": f"ses_a:{GPU_A}:{end}", "session_id": "ses_a", "device_uuid": GPU_A,
                       "start": f"2025-11-29T16:0{i}:00.000Z", "end": f"2025-11-29T16:0{i + 1}:00.000Z"}
                      for i, end in enumerate((1, 2, 3))], {})
        metrics.report_succeeded(INVENTORY_PATH)
        now[0] += 42
        metrics.report_succeeded(USAGE_PATH)
        now[0] += 8
        seen = scrape_metrics(metrics)
    assert seen[("gshare_operator_usage_queue_samples", ())] == 3
    # the oldest sample's window ended at 2025-11-29T16:01:00Z = 1764432060
    assert seen[("gshare_operator_usage_queue_oldest_sample_age_seconds", ())] == pytest.approx(now[0] - 1_764_432_060)
    ages = {dict(labels)["report"]: value for (name, labels), value in seen.items()
            if name == "gshare_operator_report_age_seconds"}
    assert ages == {"inventory": 50, "usage": 8, "status": 50, "storage": 50, "activity": 50}


def test_the_operators_exposition_passes_promtool(tmp_path: Path):
    """``promtool check metrics`` on what the operator serves over HTTP (scrape errors and durations included)."""
    from tests.metrics.promtool import check

    metrics = OperatorMetrics(usage_queue_path=str(tmp_path / "q.sqlite3"))
    metrics.scrape_failed("gpu-h100-01", "timeout")
    metrics.scraped({"gpu-v100-01": 0.012})
    server, thread = serve_metrics(metrics, 0, addr="127.0.0.1")
    try:
        answer = requests.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert "gshare_operator_hami_monitor_scrape_errors_total" in answer.text
    result = check("metrics", stdin=answer.content)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
