"""Hostile answers of HAMi's vGPU monitor (and of the apiserver's pod proxy in front of it), served over loopback by the
fake apiserver of ``test_activity``: floods, trickles, bytes that are not text, label values built to be taken for
another pod, out-of-range numbers, duplicate and foreign series, both naming schemes at once.

Whatever the monitor answers, the report sent must validate against ``contract.ACTIVITY_SCHEMA``, never attribute a
series of another pod (or another namespace's pod of the same name) to a session, never report zeros for a monitor that
could not be read, and the activity loop must keep running with no scraping thread left behind.
"""

from __future__ import annotations

import dataclasses
import gzip
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import kubernetes.client
import pytest

from operator_agent.hami_monitor import MAX_EXPOSITION_BYTES, MAX_SERIES, MonitorParseError, parse_monitor
from operator_agent.reporters.activity import run_activity
from tests.operator_agent.hami_exposition import Series, exposition
from tests.operator_agent.test_activity import (  # noqa: F401 (cluster, metrics_clock: the fixtures)
    GPU_A,
    GPU_B,
    NS,
    Held,
    by_session,
    cluster,
    metrics_clock,
    monitor_pod,
    session_pod,
    text,
    valid,
)

VALUES = ("last_kernel_seconds", "utilization_percent", "memory_used_bytes", "memory_limit_bytes")
NULLS = dict.fromkeys(VALUES)
PLUGIN = "hami-device-plugin-node-a"


def answer_with(status: int, body_parts: Callable[[], list[bytes]] | bytes, *, interval: float = 0.0,
                content_type: str = "text/plain") -> Callable[[BaseHTTPRequestHandler], None]:
    """An answer of ``status`` sending ``body_parts`` (bytes, or parts written ``interval`` seconds apart), no length."""
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.end_headers()
        parts = [body_parts] if isinstance(body_parts, bytes) else body_parts()
        try:
            for part in parts:
                handler.wfile.write(part)
                handler.wfile.flush()
                if interval:
                    time.sleep(interval)
        except OSError:
            pass  # the scraper gave up: expected
    return answer


def one_session(fake, answer, devices=(GPU_A,)) -> None:
    fake.session_pods = [session_pod("ses_busy", "node-a", devices)]
    fake.monitor_pods = [monitor_pod("node-a")]
    fake.proxy = {PLUGIN: answer}


def tick_entry(cluster) -> dict:  # noqa: F811
    fake, stub, reporter, _ = cluster
    stub.bodies.clear()
    assert reporter.tick() is True
    [body] = stub.bodies
    return by_session(valid(body))["ses_busy"]


def unknown(entry: dict, words: str) -> None:
    assert entry["state"] == "unknown" and entry["gpus"] == [] and words in entry["reason"], entry


def gpu_values(entry: dict) -> dict[str, dict]:
    assert entry["state"] == "ok", entry
    return {g["device_uuid"]: {k: g[k] for k in VALUES} for g in entry["gpus"]}


def scraping_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hami-monitor") and t.is_alive()]


def scraping_threads_left() -> list[threading.Thread]:
    """The scraping threads still alive once each was given ``Held.SAFETY`` s to end (a thread still reading a body
    never ends by itself; a finished one ends as soon as its pool, shut down by the tick, hands it no more work)."""
    for thread in scraping_threads():
        thread.join(Held.SAFETY)
    return scraping_threads()


def tick_held(cluster, held: Held) -> dict:  # noqa: F811
    """``tick_entry`` while ``held`` holds the monitor's answer: the tick must end before the answer does, and the
    scraper must have closed its end of the connection."""
    try:
        entry = tick_entry(cluster)
        assert not held.finished.is_set(), "the tick waited for the monitor's answer to end"
    finally:
        held.release.set()
    assert held.finished.wait(Held.SAFETY) and held.peer_closed.is_set(), "the scraper kept the connection open"
    return entry


def busy(pod: str = "ses-busy", namespace: str = NS, uuid: str = GPU_A, **values) -> Series:
    fields = {"used": 1 << 30, "limit": 4 << 30, "util": 50, "last_kernel": 3.0, **values}
    return Series(namespace, pod, "main", 0, uuid, **fields)


