"""Connect links through a REAL Envoy configured as Envoy Gateway v1.9.0 configures a session's HTTPRoute and
SecurityPolicy (``tests/e2e/envoy.py``), its ext_authz check answered by the control plane under gunicorn.

Path of every request: test client -> Envoy (``ext_authz`` HTTP service: ``<method>
/internal/connect/ext-authz<normalised path and query>``, ``Host`` = the session domain, ``Cookie``,
``Authorization``, ``X-Forwarded-Proto``) -> the control plane (``tests/e2e/gunicorn.py``) -> on 200, the session's
echo backend, which answers with the method, path and ``X-Auth-Request-User`` it received; on any other answer,
that answer goes to the client.

Envoy listens on plain http on loopback, so the ``Secure`` connect cookie is sent back by hand, as a browser would
over https. Hostile paths are sent byte for byte over a socket.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.cache import cache
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from sessions import connect, services
from sessions.models import Session
from tests.e2e.envoy import envoy_proxy  # noqa: F401 -- the fixture
from tests.e2e.gunicorn import control_plane  # noqa: F401 -- the fixture
from tests.factories import ClusterFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DOMAIN = "gpu-a.example.com"


class _Echo(BaseHTTPRequestHandler):
    """A session pod: answers 200 with the method, path and ``X-Auth-Request-User`` it received."""

    def _echo(self):
        seen = {"method": self.command, "path": self.path, "user": self.headers.get_all("X-Auth-Request-User")}
        self.server.seen.append(seen)
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _echo  # noqa: N815 -- http.server's names

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def echo():
    """Factory: ``start() -> server`` (``server.seen`` lists what it received); all stopped at teardown."""
    servers = []

    def start():
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
        server.seen = []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def stack(django_user_model, control_plane, envoy_proxy, echo):  # noqa: F811 -- the imported fixtures
    """carol's two Running sessions on ``gpu-a.example.com``, each routed by Envoy to its own echo backend."""
    cache.clear()
    connect.clear_local_caches()
    owner = django_user_model.objects.create_user("carol")
    cluster = ClusterFactory(session_domain=DOMAIN)
    mine = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    yours = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    backends = {mine.public_id: echo(), yours.public_id: echo()}
    proxy = envoy_proxy(
        host=DOMAIN, control_plane=control_plane,
        backends={sid: f"http://127.0.0.1:{server.server_address[1]}" for sid, server in backends.items()},
    )
    token = services.session_connect(session=mine, user=owner).split("token=")[1]
    return {"mine": mine, "yours": yours, "backends": backends, "envoy": proxy, "token": token}


