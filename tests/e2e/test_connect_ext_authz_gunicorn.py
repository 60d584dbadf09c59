"""Envoy's ext_authz check request shape sent byte for byte to the control plane under a real gunicorn.

Each request is what Envoy sends for a session request (``sessions.ext_authz``): ``<method>
/internal/connect/ext-authz<original path and query> HTTP/1.1`` with ``Host: <session domain>``, the allowed
``Cookie``/``Authorization``/``X-Forwarded-Proto`` and no body. They go over a raw socket, so every path trick
(``..``, ``%2e%2e``, ``%2f``, ``%5c``, ``//``, a second ``/s/``, ``%00``, non-UTF-8 bytes, an overlong path) reaches
gunicorn exactly as written and is judged on gunicorn's ``RAW_URI``.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from http.cookies import SimpleCookie

import jwt
import pytest
from django.core.cache import cache

import contract
from identity.internal_jwt import CONNECT_AUDIENCE
from identity.keys import signing_key_ensure
from sessions import connect, services
from sessions.models import Session
from tests.e2e.gunicorn import INTERNAL_HOST, PUBLIC_HOST, control_plane  # noqa: F401 -- the fixture
from tests.factories import ClusterFactory
from tests.helpers import table_locked

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DOMAIN = "gpu-a.example.com"
PREFIX = contract.CONNECT_EXT_AUTHZ_PATH.encode()


def send(url: str, method: bytes, target: bytes, host: bytes = DOMAIN.encode(), headers: dict[bytes, bytes] | None = None):
    """One HTTP/1.1 request written byte for byte; ``(status, headers {lowercase name: [values]}, body)``."""
    port = int(url.rsplit(":", 1)[1])
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: " + host, b"X-Forwarded-Proto: https", b"Connection: close"]
    lines += [name + b": " + value for name, value in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        response = http.client.HTTPResponse(sock, method=method.decode())
        response.begin()
        body = response.read()
    found: dict[str, list[str]] = {}
    for name, value in response.getheaders():
        found.setdefault(name.lower(), []).append(value)
    return response.status, found, body


def code_of(body: bytes) -> str:
    return json.loads(body)["code"]


@pytest.fixture
def sessions(django_user_model):
    cache.clear()
    connect.clear_local_caches()
    owner = django_user_model.objects.create_user("carol")
    cluster = ClusterFactory(session_domain=DOMAIN)
    ClusterFactory(session_domain="gone.example.com", status="deregistered")
    mine = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    yours = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    token = services.session_connect(session=mine, user=owner).split("token=")[1]
    return mine, yours, token


def test_link_then_cookie_for_every_method(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, _yours, token = sessions
    sid = mine.public_id.encode()
    status, headers, _ = send(control_plane, b"GET", PREFIX + b"/s/" + sid + b"/lab?x=1&token=" + token.encode())
    assert status == 307 and headers["location"] == [f"/s/{mine.public_id}/lab?x=1"]
    assert headers["cache-control"] == ["no-store"]
    cookie = SimpleCookie(headers["set-cookie"][0])[connect.COOKIE_NAME]
    assert cookie["path"] == f"/s/{mine.public_id}/" and cookie["secure"] and cookie["httponly"]
    with_cookie = {b"Cookie": f"{connect.COOKIE_NAME}={cookie.value}".encode()}
    for method in (b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS"):
        status, headers, _ = send(control_plane, method, PREFIX + b"/s/" + sid + b"/lab?x=1", headers=with_cookie)
        assert status == 200 and headers["x-auth-request-user"] == ["carol"], method
        assert headers["cache-control"] == ["no-store"] and "set-cookie" not in headers
        status, headers, body = send(control_plane, method, PREFIX + b"/s/" + sid + b"/lab")
        assert status == 401 and headers["cache-control"] == ["no-store"], method
        if method != b"HEAD":
            assert code_of(body) == "token_missing"


TRICKS = [
    b"/s/{mine}/../{yours}/lab", b"/s/{mine}/../../s/{yours}/lab", b"/s/{mine}/%2e%2e/%2e%2e/s/{yours}/lab",
    b"/s/{mine}/%2E%2E/{yours}/", b"/s/{mine}/.%2e/{yours}/", b"/s/{mine}/%2e/lab", b"/s/{mine}/./lab",
    b"/s/{mine}/..%2f..%2fs/{yours}/lab", b"/s/{mine}%2F..%2F{yours}/", b"/s/{mine}/..%5c..%5cs%5c{yours}/",
    b"/s/{mine}/..\\..\\s\\{yours}\\lab", b"//s/{mine}/lab", b"/s/{mine}//lab", b"/s//{mine}/lab",
    b"/s/{mine}/x/s/{yours}/lab", b"/s/{mine}/%73/{yours}/", b"/s/{mine}/a%00b", b"/s/{mine}/%zz", b"/x/../s/{mine}/",
    b"/s/{mine}/%252e%252e/%252e%252e/s/{yours}/",
]


def test_every_path_trick_is_refused(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, yours, token = sessions
    for path in TRICKS:
        target = PREFIX + path.replace(b"{mine}", mine.public_id.encode()).replace(b"{yours}", yours.public_id.encode())
        status, headers, body = send(control_plane, b"GET", target + b"?token=" + token.encode())
        assert (status, code_of(body)) == (401, "connect_refused"), (path, body)
        assert "set-cookie" not in headers and "x-auth-request-user" not in headers


def test_non_utf8_and_overlong_paths_are_judged_never_a_500(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, _yours, token = sessions
    base = PREFIX + b"/s/" + mine.public_id.encode() + b"/"
    query = b"?token=" + token.encode()
    for path in (b"%ff%fe", b"caf%C3%A9", b"a" * 2500):  # plain paths under the session, as nginx routes them
        status, _, _ = send(control_plane, b"GET", base + path + query)
        assert status == 307, path
    for path in (b"\xff\xfe", b"caf\xc3\xa9"):  # raw bytes above ASCII: gunicorn refuses the request line itself
        status, _, body = send(control_plane, b"GET", base + path + query)
        assert status == 400, body
    status, _, _ = send(control_plane, b"GET", base + b"a" * 70000 + query)
    assert status == 414  # gunicorn's request-line limit (4094 bytes), before any view: refused, never let in


def test_tokens_expired_forged_and_of_another_session(control_plane, sessions, settings):  # noqa: F811 -- the fixture
    mine, yours, token = sessions
    sid = mine.public_id.encode()
    head, payload, signature = token.split(".")
    forged = f"{head}.{payload}.{signature[::-1]}".encode()
    assert code_of(send(control_plane, b"GET", PREFIX + b"/s/" + sid + b"/?token=" + forged)[2]) == "token_invalid"
    status, _, body = send(control_plane, b"GET", PREFIX + b"/s/" + yours.public_id.encode() + b"/?token=" + token.encode())
    assert (status, code_of(body)) == (401, "connect_refused")
    key, now = signing_key_ensure(), int(time.time())
    expired = jwt.encode(
        {"iss": settings.GSHARE_JWT_ISSUER, "sub": f"user:{mine.owner_id}", "aud": CONNECT_AUDIENCE, "use": "link",
         "sid": mine.public_id, "name": "carol", "host": DOMAIN, "iat": now - 900, "exp": now - 600},
        key.private_key_pem, algorithm="RS256", headers={"kid": key.kid},
    ).encode()
    assert code_of(send(control_plane, b"GET", PREFIX + b"/s/" + sid + b"/?token=" + expired)[2]) == "token_invalid"


def test_hosts(control_plane, sessions):  # noqa: F811 -- the fixture
    mine, _yours, token = sessions
    # A cluster whose session_domain is the control plane's public host (DJANGO_ALLOWED_HOSTS lists it): never answered.
    public = Session.objects.create(owner=mine.owner, cluster=ClusterFactory(session_domain=PUBLIC_HOST), image="img", gpus=1,
                                    phase=Session.Phase.RUNNING)
    public_link = services.session_connect(session=public, user=mine.owner).split("token=")[1]
    status, _, body = send(control_plane, b"GET", PREFIX + f"/s/{public.public_id}/?token={public_link}".encode(), host=PUBLIC_HOST.encode())
    assert (status, code_of(body)) == (404, "not_found")
    target = PREFIX + b"/s/" + mine.public_id.encode() + b"/?token=" + token.encode()
    assert send(control_plane, b"GET", target, host=DOMAIN.encode() + b":443")[0] == 307
    for host in (PUBLIC_HOST.encode(), b"gone.example.com", b"unknown.example.net", b"gpu-a.example.com.evil.net"):
        status, _, body = send(control_plane, b"GET", target, host=host)
        assert status == 404 and code_of(body) == "not_found", host
    status, _, body = send(control_plane, b"GET", target, host=INTERNAL_HOST.encode())
    assert (status, code_of(body)) == (401, "connect_refused")  # answered on the internal host: another host than the session's
    # The other internal routes keep their host rule: not on a session domain.
    # (Django answers 400 first: DJANGO_ALLOWED_HOSTS does not list the session domain.)
    assert send(control_plane, b"GET", contract.CONNECT_VERIFY_PATH.encode(), host=DOMAIN.encode())[0] in (400, 404)
    assert send(control_plane, b"GET", b"/internal/ping", host=DOMAIN.encode())[0] in (400, 404)
    # An absolute-form target is not a check Envoy sends.
    absolute = b"http://" + DOMAIN.encode() + target
    assert send(control_plane, b"GET", absolute)[0] in (401, 404)



def test_a_database_too_slow_for_the_host_rule_is_a_fast_503(control_plane, sessions):  # noqa: F811 -- the fixture
    """The registered session domains are read under the verify's statement timeout: a locked clusters table answers
    503 ``verify_unavailable`` within about a second (Envoy then refuses, ``failOpen: false``), never a 404 or a 500."""
    from clusters.models import Cluster

    mine, _yours, token = sessions
    target = PREFIX + b"/s/" + mine.public_id.encode() + b"/?token=" + token.encode()
    with table_locked(Cluster):  # a fresh gunicorn has not read the domains yet
        status, headers, body = send(control_plane, b"GET", target)
    # The statement timeout's answer: without it the read would wait on the lock until the test released it.
    assert (status, code_of(body)) == (503, "verify_unavailable") and headers["retry-after"] == ["1"], body
    assert send(control_plane, b"GET", target)[0] == 307  # decides again at once
