"""Operator token rotation (push into the cluster's Secret), its warnings, the token exchange and revocation.

Every apiserver is the Kubernetes API emulator over HTTP on loopback (``fleet_cluster``) or a loopback
listener that never answers (``silent_listener``); the control plane is the live server for HTTP checks.
"""

from __future__ import annotations

import base64
import datetime
import logging
import time
from io import StringIO

import jwt
import kubernetes
import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from clusters import services, tasks
from clusters.internal.authentication import OperatorTokenAuthentication
from clusters.models import Cluster
from clusters.operator_token import rotation as token_rotation
from clusters.operator_token.rotation import OperatorTokenPushFailed, Outcome, operator_token_push, operator_tokens_rotate
from clusters.operator_token.tokens import operator_token_mint
from identity.internal_jwt import CONNECT_AUDIENCE, OPERATOR_AUDIENCE, sign_internal_jwt, verify_internal_jwt
from tests.factories import ClusterFactory
from tests.helpers import Http, kubeconfig_text, silent_kubeconfig

pytestmark = pytest.mark.django_db

NAMESPACE = "gshare-system"
SECRET = "gshare-operator-internal-jwt"
KEY = "internal-jwt"
EMPTY_INVENTORY = {"nodes": []}


# --------------------------------------------------------------------------- helpers


def register(fleet_cluster, name="lab-c1", **options):
    """Register an emulated fleet cluster through the real service (probe included)."""
    emulated = fleet_cluster(name, **options)
    cluster = services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated), session_domain=f"{name}.example.com")
    return cluster, emulated


def secret_of(emulated) -> dict | None:
    for secret in emulated.objects_of("secrets"):
        if secret["metadata"]["name"] == SECRET and secret["metadata"].get("namespace") == NAMESPACE:
            return secret
    return None


def secret_token(emulated) -> str | None:
    secret = secret_of(emulated)
    return base64.b64decode(secret["data"][KEY]).decode() if secret else None


def core_v1(emulated) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config_dict(yaml.safe_load(kubeconfig_text(emulated))))


def claims(token: str) -> dict:
    return verify_internal_jwt(token, OPERATOR_AUDIENCE)


def silent_cluster(host_port: str, **fields) -> Cluster:
    return ClusterFactory(kubeconfig=yaml.safe_dump(silent_kubeconfig(host_port)), apiserver_url=f"http://{host_port}", **fields)


@pytest.fixture
def eager_retries():
    """Let eager tasks retry (Celery re-runs an eager task's retry at once); test settings propagate instead."""
    from gshare.celery import app

    before = app.conf.task_eager_propagates
    app.conf.task_eager_propagates = False
    yield
    app.conf.task_eager_propagates = before


@pytest.fixture
def fast_push(settings):
    settings.GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT = 0.3
    return settings


# --------------------------------------------------------------------------- minting


def test_mint_adds_gen_and_records_the_latest_expiry():
    cluster = ClusterFactory()
    long = claims(operator_token_mint(cluster_id=cluster.public_id, ttl=3600))
    assert long["gen"] == 1
    cluster.refresh_from_db()
    assert cluster.operator_token_expires_at == datetime.datetime.fromtimestamp(long["exp"], tz=datetime.UTC)
    operator_token_mint(cluster_id=cluster.public_id, ttl=60)  # an earlier expiry does not replace a later one
    cluster.refresh_from_db()
    assert cluster.operator_token_expires_at == datetime.datetime.fromtimestamp(long["exp"], tz=datetime.UTC)
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    assert claims(operator_token_mint(cluster_id=cluster.public_id))["gen"] == 2


# --------------------------------------------------------------------------- push


