"""What the operator's log says when it cannot report: each failure of the guide's "Registered, but no nodes appear",
against a real loopback server (or a name that cannot resolve), in one sentence with its fix."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest

from demo.emulator.tls import generate_certificates
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneAuthError, ControlPlaneClient, ControlPlaneRejected, ControlPlaneUnavailable
from tests.helpers import serving

SNAPSHOT = {"nodes": []}
CONSOLE_PAGE = b"<!doctype html><html><head><title>Log in | gShare</title></head><body>console</body></html>"
NGINX_403 = b"<html><head><title>403 Forbidden</title></head><body><center><h1>403 Forbidden</h1></center><hr><center>nginx</center></body></html>"


@contextmanager
def serve(status: int, body: bytes, content_type: str = "text/html", *, tls=None) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            pass

    with serving(Handler, tls=tls) as url:
        yield url


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "internal-jwt"
    path.write_text("eyJhbGciOiJSUzI1NiJ9.SECRET-TOKEN-VALUE.c2ln\n")
    return path


def client_for(url: str, token_file) -> ControlPlaneClient:
    config = OperatorConfig(cluster_id="clu_test", control_plane_url=url, token_file=str(token_file), http_timeout=3.0)
    return ControlPlaneClient(config, sleep=lambda delay: None, max_attempts=2)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def error_lines(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_a_name_that_does_not_resolve_is_a_dns_failure(token_file, caplog):
    # RFC 6761: names under .invalid never resolve.
    with pytest.raises(ControlPlaneUnavailable) as excinfo:
        client_for("http://gshare-internal.invalid:8000", token_file).put_inventory(SNAPSHOT)
    message = str(excinfo.value)
    assert "DNS failure: gshare-internal.invalid does not resolve from this cluster" in message
    assert "ingress.internalPlane.host" in message
    assert "DNS failure" in error_lines(caplog)


def test_a_refused_connection_names_the_host_and_port(token_file, caplog):
    port = closed_port()
    with pytest.raises(ControlPlaneUnavailable) as excinfo:
        client_for(f"http://127.0.0.1:{port}", token_file).put_inventory(SNAPSHOT)
    assert f"connection refused by 127.0.0.1:{port}" in str(excinfo.value)
    assert "ingress.internalPlane.enabled=true" in str(excinfo.value)
    assert f"connection refused by 127.0.0.1:{port}" in error_lines(caplog)


def test_a_certificate_this_pod_does_not_trust_is_a_tls_failure(token_file, caplog):
    with serve(200, b"{}", "application/json", tls=generate_certificates("127.0.0.1")) as url:
        with pytest.raises(ControlPlaneUnavailable) as excinfo:
            client_for(url, token_file).put_inventory(SNAPSHOT)
    message = str(excinfo.value)
    assert "TLS failure talking to 127.0.0.1" in message and "CERTIFICATE_VERIFY_FAILED" in message
    assert "ingress.internalPlane.tlsSecretName" in message


def test_a_403_page_from_the_ingress_is_its_source_range(token_file, caplog):
    with serve(403, NGINX_403) as url:
        with pytest.raises(ControlPlaneRejected) as excinfo:
            client_for(url, token_file).put_inventory(SNAPSHOT)
    assert "refused this cluster's source address (403 from the ingress, not from gShare)" in str(excinfo.value)
    assert "ingress.internalPlane.sourceRange" in error_lines(caplog)


def test_an_html_page_is_the_public_console_and_is_not_taken_as_a_report(token_file, caplog):
    with serve(200, CONSOLE_PAGE) as url:
        with pytest.raises(ControlPlaneRejected) as excinfo:
            client_for(url, token_file).put_inventory(SNAPSHOT)
    message = str(excinfo.value)
    assert "answered 200 with a page that is not the control plane's internal API" in message
    assert "the internal plane is closed" in message and "ingress.internalPlane.enabled=true" in message
    assert "the internal plane is closed" in error_lines(caplog)


def test_the_public_hosts_not_found_is_the_closed_internal_plane(token_file, caplog):
    with serve(404, b'{"code": "not_found", "detail": "No such route."}', "application/json") as url:
        with pytest.raises(ControlPlaneRejected) as excinfo:
            client_for(url, token_file).put_inventory(SNAPSHOT)
    assert "is not one of the control plane's internal hosts" in str(excinfo.value)


def test_a_401_is_the_token_with_the_rotation_command(token_file, caplog):
    with serve(401, b'{"code": "token_invalid", "detail": "The operator token expired."}', "application/json") as url:
        with pytest.raises(ControlPlaneAuthError):
            client_for(url, token_file).put_inventory(SNAPSHOT)
    lines = error_lines(caplog)
    assert "operator token expired or revoked: rotate it" in lines
    assert "`manage.py rotate_operator_tokens --cluster clu_test`" in lines
    assert "SECRET-TOKEN-VALUE" not in caplog.text