def send(proxy, method: str, target: bytes, headers: dict[str, str] | None = None):
    """One request to Envoy written byte for byte (``Host`` = the session domain); ``(status, headers, body)``."""
    lines = [method.encode() + b" " + target + b" HTTP/1.1", f"Host: {DOMAIN}".encode(), b"Connection: close"]
    lines += [f"{name}: {value}".encode() for name, value in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        body = response.read()
    return response.status, response.headers, body


def test_link_307_cookie_then_the_pod_sees_the_user(stack):
    mine, proxy, token = stack["mine"], stack["envoy"], stack["token"]
    backend = stack["backends"][mine.public_id]
    sid = mine.public_id
    status, headers, body = send(proxy, "GET", f"/s/{sid}/lab".encode())
    assert status == 401 and json.loads(body)["code"] == "token_missing", proxy.log_tail()
    assert not backend.seen

    status, headers, _ = send(proxy, "GET", f"/s/{sid}/lab?x=1&token={token}".encode())
    assert status == 307 and headers["Location"] == f"/s/{sid}/lab?x=1", proxy.log_tail()
    cookie = SimpleCookie(headers["Set-Cookie"])[connect.COOKIE_NAME]
    assert cookie["path"] == f"/s/{sid}/" and cookie["secure"] and cookie["httponly"]
    assert headers["Cache-Control"] == "no-store" and not backend.seen

    jar = {"Cookie": f"{connect.COOKIE_NAME}={cookie.value}"}
    for method in ("GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"):
        status, headers, body = send(proxy, method, f"/s/{sid}/lab?x=1".encode(), {**jar, "Content-Length": "0"})
        assert status == 200, (method, body, proxy.log_tail())
        assert backend.seen[-1] == {"method": method, "path": f"/s/{sid}/lab?x=1", "user": ["carol"]}
        assert "Set-Cookie" not in headers
    # A client's own X-Auth-Request-User is replaced by the check's answer, never passed along.
    send(proxy, "GET", f"/s/{sid}/api".encode(), {**jar, "X-Auth-Request-User": "mallory"})
    assert backend.seen[-1]["user"] == ["carol"]
    count = len(backend.seen)
    status, _, body = send(proxy, "GET", f"/s/{sid}/api".encode(), {"X-Auth-Request-User": "carol"})
    assert status == 401 and len(backend.seen) == count
    # Bearer, for API clients.
    status, _, _ = send(proxy, "GET", f"/s/{sid}/api".encode(), {"Authorization": f"Bearer {token}"})
    assert status == 200 and backend.seen[-1]["user"] == ["carol"]


def test_another_session_a_deactivated_owner_and_forged_tokens_are_refused(stack):
    mine, yours, proxy, token = stack["mine"], stack["yours"], stack["envoy"], stack["token"]
    status, _, body = send(proxy, "GET", f"/s/{yours.public_id}/?token={token}".encode())
    assert (status, json.loads(body)["code"]) == (401, "connect_refused")
    head, payload, signature = token.split(".")
    status, _, body = send(proxy, "GET", f"/s/{mine.public_id}/?token={head}.{payload}.{signature[::-1]}".encode())
    assert (status, json.loads(body)["code"]) == (401, "token_invalid")
    mine.owner.is_active = False
    mine.owner.save()  # drops the user's cached facts once committed
    status, _, body = send(proxy, "GET", f"/s/{mine.public_id}/?token={token}".encode())
    assert (status, json.loads(body)["code"]) == (403, "connect_forbidden")
    assert not any(server.seen for server in stack["backends"].values())


#: Each hostile path and what the client gets through Envoy: ``refused`` (the check's 401 ``connect_refused``: Envoy
#: normalised the path onto the other session, or it is ambiguous as written), ``unescaped`` (Envoy's own 307 to the
#: unescaped path, ``UNESCAPE_AND_REDIRECT`` of ``%2F``/``%5C``, which following refuses in turn), ``mine`` (Envoy
#: normalised it onto my own session, which the check lets in with the link's 307), ``envoy_400`` (Envoy refuses the
#: request line), ``too_long`` (414 from the control plane's gunicorn, passed to the client as a denial).
TRICKS = [
    (b"/s/{mine}/../{yours}/lab", "refused"),
    (b"/s/{mine}/../../s/{yours}/lab", "refused"),
    (b"/s/{mine}/%2e%2e/{yours}/lab", "refused"),
    (b"/s/{mine}/%2E%2E/%2e%2E/s/{yours}/lab", "refused"),
    (b"/s/{mine}/.%2e/{yours}/", "refused"),
    (b"/s/{mine}/..%2f{yours}/lab", "unescaped"),
    (b"/s/{mine}%2F..%2F{yours}/lab", "unescaped"),
    (b"/s/{mine}/..%5c{yours}/lab", "unescaped"),
    (b"/s/{mine}/..\\{yours}/lab", "refused"),
    (b"//s/{yours}/lab", "refused"),
    (b"/s/{mine}//../{yours}/lab", "mine"),  # RFC 3986 drops the empty segment: /s/<mine>/<yours>/lab
    (b"/s/{mine}/x/s/{yours}/", "refused"),
    (b"/s/{mine}/%73/{yours}/", "refused"),
    (b"/x/../s/{yours}/", "refused"),
    (b"/s/{mine}/%252e%252e/%252e%252e/s/{yours}/", "refused"),
    (b"/s/{mine}/a%00b", "envoy_400"),
    (b"/s/{mine}/\xff\xfe", "envoy_400"),
    (b"/s/{mine}/" + b"a" * 9000, "too_long"),
]


def test_path_tricks_never_reach_another_session(stack):
    """Envoy normalises the path (``normalize_path``, ``merge_slashes``, ``UNESCAPE_AND_REDIRECT``) before routing and
    before the check, so the check judges the path Envoy routes: a token for one session never opens another's
    backend, whatever the spelling. (One Envoy and one gunicorn for every trick: each costs seconds to start.)"""
    mine, yours, proxy, token = stack["mine"], stack["yours"], stack["envoy"], stack["token"]
    for trick, outcome in TRICKS:
        target = trick.replace(b"{mine}", mine.public_id.encode()).replace(b"{yours}", yours.public_id.encode())
        status, headers, body = send(proxy, "GET", target + b"?token=" + token.encode())
        found = {
            (401, False): "refused", (307, True): "mine", (307, False): "unescaped", (400, False): "envoy_400",
            (414, False): "too_long",
        }.get((status, "Set-Cookie" in headers), f"{status}")
        assert found == outcome, (trick, status, dict(headers), body[:300], proxy.log_tail())
        if outcome == "refused":
            assert json.loads(body)["code"] == "connect_refused", trick
        elif outcome == "mine":
            assert headers["Location"].startswith(f"/s/{mine.public_id}/") and "token=" not in headers["Location"], trick
        elif outcome == "unescaped":  # following Envoy's redirect reaches the check, which refuses the other session
            assert "%" not in headers["Location"].split("?")[0], trick
            status, _, body = send(proxy, "GET", headers["Location"].encode())
            assert (status, json.loads(body)["code"]) == (401, "connect_refused"), trick
        assert not stack["backends"][yours.public_id].seen and not stack["backends"][mine.public_id].seen, trick


class _CannotDecide(BaseHTTPRequestHandler):
    """A control plane that cannot decide: 503 ``verify_unavailable`` to every check, as ``sessions.connect`` answers
    with its database or Redis out of reach."""

    def _answer(self):
        self.server.checks.append((self.command, self.path, self.headers.get("Host")))
        body = b'{"code": "verify_unavailable", "detail": "..."}'
        self.send_response(503)
        self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer  # noqa: N815 -- http.server's names

    def log_message(self, *args):  # quiet
        pass


def test_a_control_plane_that_cannot_decide_or_cannot_be_reached_fails_closed(envoy_proxy, echo):  # noqa: F811 -- the fixture
    """``failOpen: false``: Envoy turns the check's 5xx, and a control plane it cannot reach, into its own 403 (the
    filter's default ``status_on_error``), and the backend sees nothing."""
    undecided = ThreadingHTTPServer(("127.0.0.1", 0), _CannotDecide)
    undecided.checks = []
    threading.Thread(target=undecided.serve_forever, daemon=True).start()
    backend = echo()
    sid = "ses_abc123"
    try:
        proxy = envoy_proxy(host=DOMAIN, control_plane=f"http://127.0.0.1:{undecided.server_address[1]}",
                            backends={sid: f"http://127.0.0.1:{backend.server_address[1]}"})
        status, _, _ = send(proxy, "POST", f"/s/{sid}/lab?x=1".encode(), {"Content-Length": "0"})
        assert status == 403, proxy.log_tail()
        assert undecided.checks == [("POST", f"/internal/connect/ext-authz/s/{sid}/lab?x=1", DOMAIN)]  # the check's shape
    finally:
        undecided.shutdown()
        undecided.server_close()
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    proxy = envoy_proxy(host=DOMAIN, control_plane=f"http://127.0.0.1:{port}",
                        backends={sid: f"http://127.0.0.1:{backend.server_address[1]}"})
    assert send(proxy, "GET", f"/s/{sid}/".encode())[0] == 403
    assert not backend.seen


_PIECES = [b"/", b"/", b"/", b"s", b"{mine}", b"{yours}", b".", b"..", b"%2e", b"%2E", b"%2e%2e", b"%2f", b"%2F", b"%5c",
           b"%5C", b"\\", b"%25", b"%252e", b"%73", b"%00", b";", b"lab", b"?", b"#", b"%3f", b"+", b"%20"]


@hypothesis_settings(max_examples=150, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(_PIECES), max_size=12))
def test_no_spelling_of_a_path_takes_a_token_to_another_sessions_backend(stack, pieces):
    """Whatever Envoy makes of a path (normalised, merged, redirected, refused), a Bearer token for one session lets
    a request reach that session's backend only, and only on a path under it."""
    mine, yours, proxy, token = stack["mine"], stack["yours"], stack["envoy"], stack["token"]
    target = (b"/s/{mine}/" + b"".join(pieces)).replace(b"{mine}", mine.public_id.encode()).replace(b"{yours}", yours.public_id.encode())
    status, _, _ = send(proxy, "GET", target, {"Authorization": f"Bearer {token}"})
    assert not stack["backends"][yours.public_id].seen, (target, status)
    for seen in stack["backends"][mine.public_id].seen:
        assert seen["path"].startswith(f"/s/{mine.public_id}/") or seen["path"] == f"/s/{mine.public_id}", (target, seen)
        assert seen["user"] == ["carol"]
