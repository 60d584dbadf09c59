"""Attacks on ``POST /api/v1/clusters/{id}/operator-token/push``, ``GET /api/v1/version`` and ``GET /api/v1/me`` over real
HTTP (the live server): tokens that must not work, ids that are not ids, many pushes at once, bodies the route does not
take. Each refusal is a JSON error with its code, never a 500, and pushes nothing."""

from __future__ import annotations

import base64
import http.client
import threading
import urllib.parse

import pytest
import requests
from django.contrib.auth import get_user_model

from audit.models import AuditRecord
from clusters import services
from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_issue
from identity.models import ApiToken
from identity.tokens import api_token_create, api_token_revoke
from tests.clusters.test_token_rotation import KEY, claims, secret_of, secret_token
from tests.helpers import kubeconfig_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ROUTES = [("POST", "/api/v1/clusters/{id}/operator-token/push"), ("GET", "/api/v1/version"), ("GET", "/api/v1/me")]


@pytest.fixture
def registered(fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster = services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated), session_domain="lab-c1.example.com")
    return cluster, emulated


def _raw(live_server, method: str, path: str, *, headers: dict | None = None, body: bytes = b"") -> tuple[int, bytes, str]:
    """Send ``path`` exactly as written (no client-side normalisation of ``..`` or percent-escapes)."""
    parsed = urllib.parse.urlsplit(live_server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            conn.putheader(key, value)
        conn.endheaders(body or None)
        response = conn.getresponse()
        return response.status, response.read(), response.getheader("Content-Type") or ""
    finally:
        conn.close()


def _nothing_pushed(emulated) -> None:
    assert secret_of(emulated) is None
    assert not AuditRecord.objects.filter(action__startswith="operator_token_rotate").exists()


# ----------------------------------------------------------------- tokens


def _tokens(cluster) -> dict[str, str]:
    """Credentials that must not push (and, but for the researcher's, not read version/me)."""
    user_model = get_user_model()
    staff = user_model.objects.create_user("ops2", password="x", is_staff=True)
    _, revoked = api_token_create(username=staff.username, name="revoked")
    api_token_revoke(token=ApiToken.objects.get(name="revoked"))
    inactive_user = user_model.objects.create_user("gone", password="x", is_staff=True)
    _, inactive = api_token_create(username=inactive_user.username)
    inactive_user.is_active = False
    inactive_user.save()
    _, real = api_token_create(username=staff.username, name="real")
    key_id = real.split("_", 2)[1]
    operator = operator_token_issue(cluster=cluster).token
    expired = operator_token_issue(cluster=cluster, ttl=1).token
    return {
        "forged, a real key id": f"gsh_{key_id}_{'A' * 43}",
        "forged shape": "gsh_deadbeef_" + "B" * 43,
        "revoked": revoked,
        "inactive staff user": inactive,
        "operator JWT": operator,
        "expired operator JWT": expired,
        "truncated": real[:-1],
        "with a NUL": real[:10] + "%00" + real[10:],
        "huge": "gsh_" + "x" * 20000,
    }


def test_tokens_that_are_not_a_live_api_token_are_refused_everywhere(registered, live_server):
    import time

    cluster, emulated = registered
    tokens = _tokens(cluster)
    time.sleep(1.1)  # the 1-second operator token has expired
    for what, token in tokens.items():
        for method, route in ROUTES:
            response = requests.request(method, live_server.url + route.format(id=cluster.public_id), timeout=30,
                                        headers={"Authorization": f"Bearer {token}"})
            assert response.status_code in (400, 401), (what, route, response.status_code, response.text[:300])
            assert response.headers["Content-Type"].startswith("application/json"), (what, route)
            assert response.json()["code"] in ("not_authenticated", "authentication_failed", "api_token_invalid"), (what, route, response.text)
            assert token not in response.text
    _nothing_pushed(emulated)


@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "Bearer a b", "Token gsh_a_b", "Basic YWRtaW46YWRtaW4=", "bearer " + "z" * 9000])
def test_malformed_authorization_headers_are_401_json(registered, live_server, header):
    cluster, emulated = registered
    for method, route in ROUTES:
        status, body, kind = _raw(live_server, method, route.format(id=cluster.public_id), headers={"Authorization": header})
        assert status in (400, 401, 403) and kind.startswith("application/json"), (header, route, status, body[:200])
    _nothing_pushed(emulated)