def test_push_creates_then_replaces_the_secret(fleet_cluster):
    cluster, emulated = register(fleet_cluster)
    assert secret_of(emulated) is None

    first = operator_token_push(cluster)
    assert (first.outcome, first.secret_action, first.generation) == (Outcome.ROTATED, "created", 1)
    token = secret_token(emulated)
    first_claims = claims(token)
    assert first_claims["sub"] == f"operator:{cluster.public_id}" and first_claims["gen"] == 1
    assert first_claims["exp"] - first_claims["iat"] == 604800  # GSHARE_OPERATOR_TOKEN_TTL
    assert secret_of(emulated)["type"] == "Opaque"
    cluster.refresh_from_db()
    assert cluster.operator_token_expires_at == first.expires_at
    assert cluster.operator_token_rotated_at is not None and cluster.operator_token_rotation_error == ""
    assert cluster.operator_token_rotation_attempted_at <= cluster.operator_token_rotated_at

    # Someone added a key: a replace keeps it and only changes internal-jwt.
    core_v1(emulated).patch_namespaced_secret(SECRET, NAMESPACE, {"data": {"other": base64.b64encode(b"kept").decode()}})
    second = operator_token_push(cluster, ttl=1200)
    assert (second.outcome, second.secret_action) == (Outcome.ROTATED, "replaced")
    assert secret_token(emulated) != token
    assert claims(secret_token(emulated))["exp"] - claims(secret_token(emulated))["iat"] == 1200
    assert base64.b64decode(secret_of(emulated)["data"]["other"]) == b"kept"
    cluster.refresh_from_db()
    assert cluster.operator_token_expires_at == first.expires_at  # the 7-day token is still the one expiring last
    assert "token" not in repr(second).replace("operator_token", "")


def test_rotate_is_idempotent_and_cluster_forces(fleet_cluster):
    cluster, emulated = register(fleet_cluster)
    results = operator_tokens_rotate()
    assert [(r.cluster_id, r.outcome) for r in results] == [(cluster.public_id, Outcome.ROTATED)]
    token = secret_token(emulated)

    again = operator_tokens_rotate()  # the same day: nothing changes
    assert [r.outcome for r in again] == [Outcome.SKIPPED] and "not due" in again[0].detail
    assert secret_token(emulated) == token

    forced = operator_tokens_rotate(cluster_id=cluster.public_id)
    assert [r.outcome for r in forced] == [Outcome.ROTATED]
    assert secret_token(emulated) != token

    # A day later it is due again.
    Cluster.objects.filter(pk=cluster.pk).update(operator_token_rotated_at=timezone.now() - datetime.timedelta(days=1))
    assert [r.outcome for r in operator_tokens_rotate()] == [Outcome.ROTATED]


def test_rotate_skips_deregistered_and_refuses_unknown(fleet_cluster):
    cluster, _ = register(fleet_cluster)
    services.cluster_deregister(cluster=cluster)
    assert operator_tokens_rotate() == []
    with pytest.raises(CommandError, match="deregistered"):
        call_command("rotate_operator_tokens", "--cluster", cluster.public_id)
    with pytest.raises(CommandError, match="No cluster"):
        call_command("rotate_operator_tokens", "--cluster", "clu_nope")


def test_dry_run_changes_nothing(fleet_cluster):
    cluster, emulated = register(fleet_cluster)
    before = Cluster.objects.filter(pk=cluster.pk).values().get()
    seen = len(emulated.requests_seen())
    out = StringIO()
    call_command("rotate_operator_tokens", "--dry-run", stdout=out)
    assert f"{cluster.name} {cluster.public_id} would_rotate" in out.getvalue()
    assert [r.outcome for r in operator_tokens_rotate(cluster_id=cluster.public_id, dry_run=True)] == [Outcome.WOULD_ROTATE]
    assert Cluster.objects.filter(pk=cluster.pk).values().get() == before
    assert secret_of(emulated) is None
    assert len(emulated.requests_seen()) == seen  # not even dialled


def test_command_rotates_and_prints_no_token(fleet_cluster):
    cluster, emulated = register(fleet_cluster)
    out = StringIO()
    call_command("rotate_operator_tokens", stdout=out)
    assert f"{cluster.name} {cluster.public_id} rotated generation=1" in out.getvalue()
    assert "created" in out.getvalue()
    assert secret_token(emulated) not in out.getvalue()


def test_missing_namespace_is_a_clear_failure(fleet_cluster):
    from demo import fleet

    objects = [o for o in fleet.cluster_objects("lab-c1") if not (o["kind"] == "Namespace" and o["metadata"]["name"] == NAMESPACE)]
    cluster, _ = register(fleet_cluster, objects=objects)
    with pytest.raises(OperatorTokenPushFailed) as excinfo:
        operator_token_push(cluster)
    assert excinfo.value.code == "token_push_namespace_missing"
    assert "install the operator chart" in excinfo.value.detail
    cluster.refresh_from_db()
    assert "Namespace gshare-system does not exist" in cluster.operator_token_rotation_error
    assert cluster.operator_token_rotated_at is None and cluster.operator_token_expires_at is None


