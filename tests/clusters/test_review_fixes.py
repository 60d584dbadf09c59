"""Review fixes: the token exchange is bounded (refresh window, lifetime, throttle) and audited; console actions
need the change permission; cluster changes and deregistrations are audited with their actor; the operator
token commands print ``code: detail``.

Tokens with chosen ``iat``/``exp`` are signed with the active key directly (:func:`signed`), so a token "in its
last quarter" needs no sleeping; the exchange service also takes ``now``.
"""

from __future__ import annotations

import logging
import time
import uuid

import jwt
import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import RequestFactory

from clusters import services
from clusters.admin import ClusterAdmin
from clusters.models import Cluster
from clusters.operator_token.tokens import (
    TokenRefreshThrottled,
    TokenRefreshTooEarly,
    operator_token_exchange,
    operator_token_mint,
    operator_token_refresh_after,
)
from gshare.admin import ApiTokenAdmin
from gshare.auth.internal_jwt import OPERATOR_AUDIENCE, verify_internal_jwt
from gshare.auth.keys import signing_key_ensure
from gshare.auth.tokens import api_token_create
from gshare.models import ApiToken
from operator_agent.token import Candidate, TokenRefresher
from tests.conftest import Http, kubeconfig_text
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db(transaction=True)

EMPTY_INVENTORY = {"nodes": []}
CLUSTER_ACTIONS = {"connection_test", "deregister", "rotate_operator_token", "revoke_operator_tokens"}


def signed(cluster: Cluster, *, iat: float, exp: float, gen: int | None = None) -> str:
    """An operator token for ``cluster`` with exactly these ``iat``/``exp``, signed by the active key."""
    key = signing_key_ensure()
    payload = {
        "iss": settings.GSHARE_JWT_ISSUER, "sub": f"operator:{cluster.public_id}", "aud": OPERATOR_AUDIENCE,
        "iat": int(iat), "nbf": int(iat), "exp": int(exp), "jti": uuid.uuid4().hex,
        "gen": cluster.credential_generation if gen is None else gen,
    }
    return jwt.encode(payload, key.private_key_pem, algorithm="RS256", headers={"kid": key.kid})


