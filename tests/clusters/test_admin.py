"""Console pages: no kubeconfig anywhere, filters by cluster, query counts that do not grow, inventory the console
cannot delete."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters import services as cluster_services
from clusters.models import GpuDevice, Node
from core.exceptions import Conflict
from demo import fleet
from sessions import create
from sessions.models import Allocation, Session
from tests.console_checks import assert_read_only, page_text
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db


def _grow():
    cluster = ClusterFactory()
    for _ in range(3):
        GpuDeviceFactory.create_batch(2, node=NodeFactory(cluster=cluster), cluster=cluster)
    return cluster


@pytest.mark.parametrize("path", ["/clusters/cluster/", "/clusters/node/", "/clusters/gpudevice/"])
def test_list_pages_have_constant_queries(console, path):
    counts = []
    for _ in range(2):
        _grow()
        with CaptureQueriesContext(connection) as queries:
            response = console.get(path)
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_cluster_pages_never_show_the_kubeconfig(console):
    cluster = _grow()
    for path in ["/clusters/cluster/", f"/clusters/cluster/{cluster.pk}/change/"]:
        html = console.get(path).content.decode()
        assert "factory-token" not in html
        assert "kubeconfig" not in html.lower()
    html = console.get("/clusters/cluster/").content.decode()
    assert "heartbeat" in html


def test_cluster_page_warns_about_a_cluster_admin_credential_with_the_fix(console):
    from clusters.probe import LEAST_PRIVILEGE_FIX

    cluster = ClusterFactory(last_connection_test={
        "status": "connected", "checks": {"apiserver_reachable": True, "credential_least_privilege": False},
        "detail": {"credential_least_privilege": LEAST_PRIVILEGE_FIX}})
    text = page_text(console.get(f"/clusters/cluster/{cluster.pk}/change/"))
    assert "cluster-admin credential stored" in text and "re-run `manage.py attach_cluster`" in text
    cluster.last_connection_test = {"status": "connected", "checks": {"credential_least_privilege": True}, "detail": {}}
    cluster.save(update_fields=["last_connection_test"])
    text = page_text(console.get(f"/clusters/cluster/{cluster.pk}/change/"))
    assert "least privilege (ServiceAccount gshare-control-plane)" in text and "cluster-admin credential" not in text


def test_node_and_gpu_pages_filter_by_cluster(console):
    a, b = _grow(), _grow()
    gpus = console.get(f"/clusters/gpudevice/?cluster__id__exact={a.pk}").context["cl"].result_list
    assert len(gpus) == 6 and {g.cluster_id for g in gpus} == {a.pk}
    nodes = console.get(f"/clusters/node/?cluster__id__exact={b.pk}").context["cl"].result_list
    assert len(nodes) == 3 and {n.cluster_id for n in nodes} == {b.pk}


#: The routing fields of the change form as a browser posts them for a cluster with the default routing.
ROUTING_FORM = {"routing": "ingress-nginx", "gateway_name": "gshare-sessions", "gateway_namespace": "gshare-system"}


def test_console_edit_goes_through_the_service(console):
    cluster = ClusterFactory()
    response = console.post(
        f"/clusters/cluster/{cluster.pk}/change/",
        {"session_domain": "edited.example.com", "ingress_node": "n9", "volume_storage_class": "nfs", **ROUTING_FORM},
    )
    assert response.status_code == 302
    cluster.refresh_from_db()
    assert cluster.session_domain == "edited.example.com"


def test_dashboard_lists_the_fleet_in_constant_queries(console):
    counts = []
    for _ in range(2):
        cluster = _grow()
        with CaptureQueriesContext(connection) as queries:
            html = console.get("/").content.decode()
        counts.append(len(queries))
        assert cluster.name in html and cluster.public_id in html
    assert counts[0] == counts[1], counts


def test_nodes_and_gpus_are_read_only(console):
    cluster = _grow()
    assert_read_only(console, "/clusters/node/", Node.objects.filter(cluster=cluster).first())
    assert_read_only(console, "/clusters/gpudevice/", GpuDevice.objects.filter(cluster=cluster).first())


def test_console_cannot_delete_the_gpu_or_node_of_a_running_session(console):
    """The reproduced incident: deleting a GPU (or its node) in the console deleted the reservations of the shared
    session on it; the operator re-reported the GPU and placement then put an 8-GPU session next to the live one
    (stuck in Starting with NodeUnfitPod). Now every delete is refused and the 8-GPU request finds no room."""
    cluster = ClusterFactory(name="lab-c1")
    snapshot = fleet.expected_inventory("lab-c1")["snapshot"]["nodes"]  # 8x H100 80GB on gpu-h100-01, 2x V100 32GB
    cluster_services.inventory_apply(cluster=cluster, nodes=snapshot)
    user = UserFactory()
    shared = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=40000, gpu_cores=30)
    Session.objects.filter(pk=shared.pk).update(phase=Session.Phase.RUNNING)
    allocation = Allocation.objects.select_related("device__node").get(session=shared)
    gpu, node = allocation.device, allocation.device.node
    assert node.name == "gpu-h100-01"
    reserved = list(Allocation.objects.values())

    for url, pk in (("/clusters/gpudevice/", gpu.pk), ("/clusters/node/", node.pk)):
        assert console.post(f"{url}{pk}/delete/", {"post": "yes"}).status_code == 403
        assert console.post(url, {"action": "delete_selected", "_selected_action": [pk], "post": "yes", "index": 0}).status_code == 403
    assert GpuDevice.objects.filter(pk=gpu.pk).exists() and Node.objects.filter(pk=node.pk).exists()
    assert list(Allocation.objects.values()) == reserved

    cluster_services.inventory_apply(cluster=cluster, nodes=snapshot)  # the operator's next report
    with pytest.raises(Conflict) as refused:
        create.session_create(owner=user, image="img", gpus=8)
    assert refused.value.code == "no_capacity"
    assert list(Allocation.objects.values()) == reserved


@pytest.mark.django_db
def test_cluster_form_refuses_what_the_api_refuses(console, http):
    """A refusal of ``cluster_update`` (decided under the cluster's row lock) is a form error, as in PATCH; it was a 500."""
    cluster = ClusterFactory(session_domain="lab-c1.example.com")
    ClusterFactory(session_domain="taken.example.com")
    SessionFactory(cluster=cluster, phase="Running")
    form = {"session_domain": "lab-c1.example.com", "ingress_node": "", "volume_storage_class": "", **ROUTING_FORM}
    for domain in ("taken.example.com", "moved.example.com"):  # session_domain_taken, cluster_has_live_sessions (409)
        api = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"session_domain": domain})
        assert api.status_code == 409, api.text
        page = console.post(f"/clusters/cluster/{cluster.pk}/change/", {**form, "session_domain": domain})
        assert page.status_code == 200 and api.json()["detail"] in page_text(page)
        cluster.refresh_from_db()
        assert cluster.session_domain == "lab-c1.example.com"
    bad = console.post(f"/clusters/cluster/{cluster.pk}/change/", {**form, "ingress_node": "Not A Node!"})
    assert bad.status_code == 200 and http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"ingress_node": "Not A Node!"}).status_code == 400
    ok = console.post(f"/clusters/cluster/{cluster.pk}/change/", {**form, "ingress_node": "gpu-h100-01"})
    assert ok.status_code == 302
    cluster.refresh_from_db()
    assert cluster.ingress_node == "gpu-h100-01"