def test_refused_credentials_are_a_clear_failure(fleet_cluster):
    cluster, emulated = register(fleet_cluster)
    config = yaml.safe_load(kubeconfig_text(emulated))
    config["users"][0]["user"]["token"] = "wrong-token"
    Cluster.objects.filter(pk=cluster.pk).update(kubeconfig=yaml.safe_dump(config))
    with pytest.raises(OperatorTokenPushFailed) as excinfo:
        operator_token_push(Cluster.objects.get(pk=cluster.pk))
    assert excinfo.value.code == "token_push_forbidden"
    assert "create secret generic gshare-operator-internal-jwt" in excinfo.value.detail
    assert secret_of(emulated) is None


# --------------------------------------------------------------------------- failure, warning, retries


@pytest.mark.django_db(transaction=True)
def test_unreachable_apiserver_records_error_warns_and_retries(silent_listener, fast_push, eager_retries, http, console, caplog):
    cluster = silent_cluster(silent_listener, operator_token_expires_at=timezone.now() + datetime.timedelta(days=5))
    caplog.set_level(logging.INFO)

    tasks.rotate_operator_tokens.delay()  # eager: the push, then the retry task and its retries

    cluster.refresh_from_db()
    assert cluster.operator_token_rotation_attempted_at is not None and cluster.operator_token_rotated_at is None
    assert "did not answer within 0.3 s" in cluster.operator_token_rotation_error
    retries = [r.getMessage() for r in caplog.records if "operator token push to" in r.getMessage()]
    max_retries = tasks.TOKEN_PUSH_RETRY["max_retries"]
    assert sum("retrying in" in line for line in retries) == max_retries
    assert "giving up" in retries[-1]
    # The daily run, the first retry, then each retry (the detail varies: refused while connecting, or cut off).
    prefix = f"operator token rotation failed: cluster {cluster.public_id} ({cluster.name}): token_push_unreachable "
    assert sum(r.getMessage().startswith(prefix) for r in caplog.records) == 1 + 1 + max_retries

    body = http.get(f"/api/v1/clusters/{cluster.public_id}").json()["operator_token"]
    assert body["last_rotation_error"] == cluster.operator_token_rotation_error
    assert body["rotated_at"] is None
    assert body["expires_at"] is not None
    assert body["warning"].startswith("The last operator token rotation at ")
    assert f"manage.py rotate_operator_tokens --cluster {cluster.public_id}" in body["warning"]

    for path in ["/clusters/cluster/", f"/clusters/cluster/{cluster.pk}/change/"]:
        html = console.get(path).content.decode()
        assert "The last operator token rotation at" in html
        assert f"rotate_operator_tokens --cluster {cluster.public_id}" in html

    with pytest.raises(CommandError, match="1 rotation"):
        call_command("rotate_operator_tokens", stdout=StringIO(), stderr=StringIO())


def test_a_later_success_clears_the_warning(fleet_cluster, http):
    cluster, _ = register(fleet_cluster)
    Cluster.objects.filter(pk=cluster.pk).update(operator_token_rotation_error="The apiserver did not answer.")
    assert tasks.retry_operator_token_push.delay(cluster.public_id) is not None
    body = http.get(f"/api/v1/clusters/{cluster.public_id}").json()["operator_token"]
    assert body["last_rotation_error"] == "" and body["warning"] is None and body["rotated_at"] is not None


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"operator_token_expires_at": "+5d", "operator_token_rotated_at": "-1h"}, None),
        ({"operator_token_expires_at": "+2d", "operator_token_rotated_at": "-5d"}, "has not been renewed"),
        ({"operator_token_expires_at": "-1h"}, "expired at"),
        ({}, "No operator token is on record"),
    ],
)
def test_api_warning(http, fields, expected):
    now = timezone.now()
    offsets = {"+5d": datetime.timedelta(days=5), "+2d": datetime.timedelta(days=2), "-1h": -datetime.timedelta(hours=1),
               "-5d": -datetime.timedelta(days=5)}
    cluster = ClusterFactory(**{name: now + offsets[value] for name, value in fields.items()})
    body = http.get(f"/api/v1/clusters/{cluster.public_id}").json()["operator_token"]
    assert set(body) == {"expires_at", "rotated_at", "last_rotation_error", "warning"}
    if expected is None:
        assert body["warning"] is None
    else:
        assert expected in body["warning"] and f"--cluster {cluster.public_id}" in body["warning"]


