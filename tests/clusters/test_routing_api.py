"""A cluster's routing mode through the API: set at registration (default ingress-nginx), changed with PATCH, shown to
everyone (its Gateway to staff only), every malformed value refused with its own code and nothing changed, audited;
and no session domain may be the control plane's own host."""

from __future__ import annotations

import pytest

from audit.models import AuditRecord
from clusters.models import Cluster
from tests.factories import ClusterFactory
from tests.helpers import kubeconfig_text

pytestmark = pytest.mark.django_db


def register(http, emulated, name="lab", **extra):
    body = {"name": name, "kubeconfig": kubeconfig_text(emulated), "session_domain": f"{name}.gpu.example.com", **extra}
    return http.post("/api/v1/clusters", json=body)


def refused(response, code: str, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code, body
    assert body["detail"]
    return body


def test_registration_defaults_to_ingress_nginx_and_takes_gateway_api(http, fleet_cluster):
    plain = register(http, fleet_cluster("lab-c1"), name="plain")
    assert plain.status_code == 201, plain.text
    assert (plain.json()["routing"], plain.json()["gateway_name"], plain.json()["gateway_namespace"]) == (
        "ingress-nginx", "gshare-sessions", "gshare-system")
    gateway = register(http, fleet_cluster("lab-c2"), name="gw", routing="gateway-api", gateway_name="edge", gateway_namespace="infra")
    assert gateway.status_code == 201, gateway.text
    row = Cluster.objects.get(public_id=gateway.json()["id"])
    assert (row.routing, row.gateway_name, row.gateway_namespace) == ("gateway-api", "edge", "infra")
    audit = AuditRecord.objects.get(action="cluster_register", object_id=row.public_id)
    assert audit.changes["routing"] == {"old": None, "new": "gateway-api"} and audit.changes["gateway_name"]["new"] == "edge"


@pytest.mark.parametrize(("field", "value", "code"), [
    ("routing", "istio", "invalid_routing"),
    ("routing", "", "invalid_routing"),
    ("routing", "Gateway-API", "invalid_routing"),
    ("routing", 1, "invalid_routing"),
    ("routing", ["gateway-api"], "invalid_routing"),
    ("routing", {"mode": "gateway-api"}, "invalid_routing"),
    ("gateway_name", "Edge_Gateway", "invalid_gateway_name"),
    ("gateway_name", "", "invalid_gateway_name"),
    ("gateway_name", "a" * 254, "invalid_gateway_name"),
    ("gateway_name", "edge\n", "invalid_gateway_name"),
    ("gateway_name", "edge\x00", "invalid_gateway_name"),
    ("gateway_name", "\u00e9dge", "invalid_gateway_name"),
    ("routing", "gateway-api\x00", "invalid_routing"),
    ("routing", "x" * 100_000, "invalid_routing"),
    ("gateway_name", 7, "invalid_gateway_name"),
    ("gateway_namespace", "infra.system", "invalid_gateway_namespace"),
    ("gateway_namespace", "a" * 64, "invalid_gateway_namespace"),
    ("gateway_namespace", "-infra", "invalid_gateway_namespace"),
])
def test_a_malformed_routing_setting_is_refused_with_its_code_and_nothing_is_registered(http, field, value, code):
    body = {"name": "lab", "kubeconfig": "never read", "session_domain": "lab.gpu.example.com", field: value}
    refused(http.post("/api/v1/clusters", json=body), code)
    assert not Cluster.objects.exists()
    assert not AuditRecord.objects.filter(action__startswith="cluster_").exists()


@pytest.mark.parametrize(("field", "value", "code"), [
    ("routing", "nginx", "invalid_routing"),
    ("routing", None, "invalid_request"),
    ("gateway_name", "UPPER", "invalid_gateway_name"),
    ("gateway_namespace", "a/b", "invalid_gateway_namespace"),
])
def test_a_patch_with_one_malformed_value_changes_nothing(http, field, value, code):
    cluster = ClusterFactory(session_domain="lab.gpu.example.com", ingress_node="n1")
    body = {"routing": "gateway-api", "gateway_name": "edge", "ingress_node": "n2", field: value}
    refused(http.patch(f"/api/v1/clusters/{cluster.public_id}", json=body), code)
    cluster.refresh_from_db()
    assert (cluster.routing, cluster.gateway_name, cluster.ingress_node) == ("ingress-nginx", "gshare-sessions", "n1")
    assert not AuditRecord.objects.filter(action="cluster_update").exists()


def test_patch_changes_the_routing_and_says_how_many_sessions_follow(http):
    cluster = ClusterFactory()
    response = http.patch(f"/api/v1/clusters/{cluster.public_id}",
                          json={"routing": "gateway-api", "gateway_name": "edge", "gateway_namespace": "infra"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["routing"], body["gateway_name"], body["gateway_namespace"], body["sessions_reapplied"]) == (
        "gateway-api", "edge", "infra", 0)
    audit = AuditRecord.objects.get(action="cluster_update")
    assert audit.actor == "api:admin"
    assert audit.changes == {"routing": {"old": "ingress-nginx", "new": "gateway-api"},
                             "gateway_name": {"old": "gshare-sessions", "new": "edge"},
                             "gateway_namespace": {"old": "gshare-system", "new": "infra"}}
    assert audit.details == {"sessions_reapplied": 0}
    # Another change that leaves the routing as it is re-applies nothing.
    again = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"ingress_node": "n3"}).json()
    assert again["sessions_reapplied"] == 0 and again["routing"] == "gateway-api"