# --- size and time -----------------------------------------------------------------------------------------------------

def test_a_body_over_the_limit_is_unknown_not_zeros(cluster):  # noqa: F811
    head = exposition([busy()])
    flood = head + b"# padding " + b"x" * (MAX_EXPOSITION_BYTES + 1024 * 1024) + b"\n"
    one_session(cluster[0], text(flood))
    unknown(tick_entry(cluster), f"more than {MAX_EXPOSITION_BYTES} bytes")


def test_a_body_trickling_a_byte_a_second_costs_the_scrapes_timeout(cluster):  # noqa: F811
    held = Held()
    one_session(cluster[0], held.trickle(1.0, part=b"#"))
    unknown(tick_held(cluster, held), "did not finish its answer within 1 s")
    assert scraping_threads_left() == []


@pytest.mark.parametrize("status", [500, 503])
def test_an_error_status_with_a_huge_body_is_not_read_whole(cluster, status):  # noqa: F811
    one_session(cluster[0], answer_with(status, lambda: [b"e" * (1 << 20)] * 64))  # 64 MiB
    entry = tick_entry(cluster)
    unknown(entry, f"answered {status}")
    assert len(entry["reason"]) <= 1000


def test_an_error_status_trickling_its_body_leaves_no_thread_behind(cluster):  # noqa: F811
    # Each byte arrives before the read timeout (1 s), so only the scrape's own deadline can end it.
    held = Held()
    one_session(cluster[0], held.trickle(0.3, status=503, part=b"x"))
    unknown(tick_held(cluster, held), "answered 503")
    assert held.lines_sent >= 1
    assert scraping_threads_left() == [], "a scraping thread still reads the trickling error body"


def test_a_gzip_bomb_is_bounded_by_its_decoded_size(cluster):  # noqa: F811
    bomb = gzip.compress(exposition([busy()]) + b"#" * (256 << 20), compresslevel=1)  # 256 MiB of text in ~1 MiB

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", str(len(bomb)))
        handler.end_headers()
        try:
            handler.wfile.write(bomb)
        except OSError:
            pass

    one_session(cluster[0], answer)
    tracemalloc.start()
    try:
        entry = tick_entry(cluster)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    unknown(entry, f"more than {MAX_EXPOSITION_BYTES} bytes")
    assert peak < 64 << 20, f"{peak} bytes held reading a 1 MiB gzip answer"


# --- bytes that are not Prometheus text ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "words"), [
    (exposition([busy()]) + b"# bad \xff\xfe utf-8\n", "not UTF-8"),
    (exposition([busy()]).replace(b"ses-busy", b"ses-\x00busy", 1), "NUL"),
    (b'hami_vgpu_memory_used_bytes{namespace="gshare-sessions",pod="ses-busy" 1\n', "not Prometheus text"),
    (b"\xef\xbb\xbf" + exposition([busy()]), ""),  # a BOM: refused or read, never zeros
])
def test_undecodable_answers_are_unknown(cluster, body, words):  # noqa: F811
    one_session(cluster[0], text(body))
    entry = tick_entry(cluster)
    if entry["state"] == "ok":  # only the BOM case may parse; then the values are the monitor's
        assert gpu_values(entry)[GPU_A]["memory_used_bytes"] == 1 << 30
    else:
        unknown(entry, words)


# --- labels built to be taken for the session's pod ----------------------------------------------------------------------

@pytest.mark.parametrize("pod_label", [
    'ses-busy\\"', "ses-busy\\n", "ses-busy\\\\", 'ses-busy\\",namespace=\\"gshare-sessions', "SES-BUSY", " ses-busy",
    "ses-busy ", "ses-busy\\t",
])
def test_label_values_with_quotes_newlines_and_escapes_are_not_the_sessions_pod(cluster, pod_label):  # noqa: F811
    body = (f'hami_vgpu_memory_used_bytes{{namespace="{NS}",pod="{pod_label}",container="main",vdevice_index="0",'
            f'device_uuid="{GPU_A}",zone="vGPU"}} 123456\n').encode()
    one_session(cluster[0], text(body))
    assert gpu_values(tick_entry(cluster)) == {GPU_A: NULLS}


