"""Connect tokens by use and the user behind them: a connect cookie never renews itself, and stops working when its
user is deactivated.

* a link token (``use: "link"``, from ``POST /api/v1/sessions/{id}/connect``) is accepted as ``?token=`` (the verify
  answers with a cookie) or as ``Authorization: Bearer``; a cookie token (``use: "cookie"``) only as the cookie, so it
  is never renewed; a token without ``use`` is neither;
* a cookie lives ``GSHARE_CONNECT_COOKIE_TTL`` from its link's ``iat`` (its ``auth_time``), whatever its ``exp`` says;
* the token's user must be active and still the session's owner or staff (403 ``connect_forbidden``), decided from
  cached facts that a user's save drops at once (refused within ``FACTS_CACHE_SECONDS``) and that expire on their own
  within ``GSHARE_CONNECT_CACHE_SECONDS`` when a change bypasses ``save()``;
* an invalidation that lands while a verify reads the database is not undone by that verify's cache write.
"""

import threading
import time

import jwt
import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

import contract
from identity.internal_jwt import CONNECT_AUDIENCE, sign_internal_jwt
from identity.keys import signing_key_ensure
from identity.tokens import api_token_create
from sessions import connect, lifecycle, services
from sessions.models import Session
from tests.factories import ClusterFactory
from tests.helpers import Http

pytestmark = pytest.mark.django_db

DOMAIN = "gpu-a.example.com"
#: How long after a user's save (or a session's phase change) every server process refuses: its local facts' TTL.
BOUND = connect.FACTS_CACHE_SECONDS + 0.2


@pytest.fixture
def running(django_user_model):
    cache.clear()
    connect.clear_local_caches()
    owner = django_user_model.objects.create_user("anna")
    cluster = ClusterFactory(session_domain=DOMAIN)
    return Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)


def verify(client, url, **headers):
    return client.get("/internal/connect/verify", HTTP_X_ORIGINAL_URL=url, HTTP_X_ORIGINAL_METHOD="GET", **headers)


def base(session) -> str:
    return f"https://{DOMAIN}/s/{session.public_id}/"


def claims_of(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def signed(session, **claims) -> str:
    """A connect token signed with the active key, with exactly these claims on top of the usual ones."""
    key = signing_key_ensure()
    now = int(time.time())
    payload = {"iss": settings.GSHARE_JWT_ISSUER, "sub": f"user:{session.owner_id}", "aud": CONNECT_AUDIENCE,
               "sid": session.public_id, "name": session.owner.get_username(), "host": DOMAIN, "iat": now, "nbf": now,
               "exp": now + 300, "jti": "t", **claims}
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, key.private_key_pem, algorithm="RS256", headers={"kid": key.kid})


def open_link(client, session, user=None) -> tuple[str, str]:
    """Open a fresh link of ``user`` (default: the owner): ``(link token, cookie token)``; the client keeps no cookie."""
    url = services.session_connect(session=session, user=user or session.owner)
    response = verify(client, url)
    assert response.status_code == 200, response.content
    cookie = response.cookies[connect.COOKIE_NAME].value
    client.cookies.clear()
    return url.split("token=", 1)[1], cookie


def assert_refused(response, status: int, code: str):
    assert response.status_code == status, (response.status_code, response.content)
    assert response.json()["code"] == code and response.json()["detail"]
    assert not response.cookies and not response.has_header("X-Auth-Request-User")


def test_link_and_cookie_tokens_are_marked_by_use_and_the_cookie_ends_a_fixed_time_after_its_link(client, running):
    url = services.session_connect(session=running, user=running.owner)
    link = claims_of(url.split("token=", 1)[1])
    assert link["use"] == "link" and link["exp"] - link["iat"] == settings.GSHARE_CONNECT_TOKEN_TTL
    response = verify(client, url)
    assert response.status_code == 200
    morsel = response.cookies[connect.COOKIE_NAME]
    cookie = claims_of(morsel.value)
    assert cookie["use"] == "cookie" and cookie["sid"] == running.public_id and cookie["sub"] == link["sub"]
    assert cookie["auth_time"] == link["iat"]
    assert 0 <= cookie["exp"] - (link["iat"] + settings.GSHARE_CONNECT_COOKIE_TTL) <= 1  # the signer's clock may tick once
    assert abs(int(morsel["max-age"]) - (cookie["exp"] - time.time())) <= 2


