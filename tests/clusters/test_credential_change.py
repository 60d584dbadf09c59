"""Changing a cluster's kubeconfig in place (``PATCH /api/v1/clusters/{id}`` with ``kubeconfig``), through HTTP
on the live server, against emulated apiservers of the demo fleet. A cluster is identified by the
``metadata.uid`` of its ``kube-system`` namespace, recorded at registration."""


import pytest
import yaml

from attach import least_privilege
from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_mint
from demo import fleet
from kube import KubeGateway
from kube.kubeconfig import validate_kubeconfig
from tests.helpers import kubeconfig_text, load_kubeconfig_fixture, silent_kubeconfig

pytestmark = pytest.mark.django_db


def kube_system_uid(name: str) -> str:
    """The uid the demo fleet seeds on cluster ``name``'s kube-system namespace."""
    return next(
        o["metadata"]["uid"] for o in fleet.cluster_objects(name) if o["kind"] == "Namespace" and o["metadata"]["name"] == "kube-system"
    )


def register(http, emulated, name: str) -> dict:
    response = http.post("/api/v1/clusters", json={"name": name, "kubeconfig": kubeconfig_text(emulated), "session_domain": f"{name}.example.com"})
    assert response.status_code == 201, response.text
    return response.json()


def kubeconfig_for(emulated, *, token: str, user: str = "gshare-rotated", context: str = "rotated") -> str:
    """A kubeconfig for ``emulated`` with its own user and context names (another credential)."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": "gpu", "cluster": {"server": emulated.url}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": "gpu", "user": user}}],
    })


def accept_only_token(emulated, token: str) -> None:
    """Make the emulated apiserver accept ``token`` only (the old ServiceAccount token is revoked)."""

    async def change():
        emulated.emulator.token = token

    emulated.call(change)


def snapshot(cluster_id: str) -> tuple:
    row = Cluster.objects.get(public_id=cluster_id)
    return row.kubeconfig, row.apiserver_url, row.kube_system_uid, row.credential_generation, row.session_domain


def test_registration_records_the_kube_system_uid(http, fleet_cluster):
    first = register(http, fleet_cluster("lab-c1"), "lab-c1")
    second = register(http, fleet_cluster("lab-c2"), "lab-c2")
    assert Cluster.objects.get(public_id=first["id"]).kube_system_uid == kube_system_uid("lab-c1")
    assert Cluster.objects.get(public_id=second["id"]).kube_system_uid == kube_system_uid("lab-c2")
    assert kube_system_uid("lab-c1") != kube_system_uid("lab-c2")


def test_new_credential_for_the_same_cluster_is_accepted_and_used(http, fleet_cluster, http_for):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated, "lab-c1")["id"]
    operator_token = operator_token_mint(cluster_id=cluster_id)
    _, _, uid, generation, _ = snapshot(cluster_id)

    accept_only_token(emulated, "rotated-sa-token")  # the apiserver revokes the old token
    stale = http.post(f"/api/v1/clusters/{cluster_id}/connection-test")
    assert stale.status_code == 400 and stale.json()["code"] == "cluster_auth_failed"

    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_for(emulated, token="rotated-sa-token")})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == cluster_id and body["name"] == "lab-c1" and body["apiserver_url"] == emulated.url
    assert "kubeconfig" not in body and "rotated-sa-token" not in response.text
    shown = http.get(f"/api/v1/clusters/{cluster_id}")
    assert "rotated-sa-token" not in shown.text and "emulator-token" not in shown.text

    row = Cluster.objects.get(public_id=cluster_id)
    assert "rotated-sa-token" in row.kubeconfig and "gshare-rotated" in row.kubeconfig
    assert row.kube_system_uid == uid and row.credential_generation == generation
    assert Cluster.objects.filter(name="lab-c1").count() == 1

    # A later connection test dials with the new credential (the old one is refused by the apiserver now).
    report = http.post(f"/api/v1/clusters/{cluster_id}/connection-test")
    assert report.status_code == 200, report.text
    assert report.json()["checks"]["apiserver_reachable"] is True

    # The operator keeps its token: the cluster's credential towards the control plane did not change.
    operator = http_for(operator_token)
    inventory = operator.put("/internal/v1/inventory", json=fleet.expected_inventory("lab-c1")["snapshot"])
    assert inventory.status_code == 200, inventory.text


def test_same_cluster_at_a_new_address_moves_the_apiserver_url(http, fleet_cluster):
    old = fleet_cluster("lab-c1")
    cluster_id = register(http, old, "lab-c1")["id"]
    moved = fleet_cluster("lab-c1")  # the same cluster (same kube-system uid) behind another address
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(moved), "ingress_node": "gpu-node-02"})
    assert response.status_code == 200, response.text
    assert response.json()["apiserver_url"] == moved.url != old.url
    assert response.json()["ingress_node"] == "gpu-node-02"
    seen_before = len(moved.requests_seen())
    assert http.post(f"/api/v1/clusters/{cluster_id}/connection-test").json()["checks"]["apiserver_reachable"]
    assert len(moved.requests_seen()) > seen_before


def test_another_clusters_kubeconfig_is_different_cluster(http, fleet_cluster):
    lab_c1, lab_c2 = fleet_cluster("lab-c1"), fleet_cluster("lab-c2")
    cluster_id = register(http, lab_c1, "lab-c1")["id"]
    before = snapshot(cluster_id)
    body = {"kubeconfig": kubeconfig_text(lab_c2), "session_domain": "changed.example.com"}

    refused = http.patch(f"/api/v1/clusters/{cluster_id}", json=body)
    assert refused.status_code == 409, refused.text
    error = refused.json()
    assert error["code"] == "different_cluster"
    assert kube_system_uid("lab-c1") in error["detail"] and kube_system_uid("lab-c2") in error["detail"]
    assert "lab-c1" in error["detail"] and "register it separately" in error["detail"]
    assert "emulator-token" not in refused.text
    assert snapshot(cluster_id) == before  # neither the credential nor the other field changed

    other_id = register(http, lab_c2, "lab-c2")["id"]
    refused = http.patch(f"/api/v1/clusters/{cluster_id}", json=body)
    assert refused.status_code == 409 and f"registered cluster 'lab-c2' ({other_id})" in refused.json()["detail"]
    assert snapshot(cluster_id) == before
    # The old credential is still the one used.
    seen_before = len(lab_c1.requests_seen())
    assert http.post(f"/api/v1/clusters/{cluster_id}/connection-test").json()["checks"]["apiserver_reachable"]
    assert len(lab_c1.requests_seen()) > seen_before


@pytest.mark.parametrize(
    ("fixture", "code"),
    [
        ("eks-exec-aws-eks-get-token.yaml", "kubeconfig_exec_forbidden"),
        ("oidc-auth-provider.yaml", "kubeconfig_exec_forbidden"),
        ("ca-file-paths-minikube.yaml", "kubeconfig_local_file"),
        ("k3s.yaml", "kubeconfig_localhost"),
        ("kubectl-config-view-redacted.yaml", "kubeconfig_invalid"),
        ("multi-context-empty-current-context.yaml", "kubeconfig_invalid"),
    ],
)
def test_invalid_kubeconfig_is_refused_with_the_registration_code(http, fleet_cluster, fixture, code):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated, "lab-c1")["id"]
    before, seen = snapshot(cluster_id), len(emulated.requests_seen())
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": load_kubeconfig_fixture(fixture)})
    assert response.status_code == 400
    assert response.json()["code"] == code
    assert snapshot(cluster_id) == before
    assert len(emulated.requests_seen()) == seen  # refused before anything was dialled


def test_not_yaml_and_not_a_string_are_refused(http, fleet_cluster):
    cluster_id = register(http, fleet_cluster("lab-c1"), "lab-c1")["id"]
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": "{{{ not yaml"})
    assert response.status_code == 400 and response.json()["code"] == "kubeconfig_invalid"
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": {"apiVersion": "v1"}})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"


def test_refused_credential_is_cluster_auth_failed(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated, "lab-c1")["id"]
    before = snapshot(cluster_id)
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_for(emulated, token="wrong")})
    assert response.status_code == 400 and response.json()["code"] == "cluster_auth_failed"
    assert snapshot(cluster_id) == before


def test_unreachable_is_the_registration_status(http, fleet_cluster, silent_listener, settings):
    cluster_id = register(http, fleet_cluster("lab-c1"), "lab-c1")["id"]
    before = snapshot(cluster_id)
    settings.GSHARE_PROBE_TIMEOUT = 1.5
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": yaml.safe_dump(silent_kubeconfig(silent_listener))})
    assert response.status_code == 504
    assert response.json()["code"] == "cluster_unreachable"
    # cut off by the configured budget itself (GSHARE_PROBE_TIMEOUT passed down), not by a socket timeout or the peer
    detail = response.json()["detail"]
    assert "did not answer within 1.5 s" in detail and "cut off at the deadline" in detail, detail
    assert snapshot(cluster_id) == before


def test_a_deregistered_cluster_cannot_change_its_credential(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated, "lab-c1")["id"]
    http.delete(f"/api/v1/clusters/{cluster_id}")
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(emulated)})
    assert response.status_code == 409 and response.json()["code"] == "cluster_deregistered"


def test_only_staff_may_change_a_credential(http, http_user, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated, "lab-c1")["id"]
    response = http_user.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(emulated)})
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"


# --------------------------------------------------------------------------- clusters registered before identities


def forget_identity(cluster_id: str) -> None:
    """Make the cluster look registered before kube_system_uid was recorded (migration 0005 left it empty)."""
    Cluster.objects.filter(public_id=cluster_id).update(kube_system_uid="")


def test_legacy_cluster_records_its_identity_from_the_current_credential(http, fleet_cluster):
    lab_c1, lab_c2 = fleet_cluster("lab-c1"), fleet_cluster("lab-c2")
    cluster_id = register(http, lab_c1, "lab-c1")["id"]
    forget_identity(cluster_id)
    refused = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(lab_c2)})
    assert refused.status_code == 409 and refused.json()["code"] == "different_cluster"
    # The identity read through the old credential was recorded even though the change was refused.
    assert Cluster.objects.get(public_id=cluster_id).kube_system_uid == kube_system_uid("lab-c1")

    forget_identity(cluster_id)
    accepted = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_for(lab_c1, token="emulator-token")})
    assert accepted.status_code == 200, accepted.text
    assert Cluster.objects.get(public_id=cluster_id).kube_system_uid == kube_system_uid("lab-c1")


def test_legacy_cluster_whose_credential_no_longer_works_is_cluster_identity_unknown(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated, "lab-c1")["id"]
    forget_identity(cluster_id)
    before = snapshot(cluster_id)
    accept_only_token(emulated, "rotated-sa-token")
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_for(emulated, token="rotated-sa-token")})
    assert response.status_code == 409
    error = response.json()
    assert error["code"] == "cluster_identity_unknown"
    assert "register it again" in error["detail"] and "connection-test" in error["detail"]
    assert "rotated-sa-token" not in response.text and "emulator-token" not in response.text
    assert snapshot(cluster_id) == before


def test_connection_test_records_a_legacy_clusters_identity(http, fleet_cluster):
    cluster_id = register(http, fleet_cluster("lab-c1"), "lab-c1")["id"]
    forget_identity(cluster_id)
    assert http.post(f"/api/v1/clusters/{cluster_id}/connection-test").status_code == 200
    assert Cluster.objects.get(public_id=cluster_id).kube_system_uid == kube_system_uid("lab-c1")


# --------------------------------------------------------------------------- a credential that may not read kube-system


def without_identity_grant(emulated, settings) -> str:
    """The kubeconfig of the control plane's ServiceAccount on ``emulated`` with an older ClusterRole: no ``get`` on
    the namespace kube-system (the emulator's RBAC answers 403 to reading it)."""
    admin = validate_kubeconfig(kubeconfig_text(emulated), loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST).config
    with KubeGateway.for_kubeconfig(admin, call_timeout=10) as kube:
        token = least_privilege.apply_credential(kube)
        role = next(o for o in least_privilege.credential_objects() if o["kind"] == "ClusterRole")
        kube.apply({**role, "rules": [r for r in role["rules"] if r["resources"] != ["namespaces"]]})
    return least_privilege.credential_kubeconfig(admin, token)


def test_registration_refuses_a_credential_that_may_not_read_kube_system(http, fleet_cluster, settings):
    restricted = without_identity_grant(fleet_cluster("lab-c1"), settings)
    response = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": restricted})
    assert response.status_code == 400
    assert response.json()["code"] == "cluster_auth_failed"
    assert "kube-system" in response.json()["detail"] and "--resource-name=kube-system" in response.json()["detail"]
    assert Cluster.objects.count() == 0


def test_connection_test_still_works_without_the_kube_system_grant(http, fleet_cluster, settings):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated, "lab-c1")["id"]
    restricted = without_identity_grant(emulated, settings)
    # Registered before identities were recorded, with the older ClusterRole.
    Cluster.objects.filter(public_id=cluster_id).update(kube_system_uid="", kubeconfig=restricted)
    report = http.post(f"/api/v1/clusters/{cluster_id}/connection-test")
    assert report.status_code == 200 and report.json()["checks"]["apiserver_reachable"]
    assert report.json()["checks"]["credential_least_privilege"] is True
    refused = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": restricted})
    assert refused.status_code == 409 and refused.json()["code"] == "cluster_identity_unknown"
    assert "--resource-name=kube-system" in refused.json()["detail"]
