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


@pytest.fixture
def apiserver_proxy(settings):
    """Factory: ``start(upstream, answer) -> URL``, a loopback server in front of the apiserver at ``upstream`` (an
    emulator's URL): each request is first given to ``answer(method, path, body) -> (status, body bytes) | None``, and
    relayed to ``upstream`` (Authorization, Content-Type and Accept headers kept) when it returns None. Added to
    ``GSHARE_LOOPBACK_ALLOWLIST``; stopped at teardown."""
    import urllib.error
    import urllib.request

    servers = []

    def start(upstream: str, answer) -> str:
        class Handler(BaseHTTPRequestHandler):
            def _relay(self):
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else None
                given = answer(self.command, self.path, data)
                if given is not None:
                    status, body = given
                else:
                    request = urllib.request.Request(upstream + self.path, data=data, method=self.command, headers={
                        k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "accept")})
                    try:
                        with urllib.request.urlopen(request, timeout=10) as response:
                            status, body = response.status, response.read()
                    except urllib.error.HTTPError as exc:
                        status, body = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        host_port = f"127.0.0.1:{server.server_address[1]}"
        settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, host_port]
        return f"http://{host_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