def test_a_cookie_token_is_accepted_only_as_the_cookie_and_never_renewed(client, running):
    _, cookie = open_link(client, running)
    # as the link (?token=) or as a bearer it is no token at all: no 200, no fresh cookie
    assert_refused(verify(client, base(running) + f"?token={cookie}"), 401, "token_invalid")
    assert_refused(verify(client, base(running) + "lab", HTTP_AUTHORIZATION=f"Bearer {cookie}"), 401, "token_invalid")
    # with the cookie sent too, the request passes on the cookie and gets no new one
    client.cookies[connect.COOKIE_NAME] = cookie
    again = verify(client, base(running) + f"?token={cookie}")
    assert again.status_code == 200 and again["X-Auth-Request-User"] == "anna"
    assert connect.COOKIE_NAME not in again.cookies
    assert verify(client, base(running) + "lab").status_code == 200


def test_a_link_token_is_not_a_cookie_and_a_token_without_use_is_nothing(client, running):
    link, _ = open_link(client, running)
    client.cookies[connect.COOKIE_NAME] = link
    assert_refused(verify(client, base(running)), 401, "token_invalid")
    client.cookies.clear()
    legacy = sign_internal_jwt(f"user:{running.owner_id}", 300, audience=CONNECT_AUDIENCE,
                               claims={"sid": running.public_id, "name": "anna", "host": DOMAIN})
    assert_refused(verify(client, base(running) + f"?token={legacy}"), 401, "token_invalid")
    assert_refused(verify(client, base(running), HTTP_AUTHORIZATION=f"Bearer {legacy}"), 401, "token_invalid")
    client.cookies[connect.COOKIE_NAME] = legacy
    assert_refused(verify(client, base(running)), 401, "token_invalid")
    for use in ("other", "", 1, None):
        client.cookies[connect.COOKIE_NAME] = signed(running, use=use, auth_time=int(time.time()))
        assert_refused(verify(client, base(running)), 401, "token_invalid")


def test_the_cookie_lifetime_counts_from_its_link_whatever_its_exp(client, running, settings):
    settings.GSHARE_CONNECT_COOKIE_TTL = 400
    now = int(time.time())
    old_link = signed(running, use="link", iat=now - 350, nbf=now - 350, exp=now + 60)
    response = verify(client, base(running) + f"?token={old_link}")
    assert response.status_code == 200
    morsel = response.cookies[connect.COOKIE_NAME]
    assert 0 <= claims_of(morsel.value)["exp"] - (now - 350 + 400) <= 1 and 45 <= int(morsel["max-age"]) <= 50
    client.cookies.clear()
    # a link older than the cookie lifetime still opens this request, but gives no cookie
    older = signed(running, use="link", iat=now - 450, nbf=now - 450, exp=now + 60)
    response = verify(client, base(running) + f"?token={older}")
    assert response.status_code == 200 and connect.COOKIE_NAME not in response.cookies
    # a cookie whose link is older than GSHARE_CONNECT_COOKIE_TTL is refused even when its exp is later
    client.cookies[connect.COOKIE_NAME] = signed(running, use="cookie", auth_time=now - 401, exp=now + 3600)
    assert_refused(verify(client, base(running)), 401, "token_invalid")
    for auth_time in (None, "x", now + 3600):  # missing, not a number, in the future
        client.cookies[connect.COOKIE_NAME] = signed(running, use="cookie", auth_time=auth_time)
        assert_refused(verify(client, base(running)), 401, "token_invalid")
    now = int(time.time())
    client.cookies[connect.COOKIE_NAME] = signed(running, use="cookie", auth_time=now - 390, exp=now + 3600)
    assert verify(client, base(running)).status_code == 200  # within its lifetime: the exp does not matter


def test_a_deactivated_user_is_refused_within_the_bound_and_again_allowed_when_reactivated(
    client, running, django_capture_on_commit_callbacks
):
    link, cookie = open_link(client, running)
    client.cookies[connect.COOKIE_NAME] = cookie
    assert verify(client, base(running) + "lab").status_code == 200  # the facts are cached now
    owner = running.owner
    owner.is_active = False
    with django_capture_on_commit_callbacks(execute=True):
        owner.save()
    time.sleep(BOUND)
    assert_refused(verify(client, base(running) + "lab"), 403, "connect_forbidden")
    client.cookies.clear()
    assert_refused(verify(client, base(running) + f"?token={link}"), 403, "connect_forbidden")  # and no new cookie
    assert_refused(verify(client, base(running), HTTP_AUTHORIZATION=f"Bearer {link}"), 403, "connect_forbidden")
    owner.is_active = True
    with django_capture_on_commit_callbacks(execute=True):
        owner.save()
    time.sleep(BOUND)
    client.cookies[connect.COOKIE_NAME] = cookie
    assert verify(client, base(running) + "lab").status_code == 200