def unverified(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def audits(caplog, action: str | None = None) -> list[dict]:
    return [r.audit for r in caplog.records if r.name == "gshare.audit" and (action is None or r.audit["action"] == action)]


# --------------------------------------------------------------------------- 1. token exchange


def test_a_short_token_is_not_renewed_before_its_last_quarter(live_server, settings):
    """The reviewer's case: a ``--ttl 60`` token came back as a 7-day token at once, and chained forever."""
    cluster = ClusterFactory()
    token = operator_token_mint(cluster_id=cluster.public_id, ttl=60)
    response = Http(live_server.url, token).post("/internal/v1/token")
    assert (response.status_code, response.json()["code"]) == (409, "token_refresh_too_early")
    body = response.json()
    assert "token" not in body and token not in response.text
    exp = unverified(token)["exp"]
    assert body["refresh_after"] and body["expires_at"]
    refresh_after = operator_token_refresh_after(unverified(token))
    assert exp - 60 / 4 - 3 <= refresh_after <= exp - 60 / 4  # the skew allowance is at most 1/20 of the life
    assert body["refresh_after"][:19] in response.json()["detail"]


def test_a_token_in_its_refresh_window_is_exchanged_for_one_of_at_most_the_configured_ttl(live_server, settings, caplog):
    settings.GSHARE_OPERATOR_TOKEN_TTL = 3600
    cluster = ClusterFactory()
    now = time.time()
    old = signed(cluster, iat=now - 30 * 86400 + 600, exp=now + 600)  # a 30-day token with 10 minutes left
    caplog.set_level(logging.INFO, logger="gshare.audit")

    response = Http(live_server.url, old).post("/internal/v1/token")
    assert response.status_code == 200, response.text
    new = verify_internal_jwt(response.json()["token"], OPERATOR_AUDIENCE)
    assert new["exp"] - new["iat"] == 3600  # GSHARE_OPERATOR_TOKEN_TTL, not the old token's 30 days
    assert new["sub"] == f"operator:{cluster.public_id}"

    # The exchange is audited: cluster, both jti, generation; never a token.
    [line] = audits(caplog, "operator_token_exchange")
    assert line["cluster"] == cluster.public_id and line["actor"] == f"operator:{cluster.public_id}"
    assert (line["old_jti"], line["new_jti"], line["generation"]) == (unverified(old)["jti"], new["jti"], 1)
    assert old not in caplog.text and response.json()["token"] not in caplog.text

    # The fresh token is not in its window: it cannot be chained into another one right away.
    again = Http(live_server.url, response.json()["token"]).post("/internal/v1/token")
    assert (again.status_code, again.json()["code"]) == (409, "token_refresh_too_early")


def test_the_window_matches_the_operators_refresher_exactly(settings):
    """Whatever its jitter, the operator asks inside the window; a little earlier (beyond the skew allowance) is refused."""
    settings.GSHARE_JWT_LEEWAY = 0
    cluster = ClusterFactory()
    base = time.time()
    iat, exp = base - 3000, base + 600
    token = signed(cluster, iat=iat, exp=exp)
    claims = unverified(token)
    for jitter in (0.0, 0.5, 0.999999):
        refresher = TokenRefresher(tokens=None, client=None, rng=lambda jitter=jitter: jitter)
        due = refresher.refresh_at(Candidate.of(token, "file"))
        issued = operator_token_exchange(cluster=cluster, claims=claims, now=due)
        assert issued.generation == 1
    life = exp - iat
    skew = 1  # max(GSHARE_JWT_LEEWAY, 1), under life / 20
    operator_token_exchange(cluster=cluster, claims=claims, now=exp - life / 4 - skew)
    with pytest.raises(TokenRefreshTooEarly) as early:
        operator_token_exchange(cluster=cluster, claims=claims, now=exp - life / 4 - skew - 1)
    assert early.value.status == 409 and early.value.extra["refresh_after"]


def test_the_skew_allowance_is_the_jwt_leeway_but_at_most_a_twentieth_of_the_life(settings):
    settings.GSHARE_JWT_LEEWAY = 30
    assert operator_token_refresh_after({"iat": 0, "exp": 3600}) == 3600 - 900 - 30
    assert operator_token_refresh_after({"iat": 0, "exp": 60}) == 60 - 15 - 3


def test_exchanges_are_throttled_per_cluster(settings, caplog):
    settings.GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT = 3
    cluster, other = ClusterFactory(), ClusterFactory()
    now = 120 * (time.time() // 120) + 10  # 10 s into a minute: every call below falls in the same window
    claims = {"iat": now - 3000, "exp": now + 600, "jti": "a"}
    caplog.set_level(logging.INFO, logger="gshare.audit")
    for _ in range(3):
        operator_token_exchange(cluster=cluster, claims=claims, now=now)
    with pytest.raises(TokenRefreshThrottled) as throttled:
        operator_token_exchange(cluster=cluster, claims=claims, now=now + 5)
    assert (throttled.value.status, throttled.value.code, throttled.value.retry_after) == (429, "token_refresh_throttled", 45)
    with pytest.raises(TokenRefreshThrottled):
        operator_token_exchange(cluster=cluster, claims=claims, now=now + 6)
    assert len(audits(caplog, "operator_token_exchange_throttled")) == 1  # one line per minute, not per request
    operator_token_exchange(cluster=other, claims=claims, now=now)  # another cluster has its own budget
    operator_token_exchange(cluster=cluster, claims=claims, now=now + 60)  # the next minute


def test_too_early_attempts_count_too_and_429_carries_retry_after(live_server, settings):
    settings.GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT = 1
    cluster = ClusterFactory()
    token = operator_token_mint(cluster_id=cluster.public_id)
    http = Http(live_server.url, token)
    answers = [http.post("/internal/v1/token") for _ in range(3)]  # 3: a minute boundary may fall between two
    assert answers[0].json()["code"] == "token_refresh_too_early"
    throttled = next(r for r in answers if r.status_code == 429)
    assert throttled.json()["code"] == "token_refresh_throttled"
    assert 1 <= int(throttled.headers["Retry-After"]) <= 60 and throttled.json()["retry_after"] == int(throttled.headers["Retry-After"])


def test_the_storm_of_the_review_is_refused_cheaply(live_server):
    cluster = ClusterFactory()
    http = Http(live_server.url, operator_token_mint(cluster_id=cluster.public_id))
    codes = [http.post("/internal/v1/token").status_code for _ in range(25)]  # 25: even if a minute boundary falls in between
    assert codes[:10] == [409] * 10 and 429 in codes and set(codes) == {409, 429}
    cluster.refresh_from_db()
    assert cluster.credential_generation == 1


# --------------------------------------------------------------------------- 2. console permissions


@pytest.fixture
def viewer(client, django_user_model):
    user = django_user_model.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_cluster"), Permission.objects.get(codename="view_apitoken"))
    client.force_login(user)
    return user


def test_view_only_staff_can_run_no_cluster_action(client, viewer):
    c = ClusterFactory()
    for action in sorted(CLUSTER_ACTIONS):
        client.post("/clusters/cluster/", {"action": action, "_selected_action": [c.pk]})
    row = Cluster.objects.get(pk=c.pk)
    assert (row.credential_generation, row.status) == (1, c.status), "view-only staff changed the cluster"
    request = RequestFactory().get("/clusters/cluster/")
    request.user = viewer
    assert not set(ClusterAdmin(Cluster, admin.site).get_actions(request)) & CLUSTER_ACTIONS
    assert "revoke" not in ApiTokenAdmin(ApiToken, admin.site).get_actions(request)
    page = client.get("/clusters/cluster/")
    assert page.status_code == 200 and b"revoke_operator_tokens" not in page.content


def test_view_only_staff_cannot_revoke_api_tokens(client, viewer, staff_user):
    api_token_create(username=staff_user.username)
    row = ApiToken.objects.get()
    client.post("/gshare/apitoken/", {"action": "revoke", "_selected_action": [row.pk]})
    assert ApiToken.objects.get(pk=row.pk).revoked_at is None


def test_staff_with_change_permission_runs_the_actions_audited_as_themselves(client, django_user_model, caplog):
    user = django_user_model.objects.create_user("editor", "e@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_cluster"), Permission.objects.get(codename="change_cluster"))
    client.force_login(user)
    c = ClusterFactory()
    caplog.set_level(logging.INFO, logger="gshare.audit")
    client.post("/clusters/cluster/", {"action": "revoke_operator_tokens", "_selected_action": [c.pk]})
    client.post("/clusters/cluster/", {"action": "deregister", "_selected_action": [c.pk]})
    row = Cluster.objects.get(pk=c.pk)
    assert (row.credential_generation, row.status) == (3, Cluster.Status.DEREGISTERED)
    assert [(a["action"], a["actor"]) for a in audits(caplog)] == [
        ("operator_tokens_revoke", "console:editor"), ("cluster_deregister", "console:editor"),
    ]


# --------------------------------------------------------------------------- 3. audit of cluster changes


def test_patch_and_delete_through_the_api_are_audited_with_the_user(http, fleet_cluster, caplog):
    emulated = fleet_cluster("lab-c1")
    cluster_id = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": kubeconfig_text(emulated)}).json()["id"]
    caplog.set_level(logging.INFO, logger="gshare.audit")

    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(emulated), "session_domain": "x.example.com"})
    assert response.status_code == 200, response.text
    [update] = audits(caplog, "cluster_update")
    assert (update["actor"], update["cluster"], update["fields"]) == ("api:admin", cluster_id, ["kubeconfig", "session_domain"])
    assert update["apiserver_url"] == Cluster.objects.get(public_id=cluster_id).apiserver_url
    stored = Cluster.objects.get(public_id=cluster_id).kubeconfig
    token_line = next(line for line in stored.splitlines() if "token:" in line)
    assert token_line.split("token:")[1].strip() not in caplog.text  # never the credential

    response = http.delete(f"/api/v1/clusters/{cluster_id}")
    assert response.status_code == 200, response.text
    [deregister] = audits(caplog, "cluster_deregister")
    assert (deregister["actor"], deregister["cluster"], deregister["generation"]) == ("api:admin", cluster_id, 2)


