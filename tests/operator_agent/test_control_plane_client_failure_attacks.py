"""The operator's control-plane client facing answers the guide's cases do not list, against a real loopback server:
a token that an HTTP header cannot carry (never sent, never quoted in a log line or error), a redirect (not followed,
said where to), HTML in place of a 2xx or a 401, a 5xx page of the ingress, a JSON error whose detail is huge."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import (
    ControlPlaneAuthError,
    ControlPlaneClient,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
    TokenUnavailable,
)

SECRET = "SECRET-TOKEN-VALUE"
NGINX_502 = b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center></body></html>"


@contextmanager
def serve(status: int, body: bytes = b"", headers: dict | None = None) -> Iterator[tuple[str, list]]:
    hits: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            hits.append(self.headers.get("Authorization"))
            self.send_response(status)
            for name, value in {"Content-Type": "text/html", "Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def client_for(url: str, token_path) -> ControlPlaneClient:
    config = OperatorConfig(cluster_id="clu_test", control_plane_url=url, token_file=str(token_path), http_timeout=3.0)
    return ControlPlaneClient(config, sleep=lambda delay: None, max_attempts=2)


def logged(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("token", [f"eyJhbGc.{SECRET}\r\nX-Injected: 1.sig", f"eyJhbGc.{SECRET}\nmore.sig",
                                   f"eyJhbGc.{SECRET} spaced.sig", f"eyJhbGc.{SECRET}\u20ac.sig", f"eyJ.{SECRET}\x7f.sig"])
def test_a_token_a_header_cannot_carry_is_never_sent_nor_quoted(tmp_path, caplog, token):
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "internal-jwt"
    path.write_text(token)
    with serve(200, b"{}", {"Content-Type": "application/json"}) as (url, hits):
        with pytest.raises(TokenUnavailable) as caught:
            client_for(url, path).put_inventory({"nodes": []})
    assert hits == []
    assert SECRET not in str(caught.value) and SECRET not in logged(caplog)
    assert "on one line" in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_not_followed_and_says_where_to(tmp_path, caplog, status):
    path = tmp_path / "internal-jwt"
    path.write_text(f"eyJ.{SECRET}.sig")
    with serve(status, b"<html><body>moved</body></html>", {"Location": "https://gshare-internal.example.org/internal/v1/inventory"}) as (url, hits):
        with pytest.raises(ControlPlaneRejected) as caught:
            client_for(url, path).put_inventory({"nodes": []})
    assert len(hits) == 1  # not retried, not followed
    message = str(caught.value)
    assert f"redirected the call ({status}) to https://gshare-internal.example.org/internal/v1/inventory" in message
    assert "controlPlaneUrl" in message and SECRET not in logged(caplog)


def test_an_html_401_is_still_the_token_and_an_ingress_502_is_retried(tmp_path, caplog):
    path = tmp_path / "internal-jwt"
    path.write_text(f"eyJ.{SECRET}.sig")
    with serve(401, b"<html><body>401 Authorization Required</body></html>") as (url, hits):
        with pytest.raises(ControlPlaneAuthError):
            client_for(url, path).put_inventory({"nodes": []})
    with serve(502, NGINX_502) as (url, hits):
        with pytest.raises(ControlPlaneUnavailable) as caught:
            client_for(url, path).put_inventory({"nodes": []})
    assert len(hits) == 2 and "HTTP 502" in str(caught.value)
    assert SECRET not in logged(caplog) and SECRET not in str(caught.value)


def test_a_huge_error_detail_is_cut_in_the_log(tmp_path, caplog):
    path = tmp_path / "internal-jwt"
    path.write_text(f"eyJ.{SECRET}.sig")
    detail = "x" * 2_000_000
    body = ('{"code": "invalid_inventory", "detail": "' + detail + '"}').encode()
    with serve(400, body, {"Content-Type": "application/json"}) as (url, hits):
        with pytest.raises(ControlPlaneRejected) as caught:
            client_for(url, path).put_inventory({"nodes": []})
    assert caught.value.code == "invalid_inventory"
    assert max(len(r.getMessage()) for r in caplog.records) < 20_000