def test_staff_who_lose_staff_or_the_account_are_refused(client, running, django_user_model, django_capture_on_commit_callbacks):
    from django.contrib.auth.models import Permission

    admin = django_user_model.objects.create_user("root", is_staff=True)
    admin.user_permissions.add(Permission.objects.get(content_type__app_label="gpu_sessions", codename="change_session"))  # staff alone may not open others'
    _, cookie = open_link(client, running, user=admin)
    client.cookies[connect.COOKIE_NAME] = cookie
    response = verify(client, base(running))
    assert response.status_code == 200 and response["X-Auth-Request-User"] == "root"
    admin.is_staff = False
    with django_capture_on_commit_callbacks(execute=True):
        admin.save()
    time.sleep(BOUND)
    assert_refused(verify(client, base(running)), 403, "connect_forbidden")
    # the owner is unaffected
    _, owner_cookie = open_link(client, running)
    client.cookies[connect.COOKIE_NAME] = owner_cookie
    assert verify(client, base(running)).status_code == 200
    # a token naming a user that does not exist
    client.cookies[connect.COOKIE_NAME] = signed(running, use="cookie", auth_time=int(time.time()), sub="user:999999")
    assert_refused(verify(client, base(running)), 403, "connect_forbidden")
    for sub in ("user:x", "operator:clu_1", "1"):
        client.cookies[connect.COOKIE_NAME] = signed(running, use="cookie", auth_time=int(time.time()), sub=sub)
        assert_refused(verify(client, base(running)), 401, "token_invalid")


def test_a_deactivation_that_bypasses_save_is_refused_once_the_cached_facts_expire(client, running, settings, django_user_model):
    settings.GSHARE_CONNECT_CACHE_SECONDS = 2
    _, cookie = open_link(client, running)
    client.cookies[connect.COOKIE_NAME] = cookie
    assert verify(client, base(running)).status_code == 200
    django_user_model.objects.filter(pk=running.owner_id).update(is_active=False)  # no signal: nothing is invalidated
    time.sleep(settings.GSHARE_CONNECT_CACHE_SECONDS + BOUND)
    assert_refused(verify(client, base(running)), 403, "connect_forbidden")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", ["session failed", "user deactivated"])
