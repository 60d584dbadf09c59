"""The "connect returns 401" diagnosis in each routing mode: a failed ``verify_reachable`` names where that cluster's
session routes ask (ingress-nginx's auth-url, or Envoy Gateway's ext_authz on the cluster's Gateway) and the fix."""

from __future__ import annotations

import pytest

from clusters.diagnosis import cluster_problems
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

AT = "2026-12-06T00:00:00Z"
UNREACHABLE = {"verify_reachable": {"ok": False, "detail": "connection refused", "checked_at": AT}}


def verify_problem(cluster) -> str:
    (detail,) = [p.detail for p in cluster_problems(cluster) if p.check == "verify_reachable"]
    return detail


def test_an_ingress_nginx_cluster_is_told_about_the_auth_url(settings):
    settings.GSHARE_CONTROL_PLANE_URL = "https://gshare.example.com/"
    cluster = ClusterFactory(operator_checks=UNREACHABLE)
    detail = verify_problem(cluster)
    assert detail.startswith(f"connection refused (checked by the operator at {AT}).")
    assert "https://gshare.example.com/internal/connect/verify" in detail and "auth-url" in detail
    assert "ext-authz" not in detail and "Gateway" not in detail


def test_a_gateway_api_cluster_is_told_about_its_gateway_envoy_gateway_and_the_ext_authz_url(settings, http, console):
    settings.GSHARE_CONTROL_PLANE_URL = "https://gshare.example.com/"
    cluster = ClusterFactory(operator_checks=UNREACHABLE, routing="gateway-api", gateway_name="edge", gateway_namespace="infra")
    detail = verify_problem(cluster)
    assert "Gateway infra/edge" in detail
    assert "https://gshare.example.com/internal/connect/ext-authz" in detail
    assert "`manage.py attach_cluster --routing gateway-api`" in detail
    assert "auth-url" not in detail and "/internal/connect/verify" not in detail
    shown = {p["check"]: p["detail"] for p in http.get(f"/api/v1/clusters/{cluster.public_id}").json()["problems"]}
    assert shown["verify_reachable"] == detail
    page = console.get(f"/clusters/cluster/{cluster.pk}/change/").content.decode()
    assert "https://gshare.example.com/internal/connect/ext-authz" in page


def test_a_missing_controller_is_a_problem_with_the_fix_of_the_mode(settings):
    settings.GSHARE_CONTROL_PLANE_URL = "https://gshare.example.com"
    report = {"status": "connected", "checks": {"apiserver_reachable": True}, "detail": {},
              "routing": {"mode": "gateway-api", "controller": True, "gateway_programmed": False, "detail": "Gateway infra/edge is not programmed."}}
    cluster = ClusterFactory(routing="gateway-api", gateway_name="edge", gateway_namespace="infra", last_connection_test=report)
    (detail,) = [p.detail for p in cluster_problems(cluster) if p.check == "routing"]
    assert detail.startswith("Gateway infra/edge is not programmed.") and "/internal/connect/ext-authz" in detail
    # Unknown (a credential that may not read it) is not a problem of its own: the detail says so on the page.
    cluster.last_connection_test = {**report, "routing": {**report["routing"], "controller": None, "gateway_programmed": None}}
    assert not [p for p in cluster_problems(cluster) if p.check == "routing"]
