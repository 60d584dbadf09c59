"""Storage services: capacity source precedence, staleness, max-not-sum, the capacity gate, pools and volumes."""

import threading
import time
from datetime import timedelta

import kubernetes
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from clusters.models import Cluster
from clusters.probe import ClusterUnreachable
from core.exceptions import Conflict
from storage import services, tasks
from storage.capacity import pool_capacity, pool_clusters, pools_usability
from storage.models import GIB, ClusterStorageClasses, StorageCapacityReading, StoragePool, Volume
from tests.factories import (
    ClusterFactory,
    NodeDiskFactory,
    SessionFactory,
    StorageCapacityReadingFactory,
    UserFactory,
    VolumeFactory,
)
from tests.helpers import kubeconfig_text, run_threads, silent_kubeconfig
from tests.storage.kube import pool_cluster, reachable

pytestmark = pytest.mark.django_db
TIB = 1024 * GIB


def make_pool(*, manual_gb=None, sharing="all", allowed=(), storage_node="", cluster=None, name=None, storage_class="nfs-a"):
    """A pool created through the service (its capacity resolved and stored) on a cluster whose apiserver serves its
    StorageClass (``tests.storage.kube``)."""
    cluster = reachable(cluster) if cluster is not None else pool_cluster()
    return services.pool_create(
        name=name or f"pool-{StoragePool.objects.count()}", cluster=cluster, storage_class=storage_class, sharing=sharing,
        allowed_clusters=list(allowed), manual_capacity_gb=manual_gb, storage_node=storage_node,
    )


# --------------------------------------------------------------------------- pool_clusters


def test_pool_clusters_all_is_every_registered_cluster():
    own, other = ClusterFactory(), ClusterFactory()
    gone = ClusterFactory(status=Cluster.Status.DEREGISTERED)
    pool = make_pool(cluster=own)
    assert pool_clusters(pool) == {own.pk, other.pk}
    assert gone.pk not in pool_clusters(pool)


def test_pool_clusters_selected_is_its_own_and_the_allowed():
    own, allowed, outsider = ClusterFactory(), ClusterFactory(), ClusterFactory()
    pool = make_pool(cluster=own, sharing="selected", allowed=[allowed])
    assert pool_clusters(pool) == {own.pk, allowed.pk}
    assert outsider.pk not in pool_clusters(pool)


def test_pools_usability_per_cluster_in_two_queries(django_assert_num_queries):
    own, bare, silent = ClusterFactory(name="a-own"), ClusterFactory(name="b-bare"), ClusterFactory(name="c-silent")
    ClusterFactory(name="d-gone", status=Cluster.Status.DEREGISTERED)
    now = timezone.now()
    ClusterStorageClasses.objects.create(cluster=own, names=["nfs-a", "nfs-b"], read_at=now)
    ClusterStorageClasses.objects.create(cluster=bare, names=["local-path"], read_at=now - timedelta(seconds=30))
    shared, selected = make_pool(cluster=own), make_pool(cluster=own, sharing="selected", allowed=[bare], storage_class="nfs-b")
    pools = list(StoragePool.objects.filter(pk__in=[shared.pk, selected.pk]).order_by("pk"))
    with django_assert_num_queries(2):  # the clusters with their lists, the allowed clusters
        usability = pools_usability(pools, now=now)
    uses = usability[shared.pk].uses
    assert [(u.cluster.name, u.usable) for u in uses] == [("a-own", True), ("b-bare", False), ("c-silent", True)]
    assert uses[0].reason == "StorageClass nfs-a exists on a-own (listed by its operator 0 s ago)"
    assert uses[1].reason == 'storageclass "nfs-a" not found on b-bare (its operator listed local-path 30 s ago)'
    assert "has not listed its StorageClasses" in uses[2].reason  # nothing known: assumed there
    assert usability[shared.pk].usable_ids == {own.pk, silent.pk} and set(usability[shared.pk].unusable) == {bare.pk}
    assert [(u.cluster.name, u.usable) for u in usability[selected.pk].uses] == [("a-own", True), ("b-bare", False)]
    assert usability[selected.pk].use_on(silent.pk) is None


# --------------------------------------------------------------------------- capacity resolution