def test_no_warning_for_a_deregistered_cluster(http):
    cluster = ClusterFactory(status=Cluster.Status.DEREGISTERED, operator_token_rotation_error="boom")
    assert http.get(f"/api/v1/clusters/{cluster.public_id}").json()["operator_token"]["warning"] is None


@pytest.mark.django_db  # not transactional: runs before any flush removes the migration's rows
def test_beat_schedule_is_daily_and_expires_within_its_interval():
    task = PeriodicTask.objects.get(task="clusters.rotate_operator_tokens")
    assert task.enabled
    assert task.interval.every * {"seconds": 1, "days": 86400}[task.interval.period] == 86400
    assert 0 < task.expire_seconds <= 86400


# --------------------------------------------------------------------------- revocation


@pytest.mark.django_db(transaction=True)
def test_revocation_refuses_old_tokens_at_once_and_the_next_rotation_lets_the_operator_in(fleet_cluster, live_server, caplog, http):
    cluster, emulated = register(fleet_cluster)
    operator_token_push(cluster)
    old = secret_token(emulated)
    no_gen = sign_internal_jwt(f"operator:{cluster.public_id}", 600)  # a token of before `gen` existed counts as 1
    for token in (old, no_gen):
        assert Http(live_server.url, token).put("/internal/v1/inventory", json=EMPTY_INVENTORY).status_code == 200

    caplog.set_level(logging.INFO, logger="gshare.audit")
    out = StringIO()
    call_command("revoke_operator_tokens", cluster.public_id, stdout=out)
    assert "generation is now 2" in out.getvalue() and f"rotate_operator_tokens --cluster {cluster.public_id}" in out.getvalue()
    cluster.refresh_from_db()
    assert cluster.credential_generation == 2 and cluster.operator_token_expires_at is None

    for token in (old, no_gen):
        response = Http(live_server.url, token).put("/internal/v1/inventory", json=EMPTY_INVENTORY)
        assert response.status_code == 401
        assert response.json()["code"] == "token_revoked"
        assert f"rotate_operator_tokens --cluster {cluster.public_id}" in response.json()["detail"]
        assert Http(live_server.url, token).post("/internal/v1/token").json()["code"] == "token_revoked"  # nor refreshed

    audits = [r for r in caplog.records if r.name == "gshare.audit"]
    assert len(audits) == 1
    assert audits[0].audit == {
        "actor": audits[0].audit["actor"], "action": "operator_tokens_revoke", "cluster": cluster.public_id,
        "cluster_name": cluster.name, "generation": 2,
    }
    assert audits[0].audit["actor"] == "command:revoke_operator_tokens"  # the audit trail's actor vocabulary (was cli:<OS user>)
    assert old not in caplog.text
    assert "No operator token is on record" in http.get(f"/api/v1/clusters/{cluster.public_id}").json()["operator_token"]["warning"]

    [result] = operator_tokens_rotate()  # due: revoked
    assert (result.outcome, result.generation) == (Outcome.ROTATED, 2)
    new = secret_token(emulated)
    assert claims(new)["gen"] == 2
    assert Http(live_server.url, new).put("/internal/v1/inventory", json=EMPTY_INVENTORY).status_code == 200
    assert http.get(f"/api/v1/clusters/{cluster.public_id}").json()["operator_token"]["warning"] is None


def test_revoke_unknown_cluster():
    with pytest.raises(CommandError, match="No cluster"):
        call_command("revoke_operator_tokens", "clu_nope")


@pytest.mark.django_db(transaction=True)
def test_console_actions_rotate_and_revoke(fleet_cluster, console, caplog):
    cluster, emulated = register(fleet_cluster)
    caplog.set_level(logging.INFO, logger="gshare.audit")
    console.post("/clusters/cluster/", {"action": "rotate_operator_token", "_selected_action": [cluster.pk]})
    assert claims(secret_token(emulated))["gen"] == 1
    console.post("/clusters/cluster/", {"action": "revoke_operator_tokens", "_selected_action": [cluster.pk]})
    cluster.refresh_from_db()
    assert cluster.credential_generation == 2
    assert [r.audit["actor"] for r in caplog.records if r.name == "gshare.audit"] == ["console:admin"]