def test_a_researcher_reads_me_but_never_pushes_and_a_demoted_staff_token_stops_pushing(registered, live_server, plain_user, staff_user):
    cluster, emulated = registered
    _, researcher = api_token_create(username=plain_user.username)
    headers = {"Authorization": f"Bearer {researcher}"}
    assert requests.get(f"{live_server.url}/api/v1/me", headers=headers, timeout=30).json() == {"username": plain_user.username,
                                                                                               "is_staff": False}
    pushed = requests.post(f"{live_server.url}/api/v1/clusters/{cluster.public_id}/operator-token/push", headers=headers, timeout=30)
    assert pushed.status_code == 403 and pushed.json()["code"] == "permission_denied"

    _, staff = api_token_create(username=staff_user.username, name="soon-demoted")
    staff_user.is_staff = False
    staff_user.save()
    headers = {"Authorization": f"Bearer {staff}"}
    assert requests.get(f"{live_server.url}/api/v1/me", headers=headers, timeout=30).json()["is_staff"] is False
    pushed = requests.post(f"{live_server.url}/api/v1/clusters/{cluster.public_id}/operator-token/push", headers=headers, timeout=30)
    assert pushed.status_code == 403
    _nothing_pushed(emulated)


def test_a_console_session_cannot_push_without_csrf(registered, live_server, staff_user):
    """A staff browser session (the console) is a credential too: a cross-site POST without the CSRF token is refused."""
    from django.test import Client

    cluster, emulated = registered
    browser = Client()
    browser.force_login(staff_user)
    cookie = browser.cookies["sessionid"].value
    response = requests.post(f"{live_server.url}/api/v1/clusters/{cluster.public_id}/operator-token/push", timeout=30,
                             cookies={"sessionid": cookie}, headers={"Origin": "https://evil.example"})
    assert response.status_code == 403 and response.headers["Content-Type"].startswith("application/json"), response.text[:300]
    _nothing_pushed(emulated)


# ----------------------------------------------------------------- ids


@pytest.mark.parametrize("cluster_id", [
    "lab-c1",  # the name, not the id
    "..%2F..%2Fversion", "..%2f", "%2e%2e", "{id}%2F..%2F{id}", "{id}%00", "%00", "{id}%20", "{id}/", "{id}%2F",
    "clu_" + "a" * 5000, "clu_%C3%BC", "clu_\u00fc", "%FF%FE", "CLU_X", "{id}'%20OR%20'1'='1",
])
def test_push_on_anything_but_a_cluster_id_is_a_json_404(registered, live_server, staff_token, cluster_id):
    cluster, emulated = registered
    path_id = cluster_id.format(id=cluster.public_id)
    path = f"/api/v1/clusters/{urllib.parse.quote(path_id, safe='%/') if not path_id.isascii() else path_id}/operator-token/push"
    status, body, kind = _raw(live_server, "POST", path, headers={"Authorization": f"Bearer {staff_token}"})
    assert status in (400, 404, 405), (cluster_id, status, body[:300])
    assert kind.startswith("application/json"), (cluster_id, status, body[:300])
    _nothing_pushed(emulated)


def test_push_on_a_path_that_climbs_out_does_not_reach_another_route(registered, live_server, staff_token):
    cluster, emulated = registered
    status, body, kind = _raw(live_server, "POST", f"/api/v1/clusters/{cluster.public_id}/operator-token/push/../../../version",
                              headers={"Authorization": f"Bearer {staff_token}"})
    assert status in (404, 405) and kind.startswith("application/json"), (status, body[:300])
    _nothing_pushed(emulated)


# ----------------------------------------------------------------- bodies


@pytest.mark.parametrize(("content_type", "body"), [
    ("application/json", b"{not json"),
    ("application/json", b"[" * 100000),
    ("application/json", b'{"token": "mine", "ttl": -1, "generation": 0}'),
    ("multipart/form-data; boundary=x", b"--x\r\ngarbage"),
    ("application/x-www-form-urlencoded", b"a=" + b"%" * 1000),
    ("text/plain", b"\x00\xff" * 1000),
    ("application/json", b" " * (12 * 1024 * 1024)),
])
def test_push_ignores_any_body_and_never_takes_a_token_or_ttl_from_it(registered, live_server, staff_token, content_type, body):
    cluster, emulated = registered
    status, answer, kind = _raw(live_server, "POST", f"/api/v1/clusters/{cluster.public_id}/operator-token/push", body=body,
                                headers={"Authorization": f"Bearer {staff_token}", "Content-Type": content_type})
    assert kind.startswith("application/json") and status in (200, 400, 413, 415), (status, answer[:300])
    if status == 200:
        token = secret_token(emulated)
        assert token != "mine" and claims(token)["exp"] - claims(token)["iat"] > 3600
    else:
        _nothing_pushed(emulated)


