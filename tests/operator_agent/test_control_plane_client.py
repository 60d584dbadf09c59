"""ControlPlaneClient against a real HTTP server on 127.0.0.1 (no mocked transport)."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contract import CLUSTER_DEREGISTERED, FORBIDDEN_CLUSTER_SCOPE, INVENTORY_PATH, TOKEN_INVALID
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import (
    ControlPlaneAuthError,
    ControlPlaneClient,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
    TokenUnavailable,
    backoff_delay,
)

TOKEN_A = "eyJhbGciOiJSUzI1NiJ9.TOKEN-A-SECRET-VALUE.c2lnbmF0dXJl"
TOKEN_B = "eyJhbGciOiJSUzI1NiJ9.TOKEN-B-SECRET-VALUE.c2lnbmF0dXJl"
SNAPSHOT = {"nodes": [{"name": "gpu-node-01", "labels": {"gpu": "on"}, "ready": True, "devices": []}]}
OK_BODY = {"server_time": "2026-01-01T00:00:00Z", "nodes": 1}


@dataclass
class Reply:
    status: int
    body: object = None
    headers: dict = field(default_factory=dict)


@dataclass
class FakeControlPlane:
    """Scripted replies (200 OK_BODY when the script is empty); records every request."""

    url: str = ""
    script: deque = field(default_factory=deque)
    requests: list = field(default_factory=list)

    @property
    def tokens(self) -> list[str]:
        return [r["authorization"] for r in self.requests]


@pytest.fixture
def control_plane() -> Iterator[FakeControlPlane]:
    state = FakeControlPlane()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            state.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "authorization": self.headers.get("Authorization"),
                    "content_type": self.headers.get("Content-Type"),
                    "body": json.loads(raw) if raw else None,
                }
            )
            reply = state.script.popleft() if state.script else Reply(200, OK_BODY)
            payload = b"" if reply.body is None else (
                reply.body.encode() if isinstance(reply.body, str) else json.dumps(reply.body).encode()
            )
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format, *args):  # keep the test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "internal-jwt"
    path.write_text(TOKEN_A + "\n")
    return path


def make_client(url, token_file, *, sleep=None, backoff_max=60.0, rng=lambda: 1.0, **kwargs):
    config = OperatorConfig(
        cluster_id="c-test",
        control_plane_url=url,
        token_file=str(token_file),
        http_timeout=5.0,
        backoff_max=backoff_max,
    )
    delays: list[float] = []

    def record(delay: float) -> None:
        delays.append(delay)

    client = ControlPlaneClient(config, sleep=sleep or record, rng=rng, **kwargs)
    return client, delays


def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- success and token handling


def test_put_inventory_sends_snapshot_with_bearer_token(control_plane, token_file):
    client, delays = make_client(control_plane.url, token_file)

    assert client.put_inventory(SNAPSHOT) == OK_BODY

    (request,) = control_plane.requests
    assert request["method"] == "PUT"
    assert request["path"] == INVENTORY_PATH
    assert request["authorization"] == f"Bearer {TOKEN_A}"  # surrounding whitespace of the file is stripped
    assert request["content_type"] == "application/json"
    assert request["body"] == SNAPSHOT
    assert delays == []


def test_token_is_reread_between_calls(control_plane, token_file):
    client, _ = make_client(control_plane.url, token_file)
    client.put_inventory(SNAPSHOT)
    token_file.write_text(TOKEN_B)
    client.put_inventory(SNAPSHOT)
    assert control_plane.tokens == [f"Bearer {TOKEN_A}", f"Bearer {TOKEN_B}"]


def test_token_is_reread_between_retry_attempts(control_plane, token_file):
    control_plane.script.extend([Reply(503, {"code": "unavailable", "detail": "try later"})])

    def rotate_during_backoff(delay):
        token_file.write_text(TOKEN_B)

    client, _ = make_client(control_plane.url, token_file, sleep=rotate_during_backoff)
    assert client.put_inventory(SNAPSHOT) == OK_BODY
    assert control_plane.tokens == [f"Bearer {TOKEN_A}", f"Bearer {TOKEN_B}"]


def test_missing_token_file_sends_nothing(control_plane, tmp_path, caplog):
    missing = tmp_path / "nope"
    client, _ = make_client(control_plane.url, missing)
    with pytest.raises(TokenUnavailable):
        client.put_inventory(SNAPSHOT)
    assert control_plane.requests == []
    assert str(missing) in caplog.text


def test_empty_token_file_sends_nothing(control_plane, token_file, caplog):
    token_file.write_text("\n")
    client, _ = make_client(control_plane.url, token_file)
    with pytest.raises(TokenUnavailable, match="empty"):
        client.put_inventory(SNAPSHOT)
    assert control_plane.requests == []


def test_empty_success_body_returns_empty_dict(control_plane, token_file):
    control_plane.script.append(Reply(204))
    client, _ = make_client(control_plane.url, token_file)
    assert client.put_inventory(SNAPSHOT) == {}


# --------------------------------------------------------------------------- retries and backoff


def test_backoff_on_503_then_success(control_plane, token_file, caplog):
    control_plane.script.extend([Reply(503, {"code": "unavailable", "detail": "database restarting"})] * 3)
    client, delays = make_client(control_plane.url, token_file, rng=lambda: 1.0)

    with caplog.at_level(logging.WARNING, logger="operator_agent.control_plane_client"):
        assert client.put_inventory(SNAPSHOT) == OK_BODY

    assert len(control_plane.requests) == 4
    assert delays == [1.0, 2.0, 4.0]  # base 1 s, doubling; rng 1.0 = top of the jitter range
    assert "database restarting" in caplog.text
    assert "retrying" in caplog.text


def test_backoff_jitter_stays_within_half_to_full_delay(control_plane, token_file):
    control_plane.script.extend([Reply(500, "oops")] * 3)
    client, delays = make_client(control_plane.url, token_file, rng=lambda: 0.0)
    client.put_inventory(SNAPSHOT)
    assert delays == [0.5, 1.0, 2.0]


def test_backoff_is_capped(control_plane, token_file):
    control_plane.script.extend([Reply(502, "bad gateway")] * 5)
    client, delays = make_client(control_plane.url, token_file, backoff_max=3.0, max_attempts=6)
    assert client.put_inventory(SNAPSHOT) == OK_BODY
    assert delays == [1.0, 2.0, 3.0, 3.0, 3.0]


def test_retry_after_is_honoured_up_to_the_cap(control_plane, token_file):
    control_plane.script.extend(
        [
            Reply(503, {"detail": "busy"}, {"Retry-After": "7"}),
            Reply(429, {"detail": "slow down"}, {"Retry-After": "600"}),
        ]
    )
    client, delays = make_client(control_plane.url, token_file, backoff_max=30.0, rng=lambda: 0.0)
    assert client.put_inventory(SNAPSHOT) == OK_BODY
    assert delays == [7.0, 30.0]


def test_gives_up_after_max_attempts(control_plane, token_file):
    control_plane.script.extend([Reply(503, {"code": "unavailable", "detail": "down"})] * 3)
    client, delays = make_client(control_plane.url, token_file, max_attempts=3)
    with pytest.raises(ControlPlaneUnavailable, match="3 attempts"):
        client.put_inventory(SNAPSHOT)
    assert len(control_plane.requests) == 3
    assert len(delays) == 2


def test_connection_errors_are_retried(token_file, caplog):
    client, delays = make_client(f"http://127.0.0.1:{closed_port()}", token_file, max_attempts=3)
    with pytest.raises(ControlPlaneUnavailable, match="ConnectionError"):
        client.put_inventory(SNAPSHOT)
    assert delays == [1.0, 2.0]


def test_stop_request_ends_retries(control_plane, token_file):
    control_plane.script.extend([Reply(503, "down")] * 5)
    stop = threading.Event()
    client, _ = make_client(control_plane.url, token_file, sleep=lambda delay: stop.set(), stopped=stop.is_set)
    with pytest.raises(ControlPlaneUnavailable, match="stopped"):
        client.put_inventory(SNAPSHOT)
    assert len(control_plane.requests) == 1


@pytest.mark.parametrize(
    ("attempt", "rng", "cap", "expected"),
    [
        (0, 1.0, 60, 1.0),
        (0, 0.0, 60, 0.5),
        (3, 1.0, 60, 8.0),
        (10, 1.0, 60, 60.0),
        (10, 0.0, 60, 30.0),
        (500, 1.0, 5, 5.0),
    ],
)
def test_backoff_delay(attempt, rng, cap, expected):
    assert backoff_delay(attempt, cap=cap, rng=lambda: rng) == expected


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("code", "detail"),
    [
        (TOKEN_INVALID, "The operator token expired at 2026-01-08T00:00:00Z; rotate it with the attach command."),
        (CLUSTER_DEREGISTERED, "Cluster c-test was deregistered; its operator tokens are no longer accepted."),
    ],
)
def test_401_logs_rotate_line_and_does_not_retry(control_plane, token_file, caplog, code, detail):
    control_plane.script.append(Reply(401, {"code": code, "detail": detail}))
    client, delays = make_client(control_plane.url, token_file)

    with pytest.raises(ControlPlaneAuthError) as excinfo:
        client.put_inventory(SNAPSHOT)

    assert excinfo.value.status == 401
    assert excinfo.value.code == code
    assert len(control_plane.requests) == 1
    assert delays == []
    lines = [r.getMessage() for r in caplog.records if "operator token expired or revoked: rotate it" in r.getMessage()]
    assert len(lines) == 1
    assert detail in lines[0]
    assert code in lines[0]


def test_403_logs_code_and_detail(control_plane, token_file, caplog):
    detail = "Node gpu-node-09 belongs to cluster c-other; nothing was changed."
    control_plane.script.append(Reply(403, {"code": FORBIDDEN_CLUSTER_SCOPE, "detail": detail}))
    client, delays = make_client(control_plane.url, token_file)

    with pytest.raises(ControlPlaneRejected) as excinfo:
        client.put_inventory(SNAPSHOT)

    assert excinfo.value.status == 403
    assert excinfo.value.code == FORBIDDEN_CLUSTER_SCOPE
    assert len(control_plane.requests) == 1
    assert delays == []
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(FORBIDDEN_CLUSTER_SCOPE in line and detail in line and "403" in line for line in errors), errors


def test_other_4xx_is_not_retried(control_plane, token_file, caplog):
    control_plane.script.append(Reply(400, {"code": "invalid", "detail": "nodes[0].devices[0].uuid is required"}))
    client, delays = make_client(control_plane.url, token_file)
    with pytest.raises(ControlPlaneRejected):
        client.put_inventory(SNAPSHOT)
    assert delays == []
    assert "nodes[0].devices[0].uuid is required" in caplog.text


def test_non_json_error_body_is_logged_as_text(control_plane, token_file, caplog):
    control_plane.script.append(Reply(403, "<html>Forbidden by proxy</html>"))
    client, _ = make_client(control_plane.url, token_file)
    with pytest.raises(ControlPlaneRejected):
        client.put_inventory(SNAPSHOT)
    assert "Forbidden by proxy" in caplog.text


# --------------------------------------------------------------------------- secrecy


def test_token_is_never_logged(control_plane, token_file, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, urllib3 included
    errors: list[str] = []

    control_plane.script.extend(
        [
            Reply(503, {"code": "unavailable", "detail": "down"}),
            Reply(200, OK_BODY),
            Reply(401, {"code": TOKEN_INVALID, "detail": "expired"}),
            Reply(403, {"code": FORBIDDEN_CLUSTER_SCOPE, "detail": "other cluster"}),
            Reply(500, "boom"),
            Reply(500, "boom"),
        ]
    )
    client, _ = make_client(control_plane.url, token_file, max_attempts=2)
    client.put_inventory(SNAPSHOT)
    for _ in range(3):
        token_file.write_text(TOKEN_B)
        try:
            client.put_inventory(SNAPSHOT)
        except Exception as exc:  # collect every failure's text
            errors.append(repr(exc))

    unreachable, _ = make_client(f"http://127.0.0.1:{closed_port()}", token_file, max_attempts=2)
    try:
        unreachable.put_inventory(SNAPSHOT)
    except ControlPlaneUnavailable as exc:
        errors.append(repr(exc))

    assert len(errors) == 4
    assert caplog.records  # something was logged at all
    for secret in (TOKEN_A, TOKEN_B, "TOKEN-A-SECRET-VALUE", "TOKEN-B-SECRET-VALUE"):
        assert secret not in caplog.text
        assert all(secret not in text for text in errors)
