"""``POST /internal/v1/storage`` through HTTP: readings, node disks, PVC statuses, scope, validation, query counts."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.operator_token.tokens import operator_token_mint
from storage import services
from storage.models import GIB, NodeDisk, StorageCapacityReading, Volume
from tests.factories import ClusterFactory, StorageCapacityReadingFactory, VolumeFactory
from tests.helpers import Http

pytestmark = pytest.mark.django_db


def iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


@pytest.fixture
def cluster():
    return ClusterFactory(name="lab-c1")


@pytest.fixture
def operator(http_for, cluster) -> Http:
    return http_for(operator_token_mint(cluster_id=cluster.public_id))


def report(*, read_at=None, classes=(), volumes=(), nodes=()) -> dict:
    return {
        "read_at": iso(read_at or timezone.now()),
        "storage_classes": list(classes),
        "volumes": list(volumes),
        "nodes": list(nodes),
    }


def pvc(volume, phase, *, pv="", message=""):
    return {"volume_id": volume.public_id, "claim_name": volume.claim_name, "phase": phase, "volume_name": pv, "message": message}


def test_report_is_applied_and_counted(operator, cluster):
    bound, pending, lost = (VolumeFactory(cluster=cluster) for _ in range(3))
    body = report(
        classes=[{"storage_class": "nfs-a", "capacity_bytes": 2048 * GIB, "objects": 2}, {"storage_class": "nfs-b", "capacity_bytes": None, "objects": 0}],
        volumes=[
            pvc(bound, "Bound", pv="pvc-123"),
            pvc(pending, "Pending", message="MountVolume.SetUp failed: mount.nfs: not found (install nfs-common on the node)"),
            pvc(lost, "Lost"),
            {"volume_id": "vol_unknown", "claim_name": "gshare-vol-unknown", "phase": "Bound", "volume_name": "", "message": ""},
        ],
        nodes=[{"name": "nas-1", "disk_bytes": 500 * GIB}, {"name": "gpu-1", "disk_bytes": 100 * GIB}],
    )
    response = operator.post("/internal/v1/storage", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["storage_classes"] == 2 and answer["volumes"] == 3 and answer["volumes_ignored"] == 1 and answer["nodes"] == 2
    assert "server_time" in answer
    reading = StorageCapacityReading.objects.get(cluster=cluster, storage_class="nfs-a")
    assert reading.capacity_bytes == 2048 * GIB and reading.object_count == 2
    assert StorageCapacityReading.objects.get(storage_class="nfs-b").capacity_bytes is None
    assert NodeDisk.objects.get(cluster=cluster, node="nas-1").disk_bytes == 500 * GIB
    bound.refresh_from_db()
    pending.refresh_from_db()
    lost.refresh_from_db()
    assert (bound.status, bound.pv_name) == ("bound", "pvc-123") and bound.status_reported_at is not None
    assert pending.status == "pending" and "mount.nfs" in pending.status_message
    assert lost.status == "lost"

    # The next tick upserts the same rows.
    body["storage_classes"][0]["capacity_bytes"] = 3000 * GIB
    body["read_at"] = iso(timezone.now() + timedelta(seconds=1))
    assert operator.post("/internal/v1/storage", json=body).status_code == 200
    assert StorageCapacityReading.objects.filter(cluster=cluster).count() == 2
    assert StorageCapacityReading.objects.get(storage_class="nfs-a").capacity_bytes == 3000 * GIB


def test_deleted_and_unplaced_volumes_are_ignored(operator, cluster):
    deleted = VolumeFactory(cluster=cluster, status=Volume.Status.DELETED)
    unplaced = VolumeFactory(cluster=None)
    answer = operator.post("/internal/v1/storage", json=report(volumes=[pvc(deleted, "Bound"), pvc(unplaced, "Bound")])).json()
    assert answer["volumes"] == 0 and answer["volumes_ignored"] == 2
    deleted.refresh_from_db()
    unplaced.refresh_from_db()
    assert deleted.status == "deleted" and unplaced.status == "available"


def test_a_volume_of_another_cluster_refuses_the_whole_report(operator, cluster):
    own = VolumeFactory(cluster=cluster)
    foreign = VolumeFactory(cluster=ClusterFactory(name="lab-c2"), status=Volume.Status.BOUND)
    body = report(
        classes=[{"storage_class": "nfs-a", "capacity_bytes": GIB, "objects": 1}],
        volumes=[pvc(own, "Bound"), pvc(foreign, "Lost")],
        nodes=[{"name": "nas-1", "disk_bytes": GIB}],
    )
    response = operator.post("/internal/v1/storage", json=body)
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden_cluster_scope" and foreign.public_id in response.json()["detail"]
    assert not StorageCapacityReading.objects.exists() and not NodeDisk.objects.exists()
    own.refresh_from_db()
    foreign.refresh_from_db()
    assert own.status == "available" and foreign.status == "bound"


def test_a_late_report_never_overwrites_a_newer_one(operator, cluster):
    volume = VolumeFactory(cluster=cluster)
    now = timezone.now()
    operator.post("/internal/v1/storage", json=report(read_at=now, classes=[{"storage_class": "nfs-a", "capacity_bytes": 5 * GIB, "objects": 1}],
                                                      volumes=[pvc(volume, "Bound")]))
    late = operator.post("/internal/v1/storage", json=report(read_at=now - timedelta(seconds=30),
                                                             classes=[{"storage_class": "nfs-a", "capacity_bytes": GIB, "objects": 1}],
                                                             volumes=[pvc(volume, "Pending", message="old")])).json()
    assert late["volumes_ignored"] == 1
    volume.refresh_from_db()
    assert volume.status == "bound"
    assert StorageCapacityReading.objects.get().capacity_bytes == 5 * GIB


def test_a_read_at_in_the_future_counts_as_now(operator, cluster):
    operator.post("/internal/v1/storage", json=report(read_at=timezone.now() + timedelta(days=1),
                                                      classes=[{"storage_class": "nfs-a", "capacity_bytes": GIB, "objects": 1}]))
    assert StorageCapacityReading.objects.get().read_at <= timezone.now()


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda b: b.pop("read_at"), "read_at"),
        (lambda b: b.update(read_at="2026-11-29T16:00:00"), "read_at: must be an ISO 8601 time with a zone"),
        (lambda b: b.update(volumes=[{"volume_id": "vol_abc", "phase": "Released"}]), "volumes[0].phase"),
        (lambda b: b.update(storage_classes=[{"storage_class": "x", "capacity_bytes": -1}]), "storage_classes[0].capacity_bytes"),
        (lambda b: b.update(nodes=[{"name": "a", "disk_bytes": 1}, {"name": "a", "disk_bytes": 2}]), "nodes[1].name: 'a' appears twice"),
        (lambda b: b.update(nodes=[{"name": "a\x00", "disk_bytes": 1}]), "NUL"),
    ],
)
def test_malformed_reports_are_refused(operator, mutate, fragment):
    body = report()
    mutate(body)
    response = operator.post("/internal/v1/storage", json=body)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_storage_report" and fragment in response.json()["detail"]
    assert not StorageCapacityReading.objects.exists() and not NodeDisk.objects.exists()


def test_only_operator_tokens(http_for, staff_token):
    assert http_for().post("/internal/v1/storage", json=report()).status_code == 401
    assert http_for(staff_token).post("/internal/v1/storage", json=report()).status_code == 401


def _big_report(cluster, n: int) -> dict:
    volumes = [VolumeFactory(cluster=cluster) for _ in range(n)]
    return {
        "read_at": timezone.now(),
        "storage_classes": [{"storage_class": f"class-{i}", "capacity_bytes": i * GIB, "objects": 1} for i in range(n)],
        "volumes": [pvc(v, "Bound", pv=f"pv-{i}") for i, v in enumerate(volumes)],
        "nodes": [{"name": f"node-{i}", "disk_bytes": GIB} for i in range(n)],
    }


def test_query_count_does_not_grow_with_the_report(cluster, django_assert_max_num_queries):
    StorageCapacityReadingFactory(cluster=cluster, storage_class="class-1")
    counts = []
    for n in (3, 60):
        body = _big_report(cluster, n)
        with CaptureQueriesContext(connection) as queries:
            services.storage_report_apply(cluster=cluster, report=body)
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
    body = _big_report(cluster, 200)
    with django_assert_max_num_queries(counts[1]):
        services.storage_report_apply(cluster=cluster, report=body)
    assert Volume.objects.filter(status="bound").count() == 263
