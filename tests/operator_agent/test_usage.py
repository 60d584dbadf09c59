"""Usage metering (operator_agent.reporters.usage): windows, sample ids, the on-disk queue and sending to a loopback control plane.

The control plane is a real ``http.server`` on 127.0.0.1 answering ``POST /internal/v1/usage`` as the contract says
(``contract.USAGE_PATH``), with a programmable refusal per batch.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from contract import (
    FORBIDDEN_CLUSTER_SCOPE,
    INVALID_USAGE_SAMPLE,
    USAGE_MAX_SAMPLES_PER_CALL,
    USAGE_MAX_WINDOW_SECONDS,
    USAGE_PATH,
)
from operator_agent.config import DEFAULT_USAGE_QUEUE_MAX, DEFAULT_USAGE_QUEUE_PATH, ConfigError, OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.hami_pods import HAMI_POD_DEVICES_ALLOCATED_ANNOTATION
from operator_agent.reporters.usage import (
    MAX_WINDOW_MS,
    QueueError,
    SessionUsage,
    UsageQueue,
    UsageSampler,
    UsageSender,
    format_ms,
    observe_sessions,
    parse_time_ms,
    plan_samples,
    run_usage,
    sample_id,
    split_window,
)

CLUSTER = "clu_usagetest00000001"
T0 = 1_764_432_000_000  # 2025-11-29T16:00:00Z
S = 1000
GPU_A = "GPU-c15bf6bc-3faf-3140-4788-0e1dcb7af8c2"
GPU_B = "GPU-9b9030a3-d81f-7d9f-5d2b-fd98cdc57b2d"


# --------------------------------------------------------------------------- helpers


def windows_of(samples: list[dict], device: str | None = None) -> list[tuple[int, int]]:
    return [(parse_time_ms(s["start"]), parse_time_ms(s["end"])) for s in samples if device in (None, s["device_uuid"])]


def assert_contiguous(windows: list[tuple[int, int]]) -> None:
    for (_, end), (start, _) in zip(windows, windows[1:], strict=False):
        assert start == end, f"gap or overlap between windows ending {end} and starting {start}"
    assert all(0 < end - start <= MAX_WINDOW_MS for start, end in windows)


def gss(session_id: str, *, uid: str | None = None, deleting: bool = False, status: dict | None = None) -> dict:
    metadata: dict[str, Any] = {"name": session_id.replace("_", "-"), "uid": uid or f"uid-{session_id}"}
    if deleting:
        metadata["deletionTimestamp"] = "2025-11-29T16:00:00Z"
    return {"metadata": metadata, "spec": {"sessionId": session_id}, "status": status or {}}


def pod(session_id: str, *, phase: str = "Running", devices: tuple[str, ...] = (GPU_A,), owner: str | None = None,
        started: str = "2025-11-29T15:00:00Z", finished: str | None = None) -> dict:
    annotation = "".join(f"{d},NVIDIA,4096,25:" for d in devices) + ";" if devices else None
    state = {"running": {"startedAt": started}} if finished is None else {
        "terminated": {"startedAt": started, "finishedAt": finished, "exitCode": 0}}
    return {
        "metadata": {"name": session_id.replace("_", "-"), "ownerReferences": [{"uid": owner or f"uid-{session_id}"}],
                     "annotations": {HAMI_POD_DEVICES_ALLOCATED_ANNOTATION: annotation} if annotation else {}},
        "spec": {"nodeName": "gpu-h100-01"},
        "status": {"phase": phase, "startTime": "2025-11-29T14:59:00Z",
                   "containerStatuses": [{"name": "session", "state": state}]},
    }


class Clock:
    def __init__(self, now: int = T0):
        self.now = now

    def __call__(self) -> int:
        return self.now


def open_queue(path: Path, *, max_samples: int = DEFAULT_USAGE_QUEUE_MAX, clock: Callable[[], int] = lambda: T0,
               cluster_id: str = CLUSTER) -> UsageQueue:
    return UsageQueue(str(path), max_samples=max_samples, cluster_id=cluster_id, clock=clock)


def queued_samples(count: int, *, session: str = "ses_a", start: int = T0) -> list[dict]:
    """``count`` one-second samples of one GPU, in time order."""
    return [{"sample_id": sample_id(session, GPU_A, start + (i + 1) * S), "session_id": session, "device_uuid": GPU_A,
             "start": format_ms(start + i * S), "end": format_ms(start + (i + 1) * S), "gpu_util_percent": None,
             "memory_used_mib": None} for i in range(count)]


def sampler_for(queue: UsageQueue, clock: Clock, interval: float = 60.0) -> UsageSampler:
    return UsageSampler(kubernetes.client.ApiClient(), queue, namespace="gshare-sessions", interval=interval, clock=clock)


# --------------------------------------------------------------------------- times, ids, windows


def test_times_and_sample_ids():
    assert format_ms(T0 + 123) == "2025-11-29T16:00:00.123Z"
    assert parse_time_ms("2025-11-29T16:00:00.123Z") == T0 + 123
    assert parse_time_ms("2025-11-29T16:00:00Z") == T0
    assert parse_time_ms(None) is None and parse_time_ms("yesterday") is None
    assert sample_id("ses_abc", GPU_A, T0) == f"ses_abc:{GPU_A}:{T0}"
    assert len(sample_id("ses_" + "a" * 16, GPU_A, T0)) <= 128  # the control plane's column


def test_split_window_at_the_maximum():
    assert USAGE_MAX_WINDOW_SECONDS == 600 and MAX_WINDOW_MS == 600_000
    assert split_window(T0, T0 + 60 * S) == [(T0, T0 + 60 * S)]
    assert split_window(T0, T0 + 600 * S) == [(T0, T0 + 600 * S)]
    assert split_window(T0, T0 + 1500 * S) == [(T0, T0 + 600 * S), (T0 + 600 * S, T0 + 1200 * S),
                                              (T0 + 1200 * S, T0 + 1500 * S)]
    assert split_window(T0, T0) == [] and split_window(T0, T0 - 1) == []


def test_first_window_is_bounded_by_the_interval_the_session_start_and_the_queue_creation():
    running = [SessionUsage("ses_a", (GPU_A, GPU_B), started_ms=T0 - 3600 * S)]
    samples, ends = plan_samples(running, {}, now_ms=T0, interval_ms=60 * S)
    assert windows_of(samples) == [(T0 - 60 * S, T0)] * 2  # now - interval
    assert [s["device_uuid"] for s in samples] == [GPU_A, GPU_B] and ends == {"ses_a": T0}
    assert samples[0] == {"sample_id": f"ses_a:{GPU_A}:{T0}", "session_id": "ses_a", "device_uuid": GPU_A,
                          "start": "2025-11-29T15:59:00.000Z", "end": "2025-11-29T16:00:00.000Z",
                          "gpu_util_percent": None, "memory_used_mib": None}

    fresh = [SessionUsage("ses_a", (GPU_A,), started_ms=T0 - 10 * S)]
    assert windows_of(plan_samples(fresh, {}, now_ms=T0, interval_ms=60 * S)[0]) == [(T0 - 10 * S, T0)]  # pod start
    # A queue file created 5 s ago (state lost with an old pod) never back-fills what an earlier operator reported.
    assert windows_of(plan_samples(running, {}, now_ms=T0, interval_ms=60 * S, floor_ms=T0 - 5 * S)[0]) == [
        (T0 - 5 * S, T0)] * 2


def test_windows_continue_from_the_previous_end_and_split_long_gaps():
    running = [SessionUsage("ses_a", (GPU_A,), started_ms=T0 - 3600 * S)]
    cursors: dict[str, int] = {}
    produced: list[dict] = []
    for now in (T0, T0 + 60 * S, T0 + 121 * S, T0 + 121 * S, T0 + 1621 * S):  # a repeat tick, then a 25-minute gap
        samples, ends = plan_samples(running, cursors, now_ms=now, interval_ms=60 * S)
        cursors.update(ends)
        produced += samples
    windows = windows_of(produced)
    assert windows[0] == (T0 - 60 * S, T0) and windows[-1][1] == T0 + 1621 * S
    assert_contiguous(windows)
    assert [end - start for start, end in windows] == [60 * S, 60 * S, 61 * S, 600 * S, 600 * S, 300 * S]
    assert len({s["sample_id"] for s in produced}) == len(produced)


def test_an_ended_session_gets_a_last_window_up_to_its_end_then_nothing():
    ended = [SessionUsage("ses_a", (GPU_A,), started_ms=T0 - 3600 * S, ended_ms=T0 + 30 * S)]
    samples, ends = plan_samples(ended, {"ses_a": T0}, now_ms=T0 + 60 * S, interval_ms=60 * S)
    assert windows_of(samples) == [(T0, T0 + 30 * S)] and ends == {"ses_a": T0 + 30 * S}
    assert plan_samples(ended, ends, now_ms=T0 + 120 * S, interval_ms=60 * S) == ([], {})
    # never seen running and ended long ago: nothing to charge
    assert plan_samples(ended, {}, now_ms=T0 + 3600 * S, interval_ms=60 * S) == ([], {})


def test_observe_sessions_reads_phase_and_gpus_like_the_status_reports():
    sessions = [gss("ses_run"), gss("ses_two"), gss("ses_pending"), gss("ses_done"), gss("ses_stopping", deleting=True),
                gss("ses_foreign"), gss("ses_nopod"), gss("ses_nogpu")]
    pods = [pod("ses_run"), pod("ses_two", devices=(GPU_A, GPU_B)), pod("ses_pending", phase="Pending"),
            pod("ses_done", phase="Succeeded", finished="2025-11-29T16:00:30Z"), pod("ses_stopping"),
            pod("ses_foreign", owner="someone-else"), pod("ses_nogpu", devices=())]
    metered, present = observe_sessions(sessions, pods)
    assert {m.session_id: m for m in metered} == {
        "ses_run": SessionUsage("ses_run", (GPU_A,), started_ms=T0 - 3600 * S),
        "ses_two": SessionUsage("ses_two", (GPU_A, GPU_B), started_ms=T0 - 3600 * S),
        "ses_done": SessionUsage("ses_done", (GPU_A,), started_ms=T0 - 3600 * S, ended_ms=T0 + 30 * S),
    }
    assert present == {"ses_run", "ses_two", "ses_pending", "ses_done", "ses_stopping", "ses_nogpu"}


# --------------------------------------------------------------------------- the queue


def test_queue_keeps_insertion_order_and_ignores_a_sample_queued_twice(tmp_path):
    with open_queue(tmp_path / "q.sqlite3") as queue:
        samples = queued_samples(10)
        queue.record(samples[:6], {"ses_a": T0 + 6 * S})
        queue.record(samples[4:], {"ses_a": T0 + 10 * S})
        assert len(queue) == 10
        assert [q.sample for q in queue.peek(100)] == samples
        assert [q.sample["sample_id"] for q in queue.peek(3)] == [s["sample_id"] for s in samples[:3]]
        queue.remove(queue.peek(3))
        assert [q.sample for q in queue.peek(100)] == samples[3:]


def test_a_full_queue_drops_the_oldest_samples_with_an_error(tmp_path, caplog):
    with open_queue(tmp_path / "q.sqlite3", max_samples=5) as queue:
        samples = queued_samples(8)
        assert queue.record(samples[:4], {}) == 0
        with caplog.at_level(logging.ERROR, logger="operator_agent.reporters.usage"):
            assert queue.record(samples[4:], {}) == 3
        assert [q.sample for q in queue.peek(100)] == samples[3:]
        assert "dropped the 3 oldest unsent samples" in caplog.text
        assert f"between {samples[0]['start']} and {samples[2]['end']}" in caplog.text


def test_queue_and_cursors_survive_a_reopen(tmp_path):
    path = tmp_path / "q.sqlite3"
    samples = queued_samples(3)
    with open_queue(path, clock=lambda: T0 - 99 * S) as queue:
        queue.record(samples, {"ses_a": T0 + 3 * S, "ses_b": T0})
        queue.record([], {}, forget=["ses_b"])
        created = queue.created_ms
    with open_queue(path, clock=lambda: T0 + 999 * S) as queue:
        assert [q.sample for q in queue.peek(10)] == samples
        assert queue.cursors() == {"ses_a": T0 + 3 * S}
        assert queue.created_ms == created == T0 - 99 * S  # set once, when the file is created
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_queue_of_another_cluster_or_in_a_missing_directory_is_refused(tmp_path):
    open_queue(tmp_path / "q.sqlite3").close()
    with pytest.raises(QueueError, match="belongs to cluster clu_usagetest00000001, not clu_other"):
        open_queue(tmp_path / "q.sqlite3", cluster_id="clu_other")
    with pytest.raises(QueueError, match="cannot open the usage queue"):
        open_queue(tmp_path / "missing" / "q.sqlite3")


def test_sampler_restart_neither_resamples_nor_skips(tmp_path):
    """Ticks, a stop, 25 minutes down, a new process on the same file: one contiguous run of windows per GPU."""
    path = tmp_path / "q.sqlite3"
    sessions, pods = [gss("ses_run")], [pod("ses_run", devices=(GPU_A, GPU_B))]
    clock = Clock(T0 - 3600 * S)  # the file was created an hour ago
    with open_queue(path, clock=clock) as queue:
        sampler = sampler_for(queue, clock)
        for step in (0, 60, 120):
            clock.now = T0 + step * S
            assert sampler.record(sessions, pods) == 2
    clock.now = T0 + 1620 * S
    with open_queue(path, clock=clock) as queue:
        assert sampler_for(queue, clock).record(sessions, pods) == 6  # 1500 s: 600 + 600 + 300, two GPUs
        samples = [q.sample for q in queue.peek(100)]
        assert queue.cursors() == {"ses_run": T0 + 1620 * S}
    for device in (GPU_A, GPU_B):
        windows = windows_of(samples, device)
        assert_contiguous(windows)
        assert windows[0][0] == T0 - 60 * S and windows[-1][1] == T0 + 1620 * S
    assert len({s["sample_id"] for s in samples}) == len(samples) == 12
    # the session's pod is gone: its cursor is forgotten
    with open_queue(path, clock=clock) as queue:
        sampler_for(queue, clock).record([], [])
        assert queue.cursors() == {}


# --------------------------------------------------------------------------- sending


class StubControlPlane:
    """``POST /internal/v1/usage`` on loopback; ``refuse(samples) -> (status, body) | None`` decides per batch."""

    def __init__(self) -> None:
        self.batches: list[list[dict]] = []
        self.stored: dict[str, dict] = {}
        self.refuse: Callable[[list[dict]], tuple[int, dict] | None] = lambda samples: None
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                assert self.path == USAGE_PATH and self.headers["Authorization"] == "Bearer operator-token"
                samples = body["samples"]
                with stub.lock:
                    stub.batches.append(samples)
                    refusal = stub.refuse(samples)
                    if refusal is None:
                        new = [s for s in samples if s["sample_id"] not in stub.stored]
                        stub.stored.update((s["sample_id"], s) for s in new)
                        status, answer = 200, {"server_time": "2025-11-29T16:00:00Z", "accepted": len(new),
                                               "duplicates": len(samples) - len(new), "charged": "0.1"}
                    else:
                        status, answer = refusal
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


@pytest.fixture
def stub() -> Iterator[StubControlPlane]:
    control_plane = StubControlPlane()
    try:
        yield control_plane
    finally:
        control_plane.server.shutdown()
        control_plane.server.server_close()


def client_for(url: str, tmp_path: Path) -> ControlPlaneClient:
    token = tmp_path / "internal-jwt"
    token.write_text("operator-token")
    config = OperatorConfig(cluster_id=CLUSTER, control_plane_url=url, token_file=str(token), http_timeout=5,
                            backoff_max=0.01)
    return ControlPlaneClient(config, sleep=lambda _: None, max_attempts=2)


def test_sends_oldest_first_in_batches_of_at_most_5000(tmp_path, stub):
    samples = queued_samples(12_001)
    with open_queue(tmp_path / "q.sqlite3") as queue:
        queue.record(samples, {})
        assert UsageSender(client_for(stub.url, tmp_path), queue).flush() is True
        assert len(queue) == 0
    assert [len(b) for b in stub.batches] == [USAGE_MAX_SAMPLES_PER_CALL, USAGE_MAX_SAMPLES_PER_CALL, 2001]
    assert [s["sample_id"] for b in stub.batches for s in b] == [s["sample_id"] for s in samples]
    assert [s for b in stub.batches for s in b] == samples  # what was queued is what is sent


def test_a_refused_sample_is_dropped_and_the_rest_delivered(tmp_path, stub, caplog):
    samples = queued_samples(10)
    poison = samples[6]["sample_id"]

    def refuse(batch):
        ids = [s["sample_id"] for s in batch]
        if poison in ids:
            return 400, {"code": INVALID_USAGE_SAMPLE, "detail": "window ends before it starts", "index": ids.index(poison)}
        return None

    stub.refuse = refuse
    with open_queue(tmp_path / "q.sqlite3") as queue:
        queue.record(samples, {})
        with caplog.at_level(logging.ERROR, logger="operator_agent.reporters.usage"):
            assert UsageSender(client_for(stub.url, tmp_path), queue, batch_size=4).flush() is True
        assert len(queue) == 0
    assert set(stub.stored) == {s["sample_id"] for s in samples} - {poison}
    assert f"usage sample {poison} dropped" in caplog.text and "window ends before it starts" in caplog.text
    # the refused batch is sent again at once without the poison (topped up with the next oldest)
    assert [[s["sample_id"] for s in b] for b in stub.batches] == [
        [samples[i]["sample_id"] for i in ids]
        for ids in ([0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 7, 8], [9])]


@pytest.mark.parametrize("refusal", [
    (400, {"code": "invalid_usage_batch", "detail": "no index"}),  # a 400 without index: a contract mismatch, not poison
    (400, {"code": INVALID_USAGE_SAMPLE, "detail": "index out of range", "index": 99}),
    (404, {"code": "not_found", "detail": "no such route"}),  # a control plane without the route yet
    (401, {"code": "token_invalid", "detail": "expired"}),
    (503, {"code": "unavailable", "detail": "down"}),
    (403, {"code": "forbidden", "detail": "a proxy said no"}),
])
def test_other_failures_keep_everything_for_the_next_tick(tmp_path, stub, refusal):
    samples = queued_samples(5)
    stub.refuse = lambda batch: refusal
    with open_queue(tmp_path / "q.sqlite3") as queue:
        queue.record(samples, {})
        sender = UsageSender(client_for(stub.url, tmp_path), queue)
        assert sender.flush() is False
        assert [q.sample for q in queue.peek(10)] == samples
        stub.refuse = lambda batch: None
        assert sender.flush() is True and len(queue) == 0
    assert set(stub.stored) == {s["sample_id"] for s in samples}


def test_an_unreachable_control_plane_keeps_everything(tmp_path, stub):
    samples = queued_samples(5)
    with open_queue(tmp_path / "q.sqlite3") as queue:
        queue.record(samples, {})
        closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
        url = f"http://127.0.0.1:{closed.server_address[1]}"
        closed.server_close()  # nothing listens there: connection refused
        assert UsageSender(client_for(url, tmp_path), queue).flush() is False
        assert len(queue) == 5
        assert UsageSender(client_for(stub.url, tmp_path), queue).flush() is True and len(queue) == 0


def test_a_foreign_session_is_dropped_session_by_session(tmp_path, stub, caplog):
    ours, foreign = queued_samples(3, session="ses_ours"), queued_samples(2, session="ses_foreign", start=T0 + 10 * S)
    stub.refuse = lambda batch: ((403, {"code": FORBIDDEN_CLUSTER_SCOPE, "detail": "session of another cluster"})
                                 if any(s["session_id"] == "ses_foreign" for s in batch) else None)
    with open_queue(tmp_path / "q.sqlite3") as queue:
        queue.record(ours[:2] + foreign + ours[2:], {})
        with caplog.at_level(logging.ERROR, logger="operator_agent.reporters.usage"):
            assert UsageSender(client_for(stub.url, tmp_path), queue).flush() is True
        assert len(queue) == 0
    assert set(stub.stored) == {s["sample_id"] for s in ours}
    assert [len(b) for b in stub.batches] == [5, 3, 2]
    assert "usage of session ses_foreign dropped (2 samples)" in caplog.text


def test_a_replayed_batch_is_harmless(tmp_path, stub):
    samples = queued_samples(4)
    with open_queue(tmp_path / "q.sqlite3") as queue:
        queue.record(samples, {})
        UsageSender(client_for(stub.url, tmp_path), queue).flush()
        queue.record(samples, {})  # e.g. the 200 was lost and the delete never happened
        UsageSender(client_for(stub.url, tmp_path), queue).flush()
    assert len(stub.stored) == 4 and [len(b) for b in stub.batches] == [4, 4]


# --------------------------------------------------------------------------- configuration and the loop


def test_usage_configuration():
    required = {"GSHARE_CLUSTER_ID": CLUSTER, "GSHARE_CONTROL_PLANE_URL": "https://gshare.example.com"}
    config = OperatorConfig.from_environ(required)
    assert (config.usage_interval, config.usage_queue_path, config.usage_queue_max) == (
        60.0, "/var/lib/gshare/usage-queue.sqlite3", 200_000)
    assert DEFAULT_USAGE_QUEUE_PATH == "/var/lib/gshare/usage-queue.sqlite3"
    config = OperatorConfig.from_environ({**required, "GSHARE_USAGE_INTERVAL": "1.5", "GSHARE_USAGE_QUEUE_MAX": "1000",
                                          "GSHARE_USAGE_QUEUE_PATH": "/data/q.sqlite3"})
    assert (config.usage_interval, config.usage_queue_path, config.usage_queue_max) == (1.5, "/data/q.sqlite3", 1000)
    for bad in ("0", "-1", "many", "1.5"):
        with pytest.raises(ConfigError, match="GSHARE_USAGE_QUEUE_MAX"):
            OperatorConfig.from_environ({**required, "GSHARE_USAGE_QUEUE_MAX": bad})
    with pytest.raises(ConfigError, match="GSHARE_USAGE_INTERVAL"):
        OperatorConfig.from_environ({**required, "GSHARE_USAGE_INTERVAL": "0"})


def test_the_loop_logs_a_queue_it_cannot_open_once_and_stops(tmp_path, caplog):
    config = OperatorConfig(cluster_id=CLUSTER, control_plane_url="http://127.0.0.1:9", token_file=str(tmp_path / "t"),
                            usage_interval=0.01, usage_queue_path=str(tmp_path / "missing" / "q.sqlite3"))
    stop = threading.Event()
    thread = threading.Thread(target=run_usage, args=(config, kubernetes.client.ApiClient(), None, stop))
    with caplog.at_level(logging.ERROR, logger="operator_agent.reporters.usage"):
        thread.start()
        threading.Event().wait(0.2)
        stop.set()
        thread.join(5)
    assert not thread.is_alive()
    errors = [r for r in caplog.records if r.name == "operator_agent.reporters.usage"]
    assert len(errors) == 1 and "usage metering off until this is fixed: cannot open the usage queue" in errors[0].message


def test_a_new_queue_file_meters_running_sessions_from_its_creation(tmp_path):
    """No back-fill after the state was lost (first install, an emptyDir gone with its pod): never twice."""
    clock = Clock(T0)
    with open_queue(tmp_path / "q.sqlite3", clock=clock) as queue:
        sampler = sampler_for(queue, clock)
        assert sampler.record([gss("ses_run")], [pod("ses_run")]) == 0
        clock.now = T0 + 60 * S
        assert sampler.record([gss("ses_run")], [pod("ses_run")]) == 1
        assert windows_of([q.sample for q in queue.peek(10)]) == [(T0, T0 + 60 * S)]
