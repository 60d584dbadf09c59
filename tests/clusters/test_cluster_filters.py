"""One rule for ``?cluster=`` in every API list (``clusters.filters.ClusterRefFilter``, ``clusters.refs``), through
HTTP on the live server: a ``clu_...`` id finds any cluster, deregistered included; a name only a registered one
(an old cluster's name, reused, finds the new one); a value naming no cluster answers 404 ``cluster_not_found``;
an empty value filters nothing. The same in nodes, GPUs, sessions, volumes, storage pools, the storage summary and
the audit trail."""

from __future__ import annotations

import pytest

from audit.models import AuditRecord
from clusters.models import Cluster
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, StoragePoolFactory, VolumeFactory

pytestmark = pytest.mark.django_db

LISTS = ["/api/v1/nodes", "/api/v1/gpus", "/api/v1/sessions", "/api/v1/storage/volumes", "/api/v1/storage/pools", "/api/v1/audit"]


def _rows(cluster: Cluster, n: int) -> None:
    """``n`` rows of every list on ``cluster``."""
    for _ in range(n):
        node = NodeFactory(cluster=cluster)
        GpuDeviceFactory(node=node, cluster=cluster)
        SessionFactory(cluster=cluster, phase="Terminated")
        pool = StoragePoolFactory(cluster=cluster, sharing="selected")
        VolumeFactory(cluster=cluster, pool=pool)
        AuditRecord.objects.create(actor="api:alice", action="cluster_update", object_type="cluster", object_id=cluster.public_id,
                                   object_repr=cluster.name, cluster=cluster.public_id, cluster_name=cluster.name)


@pytest.fixture
def fleet():
    """``lab-a`` (registered, 2 rows of each), ``old`` (deregistered as ``lab-b``, 1 row) and the new ``lab-b``
    (registered under the old one's name, 3 rows)."""
    a = ClusterFactory(name="lab-a")
    old = ClusterFactory(name="lab-b", status=Cluster.Status.DEREGISTERED)
    new = ClusterFactory(name="lab-b")
    _rows(a, 2)
    _rows(old, 1)
    _rows(new, 3)
    return a, old, new


@pytest.mark.parametrize("path", LISTS)
def test_every_list_resolves_cluster_by_the_same_rule(http, fleet, path):
    a, old, new = fleet
    count = lambda query: http.get(f"{path}?{query}").json()["count"]  # noqa: E731
    assert count("") == count("cluster=") >= 6  # the audit trail has rows about no cluster too (the API token's)
    assert count(f"cluster={a.public_id}") == count("cluster=lab-a") == count("cluster=%20lab-a%20") == 2
    assert count(f"cluster={old.public_id}") == 1  # a deregistered cluster by its id: its history stays reachable
    assert count("cluster=lab-b") == count(f"cluster={new.public_id}") == 3  # a name finds the registered cluster only


@pytest.mark.parametrize("path", [*LISTS, "/api/v1/storage/summary"])
@pytest.mark.parametrize("ref", ["nope", "clu_nope", "LAB-A", "%F0%9F%92%A5"])
def test_every_list_answers_404_for_a_cluster_that_does_not_exist(http, fleet, path, ref):
    response = http.get(f"{path}?cluster={ref}")
    assert response.status_code == 404, response.text
    body = response.json()
    assert body["code"] == "cluster_not_found" and "GET /api/v1/clusters" in body["detail"]


def test_summary_resolves_cluster_by_the_same_rule(http, fleet):
    a, old, new = fleet
    assert http.get("/api/v1/storage/summary?cluster=lab-a").json()["cluster"] == a.public_id
    assert http.get("/api/v1/storage/summary?cluster=lab-b").json()["cluster"] == new.public_id
    assert http.get(f"/api/v1/storage/summary?cluster={old.public_id}").json()["cluster"] == old.public_id
    assert http.get("/api/v1/storage/summary?cluster=").json()["cluster"] is None


def test_filters_combine_with_the_other_parameters(http, fleet):
    a, _old, _new = fleet
    assert http.get("/api/v1/sessions?cluster=lab-a&phase=Terminated").json()["count"] == 2
    assert http.get("/api/v1/sessions?cluster=lab-a&phase=Running").json()["count"] == 0
    pool = a.storage_pools.first()
    assert http.get(f"/api/v1/storage/volumes?cluster=lab-a&pool={pool.public_id}").json()["count"] == 1
    assert http.get("/api/v1/audit?cluster=lab-a&action=cluster_update").json()["count"] == 2
    assert http.get("/api/v1/audit?cluster=lab-a&action=cluster_register").json()["count"] == 0


def test_the_schema_documents_the_cluster_parameter(http):
    schema = http.get("/api/v1/schema/?format=json").text
    for path in ("/api/v1/nodes", "/api/v1/gpus", "/api/v1/sessions", "/api/v1/storage/volumes", "/api/v1/storage/pools",
                 "/api/v1/storage/summary", "/api/v1/audit"):
        assert f"{path}" in schema
    assert schema.count("404 cluster_not_found if none") >= 7