def test_source_precedence_csi_manual_fleet_default_node_disk_none(settings):
    settings.STORAGE_POOL_CAPACITY_GB = None
    cluster = ClusterFactory(name="store")
    pool = make_pool(cluster=cluster, storage_node="nas-1")
    assert pool_capacity(pool=pool).source == "none"
    assert "set the pool's manual_capacity_gb" in pool_capacity(pool=pool).note

    NodeDiskFactory(cluster=cluster, node="nas-1", disk_bytes=500 * GIB)
    resolved = pool_capacity(pool=pool)
    assert (resolved.capacity_bytes, resolved.source) == (500 * GIB, "node_disk")
    assert "stand-in" in resolved.note and "nas-1" in resolved.note

    settings.STORAGE_POOL_CAPACITY_GB = 3000
    resolved = pool_capacity(pool=pool)
    assert (resolved.capacity_bytes, resolved.source) == (3000 * GIB, "manual")
    assert "STORAGE_POOL_CAPACITY_GB" in resolved.note

    StoragePool.objects.filter(pk=pool.pk).update(manual_capacity_gb=2048)
    pool.refresh_from_db()
    resolved = pool_capacity(pool=pool)
    assert (resolved.capacity_bytes, resolved.source) == (2048 * GIB, "manual")
    assert "manual_capacity_gb" in resolved.note

    StorageCapacityReadingFactory(cluster=cluster, storage_class="nfs-a", capacity_bytes=5 * TIB)
    resolved = pool_capacity(pool=pool)
    assert (resolved.capacity_bytes, resolved.source) == (5 * TIB, "csi")
    assert len(resolved.readings) == 1


def test_stale_csi_reading_falls_back_and_says_so(settings):
    settings.GSHARE_STORAGE_READING_MAX_AGE = 600
    cluster = ClusterFactory(name="lab-c1")
    pool = make_pool(cluster=cluster, manual_gb=2048)
    now = timezone.now()
    StorageCapacityReadingFactory(cluster=cluster, capacity_bytes=9 * TIB, read_at=now - timedelta(seconds=601))
    resolved = pool_capacity(pool=pool, now=now)
    assert (resolved.capacity_bytes, resolved.source) == (2048 * GIB, "manual")
    assert resolved.note.startswith("CSI reading from lab-c1 is 601 s old (limit 600 s): using the stated capacity")
    # Just inside the limit it counts.
    assert pool_capacity(pool=pool, now=now - timedelta(seconds=2)).source == "csi"


def test_stale_csi_without_stated_capacity_falls_back_to_the_node_disk(settings):
    settings.STORAGE_POOL_CAPACITY_GB = None
    cluster = ClusterFactory(name="lab-c1")
    pool = make_pool(cluster=cluster, storage_node="nas-1")
    NodeDiskFactory(cluster=cluster, node="nas-1", disk_bytes=400 * GIB)
    StorageCapacityReadingFactory(cluster=cluster, read_at=timezone.now() - timedelta(hours=1))
    resolved = pool_capacity(pool=pool)
    assert (resolved.capacity_bytes, resolved.source) == (400 * GIB, "node_disk")
    assert resolved.note.startswith("CSI reading from lab-c1 is 36") and "s old (limit 600 s)" in resolved.note


def test_largest_of_several_readings_never_their_sum():
    a, b, c = ClusterFactory(), ClusterFactory(), ClusterFactory()
    pool = make_pool(cluster=a, manual_gb=100)
    StorageCapacityReadingFactory(cluster=a, capacity_bytes=2 * TIB, object_count=3)
    StorageCapacityReadingFactory(cluster=b, capacity_bytes=3 * TIB, object_count=2)
    StorageCapacityReadingFactory(cluster=c, capacity_bytes=TIB)
    resolved = pool_capacity(pool=pool)
    # The pool's own cluster (where its server sits) reports: its reading is the one trusted, never a sum.
    assert (resolved.capacity_bytes, resolved.source) == (2 * TIB, "csi") and len(resolved.readings) == 3
    StorageCapacityReading.objects.filter(cluster=a).delete()
    resolved = pool_capacity(pool=pool)
    assert resolved.capacity_bytes == 3 * TIB  # the largest of the sharing clusters' readings, not 4 TiB
    assert resolved.source == "csi" and "never their sum" in resolved.note


