"""Fixtures of the cluster tests: a loopback server that answers whatever a test tells it to (an apiserver that
refuses, is hostile, or is not an apiserver)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@pytest.fixture
def hostile(settings):
    """Factory: ``start(status, body=b"", reason=None, headers=None, allow=True) -> (host:port, hits)``, a loopback
    server answering every request with that status line, headers and body, and recording each request's path and
    Authorization header in ``hits``; ``allow`` adds it to ``GSHARE_LOOPBACK_ALLOWLIST``. Stopped at teardown."""
    servers = []

    def start(status: int, body: bytes = b"", reason: str | None = None, headers: dict | None = None, allow: bool = True):
        hits: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                hits.append({"path": self.path, "authorization": self.headers.get("Authorization")})
                self.send_response_only(status, reason)
                for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        host_port = f"127.0.0.1:{server.server_address[1]}"
        if allow:
            settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, host_port]
        return host_port, hits

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
