"""Connect tokens and ``/internal/connect/verify`` (the ingress-nginx auth-url), without nginx."""

import socket
import time

import jwt
import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.exceptions import Forbidden  # noqa: F401
from identity.internal_jwt import CONNECT_AUDIENCE, sign_internal_jwt
from identity.keys import signing_key_ensure
from sessions import connect, lifecycle, services
from sessions.models import Session
from tests.factories import ClusterFactory
from tests.helpers import table_locked

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(django_user_model):
    cache.clear()
    connect.clear_local_caches()
    owner = django_user_model.objects.create_user("carol")
    cluster = ClusterFactory(session_domain="gpu-a.example.com")
    return Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)


def link(session) -> str:
    return services.session_connect(session=session, user=session.owner)


def verify(client, url, **headers):
    return client.get("/internal/connect/verify", HTTP_X_ORIGINAL_URL=url, HTTP_X_ORIGINAL_METHOD="GET", **headers)


def test_valid_link_is_allowed_and_sets_a_path_scoped_cookie(client, running):
    url = link(running)
    response = verify(client, url)
    assert response.status_code == 200
    assert response["X-Auth-Request-User"] == "carol"
    cookie = response.cookies["gshare_connect"]
    assert cookie["path"] == f"/s/{running.public_id}/" and cookie["httponly"] and cookie["secure"]
    later = f"https://gpu-a.example.com/s/{running.public_id}/lab/tree"
    client.cookies["gshare_connect"] = cookie.value
    assert verify(client, later).status_code == 200
    assert "gshare_connect" not in verify(client, later).cookies  # set only on the first visit


