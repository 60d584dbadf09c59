"""Attacks on ``GET /metrics``: public-host variants, token forgeries, other methods, and what the exposition
must never carry (kubeconfigs, tokens, users' data)."""

from __future__ import annotations

import socket

import pytest
from django.core.cache import cache

from metrics.fleet import CACHE_KEY
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory
from tests.metrics.test_gunicorn_multiprocess import gunicorn  # noqa: F401  (the fixture: the api under real gunicorn)

pytestmark = pytest.mark.django_db

INTERNAL = "127.0.0.1"
PUBLIC = "gshare.example.com"
TOKEN = "scrape-me-0123456789abcdef"


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.GSHARE_INTERNAL_HOSTS = [INTERNAL, "localhost"]
    settings.GSHARE_METRICS_CACHE_SECONDS = 0
    settings.GSHARE_METRICS_TOKEN = ""
    cache.delete(CACHE_KEY)


def exposed(response) -> bool:
    return response.status_code == 200 and b"gshare_cluster_info" in response.content


@pytest.mark.parametrize(
    "host",
    [PUBLIC, f"{PUBLIC}:443", f"{PUBLIC}:8000", PUBLIC.upper(), f"{PUBLIC}.", f"{PUBLIC}.:443", "GShare.Example.Com."],
)
def test_public_host_variants_answer_404(client, host):
    response = client.get("/metrics", HTTP_HOST=host)
    assert response.status_code == 404 and response.json()["code"] == "not_found"


@pytest.mark.parametrize("host", [f"{INTERNAL}:8000", "LOCALHOST", "localhost.", "localhost:80"])
def test_internal_host_variants_still_scrape(client, host):
    assert exposed(client.get("/metrics", HTTP_HOST=host))


def test_x_forwarded_host_does_not_make_a_public_host_internal(client):
    response = client.get("/metrics", HTTP_HOST=PUBLIC, HTTP_X_FORWARDED_HOST=INTERNAL)
    assert response.status_code == 404
    response = client.get("/metrics", HTTP_HOST=PUBLIC, HTTP_FORWARDED=f"host={INTERNAL}", HTTP_X_FORWARDED_SERVER=INTERNAL)
    assert response.status_code == 404


@pytest.mark.parametrize("host", [f"{INTERNAL}@{PUBLIC}", f"{PUBLIC}#{INTERNAL}", f"{INTERNAL} {PUBLIC}", f"{PUBLIC},{INTERNAL}"])
def test_malformed_hosts_never_expose(client, host):
    response = client.get("/metrics", HTTP_HOST=host)
    assert not exposed(response)
    assert response.status_code in (400, 404)


@pytest.mark.parametrize(
    "path", ["/metrics/", "/metrics?x", "/metrics?x=1&y", "//metrics", "/%6detrics", "/%6Detrics", "/metrics%2f", "/Metrics", "/./metrics", "/x/../metrics"]
)
def test_path_variants_on_a_public_host_never_expose(client, path):
    response = client.get(path, HTTP_HOST=PUBLIC)
    assert not exposed(response)
    assert response.status_code in (301, 302, 404), (path, response.status_code)


def raw(live_server, request: bytes) -> bytes:
    host, port = live_server.thread.host, live_server.thread.port
    with socket.create_connection((host, port), timeout=20) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("target", [b"http://127.0.0.1/metrics", b"http://localhost:80/metrics", b"HTTP://127.0.0.1/metrics"])
def test_an_absolute_uri_request_line_does_not_override_a_public_host(live_server, target):
    answer = raw(live_server, b"GET " + target + b" HTTP/1.1\r\nHost: " + PUBLIC.encode() + b"\r\nConnection: close\r\n\r\n")
    status = answer.split(b"\r\n", 1)[0]
    assert b"gshare_cluster_info" not in answer, status
    assert b" 200 " not in status


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN[:8]}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN}\x00",
        f"Bearer {TOKEN} {TOKEN}",
        f"Bearer {TOKEN.upper()}",
        f"Basic {TOKEN}",
        "Basic c2NyYXBlLW1lOg==",
        f"Token {TOKEN}",
        f"{TOKEN}",
        f"Bearer{TOKEN}",
        "Bearer " + "a" * 1_000_000,
        "Bearer " + TOKEN * 40_000,
    ],
)
def test_forged_tokens_are_refused(client, settings, authorization):
    settings.GSHARE_METRICS_TOKEN = TOKEN
    headers = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}
    response = client.get("/metrics", HTTP_HOST=INTERNAL, **headers)
    assert response.status_code == 401
    assert response.json()["code"] in ("token_missing", "token_invalid")
    assert TOKEN.encode() not in response.content
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("authorization", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer {TOKEN} ", f"Bearer  {TOKEN}"])
def test_the_right_token_in_accepted_spellings_scrapes(client, settings, authorization):
    settings.GSHARE_METRICS_TOKEN = TOKEN
    assert exposed(client.get("/metrics", HTTP_HOST=INTERNAL, HTTP_AUTHORIZATION=authorization))


def test_the_right_token_does_not_open_a_public_host(client, settings):
    settings.GSHARE_METRICS_TOKEN = TOKEN
    response = client.get("/metrics", HTTP_HOST=PUBLIC, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "options"])