@pytest.mark.django_db(transaction=True)
def test_deregistration_bumps_the_generation(fleet_cluster, live_server, caplog):
    cluster, _ = register(fleet_cluster)
    token = operator_token_mint(cluster_id=cluster.public_id)
    caplog.set_level(logging.INFO, logger="gshare.audit")
    services.cluster_deregister(cluster=cluster)
    cluster.refresh_from_db()
    assert cluster.credential_generation == 2
    [audit] = [r.audit for r in caplog.records if r.name == "gshare.audit"]
    assert (audit["action"], audit["generation"], audit["actor"]) == ("cluster_deregister", 2, "system")
    response = Http(live_server.url, token).put("/internal/v1/inventory", json=EMPTY_INVENTORY)
    assert (response.status_code, response.json()["code"]) == (401, "cluster_deregistered")
    services.cluster_deregister(cluster=cluster)  # idempotent: no second bump
    cluster.refresh_from_db()
    assert cluster.credential_generation == 2


def test_generation_check_adds_no_query():
    cluster = ClusterFactory()
    token = operator_token_mint(cluster_id=cluster.public_id)
    request = RequestFactory().put("/internal/v1/inventory", HTTP_AUTHORIZATION=f"Bearer {token}")
    verify_internal_jwt(token, OPERATOR_AUDIENCE)  # warm
    with CaptureQueriesContext(connection) as verify_only:
        verify_internal_jwt(token, OPERATOR_AUDIENCE)
    with CaptureQueriesContext(connection) as authenticate:
        principal, _ = OperatorTokenAuthentication().authenticate(request)
    assert principal.cluster.pk == cluster.pk
    assert len(authenticate) == len(verify_only) + 1  # the cluster lookup, nothing more


def test_malformed_gen_is_refused(http_for):
    cluster = ClusterFactory()
    token = sign_internal_jwt(f"operator:{cluster.public_id}", 600, claims={"gen": "1"})
    response = http_for(token).put("/internal/v1/inventory", json=EMPTY_INVENTORY)
    assert (response.status_code, response.json()["code"]) == (401, "token_invalid")


# --------------------------------------------------------------------------- token exchange


def test_token_exchange_returns_a_fresh_token_of_the_current_generation(http_for, settings, caplog):
    settings.GSHARE_OPERATOR_TOKEN_TTL = 3600
    cluster, other = ClusterFactory(), ClusterFactory()
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")  # generation 2
    old = operator_token_mint(cluster_id=cluster.public_id, ttl=4)
    other_token = operator_token_mint(cluster_id=other.public_id, ttl=4)
    time.sleep(3.2)  # into the refresh window: the last quarter of the life (plus 0.2 s skew allowance)
    caplog.set_level(logging.DEBUG)

    response = http_for(old).post("/internal/v1/token")
    assert response.status_code == 200, response.text
    assert response.headers["Cache-Control"] == "no-store"
    body = response.json()
    new = claims(body["token"])
    assert new["sub"] == f"operator:{cluster.public_id}"  # its own cluster only
    assert new["gen"] == body["generation"] == 2
    assert new["exp"] - new["iat"] == 3600
    assert datetime.datetime.fromisoformat(body["expires_at"]) == datetime.datetime.fromtimestamp(new["exp"], tz=datetime.UTC)
    cluster.refresh_from_db()
    assert cluster.operator_token_expires_at == datetime.datetime.fromisoformat(body["expires_at"])
    assert http_for(body["token"]).put("/internal/v1/inventory", json=EMPTY_INVENTORY).status_code == 200
    assert body["token"] not in caplog.text and old not in caplog.text

    # The other cluster's operator gets a token for its own cluster, whatever it sends.
    other_body = http_for(other_token).post("/internal/v1/token", json={"cluster": cluster.public_id}).json()
    assert claims(other_body["token"])["sub"] == f"operator:{other.public_id}" and other_body["generation"] == 1


def test_token_exchange_refuses_what_is_not_a_valid_operator_token(http_for):
    cluster = ClusterFactory()
    connect = sign_internal_jwt(f"operator:{cluster.public_id}", 600, audience=CONNECT_AUDIENCE)
    assert http_for(connect).post("/internal/v1/token").status_code == 401
    assert http_for().post("/internal/v1/token").json()["code"] == "token_missing"
    hs256 = jwt.encode({"sub": f"operator:{cluster.public_id}"}, "k" * 32, algorithm="HS256")
    assert http_for(hs256).post("/internal/v1/token").json()["code"] == "token_invalid"
    token = operator_token_mint(cluster_id=cluster.public_id)
    services.cluster_deregister(cluster=cluster)
    assert http_for(token).post("/internal/v1/token").json()["code"] == "cluster_deregistered"