# ----------------------------------------------------------------- many at once


def test_many_pushes_at_once_stay_consistent(registered, live_server, staff_token):
    cluster, emulated = registered
    url = f"{live_server.url}/api/v1/clusters/{cluster.public_id}/operator-token/push"
    answers: list[requests.Response] = []
    lock, go = threading.Lock(), threading.Barrier(8)

    def push():
        go.wait()
        response = requests.post(url, headers={"Authorization": f"Bearer {staff_token}"}, timeout=90)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=push) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(100)
    assert len(answers) == 8
    assert all(r.status_code in (200, 502) and r.headers["Content-Type"].startswith("application/json") for r in answers), \
        [(r.status_code, r.text[:200]) for r in answers]
    ok = [r.json() for r in answers if r.status_code == 200]
    assert ok, [r.text[:200] for r in answers]
    assert {body["generation"] for body in ok} == {cluster.credential_generation}
    assert sum(body["secret_action"] == "created" for body in ok) <= 1

    rows = AuditRecord.objects.filter(cluster=cluster.public_id)
    assert rows.filter(action="operator_token_rotate").count() == len(ok)
    assert rows.filter(action="operator_token_rotate_failed").count() == 8 - len(ok)
    assert len(set(rows.filter(action__startswith="operator_token_rotate").values_list("object_id", flat=True))) == 8

    current = Cluster.objects.get(pk=cluster.pk)
    in_secret = claims(secret_token(emulated))
    recorded = current.operator_token_expires_at.timestamp()
    assert recorded == max(_ts(body["expires_at"]) for body in ok)
    # The token the Secret holds is one of those pushed, and the recorded expiry is never earlier than its own.
    assert in_secret["jti"] in set(rows.filter(action="operator_token_rotate").values_list("object_id", flat=True))
    assert in_secret["exp"] <= recorded < in_secret["exp"] + 30
    assert base64.b64decode(secret_of(emulated)["data"][KEY]).decode().count(".") == 2
    if len(ok) == 8:
        assert not current.operator_token_rotation_error


def _ts(value: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(value).timestamp()


def test_the_live_server_answers_every_path_from_the_application(live_server, staff_token):
    """What the tests above send reaches gShare, not a file server in front of it (the test harness's media handler)."""
    for path, content in (("/pyproject.toml", "[project]"), ("/manage.py", "execute_from_command_line")):
        assert content not in requests.get(live_server.url + path, timeout=30).text, path
    response = requests.get(f"{live_server.url}/api/v1/clusters/clu_{'a' * 5000}", headers={"Authorization": f"Bearer {staff_token}"},
                            timeout=30)
    assert response.status_code == 404 and response.json()["code"] == "cluster_not_found"


@pytest.mark.parametrize("query", ["name=%00", "name=lab-c1%00", "status=%00", "name=" + "a" * 10000, "name=%C3%BC", "name=%FF",
                                   "name=lab-c1&name=x", "name[]=lab-c1", "name=lab-c1%20", "name=LAB-C1", "name=lab_c1", "name=lab-c%25"])
def test_the_name_filter_finds_exactly_that_name_or_nothing(registered, live_server, staff_token, query):
    cluster, _ = registered
    status, body, kind = _raw(live_server, "GET", f"/api/v1/clusters?{query}", headers={"Authorization": f"Bearer {staff_token}"})
    assert kind.startswith("application/json") and status in (200, 400), (query, status, body[:300])
    if status == 200:
        import json

        ids = [row["id"] for row in json.loads(body)["results"]]
        assert ids in ([], [cluster.public_id]), (query, ids)
        # Surrounding spaces are trimmed (django-filter's CharFilter, as every text filter); the attach compares names itself.
        assert ids == [] or query in ("name[]=lab-c1", "name=lab-c1%20"), (query, ids)
