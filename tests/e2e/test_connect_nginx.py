"""Connect links through a REAL nginx configured as ingress-nginx renders the session Ingress.

Path of every request: test client -> nginx (``tests/e2e/nginx.py``: ``auth_request`` to the
control plane's ``/internal/connect/verify`` on pytest-django's ``live_server``) -> on 2xx, an echo
backend standing in for the session pod, which answers with the ``X-Auth-Request-User`` and path it
received.

TLS: nginx listens on plain http on loopback, so the harness writes the auth subrequest's
``X-Original-URL`` as ``https://$http_host$request_uri`` -- what ingress-nginx's
``$scheme://$http_host$request_uri`` is on a cluster, where the ingress terminates TLS. The connect
cookie is ``Secure``, so the test sends it back by hand in a ``Cookie`` header, as a browser would
over https (``requests`` keeps Secure cookies off plain http).
"""

from __future__ import annotations

import json
import threading
import time
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import jwt
import pytest
import requests
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from gshare.auth.internal_jwt import CONNECT_AUDIENCE
from gshare.auth.keys import signing_key_ensure
from operator_agent import contract
from sessions import connect, services
from sessions.manifests import session_path
from sessions.models import Session
from tests.e2e.nginx import ingress_nginx  # noqa: F401 -- the fixture
from tests.factories import ClusterFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DOMAIN = "gpu-a.example.com"
OTHER_DOMAIN = "gpu-b.example.com"
UNKNOWN_HOST = "unknown.example.net"