def test_readings_of_clusters_that_may_not_use_the_pool_do_not_count():
    own, outsider = ClusterFactory(), ClusterFactory()
    pool = make_pool(cluster=own, sharing="selected", manual_gb=100)
    StorageCapacityReadingFactory(cluster=outsider, capacity_bytes=9 * TIB)  # another server behind the same class name
    StorageCapacityReadingFactory(cluster=own, storage_class="other-class", capacity_bytes=8 * TIB)
    resolved = pool_capacity(pool=pool)
    assert (resolved.capacity_bytes, resolved.source) == (100 * GIB, "manual")


def test_nothing_published_keeps_the_stated_capacity():
    cluster = ClusterFactory(name="lab-c2")
    pool = make_pool(cluster=cluster, manual_gb=1500)
    StorageCapacityReadingFactory(cluster=cluster, capacity_bytes=None, object_count=0)
    resolved = pool_capacity(pool=pool)
    assert (resolved.capacity_bytes, resolved.source) == (1500 * GIB, "manual")
    assert "No CSIStorageCapacity is published for nfs-a" in resolved.note


def test_refresh_stores_capacity_is_idempotent_and_constant_in_queries(django_assert_max_num_queries):
    cluster = ClusterFactory()
    pool = make_pool(cluster=cluster, manual_gb=100)
    assert pool.capacity_source == "manual" and pool.capacity_bytes == 100 * GIB  # stored at creation
    StorageCapacityReadingFactory(cluster=cluster, capacity_bytes=TIB)
    assert tasks.refresh_pool_capacity.delay().get() == 1
    pool.refresh_from_db()
    assert (pool.capacity_bytes, pool.capacity_source) == (TIB, "csi") and pool.capacity_updated_at is not None
    assert services.pools_refresh_capacity() == 0  # a second run changes nothing
    counts = []
    for _ in range(2):
        for _ in range(5):
            make_pool(manual_gb=10, sharing="selected", allowed=[ClusterFactory()], storage_node="n1")
        with CaptureQueriesContext(connection) as queries:
            services.pools_refresh_capacity()
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_beat_schedule_is_created_by_migration():
    task = PeriodicTask.objects.get(task="storage.refresh_pool_capacity")
    assert task.enabled
    assert task.interval.every == 60 and task.interval.period == "seconds"
    assert 0 < task.expire_seconds <= 60


# --------------------------------------------------------------------------- pools


def test_pool_delete_refused_while_volumes_live_on_it():
    pool = make_pool(manual_gb=100)
    volume = VolumeFactory(pool=pool)
    with pytest.raises(services.PoolInUse) as refused:
        services.pool_delete(pool=pool)
    assert refused.value.code == "pool_in_use" and refused.value.status == 409 and volume.public_id in refused.value.detail
    Volume.objects.filter(pk=volume.pk).update(status=Volume.Status.DELETED)
    services.pool_delete(pool=pool)
    assert not StoragePool.objects.exists() and not Volume.objects.exists()


def test_pool_name_taken():
    make_pool(name="nfs-a", manual_gb=1)
    with pytest.raises(services.PoolNameTaken):
        make_pool(name="nfs-a", manual_gb=1)


def test_pool_update_cannot_strand_volumes():
    own, holder = ClusterFactory(), ClusterFactory(name="holder")
    pool = make_pool(cluster=own, manual_gb=100)
    VolumeFactory(pool=pool, cluster=holder)
    with pytest.raises(services.PoolInUse, match="holder"):
        services.pool_update(pool=pool, changes={"sharing": "selected"})
    with pytest.raises(services.PoolInUse):
        services.pool_update(pool=pool, changes={"storage_class": "nfs-b"})
    updated = services.pool_update(pool=pool, changes={"sharing": "selected", "allowed_clusters": [holder], "manual_capacity_gb": 200})
    assert pool_clusters(updated) == {own.pk, holder.pk}
    assert updated.capacity_bytes == 200 * GIB


def test_pool_on_a_deregistered_cluster_is_refused():
    with pytest.raises(Conflict) as refused:
        make_pool(cluster=ClusterFactory(status=Cluster.Status.DEREGISTERED), manual_gb=1)
    assert refused.value.code == "cluster_deregistered"


# --------------------------------------------------------------------------- the capacity gate


