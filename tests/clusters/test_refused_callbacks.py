"""Refused operator callbacks are recorded on their cluster (when and why, never the token), at most once a minute,
cleared by the next accepted callback, and shown with the fix on the console's dashboard and the cluster's page.

Tokens are real: minted by ``operator_token_mint`` (or signed with the control plane's published key for the
claims the mint never gives, such as another audience); callbacks go through the test client (query counts) and
the live server over HTTP.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.cache import cache
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from clusters.internal.authentication import OperatorTokenAuthentication
from clusters.models import Cluster
from clusters.operator_refusals import REFUSAL_RECORD_PERIOD, _gate_key
from clusters.operator_token import rotation as token_rotation
from clusters.operator_token.tokens import operator_token_mint
from identity.internal_jwt import CONNECT_AUDIENCE, sign_internal_jwt
from identity.keys import signing_key_ensure
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

INVENTORY = "/internal/v1/inventory"
EMPTY_INVENTORY = {"nodes": []}


def callback(client, token: str):
    """One operator callback (an empty inventory snapshot) through the test client."""
    return client.put(INVENTORY, data=json.dumps(EMPTY_INVENTORY), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")


def refusal_of(cluster: Cluster) -> tuple:
    cluster.refresh_from_db()
    return cluster.operator_refused_since, cluster.operator_refused_at, cluster.operator_refused_reason


def cluster_updates(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith('UPDATE "clusters_cluster"')]


def expired_token(cluster: Cluster, settings) -> str:
    """A token minted for ``cluster`` with one second of life, once it has expired (no clock-skew allowance)."""
    settings.GSHARE_JWT_LEEWAY = 0
    token = operator_token_mint(cluster_id=cluster.public_id, ttl=1)
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    while time.time() < exp + 0.2:
        time.sleep(0.1)
    return token


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


# --------------------------------------------------------------------------- recording


def test_an_expired_token_records_the_refusal_and_its_reason(client, settings):
    cluster = ClusterFactory()
    token = expired_token(cluster, settings)
    before = timezone.now()
    response = callback(client, token)
    assert (response.status_code, response.json()["code"]) == (401, "token_invalid")
    since, at, reason = refusal_of(cluster)
    assert reason == "token_expired"
    assert since == at and before <= since <= timezone.now()


def test_a_revoked_generation_records_token_revoked(client):
    cluster = ClusterFactory()
    token = operator_token_mint(cluster_id=cluster.public_id)
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    response = callback(client, token)
    assert (response.status_code, response.json()["code"]) == (401, "token_revoked")
    assert refusal_of(cluster)[2] == "token_revoked"


def test_a_token_for_another_audience_records_token_wrong_audience(client):
    cluster = ClusterFactory()
    token = sign_internal_jwt(f"operator:{cluster.public_id}", 600, audience=CONNECT_AUDIENCE, claims={"gen": 1})
    assert callback(client, token).status_code == 401
    assert refusal_of(cluster)[2] == "token_wrong_audience"


def test_a_deregistered_clusters_token_records_cluster_deregistered(client):
    cluster = ClusterFactory()
    token = operator_token_mint(cluster_id=cluster.public_id)
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.DEREGISTERED)
    response = callback(client, token)
    assert (response.status_code, response.json()["code"]) == (401, "cluster_deregistered")
    assert refusal_of(cluster)[2] == "cluster_deregistered"
    # A deregistered cluster needs no token: its refusals are on record, but nothing warns about it.
    assert token_rotation.operator_token_state(cluster).warning is None


def test_forged_tokens_record_nothing(client):
    """Anyone can write ``sub = operator:<id>``: without a valid signature the claim names nobody."""
    cluster = ClusterFactory()
    key = signing_key_ensure()
    now = int(time.time())
    expired_claims = {"iss": "gshare-control-plane", "sub": f"operator:{cluster.public_id}", "aud": "gshare-internal",
                      "iat": now - 7200, "nbf": now - 7200, "exp": now - 3600, "jti": "forged", "gen": 1}
    # Signed with another RSA key under the published kid: an expired token, were its signature not checked.
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    other_key = jwt.encode(expired_claims, stranger, algorithm="RS256", headers={"kid": key.kid})
    # A real token of another cluster whose payload was rewritten to name this one, with its old signature.
    other = ClusterFactory()
    header, payload, signature = operator_token_mint(cluster_id=other.public_id).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims.update(sub=f"operator:{cluster.public_id}", exp=now - 3600)
    tampered = f"{header}.{_b64(claims)}.{signature}"
    # The payload of a real expired token under alg none.
    unsigned = f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': key.kid})}.{_b64(expired_claims)}."
    for token in (other_key, tampered, unsigned):
        assert callback(client, token).status_code == 401
    assert refusal_of(cluster) == (None, None, "")
    assert refusal_of(other) == (None, None, "")


def test_repeated_refusals_write_at_most_once_a_minute(client, settings, django_assert_max_num_queries):
    cluster = ClusterFactory()
    token = expired_token(cluster, settings)
    with CaptureQueriesContext(connection) as first:
        callback(client, token)
    assert len(cluster_updates(first)) == 1
    since, at, _ = refusal_of(cluster)
    for _ in range(5):
        # The signing key's lookup is the only query: no UPDATE, no cluster lookup.
        with django_assert_max_num_queries(1) as repeated:
            assert callback(client, token).status_code == 401
        assert cluster_updates(repeated) == []
    assert refusal_of(cluster)[:2] == (since, at)

    # Redis flushed (or down): the UPDATE runs again but matches nothing within the minute.
    cache.delete(_gate_key(cluster.public_id))
    with CaptureQueriesContext(connection) as flushed:
        callback(client, token)
    assert len(cluster_updates(flushed)) == 1
    assert refusal_of(cluster)[:2] == (since, at)

    # A minute on (the gate expired, the latest refusal is a minute old): recorded again, the start kept.
    earlier = at - datetime.timedelta(seconds=REFUSAL_RECORD_PERIOD + 1)
    Cluster.objects.filter(pk=cluster.pk).update(operator_refused_since=earlier, operator_refused_at=earlier)
    cache.delete(_gate_key(cluster.public_id))
    callback(client, token)
    since_now, at_now, reason = refusal_of(cluster)
    assert since_now == earlier and at_now > earlier and reason == "token_expired"


def test_an_accepted_callback_clears_the_refusal(client):
    cluster = ClusterFactory()
    old = operator_token_mint(cluster_id=cluster.public_id)
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    callback(client, old)
    assert refusal_of(cluster)[2] == "token_revoked"
    assert callback(client, operator_token_mint(cluster_id=cluster.public_id)).status_code == 200
    assert refusal_of(cluster) == (None, None, "")
    # The gate went with it: a refusal right after is recorded at once.
    callback(client, old)
    assert refusal_of(cluster)[2] == "token_revoked"


def test_an_accepted_callback_adds_no_query_when_nothing_is_refused():
    cluster = ClusterFactory()
    token = operator_token_mint(cluster_id=cluster.public_id)
    request = RequestFactory().put(INVENTORY, HTTP_AUTHORIZATION=f"Bearer {token}")
    OperatorTokenAuthentication().authenticate(request)  # warm the signing key
    with CaptureQueriesContext(connection) as queries:
        principal, _ = OperatorTokenAuthentication().authenticate(request)
    assert principal.cluster.pk == cluster.pk
    assert len(queries) == 2  # the signing key and the cluster: no UPDATE
    assert cluster_updates(queries) == []


def test_no_token_text_in_the_fields_or_the_logs(client, settings, caplog):
    cluster = ClusterFactory()
    revoked = operator_token_mint(cluster_id=cluster.public_id)
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    other = ClusterFactory()
    expired = expired_token(other, settings)
    with caplog.at_level(logging.DEBUG):
        callback(client, revoked)
        callback(client, expired)
    assert "operator callbacks refused" in caplog.text  # the refusal is logged (ids and a reason code)
    for c, token in ((cluster, revoked), (other, expired)):
        c.refresh_from_db()
        fields = " ".join(str(getattr(c, f)) for f in ("operator_refused_since", "operator_refused_at", "operator_refused_reason"))
        warning = token_rotation.operator_token_state(c).warning
        for part in token.split("."):
            assert part not in caplog.text
            assert part not in fields
            assert part not in warning


# --------------------------------------------------------------------------- the warning


def test_the_warning_names_when_why_and_the_fix(client):
    cluster = ClusterFactory()
    old = operator_token_mint(cluster_id=cluster.public_id)
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    callback(client, old)
    cluster.refresh_from_db()
    warning = token_rotation.operator_token_state(cluster).warning
    when = cluster.operator_refused_since.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    assert warning.startswith(f"Operator callbacks refused since {when} (token_revoked: its token was revoked")
    assert f"`manage.py rotate_operator_tokens --cluster {cluster.public_id}`" in warning
    assert "“Rotate the operator token now”" in warning


def test_the_dashboard_and_the_cluster_page_show_the_warning_with_the_fix(client, admin_client):
    cluster = ClusterFactory(name="lab-refused", last_heartbeat_at=timezone.now())
    old = operator_token_mint(cluster_id=cluster.public_id)
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    callback(client, old)
    fix = f"<code>manage.py rotate_operator_tokens --cluster {cluster.public_id}</code>"

    dashboard = admin_client.get("/").content.decode()
    assert "Operator callbacks refused since" in dashboard and "token_revoked" in dashboard and fix in dashboard

    page = admin_client.get(reverse("admin:clusters_cluster_change", args=[cluster.pk])).content.decode()
    assert "Operator callbacks refused since" in page and "Rotate the operator token now" in page
    assert f"manage.py rotate_operator_tokens --cluster {cluster.public_id}" in page
    changelist = admin_client.get(reverse("admin:clusters_cluster_changelist")).content.decode()
    assert "callbacks refused" in changelist

    # The operator gets the rotated token: its next callback clears the warning everywhere.
    assert callback(client, operator_token_mint(cluster_id=cluster.public_id)).status_code == 200
    assert "Operator callbacks refused" not in admin_client.get("/").content.decode()
    assert "Operator callbacks refused" not in admin_client.get(reverse("admin:clusters_cluster_change", args=[cluster.pk])).content.decode()


@pytest.mark.django_db
def test_over_http_a_revoked_operator_is_recorded_and_let_back_in(http_for):
    cluster = ClusterFactory()
    old = operator_token_mint(cluster_id=cluster.public_id)
    token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    refused = http_for(old).put(INVENTORY, json=EMPTY_INVENTORY)
    assert (refused.status_code, refused.json()["code"]) == (401, "token_revoked")
    assert refusal_of(cluster)[2] == "token_revoked"
    assert "Operator callbacks refused since" in token_rotation.operator_token_state(cluster).warning
    accepted = http_for(operator_token_mint(cluster_id=cluster.public_id)).put(INVENTORY, json=EMPTY_INVENTORY)
    assert accepted.status_code == 200
    assert refusal_of(cluster) == (None, None, "")
    assert token_rotation.operator_token_state(cluster).warning is None
