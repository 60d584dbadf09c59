"""The session-path checks in the operator's inventory (``checks``): validated against the shared schema, recorded as
reported (names this control plane does not know dropped), optional for operators that predate them, and judged by
the connection test and the return to ``connected``."""

from __future__ import annotations

import pytest

from clusters import services
from clusters.diagnosis import cluster_problems, operator_check_verdicts
from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_mint
from tests import contract
from tests.factories import ClusterFactory
from tests.helpers import Http

pytestmark = pytest.mark.django_db

NODES = [{"name": "gpu-node-01", "labels": {"gpu": "on"}, "ready": True, "devices": []}]
AT = "2026-12-01T18:00:00Z"


def check(ok: bool, detail: str = "as reported") -> dict:
    return {"ok": ok, "detail": detail, "checked_at": AT}


@pytest.fixture
def cluster():
    return ClusterFactory(status=Cluster.Status.PENDING, session_domain="gpu-a.example.org", ingress_node="gpu-node-01")


@pytest.fixture
def operator(http_for, cluster) -> Http:
    return http_for(operator_token_mint(cluster_id=cluster.public_id))


def test_an_old_operators_inventory_without_checks_stays_valid(operator, cluster):
    assert contract.problems(contract.INVENTORY, {"nodes": NODES}) == []
    response = operator.put("/internal/v1/inventory", json={"nodes": NODES})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["session_domain"], body["ingress_node"]) == ("gpu-a.example.org", "gpu-node-01")
    assert body["connect_verify_url"].endswith("/internal/connect/verify")
    assert body["routing"] == cluster.routing
    assert body["connect_ext_authz_url"] == body["connect_verify_url"].removesuffix("/verify") + "/ext-authz"
    cluster.refresh_from_db()
    assert cluster.operator_checks == {}
    assert [v.ok for v in operator_check_verdicts(cluster)] == [None, None]


def test_checks_are_recorded_as_reported_and_unknown_names_dropped(operator, cluster):
    checks = {"session_domain_resolves": check(False, "gpu-a.example.org does not resolve"), "verify_reachable": check(True),
              "some_future_check": check(True)}
    response = operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": checks})
    assert response.status_code == 200, response.text
    cluster.refresh_from_db()
    assert set(cluster.operator_checks) == {"session_domain_resolves", "verify_reachable"}
    [problem] = [p for p in cluster_problems(cluster) if p.check == "session_domain_resolves"]
    assert problem.detail.startswith(f"gpu-a.example.org does not resolve (checked by the operator at {AT}).")
    assert f"`PATCH /api/v1/clusters/{cluster.public_id}`" in problem.detail


@pytest.mark.parametrize("bad", [{"ok": "yes", "detail": "", "checked_at": AT}, {"ok": True}, "passed",
                                 {"ok": True, "detail": "x" * 1001, "checked_at": AT}])
def test_a_malformed_check_is_refused_whole(operator, cluster, bad):
    response = operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": {"verify_reachable": bad}})
    assert (response.status_code, response.json()["code"]) == (400, "invalid_inventory")
    assert "checks.verify_reachable" in response.json()["detail"]
    cluster.refresh_from_db()
    assert cluster.last_heartbeat_at is None


def test_a_degraded_cluster_returns_to_connected_when_the_operator_reports_the_fix(cluster):
    cluster.status = Cluster.Status.DEGRADED
    cluster.last_connection_test = {"checks": {"apiserver_reachable": True, "session_domain_resolves": False}}
    cluster.save()
    services.inventory_apply(cluster=cluster, nodes=NODES, checks={"session_domain_resolves": check(False)})
    assert Cluster.objects.get(pk=cluster.pk).status == Cluster.Status.DEGRADED
    services.inventory_apply(cluster=cluster, nodes=NODES, checks={"session_domain_resolves": check(True)})
    assert Cluster.objects.get(pk=cluster.pk).status == Cluster.Status.CONNECTED


def test_a_cluster_without_session_domain_says_how_to_set_it():
    cluster = ClusterFactory(session_domain="")
    verdict = operator_check_verdicts(cluster)[0]
    assert verdict.ok is None and "has no session_domain" in verdict.detail and "PATCH /api/v1/clusters/" in verdict.detail
