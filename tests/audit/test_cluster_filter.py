"""``GET /api/v1/audit?cluster=<name>`` finds the rows of a cluster that is gone by the name they were written under."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from audit.models import AuditRecord
from clusters.models import Cluster
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def row(cluster: Cluster, object_id: str) -> AuditRecord:
    record = AuditRecord(at=datetime.now(UTC), actor="api:admin", action=AuditRecord.Action.CLUSTER_UPDATE, object_type="cluster",
                         object_id=object_id, cluster=cluster.public_id, cluster_name=cluster.name, changes={})
    record.save()
    return record


def ids(admin_client, query: str) -> tuple[int, list[str]]:
    response = admin_client.get(f"/api/v1/audit?{query}")
    body = response.json()
    return response.status_code, [r["object"]["id"] for r in body.get("results", [])] if response.status_code == 200 else [body["code"]]


def test_a_deregistered_clusters_old_name_finds_its_rows(admin_client):
    gone = ClusterFactory(name="lab-old")
    row(gone, "a")
    Cluster.objects.filter(pk=gone.pk).update(status=Cluster.Status.DEREGISTERED)
    assert ids(admin_client, "cluster=lab-old") == (200, ["a"])
    assert ids(admin_client, f"cluster={gone.public_id}") == (200, ["a"])


def test_a_registered_cluster_wins_over_rows_written_under_its_name_by_another(admin_client):
    gone = ClusterFactory(name="lab-x")
    row(gone, "old")
    Cluster.objects.filter(pk=gone.pk).update(status=Cluster.Status.DEREGISTERED)
    reused = ClusterFactory(name="lab-x")
    row(reused, "new")
    assert ids(admin_client, "cluster=lab-x") == (200, ["new"])


def test_a_name_nobody_had_and_an_unknown_id_are_404(admin_client):
    row(ClusterFactory(name="lab-c1"), "a")
    assert ids(admin_client, "cluster=lab-never") == (404, ["cluster_not_found"])
    assert ids(admin_client, "cluster=clu_nope") == (404, ["cluster_not_found"])