@pytest.mark.parametrize("labels", [
    f'namespace="attacker",namespace="{NS}",pod="ses-busy"', f'namespace="{NS}",pod="other",pod="ses-busy"',
])
def test_a_label_given_twice_is_refused_not_read_either_way(cluster, labels):  # noqa: F811
    body = f'hami_vgpu_memory_used_bytes{{{labels},container="main",vdevice_index="0",device_uuid="{GPU_A}"}} 5\n'.encode()
    one_session(cluster[0], text(body))
    unknown(tick_entry(cluster), "not Prometheus text")


def test_series_of_another_namespaces_pod_of_the_same_name_are_never_the_sessions(cluster):  # noqa: F811
    body = exposition([busy(namespace="attacker", used=7 << 30, util=100, last_kernel=0),
                       busy(namespace="", used=7 << 30, util=100, last_kernel=0),
                       busy(namespace="gshare-sessions-x", used=7 << 30, util=100, last_kernel=0)])
    legacy = (f'vGPU_device_memory_usage_in_bytes{{podnamespace="attacker",podname="ses-busy",ctrname="main",vdeviceid="0",'
              f'deviceuuid="{GPU_A}"}} 999\n').encode()
    one_session(cluster[0], text(body + legacy))
    assert gpu_values(tick_entry(cluster)) == {GPU_A: NULLS}


def test_a_device_the_session_does_not_hold_is_left_out(cluster):  # noqa: F811
    one_session(cluster[0], text(exposition([busy(uuid=GPU_B, used=7 << 30), busy(uuid=GPU_A)])))
    assert gpu_values(tick_entry(cluster)) == {GPU_A: {"last_kernel_seconds": 3.0, "utilization_percent": 50.0,
                                                       "memory_used_bytes": 1 << 30, "memory_limit_bytes": 4 << 30}}


# --- numbers -------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-1", "1e308", "-0", "9.3e18", "0x10", "1e-400"])
def test_out_of_range_values_are_null_or_the_number_never_a_made_up_one(cluster, value):  # noqa: F811
    labels = f'namespace="{NS}",pod="ses-busy",container="main",vdevice_index="0",device_uuid="{GPU_A}"'
    body = "".join(f"{name}{{{labels}}} {value}\n" for name in (
        "hami_container_last_kernel_elapsed_seconds", "hami_container_device_utilization_ratio",
        "hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes")).encode()
    one_session(cluster[0], text(body))
    entry = tick_entry(cluster)
    if entry["state"] == "unknown":
        unknown(entry, "not Prometheus text")  # "0x10" is not a Prometheus number
        return
    got = gpu_values(entry)[GPU_A]
    number = float(value)
    for key in VALUES:
        assert got[key] is None or got[key] == (int(number) if key.startswith("memory") else number), (key, got[key])
    if value in ("NaN", "+Inf", "-Inf", "-1", "1e308", "9.3e18"):
        assert got["memory_used_bytes"] is None and got["memory_limit_bytes"] is None


def test_duplicate_series_and_many_vdevices_stay_in_range(cluster):  # noqa: F811
    labels = f'namespace="{NS}",pod="ses-busy",container="main",device_uuid="{GPU_A}"'
    lines = []
    for index in range(8):  # eight vGPUs of one GPU at the largest memory: the sum is capped, not overflowed
        lines.append(f'hami_vgpu_memory_used_bytes{{{labels},vdevice_index="{index}"}} 9.2e18\n')
    lines += [f'hami_container_device_utilization_ratio{{{labels},vdevice_index="0"}} {v}\n' for v in (10, 99, 100, 101)]
    one_session(cluster[0], text("".join(lines).encode()))
    got = gpu_values(tick_entry(cluster))[GPU_A]
    assert got["memory_used_bytes"] == 2**63 - 1
    assert got["utilization_percent"] in (None, 10.0, 99.0, 100.0)


