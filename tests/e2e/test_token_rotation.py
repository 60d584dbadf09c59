"""End to end: a real operator process (``python -m operator_agent``) against an emulated apiserver and the
control plane on a live HTTP server, through operator token rotation, self-refresh and revocation.

The operator is given its Secret (``GSHARE_OPERATOR_NAMESPACE``/``GSHARE_TOKEN_SECRET_NAME``) as the chart
does; its token file is a plain file nobody updates (there is no kubelet), so a token it uses that is not in
the file came through the Kubernetes API or its own refresh. Tokens are short-lived and the JWT leeway is 0,
so "the old token expired" really happens during the test.
"""

import base64
import time

import jwt
import pytest
from django.utils import timezone

from clusters.models import Cluster
from clusters.operator_token.rotation import operator_token_push, operator_tokens_revoke, operator_tokens_rotate
from tests.helpers import Http, registered, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

NAMESPACE = "gshare-system"
SECRET = "gshare-operator-internal-jwt"
OPERATOR_ENV = {"GSHARE_OPERATOR_NAMESPACE": NAMESPACE, "GSHARE_TOKEN_SECRET_NAME": SECRET}
EMPTY_INVENTORY = {"nodes": []}


def secret_token(emulated) -> str | None:
    for secret in emulated.objects_of("secrets"):
        if secret["metadata"]["name"] == SECRET and secret["metadata"].get("namespace") == NAMESPACE:
            return base64.b64decode(secret["data"]["internal-jwt"]).decode()
    return None


def unverified(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def heartbeat(cluster: Cluster):
    return Cluster.objects.values_list("last_heartbeat_at", flat=True).get(pk=cluster.pk)


def reports_after(cluster: Cluster, moment, what: str):
    """Wait until the operator reports after ``moment`` (an aware datetime)."""
    return wait_for(lambda: (heartbeat(cluster) or moment) > moment, timeout=30, what=what)


@pytest.fixture
def short_tokens(settings):
    """No clock-skew leeway: a token is refused the second it expires."""
    settings.GSHARE_JWT_LEEWAY = 0
    return settings


def start(fleet_cluster, operator_process, tmp_path, *, ttl: int):
    """Register lab-c1, push a ``ttl``-second token into its Secret (and the file), start the operator."""
    cluster, emulated, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1")
    operator_token_push(cluster, ttl=ttl)
    first = secret_token(emulated)
    token_path.write_text(first)
    process, log = operator_process(cluster, kubeconfig_path, token_path, env=OPERATOR_ENV)
    wait_for(lambda: heartbeat(cluster) is not None, what="the first inventory report")
    return cluster, emulated, token_path, first, process, log


def test_running_operator_keeps_reporting_across_a_push_rotation_and_the_old_tokens_expiry(
    fleet_cluster, operator_process, tmp_path, short_tokens, live_server
):
    cluster, emulated, token_path, old, process, log = start(fleet_cluster, operator_process, tmp_path, ttl=30)

    [result] = operator_tokens_rotate(cluster_id=cluster.public_id)  # 7 days, into the Secret
    new = secret_token(emulated)
    assert result.outcome == "rotated" and new != old
    wait_for(lambda: "operator token: using the secret token (generation 1" in log.read_text(), timeout=20, what="the switch to the pushed token")

    # The old token expires (leeway 0): the control plane refuses it, the operator keeps reporting.
    time.sleep(max(0.0, unverified(old)["exp"] - time.time()) + 1)
    refused = Http(live_server.url, old).put("/internal/v1/inventory", json=EMPTY_INVENTORY)
    assert (refused.status_code, refused.json()["code"]) == (401, "token_invalid")
    reports_after(cluster, timezone.now(), "a report after the old token expired")

    text = log.read_text()
    assert process.poll() is None
    assert "rotate it" not in text and "refreshing" not in text  # never refused, never needed its own refresh
    assert token_path.read_text() == old  # the file was never updated: the token came through the API
    assert old not in text and new not in text


def test_running_operator_refreshes_its_short_lived_token_and_writes_its_secret(
    fleet_cluster, operator_process, tmp_path, short_tokens, settings, live_server
):
    settings.GSHARE_OPERATOR_TOKEN_TTL = 600  # what POST /internal/v1/token hands out
    cluster, emulated, token_path, old, process, log = start(fleet_cluster, operator_process, tmp_path, ttl=15)

    wait_for(lambda: "operator token refreshed" in log.read_text(), timeout=20, what="the self-refresh")
    assert f"written to Secret {NAMESPACE}/{SECRET}" in log.read_text()
    refreshed = secret_token(emulated)
    claims = unverified(refreshed)
    assert claims["sub"] == f"operator:{cluster.public_id}" and claims["gen"] == 1
    assert claims["exp"] - claims["iat"] == 600
    cluster.refresh_from_db()
    assert cluster.operator_token_expires_at.timestamp() == claims["exp"]

    time.sleep(max(0.0, unverified(old)["exp"] - time.time()) + 1)
    assert Http(live_server.url, old).put("/internal/v1/inventory", json=EMPTY_INVENTORY).status_code == 401
    reports_after(cluster, timezone.now(), "a report after the original token expired")
    text = log.read_text()
    assert process.poll() is None and "rotate it" not in text
    assert token_path.read_text() == old
    assert old not in text and refreshed not in text


def test_revocation_locks_the_operator_out_at_once_and_the_next_rotation_lets_it_back_in(
    fleet_cluster, operator_process, tmp_path
):
    cluster, emulated, _, old, process, log = start(fleet_cluster, operator_process, tmp_path, ttl=3600)

    operator_tokens_revoke(cluster_id=cluster.public_id, actor="test")
    mark = len(log.read_text())
    wait_for(lambda: "401 token_revoked" in log.read_text()[mark:], what="the operator refused with token_revoked")
    refused_at = timezone.now()
    time.sleep(2)
    assert heartbeat(cluster) < refused_at  # no report got through since

    [result] = operator_tokens_rotate()  # due: revoked
    assert result.outcome == "rotated" and result.generation == 2
    reports_after(cluster, timezone.now(), "a report with the generation-2 token")
    assert "using the secret token (generation 2" in log.read_text()
    assert process.poll() is None
    assert secret_token(emulated) not in log.read_text()
