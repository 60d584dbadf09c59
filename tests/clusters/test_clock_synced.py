"""The operator's clock offset (``clock_offset_seconds`` of its inventory): recorded per cluster, judged as the
``clock_synced`` check by the connection test (advisory: the status is not degraded by it), ``GET /api/v1/clusters/{id}``'s
problems and the cluster page; optional for older operators (unknown); refused whole when malformed or out of bounds;
written only on the cluster of the token that sent it."""

from __future__ import annotations

import pytest

from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_mint
from tests import contract
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

NODES = [{"name": "gpu-node-01", "labels": {"gpu": "on"}, "ready": True, "devices": []}]


@pytest.fixture
def attached(live_cluster, http_for):
    """lab-c1 registered (probe and inventory applied: connected), with its operator's HTTP client."""
    cluster, _ = live_cluster("lab-c1")
    return cluster, http_for(operator_token_mint(cluster_id=cluster.public_id))


def test_the_connection_test_shows_clock_synced_failing_ok_and_unknown(attached, http, console):
    cluster, operator = attached
    from demo import fleet

    nodes = fleet.expected_inventory("lab-c1")["snapshot"]["nodes"]
    assert operator.put("/internal/v1/inventory", json={"nodes": nodes, "clock_offset_seconds": -600.25}).status_code == 200
    report = http.post(f"/api/v1/clusters/{cluster.public_id}/connection-test").json()
    assert report["checks"]["clock_synced"] is False
    detail = report["detail"]["clock_synced"]
    assert "600.250 s ahead of the control plane's" in detail and "30 s tolerance" in detail
    assert "NTP" in detail and "timedatectl set-ntp true" in detail
    assert report["status"] == "connected"  # advisory: reports still flow, re-stamped
    problems = http.get(f"/api/v1/clusters/{cluster.public_id}").json()["problems"]
    assert [p["check"] for p in problems if p["check"] == "clock_synced"] == ["clock_synced"]
    page = console.get(f"/clusters/cluster/{cluster.pk}/change/").content.decode()
    assert "600.250 s ahead of the control plane" in page and "⚠ off" in page

    assert operator.put("/internal/v1/inventory", json={"nodes": nodes, "clock_offset_seconds": 2.5}).status_code == 200
    report = http.post(f"/api/v1/clusters/{cluster.public_id}/connection-test").json()
    assert report["checks"]["clock_synced"] is True
    assert "2.500 s behind the control plane's" in report["detail"]["clock_synced"]
    assert not [p for p in http.get(f"/api/v1/clusters/{cluster.public_id}").json()["problems"] if p["check"] == "clock_synced"]

    # An operator that predates the offset: unknown (left out of checks, explained), never a failure.
    assert operator.put("/internal/v1/inventory", json={"nodes": nodes}).status_code == 200
    report = http.post(f"/api/v1/clusters/{cluster.public_id}/connection-test").json()
    assert "clock_synced" not in report["checks"] and report["detail"]["clock_synced"].startswith("Unknown, not failed")


def test_the_tolerance_is_the_settings(attached, http, settings):
    cluster, operator = attached
    settings.GSHARE_CLOCK_SKEW_TOLERANCE = 5
    assert operator.put("/internal/v1/inventory", json={"nodes": NODES, "clock_offset_seconds": 6}).status_code == 200
    assert http.post(f"/api/v1/clusters/{cluster.public_id}/connection-test").json()["checks"]["clock_synced"] is False


def test_a_digest_only_report_carries_the_offset_too(http_for):
    cluster = ClusterFactory()
    operator = http_for(operator_token_mint(cluster_id=cluster.public_id))
    from contract import inventory_digest

    digest = operator.put("/internal/v1/inventory", json={"nodes": NODES, "digest": inventory_digest(NODES)}).json()["digest"]
    answer = operator.put("/internal/v1/inventory", json={"digest": digest, "clock_offset_seconds": -42})
    assert answer.status_code == 200 and answer.json()["unchanged"], answer.text
    cluster.refresh_from_db()
    assert cluster.clock_offset_seconds == -42 and cluster.clock_offset_at is not None


@pytest.mark.parametrize("offset", [1e11, -1e11, "12", True, None, [1], {"s": 1}])
def test_a_malformed_or_absurd_offset_refuses_the_report_whole(http_for, offset):
    cluster = ClusterFactory()
    operator = http_for(operator_token_mint(cluster_id=cluster.public_id))
    assert contract.problems(contract.INVENTORY, {"nodes": NODES, "clock_offset_seconds": offset})
    response = operator.put("/internal/v1/inventory", json={"nodes": NODES, "clock_offset_seconds": offset})
    assert response.status_code == 400 and response.json()["code"] == "invalid_inventory"
    assert "clock_offset_seconds" in response.json()["detail"]
    cluster.refresh_from_db()
    assert cluster.last_heartbeat_at is None and cluster.clock_offset_seconds is None  # nothing half-applied


@pytest.mark.parametrize("raw", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_non_finite_offsets_are_refused(http_for, raw):
    cluster = ClusterFactory()
    operator = http_for(operator_token_mint(cluster_id=cluster.public_id))
    body = b'{"nodes": [], "clock_offset_seconds": ' + raw + b"}"
    response = operator.put("/internal/v1/inventory", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["code"] in ("invalid_inventory", "invalid_json"), response.text
    cluster.refresh_from_db()
    assert cluster.clock_offset_seconds is None


def test_an_operator_writes_only_its_own_clusters_offset(http_for):
    mine, theirs = ClusterFactory(), ClusterFactory()
    forger = http_for(operator_token_mint(cluster_id=theirs.public_id))
    assert forger.put("/internal/v1/inventory", json={"nodes": [], "clock_offset_seconds": -9999}).status_code == 200
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.clock_offset_seconds is None and theirs.clock_offset_seconds == -9999
    # No field of the body can name another cluster: an unknown key is dropped, the token decides.
    forger.put("/internal/v1/inventory", json={"nodes": [], "cluster": mine.public_id, "clock_offset_seconds": 1})
    mine.refresh_from_db()
    assert mine.clock_offset_seconds is None
    assert Cluster.objects.get(pk=theirs.pk).clock_offset_seconds == 1
