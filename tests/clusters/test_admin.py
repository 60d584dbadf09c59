"""Console pages: no kubeconfig anywhere, filters by cluster, query counts that do not grow."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def console(client, staff_user):
    client.force_login(staff_user)
    return client


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


def test_node_and_gpu_pages_filter_by_cluster(console):
    a, b = _grow(), _grow()
    gpus = console.get(f"/clusters/gpudevice/?cluster__id__exact={a.pk}").context["cl"].result_list
    assert len(gpus) == 6 and {g.cluster_id for g in gpus} == {a.pk}
    nodes = console.get(f"/clusters/node/?cluster__id__exact={b.pk}").context["cl"].result_list
    assert len(nodes) == 3 and {n.cluster_id for n in nodes} == {b.pk}


def test_console_edit_goes_through_the_service(console):
    cluster = ClusterFactory()
    response = console.post(
        f"/clusters/cluster/{cluster.pk}/change/",
        {"session_domain": "edited.example.com", "ingress_node": "n9", "volume_storage_class": "nfs"},
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