def test_bearer_header_works_for_api_clients(client, running):
    token = link(running).split("token=")[1]
    url = f"https://gpu-a.example.com/s/{running.public_id}/api/status"
    assert verify(client, url, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    assert verify(client, url).status_code == 401


def test_refusals(client, running, django_capture_on_commit_callbacks):
    url = link(running)
    token = url.split("token=")[1]
    other = Session.objects.create(owner=running.owner, cluster=running.cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    assert verify(client, url.replace(running.public_id, other.public_id)).status_code == 401  # wrong session
    assert verify(client, url.replace("gpu-a.example.com", "gpu-b.example.com")).status_code == 401  # wrong host
    assert verify(client, url.replace(token, token[:-3] + "AAA")).status_code == 401  # tampered
    assert verify(client, f"https://gpu-a.example.com/s/{running.public_id}/").status_code == 401  # no token
    assert verify(client, "https://gpu-a.example.com/other").status_code == 401  # not a session path
    key = signing_key_ensure()
    expired = jwt.encode(
        {"iss": "gshare-control-plane", "sub": "user:1", "aud": CONNECT_AUDIENCE, "sid": running.public_id,
         "host": "gpu-a.example.com", "iat": int(time.time()) - 600, "exp": int(time.time()) - 300},
        key.private_key_pem, algorithm="RS256", headers={"kid": key.kid},
    )
    assert verify(client, f"https://gpu-a.example.com/s/{running.public_id}/?token={expired}").status_code == 401
    operator_token = sign_internal_jwt("operator:x", 60)  # right key, wrong audience
    assert verify(client, f"https://gpu-a.example.com/s/{running.public_id}/?token={operator_token}").status_code == 401
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.session_fail(session=running, message="done")  # no longer running: the cache is invalidated on commit
    time.sleep(connect.FACTS_CACHE_SECONDS + 0.1)  # per-process facts live at most this long
    assert verify(client, url).status_code == 401


def test_refusals_are_json_with_a_code(client, running):
    url = link(running)
    token = url.split("token=")[1]
    base = f"https://gpu-a.example.com/s/{running.public_id}/"
    cases = [
        (base, {}, "token_missing"),
        (base, {"HTTP_AUTHORIZATION": "Bearer not-a-jwt"}, "token_invalid"),
        (base + "?token=" + token[:-3] + "AAA", {}, "token_invalid"),
        (url.replace("gpu-a.example.com", "gpu-b.example.com"), {}, "connect_refused"),
        (f"https://gpu-a.example.com/s/{running.public_id}/../{running.public_id}/?token={token}", {}, "connect_refused"),
        ("https://gpu-a.example.com/other", {}, "connect_refused"),
        ("https://evil@gpu-a.example.com" + url.split("gpu-a.example.com", 1)[1], {}, "connect_refused"),
        ("gpu-a.example.com/s/x/", {}, "connect_refused"),
    ]
    for original_url, headers, code in cases:
        response = verify(client, original_url, **headers)
        assert response.status_code == 401, original_url
        assert response["Content-Type"] == "application/json" and response.json()["code"] == code, (original_url, response.content)
        assert response["Cache-Control"] == "no-store" and not response.cookies
    assert verify(client, url).status_code == 200  # the link itself still passes


def test_only_owner_or_staff_get_links(running, django_user_model):
    stranger = django_user_model.objects.create_user("mallory")
    with pytest.raises(services.Forbidden):
        services.session_connect(session=running, user=stranger)
    admin = django_user_model.objects.create_user("root", is_staff=True)
    with pytest.raises(services.Forbidden):  # staff alone: not without the permission to change sessions
        services.session_connect(session=running, user=admin)
    from django.contrib.auth.models import Permission

    admin.user_permissions.add(Permission.objects.get(content_type__app_label="gpu_sessions", codename="change_session"))
    admin = django_user_model.objects.get(pk=admin.pk)  # has_perm caches the permissions on the instance
    assert services.session_connect(session=running, user=admin).startswith("https://gpu-a.example.com/")


def test_verify_uses_no_database_query_once_warm(client, running):
    url = link(running)
    verify(client, url)
    bearer = f"Bearer {url.split('token=')[1]}"
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert verify(client, f"https://gpu-a.example.com/s/{running.public_id}/x", HTTP_AUTHORIZATION=bearer).status_code == 200
    assert len(queries) == 0


def test_console_session_pages_have_constant_queries(client, running, django_user_model):
    from tests.factories import ClusterFactory as _Cluster

    admin_user = django_user_model.objects.create_superuser("boss", "b@example.com", "pw")
    client.force_login(admin_user)
    counts = []
    for _ in range(2):
        cluster = _Cluster()
        for _ in range(3):
            Session.objects.create(owner=running.owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/gpu_sessions/session/").status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
    assert client.get(f"/gpu_sessions/session/{running.pk}/change/").status_code == 200


# --- verify cannot decide: a fast 503, never a 500 or a 2xx ------------------------------------------------------


def _verify_over_http(anon, session, token: str):
    return anon.get(
        "/internal/connect/verify",
        headers={
            "X-Original-URL": f"https://gpu-a.example.com/s/{session.public_id}/lab",
            "X-Original-Method": "GET",
            "Authorization": f"Bearer {token}",
        },
        timeout=10,
    )


def _assert_unavailable(response, what: str, errors: tuple[str, ...]):
    """A 503 ``verify_unavailable`` saying which dependency failed and how: ``errors`` are the exception names a bounded
    call ends with (a timeout or a refusal), never a wait for a peer that does not answer."""
    assert response.status_code == 503, (response.status_code, response.text[:300])
    assert int(response.headers["Retry-After"]) >= 1
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == "verify_unavailable" and body["detail"]
    assert "X-Auth-Request-User" not in response.headers
    assert any(f"cannot reach its {what} now ({error})" in body["detail"] for error in errors), body["detail"]


@pytest.fixture
def closed_port() -> str:
    """``127.0.0.1:<port>`` where nothing listens (connections are refused)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    host_port = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()
    return host_port


@pytest.mark.django_db
@pytest.mark.parametrize("redis_at", ["silent", "closed"])
def test_verify_answers_a_fast_503_when_redis_does_not_answer(running, anon, settings, silent_listener, closed_port, redis_at):
    token = link(running).split("token=")[1]
    connect.clear_local_caches()
    target = silent_listener if redis_at == "silent" else closed_port
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://{target}/0"}}
    for _ in range(2):  # the second call goes through the same bounded client
        response = _verify_over_http(anon, running, token)
        # the silent Redis is given up on by the socket timeout set on the verify's client, not waited for
        _assert_unavailable(response, "cache", ("TimeoutError",) if redis_at == "silent" else ("ConnectionError",))
    client = connect.redis_client()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == connect.CACHE_TIMEOUT_SECONDS



@pytest.mark.django_db(transaction=True)
def test_verify_answers_a_fast_503_when_the_database_is_too_slow(running, anon):
    from identity.models import SigningKey

    token = link(running).split("token=")[1]
    connect.clear_local_caches()  # the signing key is looked up again
    # The lock is held until the answer came: only the verify's statement_timeout can end its wait (else the request
    # would wait for the lock, held by this thread, until the client gave up).
    with table_locked(SigningKey):
        _assert_unavailable(_verify_over_http(anon, running, token), "database", ("OperationalError", "QueryCanceled"))
    response = _verify_over_http(anon, running, token)
    assert response.status_code == 200 and response.headers["X-Auth-Request-User"] == "carol"  # decides again at once

    cache.clear()
    connect.clear_local_caches()
    with table_locked(Session):  # the session's facts must come from the database
        _assert_unavailable(_verify_over_http(anon, running, token), "database", ("OperationalError", "QueryCanceled"))


@pytest.mark.django_db
def test_verify_refuses_an_original_url_whose_authority_is_not_host_and_port(client, django_user_model):
    owner = django_user_model.objects.create_user("carol")
    session = Session.objects.create(owner=owner, cluster=ClusterFactory(session_domain="gpu-a.example.com"), image="img",
                                     gpus=1, phase=Session.Phase.RUNNING)
    url = services.session_connect(session=session, user=owner)
    path = url.split("gpu-a.example.com", 1)[1]
    for authority in ("gpu-a.example.com?x", "gpu-a.example.com#x", "gpu-a.example.com:x", "gpu-a.example.com:",
                      "gpu-a.example.com%2f", "gpu-a.example.com\\", "gpu-a..example.com", "gpu-a.example.com\x7f"):
        response = client.get("/internal/connect/verify", HTTP_X_ORIGINAL_URL=f"https://{authority}{path}",
                              HTTP_X_ORIGINAL_METHOD="GET")
        assert response.status_code == 401 and response.json()["code"] == "connect_refused", authority
    for authority in ("gpu-a.example.com", "GPU-A.example.com:443"):
        response = client.get("/internal/connect/verify", HTTP_X_ORIGINAL_URL=f"https://{authority}{path}",
                              HTTP_X_ORIGINAL_METHOD="GET")
        assert response.status_code == 200, authority