class _Echo(BaseHTTPRequestHandler):
    """The session pod: answers with what nginx forwarded (200; 404 for paths under ``missing/``)."""

    def do_GET(self):  # noqa: N802 -- http.server's name
        status = 404 if "/missing/" in self.path else 200
        body = json.dumps({
            "path": self.path,
            "user": self.headers.get("X-Auth-Request-User"),
            "host": self.headers.get("Host"),
            "forwarded_proto": self.headers.get("X-Forwarded-Proto"),
        }).encode()
        self.server.seen.append(self.path)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def backend():
    """The echo backend on ``127.0.0.1:<free port>``; ``backend.seen`` lists the paths it served."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def verdicts(monkeypatch):
    """Every ``connect.verify`` call the live server makes: ``(X-Original-URL, status, reason)``."""
    calls = []
    real = connect.verify

    def recording(**kwargs):
        verdict = real(**kwargs)
        calls.append((kwargs["original_url"], verdict.status, verdict.reason))
        return verdict

    monkeypatch.setattr(connect, "verify", recording)
    return calls


@pytest.fixture
def stack(django_user_model, live_server, backend, ingress_nginx):  # noqa: F811 -- the imported fixture
    """A Running session of ``carol`` on ``gpu-a.example.com``, another on the same cluster, and nginx.

    nginx has a server block for both clusters' domains and a catch-all, each routing both session
    paths through the auth-url to the echo backend.
    """
    cache.clear()
    connect.clear_local_caches()
    owner = django_user_model.objects.create_user("carol")
    cluster = ClusterFactory(session_domain=DOMAIN)
    ClusterFactory(session_domain=OTHER_DOMAIN)
    session = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    other = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    live = urlsplit(live_server.url)
    nginx = ingress_nginx(
        hosts=[DOMAIN, OTHER_DOMAIN],
        paths=[session_path(session.public_id), session_path(other.public_id)],
        auth_url=f"http://127.0.0.1:{live.port}/internal/connect/verify",
        backend_url=f"http://127.0.0.1:{backend.server_address[1]}",
    )
    return {"session": session, "other": other, "nginx": nginx, "backend": backend}


def get(nginx, url: str, *, cookie: str | None = None, **headers) -> requests.Response:
    """GET ``url`` (``https://<host>/<path>``) through nginx: to 127.0.0.1:<port> with ``Host: <host>``."""
    parts = urlsplit(url)
    target = f"{nginx.url}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    if cookie:
        headers["Cookie"] = cookie
    response = requests.get(target, headers={"Host": parts.hostname, **headers}, timeout=30, allow_redirects=False)
    if response.status_code >= 500:
        pytest.fail(f"nginx answered {response.status_code}:\n{nginx.logs()}", pytrace=False)
    return response


def link(session) -> str:
    return services.session_connect(session=session, user=session.owner)


def test_link_then_cookie_reach_the_session_pod_as_the_owner(stack, verdicts):
    session, nginx, backend = stack["session"], stack["nginx"], stack["backend"]
    url = link(session)
    assert url.startswith(f"https://{DOMAIN}/s/{session.public_id}/?token=")

    first = get(nginx, url, **{"X-Auth-Request-User": "mallory"})  # a client cannot choose the user
    assert first.status_code == 200, nginx.logs()
    echoed = first.json()
    assert echoed["user"] == "carol"
    assert echoed["path"].startswith(f"/s/{session.public_id}/?token=")
    assert (echoed["host"], echoed["forwarded_proto"]) == (DOMAIN, "https")
    assert verdicts[-1][:2] == (url, 200)  # X-Original-URL is exactly the link (https, host, path, query)

    cookie = SimpleCookie()
    cookie.load(first.headers["Set-Cookie"])  # auth-always-set-cookie: the verify's Set-Cookie reaches the client
    morsel = cookie[connect.COOKIE_NAME]
    assert morsel["path"] == session_path(session.public_id)
    assert morsel["httponly"] and morsel["secure"] and morsel["samesite"] == "Lax"
    sent = f"{connect.COOKIE_NAME}={morsel.value}"

    later = get(nginx, f"https://{DOMAIN}/s/{session.public_id}/lab/tree?x=1", cookie=sent)
    assert later.status_code == 200, nginx.logs()
    assert later.json() == {
        "path": f"/s/{session.public_id}/lab/tree?x=1", "user": "carol", "host": DOMAIN, "forwarded_proto": "https",
    }
    assert "Set-Cookie" not in later.headers  # only the first visit (the link) sets it
    assert len(backend.seen) == 2


def test_cookie_is_set_even_when_the_pod_answers_an_error(stack):
    # auth-always-set-cookie: without it ingress-nginx adds the verify's Set-Cookie only to 2xx/3xx answers.
    session, nginx = stack["session"], stack["nginx"]
    url = link(session).replace(f"/s/{session.public_id}/?", f"/s/{session.public_id}/missing/?")
    response = get(nginx, url)
    assert response.status_code == 404 and response.json()["user"] == "carol"
    cookie = SimpleCookie()
    cookie.load(response.headers["Set-Cookie"])
    assert cookie[connect.COOKIE_NAME]["path"] == session_path(session.public_id)


def test_expired_token_is_refused(stack):
    session, nginx = stack["session"], stack["nginx"]
    key = signing_key_ensure()
    now = int(time.time())
    expired = jwt.encode(
        {"iss": settings.GSHARE_JWT_ISSUER, "sub": f"user:{session.owner_id}", "aud": CONNECT_AUDIENCE,
         "sid": session.public_id, "name": "carol", "host": DOMAIN, "iat": now - 900, "exp": now - 600},
        key.private_key_pem, algorithm="RS256", headers={"kid": key.kid},
    )
    response = get(nginx, f"https://{DOMAIN}/s/{session.public_id}/?token={expired}")
    assert response.status_code == 401
    assert "Set-Cookie" not in response.headers and not stack["backend"].seen


def test_token_of_another_session_is_refused(stack, verdicts):
    session, other, nginx = stack["session"], stack["other"], stack["nginx"]
    other_url = link(other)
    token = other_url.split("token=", 1)[1]
    assert get(nginx, other_url).status_code == 200  # the token is good for its own session
    response = get(nginx, f"https://{DOMAIN}/s/{session.public_id}/?token={token}")
    assert response.status_code == 401
    assert verdicts[-1][1:] == (401, "token for another session")
    assert stack["backend"].seen == [f"/s/{other.public_id}/?token={token}"]


@pytest.mark.parametrize("host", [OTHER_DOMAIN, UNKNOWN_HOST])
def test_wrong_host_is_refused_by_the_control_plane(stack, verdicts, host):
    session, nginx = stack["session"], stack["nginx"]
    url = link(session)
    response = get(nginx, url.replace(f"https://{DOMAIN}/", f"https://{host}/"))
    assert response.status_code == 401
    # nginx did route it to the verify (the other cluster's server block / the catch-all): the host check refused it
    assert verdicts == [(url.replace(DOMAIN, host), 401, "wrong host")]
    assert not stack["backend"].seen


def test_terminated_session_is_refused_even_with_its_cookie(stack):
    session, nginx = stack["session"], stack["nginx"]
    url = link(session)
    first = get(nginx, url)
    assert first.status_code == 200
    cookie = SimpleCookie()
    cookie.load(first.headers["Set-Cookie"])
    sent = f"{connect.COOKIE_NAME}={cookie[connect.COOKIE_NAME].value}"
    assert get(nginx, f"https://{DOMAIN}/s/{session.public_id}/", cookie=sent).status_code == 200  # cached as Running

    # The operator reports it Terminated; the session services drop the cached facts on commit.
    services.session_status_apply(
        cluster=session.cluster,
        reports=[{"session": session.public_id, "phase": contract.PHASE_TERMINATED, "observed_at": timezone.now()}],
    )
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.TERMINATED
    time.sleep(connect.FACTS_CACHE_SECONDS + 0.1)  # each server process may keep the facts this long
    assert get(nginx, url).status_code == 401
    assert get(nginx, f"https://{DOMAIN}/s/{session.public_id}/", cookie=sent).status_code == 401
    assert len(stack["backend"].seen) == 2


def test_no_token_is_refused(stack, verdicts):
    session, nginx = stack["session"], stack["nginx"]
    response = get(nginx, f"https://{DOMAIN}/s/{session.public_id}/lab")
    assert response.status_code == 401
    assert "Set-Cookie" not in response.headers
    assert verdicts == [(f"https://{DOMAIN}/s/{session.public_id}/lab", 401, "no valid connect token")]
    assert not stack["backend"].seen
