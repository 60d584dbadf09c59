"""The operator process: configuration errors and clean shutdown on SIGTERM/SIGINT.

The process runs for real (``python -m operator_agent``). Its apiserver and control plane
point at closed loopback ports, so every tick fails and is logged; a successful report
against the Kubernetes API emulator is covered by the end-to-end tests.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def operator_env(tmp_path: Path, **overrides: str) -> dict:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""\
apiVersion: v1
kind: Config
clusters:
- name: down
  cluster:
    server: http://127.0.0.1:{closed_port()}
contexts:
- name: down
  context: {{cluster: down, user: operator}}
current-context: down
users:
- name: operator
  user: {{token: REDACTED}}
"""
    )
    token = tmp_path / "internal-jwt"
    token.write_text("not-a-real-token")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GSHARE_", "KUBERNETES_SERVICE_"))}
    env.update(
        {
            "KUBECONFIG": str(kubeconfig),
            "GSHARE_CLUSTER_ID": "c-test",
            "GSHARE_CONTROL_PLANE_URL": f"http://127.0.0.1:{closed_port()}",
            "GSHARE_TOKEN_FILE": str(token),
            "GSHARE_INVENTORY_INTERVAL": "0.5",
            "GSHARE_HTTP_TIMEOUT": "2",
            "GSHARE_METRICS_PORT": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(overrides)
    return env


def start(env: dict, *args: str) -> tuple[subprocess.Popen, queue.Queue]:
    process = subprocess.Popen(
        [sys.executable, "-m", "operator_agent", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return process, lines


def wait_for_line(lines: queue.Queue, fragment: str, timeout: float = 30.0) -> list[str]:
    """Read ``lines`` (the operator's output, ``None`` at its end) until one contains ``fragment``; the lines read.

    AssertionError, with the output, if the output ends or ``timeout`` s pass first.
    """
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if fragment in line:
            return seen
    raise AssertionError(f"{fragment!r} not logged; output was:\n{''.join(seen)}")


def drain(lines: queue.Queue) -> str:
    out = []
    while True:
        try:
            line = lines.get(timeout=5)
        except queue.Empty:
            break
        if line is None:
            break
        out.append(line)
    return "".join(out)


def test_missing_configuration_exits_2(tmp_path):
    env = operator_env(tmp_path)
    del env["GSHARE_CLUSTER_ID"]
    result = subprocess.run(
        [sys.executable, "-m", "operator_agent"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "GSHARE_CLUSTER_ID is required" in result.stderr


def test_once_with_apiserver_down_exits_1(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "operator_agent", "--once"],
        cwd=REPO_ROOT,
        env=operator_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "cannot reach the apiserver" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_loop_with_exit_0(tmp_path, signum):
    process, lines = start(operator_env(tmp_path))
    try:
        wait_for_line(lines, "cannot reach the apiserver")  # the loop is running and survives failed ticks
        process.send_signal(signum)
        assert process.wait(timeout=30) == 0
        output = drain(lines)
        assert "operator stopped" in output
        assert "Traceback" not in output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_process_serves_its_metrics_and_runs_the_activity_loop(tmp_path):
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    port = closed_port()
    process, lines = start(operator_env(tmp_path, GSHARE_METRICS_PORT=str(port), GSHARE_METRICS_ADDRESS="127.0.0.1"))
    try:
        seen = "".join(wait_for_line(lines, f"operator metrics at http://127.0.0.1:{port}/metrics"))
        seen += "".join(wait_for_line(lines, "activity not reported: cannot reach the apiserver"))
        assert "GPU activity every 30s from HAMi's vGPU monitor" in seen
        answer = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert answer.status_code == 200
        samples = [s for family in text_string_to_metric_families(answer.text) for s in family.samples]
        ages = {s.labels["report"]: s.value for s in samples if s.name == "gshare_operator_report_age_seconds"}
        assert set(ages) == {"inventory", "status", "storage", "usage", "activity"}  # nothing got through: since start
        assert all(0 <= age < 120 for age in ages.values())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "Traceback" not in drain(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_busy_metrics_port_is_logged_and_the_operator_runs_on(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process, lines = start(operator_env(tmp_path, GSHARE_METRICS_PORT=str(port), GSHARE_METRICS_ADDRESS="127.0.0.1"))
        try:
            wait_for_line(lines, "operator /metrics not served: cannot listen on 127.0.0.1 port")
            wait_for_line(lines, "cannot reach the apiserver")  # the loops run on
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