def test_a_researcher_sees_the_routing_not_the_gateway_and_cannot_change_it(http_user):
    cluster = ClusterFactory(routing="gateway-api", gateway_name="edge", gateway_namespace="infra")
    shown = http_user.get(f"/api/v1/clusters/{cluster.public_id}").json()
    assert shown["routing"] == "gateway-api"
    assert "gateway_name" not in shown and "gateway_namespace" not in shown
    denied = http_user.patch(f"/api/v1/clusters/{cluster.public_id}", json={"routing": "ingress-nginx"})
    assert denied.status_code == 403
    cluster.refresh_from_db()
    assert cluster.routing == "gateway-api"


@pytest.fixture
def control_plane_host(settings):
    settings.GSHARE_CONTROL_PLANE_URL = "https://gshare.example.com"
    settings.ALLOWED_HOSTS = ["console.example.com", ".example.org", "*", "[::1]"]
    settings.GSHARE_INTERNAL_HOSTS = ["internal.gshare.example.com:8443", "10.0.0.7"]


@pytest.mark.parametrize("domain", ["gshare.example.com", "console.example.com", "example.org", "lab.example.org",
                                    "internal.gshare.example.com"])
def test_a_session_domain_on_the_control_planes_host_is_refused(http, control_plane_host, domain):
    body = refused(http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": "never read", "session_domain": domain}),
                   "session_domain_is_control_plane")
    assert "shadow the control plane" in body["detail"]
    cluster = ClusterFactory(session_domain="lab.gpu.example.com")
    refused(http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"session_domain": domain}), "session_domain_is_control_plane")
    cluster.refresh_from_db()
    assert cluster.session_domain == "lab.gpu.example.com"
    assert not AuditRecord.objects.filter(action__startswith="cluster_").exists()


def test_names_under_the_control_planes_own_names_are_session_domains_like_any_other(http, control_plane_host):
    """Only a ``.domain`` pattern covers subdomains; ``*`` names no host."""
    cluster = ClusterFactory(session_domain="lab.gpu.example.com")
    for domain in ("sessions.gshare.example.com", "lab.console.example.com", "example.org.example.net"):
        response = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"session_domain": domain})
        assert response.status_code == 200, response.text


def test_the_console_form_changes_the_routing_through_the_service(console):
    cluster = ClusterFactory(session_domain="lab.gpu.example.com")
    form = {"session_domain": "lab.gpu.example.com", "ingress_node": "", "volume_storage_class": "",
            "routing": "gateway-api", "gateway_name": "edge", "gateway_namespace": "infra"}
    assert console.post(f"/clusters/cluster/{cluster.pk}/change/", form).status_code == 302
    cluster.refresh_from_db()
    assert (cluster.routing, cluster.gateway_name, cluster.gateway_namespace) == ("gateway-api", "edge", "infra")
    assert AuditRecord.objects.get(action="cluster_update").actor == "console:admin"
    listed = console.get("/clusters/cluster/").content.decode()
    assert "gateway-api" in listed and "Gateway infra/edge" in listed
    page = console.get(f"/clusters/cluster/{cluster.pk}/change/").content.decode()
    assert "not tested in this mode" in page


def test_the_console_form_shows_a_refusal_and_changes_nothing(console, settings):
    settings.GSHARE_CONTROL_PLANE_URL = "https://gshare.example.com"
    cluster = ClusterFactory(session_domain="lab.gpu.example.com")
    form = {"session_domain": "gshare.example.com", "ingress_node": "", "volume_storage_class": "",
            "routing": "gateway-api", "gateway_name": "edge", "gateway_namespace": "infra"}
    page = console.post(f"/clusters/cluster/{cluster.pk}/change/", form)
    assert page.status_code == 200 and "shadow the control plane" in page.content.decode()
    cluster.refresh_from_db()
    assert (cluster.session_domain, cluster.routing) == ("lab.gpu.example.com", "ingress-nginx")
