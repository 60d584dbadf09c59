"""``POST /api/v1/clusters/{id}/operator-token/push``: the control plane writes the operator token into the cluster's
Secret on a staff user's request (what attach_cluster asks for); the token is never in the answer or the audit row."""

from __future__ import annotations

import base64

import pytest

from audit.models import AuditRecord
from clusters import services
from clusters.models import Cluster
from tests.clusters.test_token_rotation import NAMESPACE, SECRET, claims, secret_of, secret_token, silent_cluster
from tests.helpers import kubeconfig_text

pytestmark = pytest.mark.django_db


def _registered(fleet_cluster, name="lab-c1"):
    emulated = fleet_cluster(name)
    cluster = services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated), session_domain=f"{name}.example.com")
    return cluster, emulated


def test_staff_push_writes_the_secret_and_answers_without_the_token(fleet_cluster, http):
    cluster, emulated = _registered(fleet_cluster)
    response = http.post(f"/api/v1/clusters/{cluster.public_id}/operator-token/push")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cluster"] == cluster.public_id and body["outcome"] == "rotated" and body["secret_action"] == "created"
    assert body["secret"] == f"{NAMESPACE}/{SECRET}" and body["generation"] == 1 and body["expires_at"]
    token = secret_token(emulated)
    assert claims(token)["sub"] == f"operator:{cluster.public_id}"
    assert token not in response.text
    cluster.refresh_from_db()
    assert cluster.operator_token_rotated_at is not None
    event = AuditRecord.objects.filter(action="operator_token_rotate", cluster=cluster.public_id).get()
    assert event.actor.startswith("api:") and token not in str(event.details)

    again = http.post(f"/api/v1/clusters/{cluster.public_id}/operator-token/push")
    assert again.status_code == 200 and again.json()["secret_action"] == "replaced"
    assert base64.b64decode(secret_of(emulated)["data"]["internal-jwt"]).decode() != token


def test_a_researcher_may_not_push(fleet_cluster, http_user, anon):
    cluster, emulated = _registered(fleet_cluster)
    response = http_user.post(f"/api/v1/clusters/{cluster.public_id}/operator-token/push")
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    assert anon.post(f"/api/v1/clusters/{cluster.public_id}/operator-token/push").status_code == 401
    assert secret_of(emulated) is None
    assert not AuditRecord.objects.filter(action="operator_token_rotate").exists()


def test_unknown_and_deregistered_clusters_are_refused(fleet_cluster, http):
    assert http.post("/api/v1/clusters/clu_nosuchcluster/operator-token/push").json()["code"] == "cluster_not_found"
    cluster, _ = _registered(fleet_cluster)
    services.cluster_deregister(cluster=cluster, actor="test")
    response = http.post(f"/api/v1/clusters/{cluster.public_id}/operator-token/push")
    assert response.status_code == 409 and response.json()["code"] == "cluster_deregistered"


def test_an_apiserver_that_never_answers_is_a_502_with_its_code(settings, silent_listener, http):
    settings.GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT = 0.3
    cluster = silent_cluster(silent_listener)
    response = http.post(f"/api/v1/clusters/{cluster.public_id}/operator-token/push")
    assert response.status_code == 502 and response.json()["code"] == "token_push_unreachable", response.text
    assert Cluster.objects.get(pk=cluster.pk).operator_token_rotation_error


def test_version_and_me_tell_a_client_what_answers(http, http_user, anon):
    from contract import GSHARE_API_VERSION
    from core.version import GSHARE_VERSION

    body = http.get("/api/v1/version").json()
    assert (body["version"], body["api"], body["operator_contract"]) == (GSHARE_VERSION, "v1", GSHARE_API_VERSION)
    assert body["cluster_layout"] == {"session_namespace": "gshare-sessions", "operator_namespace": "gshare-system",
                                      "operator_token_secret": "gshare-operator-internal-jwt", "volume_move_enabled": False}
    assert http.get("/api/v1/me").json() == {"username": "admin", "is_staff": True}
    assert http_user.get("/api/v1/me").json()["is_staff"] is False
    assert anon.get("/api/v1/version").status_code == 401 and anon.get("/api/v1/me").json()["code"] == "not_authenticated"


def test_clusters_filter_by_exact_name(fleet_cluster, http):
    cluster, _ = _registered(fleet_cluster)
    assert [row["id"] for row in http.get("/api/v1/clusters?name=lab-c1").json()["results"]] == [cluster.public_id]
    assert http.get("/api/v1/clusters?name=lab-c").json()["results"] == []
