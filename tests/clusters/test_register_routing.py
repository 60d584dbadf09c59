"""``cluster_register`` records a cluster's routing mode and Gateway (what the demo registers lab-c2 with), audited."""

from __future__ import annotations

import pytest

from audit.models import AuditRecord
from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.routing_mode import RoutingRefused
from contract import GATEWAY_NAME_DEFAULT, GATEWAY_NAMESPACE_DEFAULT, ROUTING_GATEWAY_API
from tests.helpers import kubeconfig_text

pytestmark = pytest.mark.django_db


def test_a_cluster_registered_in_gateway_api_mode_keeps_it(fleet_cluster):
    emulated = fleet_cluster("lab-c2")
    cluster = cluster_services.cluster_register(name="lab-c2", kubeconfig=kubeconfig_text(emulated),
                                                session_domain="lab-c2.gshare.localhost", routing=ROUTING_GATEWAY_API)
    cluster.refresh_from_db()
    assert (cluster.routing, cluster.gateway_name, cluster.gateway_namespace) == (
        Cluster.Routing.GATEWAY_API, GATEWAY_NAME_DEFAULT, GATEWAY_NAMESPACE_DEFAULT)
    row = AuditRecord.objects.get(action="cluster_register", object_id=cluster.public_id)
    assert row.changes["routing"] == {"old": None, "new": ROUTING_GATEWAY_API}
    assert row.changes["gateway_name"] == {"old": None, "new": GATEWAY_NAME_DEFAULT}


def test_the_default_is_ingress_nginx_and_an_unknown_mode_is_refused_before_any_probe(fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    with pytest.raises(RoutingRefused) as refused:
        cluster_services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated), routing="istio")
    assert refused.value.code == "invalid_routing"
    with pytest.raises(RoutingRefused) as refused:
        cluster_services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated), gateway_name="Not A Name")
    assert refused.value.code == "invalid_gateway_name"
    cluster = cluster_services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated))
    assert cluster.routing == Cluster.Routing.INGRESS_NGINX
    assert not Cluster.objects.filter(routing="istio").exists()