def test_a_refused_patch_writes_no_audit_line(http, fleet_cluster, caplog):
    lab_c1, lab_c2 = fleet_cluster("lab-c1"), fleet_cluster("lab-c2")
    cluster_id = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": kubeconfig_text(lab_c1)}).json()["id"]
    caplog.set_level(logging.INFO, logger="gshare.audit")
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(lab_c2)})
    assert response.json()["code"] == "different_cluster"
    assert audits(caplog) == []


def test_services_default_to_the_system_actor(caplog):
    c = ClusterFactory()
    caplog.set_level(logging.INFO, logger="gshare.audit")
    services.cluster_update(cluster=c, changes={"session_domain": "y.example.com"})
    services.cluster_deregister(cluster=c)
    assert [(a["action"], a["actor"]) for a in audits(caplog)] == [("cluster_update", "system"), ("cluster_deregister", "system")]


# --------------------------------------------------------------------------- 5. command errors print code: detail


def test_operator_token_commands_print_code_and_detail():
    cluster = ClusterFactory()
    cases = [
        (["mint_operator_token", cluster.public_id, "--ttl", "0"], "invalid_ttl: "),
        (["mint_operator_token", "clu_nope"], "cluster_not_found: "),
        (["revoke_operator_tokens", "clu_nope"], "cluster_not_found: "),
        (["rotate_operator_tokens", "--cluster", "clu_nope"], "cluster_not_found: "),
    ]
    services.cluster_deregister(cluster=ClusterFactory(name="gone"))
    gone = Cluster.objects.get(name="gone").public_id
    cases += [
        (["mint_operator_token", gone], "cluster_deregistered: "),
        (["rotate_operator_tokens", "--cluster", gone], "cluster_deregistered: "),
    ]
    for argv, prefix in cases:
        with pytest.raises(CommandError) as refused:
            call_command(*argv)
        assert str(refused.value).startswith(prefix), (argv, str(refused.value))
        assert refused.value.returncode == 1