def test_two_2tb_pools_do_not_make_room_for_a_4tb_volume(settings):
    settings.GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB = 0  # about the pools, not the per-user total (tests/storage/test_volume_total.py)
    owner = UserFactory()
    first, second = make_pool(manual_gb=2048), make_pool(manual_gb=2048)
    with pytest.raises(services.PoolFull) as refused:
        services.volume_create(owner=owner, name="big", quota_gb=4096)
    assert refused.value.code == "pool_full" and refused.value.status == 409
    assert "does not add up" in refused.value.detail
    assert "No single storage pool has room for a 4096 GiB quota. The one with the most free room is pool " in refused.value.detail
    assert "), which has a capacity of 2048 GiB (source manual" in refused.value.detail
    assert refused.value.extra["capacity_bytes"] == 2048 * GIB
    assert not Volume.objects.exists()
    volume = services.volume_create(owner=owner, name="fits", quota_gb=2048)
    assert volume.pool_id in {first.pk, second.pk}


def test_gate_counts_existing_quotas_and_picks_the_pool_with_most_free_room(settings):
    settings.GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB = 0  # about the pools, not the per-user total (tests/storage/test_volume_total.py)
    owner = UserFactory()
    big, small = make_pool(manual_gb=1000, name="big"), make_pool(manual_gb=600, name="small")
    VolumeFactory(pool=big, quota_gb=700)  # 300 free on big, 600 free on small
    VolumeFactory(pool=small, quota_gb=500, status=Volume.Status.DELETED)  # deleted: not counted
    assert services.volume_create(owner=owner, name="a", quota_gb=400).pool_id == small.pk
    with pytest.raises(services.PoolFull) as refused:
        services.volume_create(owner=owner, name="b", quota_gb=301, pool=big)
    assert "big" in refused.value.detail and "300 GiB" in refused.value.detail
    assert services.volume_create(owner=owner, name="c", quota_gb=300, pool=big).pool_id == big.pk


def test_unknown_capacity_and_no_pool_are_refused(settings):
    settings.STORAGE_POOL_CAPACITY_GB = None
    owner = UserFactory()
    with pytest.raises(services.NoStoragePool):
        services.volume_create(owner=owner, name="a", quota_gb=1)
    pool = make_pool()
    with pytest.raises(services.PoolCapacityUnknown) as refused:
        services.volume_create(owner=owner, name="a", quota_gb=1, pool=pool)
    assert refused.value.code == "pool_capacity_unknown" and "manual_capacity_gb" in refused.value.detail


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_that_fit_alone_but_not_together_exactly_one_wins(monkeypatch, settings):
    settings.GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB = 0  # about the pools, not the per-user total (tests/storage/test_volume_total.py)
    assert connection.vendor == "postgresql"
    pool = make_pool(manual_gb=1000)
    owners = [UserFactory(), UserFactory()]
    real = services._allocated_bytes

    def slow(*args, **kwargs):  # widen the window between reading the allocation and writing the volume
        result = real(*args, **kwargs)
        time.sleep(0.5)
        return result

    monkeypatch.setattr(services, "_allocated_bytes", slow)
    barrier = threading.Barrier(2)
    outcomes = []

    def create(owner):
        try:
            barrier.wait()
            services.volume_create(owner=owner, name="data", quota_gb=600, pool=pool)
            outcomes.append("created")
        except services.PoolFull:
            outcomes.append("pool_full")
        finally:
            connection.close()

    run_threads(create, [(owner,) for owner in owners], timeout=30)
    assert sorted(outcomes) == ["created", "pool_full"]
    assert Volume.objects.filter(pool=pool).count() == 1


# --------------------------------------------------------------------------- volumes


def test_volume_create_sets_the_claim_name_and_names_are_unique_per_owner():
    owner = UserFactory()
    make_pool(manual_gb=100)
    volume = services.volume_create(owner=owner, name="datasets", quota_gb=10)
    assert volume.claim_name == "gshare-" + volume.public_id.replace("_", "-")
    assert volume.status == "available" and volume.cluster is None
    with pytest.raises(services.VolumeNameTaken):
        services.volume_create(owner=owner, name="datasets", quota_gb=10)
    assert services.volume_create(owner=UserFactory(), name="datasets", quota_gb=10)  # another owner may
    services.volume_delete(volume=volume)
    assert services.volume_create(owner=owner, name="datasets", quota_gb=10)  # the name is free again


