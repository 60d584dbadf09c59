"""Envoy's ext_authz check (``/internal/connect/ext-authz/<original path>``), in process: the request shape, the
307 of a link, the host rule. Over real gunicorn and a real Envoy: tests/e2e/test_connect_ext_authz_gunicorn.py and
tests/e2e/test_connect_envoy.py."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contract
from core import instruments
from sessions import activity, connect, ext_authz, services
from sessions.models import Session
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

DOMAIN = "gpu-a.example.com"
PREFIX = contract.CONNECT_EXT_AUTHZ_PATH


@pytest.fixture
def running(django_user_model, settings):
    settings.ALLOWED_HOSTS = ["gshare.example.com", "127.0.0.1", "localhost", "testserver"]
    cache.clear()
    connect.clear_local_caches()
    ext_authz.forget_session_domains()
    owner = django_user_model.objects.create_user("carol")
    cluster = ClusterFactory(session_domain=DOMAIN)
    yield Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    ext_authz.forget_session_domains()


def check(client, original: str, *, method: str = "GET", host: str = DOMAIN, raw: str | None = None, **headers):
    """An ext_authz check as Envoy sends it: the original path+query after the prefix, Host = the original authority."""
    raw_uri = raw if raw is not None else PREFIX + original
    headers.setdefault("HTTP_X_FORWARDED_PROTO", "https")
    return client.generic(method, raw_uri, HTTP_HOST=host, RAW_URI=raw_uri, **headers)


def token_of(session) -> str:
    return services.session_connect(session=session, user=session.owner).split("token=")[1]


def test_link_is_answered_307_without_the_token_and_with_the_cookie_which_then_passes(client, running):
    token = token_of(running)
    sid = running.public_id
    response = check(client, f"/s/{sid}/lab?a=1&token={token}&b=%2F")
    assert response.status_code == 307
    assert response["Location"] == f"/s/{sid}/lab?a=1&b=%2F"
    assert response["Cache-Control"] == "no-store"
    cookie = response.cookies[connect.COOKIE_NAME]
    assert cookie["path"] == f"/s/{sid}/" and cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Lax"
    client.cookies[connect.COOKIE_NAME] = cookie.value
    allowed = check(client, f"/s/{sid}/lab?a=1&b=%2F")
    assert allowed.status_code == 200 and allowed["X-Auth-Request-User"] == "carol"
    assert allowed["Cache-Control"] == "no-store" and connect.COOKIE_NAME not in allowed.cookies


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_every_method_is_judged_alike(client, running, method):
    token = token_of(running)
    sid = running.public_id
    assert check(client, f"/s/{sid}/api/x", method=method, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    refused = check(client, f"/s/{sid}/api/x", method=method)
    assert refused.status_code == 401
    if method != "HEAD":
        assert refused.json()["code"] == "token_missing"


def test_a_token_named_in_another_spelling_is_dropped_from_the_location_too(client, running):
    token = token_of(running)
    response = check(client, f"/s/{running.public_id}/?to%6Ben={token}")
    assert response.status_code == 307 and response["Location"] == f"/s/{running.public_id}/"


def test_refusals_carry_the_verify_codes(client, running, django_user_model):
    sid = running.public_id
    token = token_of(running)
    other = Session.objects.create(owner=running.owner, cluster=running.cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    assert check(client, f"/s/{sid}/").json()["code"] == "token_missing"
    assert check(client, f"/s/{sid}/?token=forged.{token[6:]}").json()["code"] == "token_invalid"
    assert check(client, f"/s/{other.public_id}/?token={token}").json()["code"] == "connect_refused"
    assert check(client, f"/s/{sid}/?token={token}", HTTP_X_FORWARDED_PROTO="gopher").json()["code"] == "connect_refused"
    running.owner.is_active = False
    running.owner.save()
    forbidden = check(client, f"/s/{sid}/?token={token}")
    assert forbidden.status_code == 403 and forbidden.json()["code"] == "connect_forbidden"


TRICKS = [
    "/s/{sid}/../{sid}/", "/s/{sid}/../../s/{other}/lab", "/s/{sid}/%2e%2e/{sid}/", "/s/{sid}/%2E%2E/%2e%2E/s/{other}/",
    "/s/{sid}/%2E/", "/s/{sid}/file%2etxt", "/s/{sid}%2fx", "/s/{sid}/..%2F..%2Fs%2F{other}%2Flab", "/s/{sid}/%5c..",
    "/s/{sid}/..%5C..%5Cs/{other}/", "/s/{sid}/..\\..\\s\\{other}\\lab", "/s/{sid}//x", "//s/{sid}/", "/s//{sid}/",
    "/s/{sid}/x/s/{other}/", "/s/{sid}/%73/{other}/", "/s/{sid}/s/", "/s/{sid}/%00", "/s/{sid}/a%00b", "/s/{sid}/./",
    "/x/../s/{sid}/", "/s/{sid}/%zz", "/s/{sid}/%", "/S/{sid}/", "/s/", "/", "/s/{sid}/%252e%252e/%252e%252e/s/{other}/",
]
PLAIN = [
    "/s/{sid}/", "/s/{sid}", "/s/{sid}/lab/tree/a.ipynb?x=1", "/s/{sid}/api/contents/a%20b%C3%A9", "/s/{sid}/%ff%fe",
    "/s/{sid}/files/s", "/s/{sid}/x?next=/../../s/{other}/", "/%73/{sid}/lab", "/s/{sid}/..x/.y/x../x.",
    "/s/{sid}/" + "a" * 8000,
]


@pytest.fixture
def other(running):
    return Session.objects.create(owner=running.owner, cluster=running.cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)


@pytest.mark.parametrize("original", TRICKS + PLAIN)
def test_every_path_is_judged_as_the_ingress_nginx_verify_judges_it(client, running, other, original):
    """The same path rules (``sessions.connect_path``): a trick refused 401 ``connect_refused`` by both, a plain path
    let in by both (the link's 307 here, its 200 there)."""
    token = token_of(running)
    uri = original.format(sid=running.public_id, other=other.public_id) + ("&" if "?" in original else "?") + f"token={token}"
    envoy = check(client, uri)
    nginx = client.get(contract.CONNECT_VERIFY_PATH, HTTP_X_ORIGINAL_URL=f"https://{DOMAIN}{uri}", HTTP_HOST="127.0.0.1")
    if original in TRICKS:
        assert (envoy.status_code, envoy.json()["code"]) == (nginx.status_code, nginx.json()["code"]) == (401, "connect_refused")
    else:
        assert (envoy.status_code, nginx.status_code) == (307, 200)
        assert envoy.cookies[connect.COOKIE_NAME]["path"] == nginx.cookies[connect.COOKIE_NAME]["path"]


def test_the_raw_uri_decides_not_the_decoded_path(client, running):
    token = token_of(running)
    sid = running.public_id
    # Django's PATH_INFO would read /s/<sid>/x; the proxy routes %2f: refused on what the proxy sent.
    response = client.generic("GET", f"{PREFIX}/s/{sid}/x", HTTP_HOST=DOMAIN, RAW_URI=f"{PREFIX}/s/{sid}%2fx?token={token}")
    assert response.status_code == 401
    # An absolute-form target or an encoded prefix is not a check Envoy sends.
    for raw in (f"http://{DOMAIN}{PREFIX}/s/{sid}/?token={token}", f"/internal/connect/ext%2Dauthz/s/{sid}/?token={token}"):
        assert client.generic("GET", f"{PREFIX}/s/{sid}/", HTTP_HOST=DOMAIN, RAW_URI=raw).status_code == 401


def test_without_a_raw_uri_it_cannot_decide(client, running):
    response = client.get(f"{PREFIX}/s/{running.public_id}/", HTTP_HOST=DOMAIN)
    assert response.status_code == 503 and response.json()["code"] == "verify_unavailable"


def test_hosts(client, running, settings):
    token = token_of(running)
    sid = running.public_id
    original = f"/s/{sid}/?token={token}"
    assert check(client, original, host=f"{DOMAIN}:443").status_code == 307
    assert check(client, original, host="GPU-A.example.com").status_code == 307
    assert check(client, original, host="127.0.0.1").status_code == 401  # internal host: answered, wrong host
    for host in ("gshare.example.com", "unknown.example.net", "gpu-a.example.com.evil", "a/b", ""):
        response = check(client, original, host=host)
        assert response.status_code in (404, 400) and response.status_code != 200, host
    # A session domain an explicit ALLOWED_HOSTS entry matches is a public host: never answered there.
    settings.ALLOWED_HOSTS = [".example.com", "127.0.0.1"]
    assert check(client, original).status_code == 404
    settings.ALLOWED_HOSTS = ["*"]
    assert check(client, original).status_code == 307
    # Other internal routes keep their rule: not on a session domain.
    assert client.get(contract.CONNECT_VERIFY_PATH, HTTP_HOST=DOMAIN).status_code == 404


def test_a_deregistered_clusters_domain_is_not_answered(client, running):
    token = token_of(running)
    assert check(client, f"/s/{running.public_id}/?token={token}").status_code == 307
    running.cluster.status = "deregistered"
    running.cluster.save()
    assert check(client, f"/s/{running.public_id}/?token={token}").status_code == 307  # the cached set, for a moment
    ext_authz.forget_session_domains()
    assert check(client, f"/s/{running.public_id}/?token={token}").status_code == 404


def test_answers_are_observed_like_the_verify(client, running):
    child = instruments._VERIFY_CHILDREN["allowed"]
    before = child._sum.get(), sum(b.get() for b in child._buckets)
    token = token_of(running)
    assert check(client, f"/s/{running.public_id}/?token={token}").status_code == 307
    assert sum(b.get() for b in child._buckets) == before[1] + 1


@pytest.mark.parametrize(("uri", "expected"), [
    ("/s/x/?token=a", "/s/x/"),
    ("/s/x/?a=1&token=a&b=2", "/s/x/?a=1&b=2"),
    ("/s/x/?token=a&token=b&c=%26", "/s/x/?c=%26"),
    ("/s/x/?to%6Ben=a&tokens=1", "/s/x/?tokens=1"),
    ("/s/x/?a=1&&token", "/s/x/?a=1"),
    ("/s/x/?token+=a&x=token", "/s/x/?token+=a&x=token"),  # "token " is another name
    ("/s/x/", "/s/x/"),
])
def test_without_token(uri, expected):
    assert ext_authz.without_token(uri) == expected


def test_a_check_let_in_notes_the_connection_for_the_idle_policy(client, running):
    activity.forget_noted()
    sid = running.public_id
    assert sid not in (activity.connections_pending([sid]) or {})
    assert check(client, f"/s/{sid}/?token={token_of(running)}").status_code == 307
    assert sid in (activity.connections_pending([sid]) or {})


_PIECES = ["/", "/", "s", "{sid}", "{other}", ".", "..", "%2e", "%2E", "%2f", "%5C", "\\", "%25", "%00", "%73", "?", "#",
           "lab", "%C3%A9", "%ff", "token=", "&"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(_PIECES), max_size=12))
def test_any_path_gets_the_verdict_the_verify_gives(running, other, pieces):
    """For any original path and query, the check's verdict is the verify's for ``X-Original-URL`` = the same URI."""
    token = _tokens.setdefault(running.public_id, token_of(running))
    uri = ("/s/{sid}/" + "".join(pieces)).format(sid=running.public_id, other=other.public_id)
    uri += ("&" if "?" in uri else "?") + f"token={token}"
    envoy = ext_authz.check(raw_uri=PREFIX + uri, host=DOMAIN).verdict
    nginx = connect.verify(original_url=f"https://{DOMAIN}{uri}")
    assert (envoy.status, envoy.code, envoy.session) == (nginx.status, nginx.code, nginx.session), uri


_tokens: dict[str, str] = {}