def python_calls(work: Callable[[], object]) -> int:
    """How many Python function calls ``work`` makes in this thread: a measure of work that, unlike seconds, does not
    depend on how busy the machine is."""
    calls = 0

    def count(frame, event, arg):  # noqa: ARG001
        nonlocal calls
        if event == "call":
            calls += 1

    previous = sys.getprofile()
    sys.setprofile(count)
    try:
        work()
    finally:
        sys.setprofile(previous)
    return calls


def others_body(count: int) -> bytes:
    others = [busy(pod=f"other-{i}", uuid=GPU_A if i % 2 else GPU_B, used=5 << 30) for i in range(count)]
    return exposition([*others, busy(used=2 << 30)])


def test_thousands_of_containers_of_other_pods(cluster):  # noqa: F811
    """Among 3,000 containers of other pods the session's own is found. The fixture's 1 s scrape timeout (what the
    hung-monitor tests need) is not the subject here: on a busy machine the big answer may take longer, so the scrape
    gets the time a hang guard needs, and the work is bounded by counting below, not by seconds."""
    fake, _, reporter, _ = cluster
    reporter.config = dataclasses.replace(reporter.config, hami_monitor_timeout=300.0)
    one_session(fake, text(others_body(3000)))
    got = gpu_values(tick_entry(cluster))
    assert got[GPU_A]["memory_used_bytes"] == 2 << 30


def test_the_work_of_reading_one_pod_grows_linearly_with_the_other_pods():
    """Parsing the answer and picking out one session's pod costs work in proportion to the series, not their square:
    ten times the other pods' containers cost at most about ten times the calls (counted, not timed)."""
    def read(count: int) -> Callable[[], object]:
        body = others_body(count)
        return lambda: parse_monitor(body).for_pod(NS, "ses-busy")

    small, large = python_calls(read(300)), python_calls(read(3000))
    assert parse_monitor(others_body(3000)).for_pod(NS, "ses-busy")[GPU_A].memory_used_bytes == 2 << 30
    assert 5 * small < large < 11 * small, (small, large)


def test_more_samples_than_max_series_is_refused():
    line = b'hami_vgpu_memory_used_bytes{pod="p",namespace="n",container="c",vdevice_index="0",device_uuid="u"} 1\n'
    with pytest.raises(MonitorParseError, match="more than"):
        parse_monitor(line * (MAX_SERIES + 1))


def test_both_schemes_at_once_read_the_current_one_alone(cluster):  # noqa: F811
    body = exposition([busy(used=1 << 30, limit=4 << 30)], legacy_too=True)
    legacy_only_pod = (f'vGPU_device_memory_usage_in_bytes{{podnamespace="{NS}",podname="ses-busy",ctrname="side",'
                       f'vdeviceid="1",deviceuuid="{GPU_A}"}} {7 << 30}\n').encode()
    one_session(cluster[0], text(body + legacy_only_pod))
    got = gpu_values(tick_entry(cluster))[GPU_A]
    assert (got["memory_used_bytes"], got["memory_limit_bytes"]) == (1 << 30, 4 << 30)


# --- the loop ------------------------------------------------------------------------------------------------------------

def test_the_activity_loop_survives_a_hostile_monitor(cluster):  # noqa: F811
    fake, stub, reporter, metrics = cluster
    answers = iter([text(b"\xff" * 100), answer_with(500, b"boom"), text(exposition([busy()]))])
    state = {"answer": next(answers)}

    def rotating(handler):
        current = state["answer"]
        state["answer"] = next(answers, current)
        current(handler)

    one_session(fake, rotating)
    config = dataclasses.replace(reporter.config, activity_interval=0.2)
    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=reporter.core.api_client.configuration.host))
    stop = threading.Event()
    loop = threading.Thread(target=run_activity, args=(config, api, reporter.client, stop), daemon=True)
    stub.bodies.clear()
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while len(stub.bodies) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert loop.is_alive()
    finally:
        stop.set()
        loop.join(5)
        api.close()
    assert not loop.is_alive()
    states = [by_session(valid(body))["ses_busy"]["state"] for body in stub.bodies[:3]]
    assert states == ["unknown", "unknown", "ok"]