def test_volume_quota_grows_through_the_gate_and_never_shrinks():
    pool = make_pool(manual_gb=100)
    volume = VolumeFactory(pool=pool, quota_gb=50)
    VolumeFactory(pool=pool, quota_gb=30)
    with pytest.raises(services.VolumeShrinkUnsupported) as refused:
        services.volume_update_quota(volume=volume, quota_gb=49)
    assert refused.value.code == "volume_shrink_unsupported"
    with pytest.raises(services.PoolFull):
        services.volume_update_quota(volume=volume, quota_gb=71)  # 71 + 30 > 100
    assert services.volume_update_quota(volume=volume, quota_gb=70).quota_gb == 70  # its own 50 is not counted twice
    assert services.volume_update_quota(volume=volume, quota_gb=70).quota_gb == 70


def test_volume_in_use_by_a_running_session():
    volume = VolumeFactory()
    session = SessionFactory(volumes=[volume], phase="Running")
    with pytest.raises(services.VolumeInUse) as refused:
        services.volume_delete(volume=volume)
    assert refused.value.code == "volume_in_use" and session.public_id in refused.value.detail
    session.phase = "Terminated"
    session.save()
    assert services.volume_delete(volume=volume).status == "deleted"


def test_volume_delete_deletes_its_pvc_through_the_clusters_apiserver(fleet_cluster, settings):
    emulated = fleet_cluster("lab-c1")
    cluster = ClusterFactory(apiserver_url=emulated.url, kubeconfig=kubeconfig_text(emulated))
    volume = VolumeFactory(cluster=cluster, status=Volume.Status.BOUND)
    api = kubernetes.config.new_client_from_config_dict(emulated.kubeconfig("lab"))
    core = kubernetes.client.CoreV1Api(api)
    namespace = settings.GSHARE_SESSION_NAMESPACE
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": volume.claim_name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "nfs-a"},
    })
    deleted = services.volume_delete(volume=volume)
    assert deleted.status == "deleted" and deleted.deleted_at is not None
    names = [pvc.metadata.name for pvc in core.list_namespaced_persistent_volume_claim(namespace).items]
    assert volume.claim_name not in names
    # A PVC already gone (404) is fine.
    other = VolumeFactory(cluster=cluster, status=Volume.Status.BOUND)
    assert services.volume_delete(volume=other).status == "deleted"
    api.close()


def test_volume_delete_with_an_unreachable_cluster_changes_nothing(silent_listener, settings):
    import yaml

    settings.GSHARE_PROBE_TIMEOUT = 0.5
    cluster = ClusterFactory(apiserver_url=f"http://{silent_listener}", kubeconfig=yaml.safe_dump(silent_kubeconfig(silent_listener)))
    volume = VolumeFactory(cluster=cluster, status=Volume.Status.BOUND)
    with pytest.raises(ClusterUnreachable) as refused:
        services.volume_delete(volume=volume)
    assert refused.value.status == 504 and volume.claim_name in refused.value.detail
    volume.refresh_from_db()
    assert volume.status == "bound" and volume.deleted_at is None


def test_volume_on_a_deregistered_cluster_is_only_marked():
    volume = VolumeFactory(cluster=ClusterFactory(status=Cluster.Status.DEREGISTERED), status=Volume.Status.BOUND)
    assert services.volume_delete(volume=volume).status == "deleted"


def test_moving_volume_cannot_be_deleted_or_grown():
    volume = VolumeFactory(status=Volume.Status.MOVING, cluster=ClusterFactory())
    with pytest.raises(services.VolumeMoving):
        services.volume_delete(volume=volume)
    with pytest.raises(services.VolumeMoving):
        services.volume_update_quota(volume=volume, quota_gb=20)


def test_a_pool_whose_cluster_was_deregistered_can_still_be_changed():
    cluster = ClusterFactory()
    pool = make_pool(cluster=cluster, manual_gb=10)
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.DEREGISTERED)
    assert services.pool_update(pool=pool, changes={"manual_capacity_gb": 20}).capacity_bytes == 20 * GIB
    with pytest.raises(Conflict):
        services.pool_update(pool=pool, changes={"sharing": "selected", "allowed_clusters": [ClusterFactory(status=Cluster.Status.DEREGISTERED)]})
