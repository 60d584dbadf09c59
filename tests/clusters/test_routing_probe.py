"""The connection test's ``routing`` report against emulated apiservers: for ingress-nginx an IngressClass of
``k8s.io/ingress-nginx``, for gateway-api an Accepted GatewayClass of Envoy Gateway and the cluster's Gateway
Programmed (conditions as Gateway API v1.6.1 writes them; the CRDs are the upstream ones in tests/fixtures/crds).
Statuses are written here as a controller would; a missing piece is a problem with its fix, never an error."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from clusters.models import Cluster
from demo import fleet
from tests.helpers import kubeconfig_text

pytestmark = pytest.mark.django_db

CRDS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "crds"
ENVOY = "gateway.envoyproxy.io/gatewayclass-controller"
AT = "2026-12-06T00:00:00Z"


def gateway_api_crds() -> list[dict]:
    """The Gateway API v1.6.1 GatewayClass and Gateway CRDs, as released."""
    return [yaml.safe_load((CRDS / f"gateway.networking.k8s.io_{plural}.yaml").read_text()) for plural in ("gatewayclasses", "gateways")]


def condition(kind: str, status: str = "True", generation: int = 1, reason: str | None = None) -> dict:
    return {"type": kind, "status": status, "reason": reason or (kind if status == "True" else "Pending"),
            "message": f"{kind} {status}", "lastTransitionTime": AT, "observedGeneration": generation}


def ingress_class(controller: str = "k8s.io/ingress-nginx", name: str = "nginx") -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": name}, "spec": {"controller": controller}}


def gateway_class(*conditions: dict, controller: str = ENVOY) -> dict:
    obj = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "envoy-gateway"},
           "spec": {"controllerName": controller}}
    if conditions:
        obj["status"] = {"conditions": list(conditions)}
    return obj


def gateway(*conditions: dict, name: str = "gshare-sessions", generation: int = 1) -> dict:
    obj = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
           "metadata": {"name": name, "namespace": "gshare-system", "generation": generation},
           "spec": {"gatewayClassName": "envoy-gateway",
                    "listeners": [{"name": "http", "protocol": "HTTP", "port": 80, "hostname": "lab.gpu.example.com"}]}}
    if conditions:
        obj["status"] = {"conditions": list(conditions)}
    return obj


def register(http, emulated, **extra) -> str:
    response = http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": kubeconfig_text(emulated),
                                                   "session_domain": "lab.gpu.example.com", **extra})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def connection_test(http, cluster_id: str) -> dict:
    response = http.post(f"/api/v1/clusters/{cluster_id}/connection-test")
    assert response.status_code == 200, response.text
    return response.json()


def problems(http, cluster_id: str) -> dict[str, str]:
    return {p["check"]: p["detail"] for p in http.get(f"/api/v1/clusters/{cluster_id}").json()["problems"]}


def test_ingress_nginx_needs_an_ingress_class_of_ingress_nginx(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1", objects=[*fleet.cluster_objects("lab-c1"), ingress_class("example.com/other", name="other")])
    cluster_id = register(http, emulated)
    report = connection_test(http, cluster_id)
    routing = report["routing"]
    assert (routing["mode"], routing["controller"], routing["gateway_programmed"]) == ("ingress-nginx", False, None)
    assert "No IngressClass with controller k8s.io/ingress-nginx" in routing["detail"]
    assert "attach_cluster --routing ingress-nginx" in routing["detail"] and "2026-03-24" in routing["detail"]
    assert "routing" not in report["checks"]  # reported and shown as a problem; the status is the other checks'
    assert "k8s.io/ingress-nginx" in problems(http, cluster_id)["routing"]
    assert Cluster.objects.get(public_id=cluster_id).last_connection_test["routing"] == routing

    emulated.add(ingress_class())
    routing = connection_test(http, cluster_id)["routing"]
    assert (routing["controller"], routing["gateway_programmed"]) == (True, None)
    assert routing["detail"] == "IngressClass nginx (controller k8s.io/ingress-nginx) found."
    assert "routing" not in problems(http, cluster_id)


def test_a_cluster_without_the_gateway_api_has_no_controller_and_is_told_the_fix(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated, routing="gateway-api")
    before = connection_test(http, cluster_id)
    routing = before["routing"]
    assert (routing["mode"], routing["controller"], routing["gateway_programmed"]) == ("gateway-api", False, False)
    assert "answers 404" in routing["detail"] and "attach_cluster --routing gateway-api" in routing["detail"]
    assert before["checks"]["apiserver_reachable"] is True
    problem = problems(http, cluster_id)["routing"]
    assert "CRDs are not installed" in problem and "/internal/connect/ext-authz" in problem


def test_gateway_api_needs_an_accepted_envoy_gateway_class_and_a_programmed_gateway(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1", objects=[*fleet.cluster_objects("lab-c1"), *gateway_api_crds()])
    cluster_id = register(http, emulated, routing="gateway-api")
    routing = connection_test(http, cluster_id)["routing"]
    assert (routing["controller"], routing["gateway_programmed"]) == (False, False)
    assert f"No GatewayClass with controllerName {ENVOY}" in routing["detail"]
    assert "Gateway gshare-system/gshare-sessions" in routing["detail"] and "does not exist" in routing["detail"]

    # Written, but no controller took them up yet: the status the CRDs default (Unknown, "Waiting for controller").
    emulated.add(gateway_class())
    emulated.add(gateway())
    routing = connection_test(http, cluster_id)["routing"]
    assert (routing["controller"], routing["gateway_programmed"]) == (False, False)
    assert "is not Accepted (envoy-gateway: Accepted=Unknown (Pending: Waiting for controller))" in routing["detail"]
    assert "is not programmed (Programmed=Unknown (Pending: Waiting for controller))" in routing["detail"]

    # A status without conditions.
    emulated.add({**gateway_class(), "status": {"conditions": []}})
    routing = connection_test(http, cluster_id)["routing"]
    assert routing["controller"] is False and "envoy-gateway: no Accepted condition" in routing["detail"]

    # A controller refused them.
    emulated.add(gateway_class(condition("Accepted", "False", reason="InvalidParameters")))
    emulated.add(gateway(condition("Accepted", "True"), condition("Programmed", "False", reason="AddressNotAssigned")))
    routing = connection_test(http, cluster_id)["routing"]
    assert (routing["controller"], routing["gateway_programmed"]) == (False, False)
    assert "Accepted=False (InvalidParameters" in routing["detail"] and "Programmed=False (AddressNotAssigned" in routing["detail"]

    # Envoy Gateway accepted the class and programmed the Gateway.
    emulated.add(gateway_class(condition("Accepted")))
    emulated.add(gateway(condition("Accepted"), condition("Programmed")))
    routing = connection_test(http, cluster_id)["routing"]
    assert (routing["mode"], routing["controller"], routing["gateway_programmed"]) == ("gateway-api", True, True)
    assert "Gateway gshare-system/gshare-sessions is programmed" in routing["detail"]
    assert "routing" not in problems(http, cluster_id)

    # A condition for an older generation of the Gateway says nothing about the spec it has now.
    emulated.add(gateway(condition("Accepted"), condition("Programmed", generation=1), generation=2))
    routing = connection_test(http, cluster_id)["routing"]
    assert routing["gateway_programmed"] is False and "for generation 1 of 2" in routing["detail"]


def test_another_gateway_named_in_the_cluster_is_the_one_checked(http, fleet_cluster):
    programmed = (condition("Accepted"), condition("Programmed"))
    emulated = fleet_cluster("lab-c1", objects=[*fleet.cluster_objects("lab-c1"), *gateway_api_crds(),
                                                gateway_class(condition("Accepted")), gateway(*programmed)])
    cluster_id = register(http, emulated, routing="gateway-api", gateway_name="edge")
    routing = connection_test(http, cluster_id)["routing"]
    assert routing["gateway_programmed"] is False and "Gateway gshare-system/edge" in routing["detail"]
    assert http.patch(f"/api/v1/clusters/{cluster_id}", json={"gateway_name": "gshare-sessions"}).status_code == 200
    assert connection_test(http, cluster_id)["routing"]["gateway_programmed"] is True


def test_a_report_of_the_other_mode_is_no_problem_of_this_one(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated)
    assert connection_test(http, cluster_id)["routing"]["controller"] is False
    assert "routing" in problems(http, cluster_id)
    assert http.patch(f"/api/v1/clusters/{cluster_id}", json={"routing": "gateway-api"}).status_code == 200
    assert "routing" not in problems(http, cluster_id)  # the last test was of ingress-nginx: run it again


def test_an_unreachable_apiserver_leaves_the_routing_unknown(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    cluster_id = register(http, emulated)
    emulated.stop()
    report = connection_test(http, cluster_id)
    assert report["status"] == "unreachable"
    assert report["routing"] == {"mode": "ingress-nginx", "controller": None, "gateway_programmed": None,
                                 "detail": "Not checked: the apiserver did not answer."}