def test_other_methods_answer_405_on_internal_and_404_on_public(client, method):
    internal = getattr(client, method)("/metrics", HTTP_HOST=INTERNAL)
    assert internal.status_code == 405 and internal.json()["code"] == "method_not_allowed"
    assert internal["Allow"] == "GET, HEAD"
    assert b"gshare_cluster_info" not in internal.content
    public = getattr(client, method)("/metrics", HTTP_HOST=PUBLIC)
    assert public.status_code == 404 and public.json()["code"] == "not_found"


def test_other_methods_are_checked_before_the_token(client, settings):
    settings.GSHARE_METRICS_TOKEN = TOKEN
    response = client.post("/metrics", HTTP_HOST=INTERNAL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 405


def test_head_needs_the_token_too(client, settings):
    settings.GSHARE_METRICS_TOKEN = TOKEN
    response = client.head("/metrics", HTTP_HOST=INTERNAL)
    assert response.status_code == 401


def test_no_secret_or_private_data_in_the_exposition(client, settings):
    settings.GSHARE_METRICS_TOKEN = TOKEN
    cluster = ClusterFactory(name="alpha", kubeconfig="apiVersion: v1\nusers:\n- user:\n    token: kube-secret-TOKEN-42\n")
    node = NodeFactory(cluster=cluster)
    GpuDeviceFactory(node=node, cluster=cluster, index=0)
    user = UserFactory(username="private-alice", email="alice.private@example.org")
    SessionFactory(owner=user, cluster=cluster, image="registry.example.org/alice/secret-image:tag")
    response = client.get("/metrics", HTTP_HOST=INTERNAL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert exposed(response)
    text = response.content.decode()
    for secret in ("kube-secret-TOKEN-42", "apiVersion", TOKEN, "private-alice", "alice.private", "secret-image", "@"):
        assert secret not in text, secret
    assert response["Cache-Control"] == "no-store"


@pytest.mark.parametrize("target", [b"//metrics", b"/%6detrics", b"/metrics/", b"/metrics?x", b"/./metrics", b"/a/../metrics", b"/metrics;x", b"/metrics%00"])
def test_raw_path_variants_on_a_public_host_never_expose(live_server, target):
    answer = raw(live_server, b"GET " + target + b" HTTP/1.1\r\nHost: " + PUBLIC.encode() + b"\r\nConnection: close\r\n\r\n")
    assert b"gshare_cluster_info" not in answer, answer.split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /metrics HTTP/1.1\r\nHost: gshare.example.com\r\nHost: 127.0.0.1\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: gshare.example.com\r\n",
        b"POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n",
        b"PUT /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + b"a" * 70000 + b"\r\n",
    ],
)
def test_raw_requests_that_never_expose(live_server, request_head):
    """Two Host headers (joined by the server: not a valid host, 400), unsafe methods (refused before the view),
    a header past the server's line limit (431)."""
    answer = raw(live_server, request_head + b"Connection: close\r\n\r\n")
    status = answer.split(b"\r\n", 1)[0]
    assert b"gshare_cluster_info" not in answer, status
    assert status.split(b" ")[1] in (b"400", b"403", b"405", b"431"), status


@pytest.mark.django_db(transaction=True)
def test_under_gunicorn_the_absolute_form_and_path_tricks_on_a_public_host_never_expose(gunicorn):  # noqa: F811
    url, _multiproc = gunicorn
    port = int(url.rsplit(":", 1)[1])
    for head, statuses in [
        (b"GET http://127.0.0.1/metrics HTTP/1.1\r\nHost: gshare.example.com\r\n", (b"404",)),
        (b"GET http://localhost/metrics HTTP/1.1\r\nHost: gshare.example.com:443\r\n", (b"404",)),
        (b"GET //metrics HTTP/1.1\r\nHost: gshare.example.com\r\n", (b"302", b"404")),
        (b"GET /%6detrics HTTP/1.1\r\nHost: gshare.example.com\r\n", (b"404",)),
        (b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + b"a" * 9000 + b"\r\n", (b"400", b"431")),
    ]:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.sendall(head + b"Connection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        status = answer.split(b"\r\n", 1)[0]
        assert b"gshare_cluster_info" not in answer, (head[:60], status)
        assert status.split(b" ")[1] in statuses, (head[:60], status)


def test_an_unsafe_method_from_a_real_client_is_the_json_405_not_the_csrf_page(db):
    from django.test import Client

    response = Client(enforce_csrf_checks=True).post("/metrics", HTTP_HOST="127.0.0.1")
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"


def test_control_characters_around_the_token_are_not_whitespace(db, settings):
    from django.test import Client

    settings.GSHARE_METRICS_TOKEN = "metrics-secret-0123456789"
    client = Client()
    assert client.get("/metrics", HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION="Bearer metrics-secret-0123456789 ").status_code == 200
    for wrapped in ("\x1fmetrics-secret-0123456789", "metrics-secret-0123456789\x0b"):
        response = client.get("/metrics", HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {wrapped}")
        assert response.status_code == 401 and response.json()["code"] == "token_invalid"
