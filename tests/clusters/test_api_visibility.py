"""What a non-staff API user sees of the fleet, field by field, against what staff see (HTTP on the live server)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory

pytestmark = pytest.mark.django_db

#: Every field a plain user sees, per endpoint (nothing else).
PUBLIC = {
    "clusters": {"id", "name", "status", "session_domain", "gpu_models", "node_count", "gpu_count", "registered_at", "deregistered_at"},
    "nodes": {"name", "cluster", "cluster_name", "gpu_mode", "ready", "last_seen_at", "gpu_count"},
    "gpus": {"uuid", "cluster", "cluster_name", "node", "index", "model", "memory_mib", "split_count", "cores", "health", "mode",
             "last_seen_at"},
}
#: Fields only staff see, per endpoint: how the control plane reaches and authenticates to the cluster, and how the
#: cluster is wired.
STAFF_ONLY = {
    "clusters": {"apiserver_url", "kube_system_uid", "credential_generation", "operator_token", "ingress_node", "volume_storage_class",
                 "routing", "gateway_name", "gateway_namespace",
                 "kubernetes_version", "last_heartbeat_at", "heartbeat_age_seconds", "last_connection_test", "last_connection_test_at",
                 "operator_checks", "problems"},
    "nodes": {"labels", "inventory_error"},
    "gpus": set(),
}
APISERVER = "https://apiserver.lab-c1.internal.example:6443"
UID = "5e1c0a51-uid-of-kube-system"
LABEL = "rack-7-row-b"


@pytest.fixture
def fleet_rows():
    now = timezone.now()
    cluster = ClusterFactory(
        name="lab-c1", apiserver_url=APISERVER, kube_system_uid=UID, ingress_node="lab-c1-cp-01", volume_storage_class="nfs-csi",
        last_heartbeat_at=now, operator_token_expires_at=now + timedelta(days=7), operator_token_rotated_at=now,
        operator_token_rotation_error="", last_connection_test_at=now,
        last_connection_test={"status": "connected", "checks": {"apiserver_reachable": True}, "detail": {"apiserver_reachable": f"{APISERVER} answered"}},
    )
    node = NodeFactory(cluster=cluster, labels={"gpu": "on", "topology.example.com/rack": LABEL}, inventory_error="bad annotation")
    GpuDeviceFactory(node=node, cluster=cluster, model="NVIDIA H100 80GB HBM3")
    GpuDeviceFactory(node=node, cluster=cluster, model="Tesla V100-SXM2-32GB")
    GpuDeviceFactory(node=node, cluster=cluster, model="NVIDIA H100 80GB HBM3")
    bare = ClusterFactory(name="lab-c2")
    return cluster, bare


def rows(client, endpoint: str, cluster) -> list[dict]:
    """Every representation of ``endpoint`` objects: the list, the list filtered by cluster, and the detail view."""
    listed = client.get(f"/api/v1/{endpoint}")
    assert listed.status_code == 200, listed.text
    found = listed.json()["results"]
    filtered = client.get(f"/api/v1/{endpoint}?cluster={cluster.public_id}")
    assert filtered.status_code == 200
    found += filtered.json()["results"]
    if endpoint == "clusters":
        shown = client.get(f"/api/v1/clusters/{cluster.public_id}")
        assert shown.status_code == 200
        found.append(shown.json())
    assert found
    return found


@pytest.mark.parametrize("endpoint", sorted(PUBLIC))
def test_a_plain_user_sees_exactly_the_public_fields(http_user, fleet_rows, endpoint):
    cluster, _ = fleet_rows
    for row in rows(http_user, endpoint, cluster):
        assert set(row) == PUBLIC[endpoint], sorted(set(row) ^ PUBLIC[endpoint])


@pytest.mark.parametrize(("endpoint", "field"), sorted((e, f) for e, fields in STAFF_ONLY.items() for f in fields))
def test_each_staff_only_field_is_absent_for_a_plain_user_and_present_for_staff(http, http_user, fleet_rows, endpoint, field):
    cluster, _ = fleet_rows
    assert all(field not in row for row in rows(http_user, endpoint, cluster))
    assert all(field in row for row in rows(http, endpoint, cluster))


@pytest.mark.parametrize("endpoint", sorted(PUBLIC))
def test_staff_see_the_public_fields_too(http, fleet_rows, endpoint):
    cluster, _ = fleet_rows
    for row in rows(http, endpoint, cluster):
        assert set(row) == PUBLIC[endpoint] | STAFF_ONLY[endpoint]


def test_no_staff_only_value_reaches_a_plain_user_anywhere(http, http_user, fleet_rows):
    cluster, _ = fleet_rows
    seen = " ".join(http_user.get(path).text for path in (
        "/api/v1/clusters", f"/api/v1/clusters/{cluster.public_id}", "/api/v1/nodes", "/api/v1/gpus"))
    for secret in (APISERVER, "apiserver.lab-c1.internal", UID, LABEL, "lab-c1-cp-01", "nfs-csi", "bad annotation"):
        assert secret not in seen
    staff_seen = http.get(f"/api/v1/clusters/{cluster.public_id}").json()
    assert staff_seen["apiserver_url"] == APISERVER and staff_seen["kube_system_uid"] == UID
    assert staff_seen["operator_token"]["expires_at"] is not None
    assert http.get("/api/v1/nodes").json()["results"][0]["labels"]["topology.example.com/rack"] == LABEL


def test_a_plain_user_learns_the_gpu_models_of_each_cluster(http_user, fleet_rows):
    cluster, bare = fleet_rows
    listed = {c["name"]: c for c in http_user.get("/api/v1/clusters").json()["results"]}
    assert listed["lab-c1"]["gpu_models"] == ["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"]
    assert listed["lab-c1"]["gpu_count"] == 3 and listed["lab-c1"]["node_count"] == 1
    assert listed["lab-c1"]["session_domain"] == cluster.session_domain and listed["lab-c1"]["status"] == "connected"
    assert listed["lab-c2"]["gpu_models"] == [] and listed["lab-c2"]["gpu_count"] == 0
    assert http_user.get(f"/api/v1/clusters/{bare.public_id}").json()["gpu_models"] == []


def test_a_plain_user_can_change_nothing(http_user, fleet_rows):
    cluster, _ = fleet_rows
    for response in (http_user.patch(f"/api/v1/clusters/{cluster.public_id}", json={"ingress_node": "x"}),
                     http_user.post(f"/api/v1/clusters/{cluster.public_id}/connection-test"),
                     http_user.delete(f"/api/v1/clusters/{cluster.public_id}")):
        assert response.status_code == 403 and response.json()["code"] == "permission_denied"
        assert APISERVER not in response.text