def test_an_invalidation_during_the_facts_read_is_not_undone_by_the_cache_write(running, change):
    """The verify reads the facts (Running, active), the change commits and drops them, then the verify caches
    what it read: without a guard Redis would say Running/active for GSHARE_CONNECT_CACHE_SECONDS (30 s)."""
    table = Session._meta.db_table if change == "session failed" else running.owner._meta.db_table
    url = services.session_connect(session=running, user=running.owner)
    token = url.split("token=", 1)[1]
    request = base(running) + "lab"
    assert connect.verify(original_url=request, authorization=f"Bearer {token}").status == 200
    cache.clear()
    connect.clear_local_caches()
    fired = []

    def change_now():
        try:
            if change == "session failed":
                lifecycle.session_fail(session=Session.objects.get(pk=running.pk), message="done")
            else:
                owner = type(running.owner).objects.get(pk=running.owner_id)
                owner.is_active = False
                owner.save()
        finally:
            connections.close_all()

    def after_the_read(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not fired and f'FROM "{table}"' in sql:
            fired.append(sql)
            worker = threading.Thread(target=change_now)  # another connection, committed before the verify goes on
            worker.start()
            worker.join(timeout=30)
        return result

    with connection.execute_wrapper(after_the_read):
        first = connect.verify(original_url=request, authorization=f"Bearer {token}")
    assert fired and first.status == 200  # it read the facts from before the change
    time.sleep(BOUND)
    assert connect.verify(original_url=request, authorization=f"Bearer {token}").status in (401, 403)


# --- over HTTP on the live server ---------------------------------------------------------------------------------


def _verify_http(anon, url: str, *, cookie: str = "", bearer: str = ""):
    headers = {"X-Original-URL": url, "X-Original-Method": "GET"}
    if cookie:
        headers["Cookie"] = f"{connect.COOKIE_NAME}={cookie}"
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    return anon.get("/internal/connect/verify", headers=headers, allow_redirects=False)


@pytest.mark.django_db(transaction=True)
def test_over_http_a_cookie_is_never_renewed_nor_a_link_and_ends_with_its_user(running, live_server, anon):
    owner = running.owner
    api = Http(live_server.url, api_token_create(username="anna")[1])
    url = api.post(f"/api/v1/sessions/{running.public_id}/connect").json()["url"]
    first = _verify_http(anon, url)
    assert first.status_code == 200 and first.headers["X-Auth-Request-User"] == "anna"
    cookie = first.cookies[connect.COOKIE_NAME]
    assert claims_of(cookie)["use"] == "cookie"

    later = _verify_http(anon, base(running) + "lab", cookie=cookie)
    assert later.status_code == 200 and "Set-Cookie" not in later.headers
    renew = _verify_http(anon, base(running) + f"?token={cookie}")  # a cookie offered as a link token
    assert renew.status_code == 401 and renew.json()["code"] == "token_invalid" and "Set-Cookie" not in renew.headers
    both = _verify_http(anon, base(running) + f"?token={cookie}", cookie=cookie)
    assert both.status_code == 200 and "Set-Cookie" not in both.headers
    assert Http(live_server.url, cookie).post(f"/api/v1/sessions/{running.public_id}/connect").status_code == 401  # no new link

    owner.is_active = False
    owner.save()
    time.sleep(BOUND)
    gone = _verify_http(anon, base(running) + "lab", cookie=cookie)
    assert gone.status_code == 403 and gone.json()["code"] == "connect_forbidden"
    assert "X-Auth-Request-User" not in gone.headers and "Set-Cookie" not in gone.headers
    assert _verify_http(anon, url).status_code == 403
    assert api.post(f"/api/v1/sessions/{running.public_id}/connect").status_code == 401  # as the API already did


@pytest.mark.django_db(transaction=True)
def test_over_http_a_user_deactivated_in_the_console_is_refused_within_the_bound(running, live_server, anon, django_user_model):
    _, cookie = open_link(Client(), running)
    assert _verify_http(anon, base(running), cookie=cookie).status_code == 200
    staff = django_user_model.objects.create_superuser("boss", "boss@example.com", "boss-password")
    console = Client()
    console.force_login(staff)
    owner = running.owner
    form = {
        "username": owner.username, "first_name": "", "last_name": "", "email": "", "is_staff": "", "is_superuser": "",
        "last_login_0": "", "last_login_1": "", "date_joined_0": owner.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": owner.date_joined.strftime("%H:%M:%S"), "_save": "Save",
    }  # is_active left out: unchecked
    response = console.post(f"/auth/user/{owner.pk}/change/", form)
    assert response.status_code == 302, response.content[:2000]
    owner.refresh_from_db()
    assert not owner.is_active
    time.sleep(BOUND)
    refused = _verify_http(anon, base(running), cookie=cookie)
    assert refused.status_code == 403 and refused.json()["code"] == "connect_forbidden"


@pytest.mark.django_db
def test_over_http_a_stopped_session_is_refused_within_the_bound(live_cluster, http_user, anon, plain_user):
    cluster, _ = live_cluster("lab-c1")
    session_id = http_user.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1}).json()["id"]
    lifecycle.session_status_apply(
        cluster=cluster, reports=[{"session": session_id, "phase": contract.PHASE_RUNNING, "observed_at": timezone.now()}],
    )
    url = http_user.post(f"/api/v1/sessions/{session_id}/connect").json()["url"]
    first = _verify_http(anon, url)
    assert first.status_code == 200 and first.headers["X-Auth-Request-User"] == "alice"
    cookie = first.cookies[connect.COOKIE_NAME]
    page = f"https://{cluster.session_domain}/s/{session_id}/lab"
    assert _verify_http(anon, page, cookie=cookie).status_code == 200
    assert http_user.delete(f"/api/v1/sessions/{session_id}").status_code == 202
    time.sleep(BOUND)
    refused = _verify_http(anon, page, cookie=cookie)
    assert refused.status_code == 401 and refused.json()["code"] == "connect_refused"
    assert _verify_http(anon, url).status_code == 401
