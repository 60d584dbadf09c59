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

Hostile paths (``..``, ``%2e%2e``, ``%2f``, ``%5c``, ``//``, a second ``/s/<id>/``) are sent byte for
byte with ``http.client`` (``requests``/urllib3 would resolve dot segments first, like ``curl`` without
``--path-as-is``), to nginx routing each session's location to its own echo backend.
"""

from __future__ import annotations

import http.client
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
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import contract
from identity.internal_jwt import CONNECT_AUDIENCE
from identity.keys import signing_key_ensure
from sessions import connect, lifecycle, services
from sessions.connect_path import nginx_uri
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
def echo_backends():
    """Factory: ``start() -> server``, an echo backend on ``127.0.0.1:<free port>``; ``server.seen`` lists the
    paths it served. All are stopped at teardown."""
    started = []

    def start():
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
        server.seen = []
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        started.append((server, thread))
        return server

    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def backend(echo_backends):
    """One echo backend standing in for every session pod."""
    return echo_backends()


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


def raw_get(nginx, host: str, request_uri: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET ``request_uri`` through nginx exactly as written (no dot-segment removal, no re-quoting)."""
    conn = http.client.HTTPConnection("127.0.0.1", nginx.port, timeout=30)
    try:
        conn.putrequest("GET", request_uri, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


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
    lifecycle.session_status_apply(
        cluster=session.cluster,
        reports=[{"session": session.public_id, "phase": contract.PHASE_TERMINATED, "observed_at": timezone.now()}],
    )
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.TERMINATED
    time.sleep(connect.FACTS_CACHE_SECONDS + 0.1)  # each server process may keep the facts this long
    assert get(nginx, url).status_code == 401
    assert get(nginx, f"https://{DOMAIN}/s/{session.public_id}/", cookie=sent).status_code == 401
    assert len(stack["backend"].seen) == 2


def test_a_cookie_is_never_renewed_and_ends_when_its_user_is_deactivated(stack, verdicts):
    session, nginx, backend = stack["session"], stack["nginx"], stack["backend"]
    first = get(nginx, link(session))
    assert first.status_code == 200 and first.json()["user"] == "carol", nginx.logs()
    cookie = SimpleCookie()
    cookie.load(first.headers["Set-Cookie"])
    token = cookie[connect.COOKIE_NAME].value
    sent = f"{connect.COOKIE_NAME}={token}"
    page = f"https://{DOMAIN}/s/{session.public_id}/lab"
    assert get(nginx, page, cookie=sent).status_code == 200
    served = len(backend.seen)

    # The cookie's token as the link: refused, and no fresh cookie reaches the client.
    renew = get(nginx, f"https://{DOMAIN}/s/{session.public_id}/?token={token}")
    assert renew.status_code == 401 and "Set-Cookie" not in renew.headers
    assert verdicts[-1][1:] == (401, "no valid connect token (cookie token as query)")
    # With the cookie sent as well, the request passes on the cookie, still without a new one.
    both = get(nginx, f"https://{DOMAIN}/s/{session.public_id}/?token={token}", cookie=sent)
    assert both.status_code == 200 and "Set-Cookie" not in both.headers
    assert len(backend.seen) == served + 1

    owner = session.owner
    owner.is_active = False
    owner.save()  # the console's change form does the same; the user's cached facts are dropped on commit
    time.sleep(connect.FACTS_CACHE_SECONDS + 0.2)  # each server process may keep the facts this long
    assert get(nginx, page, cookie=sent).status_code == 403
    assert verdicts[-1][1:] == (403, "user deactivated or gone")
    late = get(nginx, link(session))  # a link minted before the deactivation: refused too, and no cookie
    assert late.status_code == 403 and "Set-Cookie" not in late.headers
    assert len(backend.seen) == served + 1


def test_no_token_is_refused(stack, verdicts):
    session, nginx = stack["session"], stack["nginx"]
    response = get(nginx, f"https://{DOMAIN}/s/{session.public_id}/lab")
    assert response.status_code == 401
    assert "Set-Cookie" not in response.headers
    assert verdicts == [(f"https://{DOMAIN}/s/{session.public_id}/lab", 401, "no valid connect token")]
    assert not stack["backend"].seen


@pytest.fixture
def two_owners(django_user_model, live_server, echo_backends, ingress_nginx):  # noqa: F811 -- the imported fixture
    """Session S1 of ``anna`` and session M1 of ``bruno`` on one cluster, each Ingress routing to its own pod."""
    cache.clear()
    connect.clear_local_caches()
    cluster = ClusterFactory(session_domain=DOMAIN)
    anna = django_user_model.objects.create_user("anna")
    bruno = django_user_model.objects.create_user("bruno")
    s1 = Session.objects.create(owner=anna, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    m1 = Session.objects.create(owner=bruno, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    pods = {s1.public_id: echo_backends(), m1.public_id: echo_backends()}
    live = urlsplit(live_server.url)
    nginx = ingress_nginx(
        hosts=[DOMAIN],
        paths=[session_path(s1.public_id), session_path(m1.public_id)],
        auth_url=f"http://127.0.0.1:{live.port}/internal/connect/verify",
        backend_url="http://127.0.0.1:9",  # unused: every path has its own pod
        backends={session_path(sid): f"http://127.0.0.1:{pod.server_address[1]}" for sid, pod in pods.items()},
    )
    return {"s1": s1, "m1": m1, "pods": pods, "nginx": nginx}


def _attacks(m: str, s: str) -> dict[str, str]:
    """Request URIs that nginx may route to S1's location (or that look like it), built from M1's path."""
    return {
        "dot-dot": f"/s/{m}/../../s/{s}/lab",
        "dot-dot one level": f"/s/{m}/../{s}/lab",
        "dot then dot-dot": f"/s/{m}/./../../s/{s}/lab",
        "%2e%2e": f"/s/{m}/%2e%2e/%2e%2e/s/{s}/lab",
        "%2E%2E": f"/s/{m}/%2E%2E/%2E%2E/s/{s}/lab",
        "%2E": f"/s/{m}/.%2E/%2E./s/{s}/lab",
        "%2f": f"/s/{m}/..%2f..%2fs/{s}/lab",
        "%2F": f"/s/{m}/..%2F..%2Fs%2F{s}%2Flab",
        "%2f after the id": f"/s/{m}%2f..%2f..%2fs%2f{s}/lab",
        "%5c": f"/s/{m}/..%5c..%5cs%5c{s}%5clab",
        "%5C": f"/s/{m}/..%5C..%5Cs/{s}/lab",
        "backslash": f"/s/{m}/..\\..\\s\\{s}\\lab",
        "//": f"/s/{m}//../../s/{s}/lab",
        "// in front": f"//s/{m}/..//../s/{s}/lab",
        "second /s/<id>/": f"/s/{m}/s/{s}/lab",
        "second /s/ via ..;": f"/s/{m}/..;/../s/{s}/lab",
        "double-encoded dots": f"/s/{m}/%252e%252e/%252e%252e/s/{s}/lab",
        "mixed": f"/s/{m}/.%2e/%2E./%2fs/{s}/./lab?x=1",
        "mixed with query": f"/s/{m}/%2e%2e%2f%2E%2E/s/{s}/lab?next=/s/{m}/",
    }


def test_attacker_with_a_token_for_his_session_never_reaches_another_session(two_owners, verdicts):
    s1, m1, pods, nginx = two_owners["s1"], two_owners["m1"], two_owners["pods"], two_owners["nginx"]
    token = link(m1).split("token=", 1)[1]

    # The legitimate paths still work: each owner reaches their own pod as themselves.
    status, _, body = raw_get(nginx, DOMAIN, f"/s/{m1.public_id}/lab", {"Authorization": f"Bearer {token}"})
    assert (status, json.loads(body)["user"]) == (200, "bruno"), nginx.logs()
    anna_url = link(s1)
    status, _, body = raw_get(nginx, DOMAIN, urlsplit(anna_url).path + "?" + urlsplit(anna_url).query)
    assert (status, json.loads(body)["user"]) == (200, "anna"), nginx.logs()
    assert len(pods[s1.public_id].seen) == 1 and len(pods[m1.public_id].seen) == 1
    verdicts.clear()

    for name, uri in _attacks(m1.public_id, s1.public_id).items():
        for where in ("bearer", "query"):
            before = len(verdicts)
            if where == "bearer":
                status, _, _ = raw_get(nginx, DOMAIN, uri, {"Authorization": f"Bearer {token}"})
            else:
                status, _, _ = raw_get(nginx, DOMAIN, uri + ("&" if "?" in uri else "?") + f"token={token}")
            assert status in (400, 401, 404), (name, where, status, nginx.logs())
            assert pods[s1.public_id].seen == [f"{urlsplit(anna_url).path}?{urlsplit(anna_url).query}"], (name, where)
            # Whenever nginx asked (it routed the request to a session location), the verify said 401 on the path.
            for original_url, verdict, reason in verdicts[before:]:
                assert (verdict, reason.split(":")[0]) == (401, "path refused"), (name, where, original_url, reason)
            if nginx_uri(uri) is not None and nginx_uri(uri).startswith("/s/"):
                assert len(verdicts) == before + 1 and status == 401, (name, where, status, verdicts[before:])
    assert pods[m1.public_id].seen == [f"/s/{m1.public_id}/lab"]


def test_verify_answers_401_json_for_each_hostile_path(two_owners, anon):
    s1, m1 = two_owners["s1"], two_owners["m1"]
    token = link(m1).split("token=", 1)[1]
    for name, uri in _attacks(m1.public_id, s1.public_id).items():
        response = anon.get(
            "/internal/connect/verify",
            headers={"X-Original-URL": f"https://{DOMAIN}{uri}", "X-Original-Method": "GET", "Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 401, (name, response.status_code)
        assert response.json()["code"] == "connect_refused", name
        assert "X-Auth-Request-User" not in response.headers, name


URI_PIECES = [
    "/", "/", "/", "s", "a", ".", "..", "%2e", "%2E", "%2f", "%2F", "%5c", "\\", "%25", "%23", "%3f", "%3F", "%00",
    "%", "%4", "%zz", "?", "#", "+", "%73", "%41", "..;", "x.", ".x",
]


def test_nginx_uri_is_what_nginx_routes_on(ingress_nginx):  # noqa: F811 -- the imported fixture
    """The control plane's port of nginx's URI parser against the real nginx's ``$uri`` (None where nginx answers 400)."""
    nginx = ingress_nginx(
        hosts=[], paths=[], auth_url="http://127.0.0.1:9/", backend_url="http://127.0.0.1:9", catch_all=False, uri_echo_host="uri.test",
    )

    @hypothesis_settings(max_examples=300, deadline=None, database=None)
    @given(st.lists(st.sampled_from(URI_PIECES), max_size=12).map(lambda parts: "/" + "".join(parts)))
    def same_as_nginx(request_uri):
        status, _, body = raw_get(nginx, "uri.test", request_uri)
        assert status in (200, 400), (request_uri, status)
        assert nginx_uri(request_uri) == (body.decode("latin-1") if status == 200 else None), request_uri

    same_as_nginx()
