"""Sessions that mount volumes, through HTTP against emulated clusters: stickiness, first placement, pool
sharing, only where the pool's StorageClass exists, ownership, the GShareSession's ``spec.volumes``, a race for a
new volume, and the query count."""

import threading
import time

import kubernetes
import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_mint
from core.exceptions import Conflict
from demo import fleet
from operator_agent.reporters.storage import collect_storage
from sessions import create, placement
from sessions.models import Session
from storage.models import ClusterStorageClasses, StoragePool, Volume
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory
from tests.helpers import Http, kubeconfig_text, lock_waiters

pytestmark = pytest.mark.django_db

GSS = ("gsharesessions", "gshare.io", "v1alpha1")


def start(http, **body):
    return http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, **body})


def make_pool(cluster, *, name="tank", sharing=StoragePool.Sharing.ALL, allowed=(), storage_class="gshare-nfs"):
    pool = StoragePool.objects.create(name=name, cluster=cluster, storage_class=storage_class, sharing=sharing)
    pool.allowed_clusters.set(allowed)
    return pool


def make_volume(owner, pool, *, name="datasets", quota_gb=50, cluster=None, **fields):
    fields.setdefault("claim_name", f"claim-{name}" if cluster is not None else "")
    fields.setdefault("status", Volume.Status.BOUND if cluster is not None else Volume.Status.AVAILABLE)
    return Volume.objects.create(owner=owner, pool=pool, name=name, quota_gb=quota_gb, cluster=cluster, **fields)


@pytest.fixture
def two(live_cluster):
    """lab-c1 and lab-c2, registered with their inventory (binpack's tie-break prefers lab-c1), and their emulators."""
    (c1, e1), (c2, e2) = live_cluster("lab-c1"), live_cluster("lab-c2")
    return c1, c2, {"lab-c1": e1, "lab-c2": e2}


def test_a_volume_keeps_unpinned_sessions_on_its_cluster(http_user, plain_user, two):
    c1, c2, _ = two
    vol = make_volume(plain_user, make_pool(c1), cluster=c2)
    assert start(http_user).json()["cluster"] == c1.public_id  # without the volume: lab-c1 (tie-break)
    body = start(http_user, volumes=[vol.public_id]).json()
    assert body["cluster"] == c2.public_id and body["volumes"] == [vol.public_id]
    assert set(Session.objects.get(public_id=body["id"]).volumes.all()) == {vol}
    # Its cluster unreachable: the session is not sent elsewhere; the refusal says where it looked and how to get out.
    Cluster.objects.filter(pk=c2.pk).update(status=Cluster.Status.UNREACHABLE)
    refused = start(http_user, volumes=[vol.public_id])
    assert refused.status_code == 409 and refused.json()["code"] == "no_capacity"
    assert "cluster lab-c2 (volume datasets is there)" in refused.json()["detail"]
    assert f"/api/v1/storage/volumes/{vol.public_id}/move" in refused.json()["detail"]


def test_a_session_pinned_elsewhere_is_refused_naming_the_volumes_cluster(http_user, plain_user, two):
    c1, c2, _ = two
    vol = make_volume(plain_user, make_pool(c1), cluster=c2)
    before = Session.objects.count()
    response = start(http_user, volumes=[vol.public_id], cluster="lab-c1")
    assert response.status_code == 409, response.text
    body = response.json()
    assert body["code"] == "volume_on_another_cluster"
    assert "lab-c2" in body["detail"] and c2.public_id in body["detail"]
    assert f"/api/v1/storage/volumes/{vol.public_id}/move" in body["detail"] and "pin" in body["detail"]
    assert Session.objects.count() == before
    assert start(http_user, volumes=[vol.public_id], cluster=c2.public_id).status_code == 201


def test_first_placement_gives_the_volume_its_cluster_and_the_manifest_mounts_it(http_user, plain_user, two):
    c1, c2, emulated = two
    vol = make_volume(plain_user, make_pool(c1, storage_class="tank-nfs"), name="datasets", quota_gb=50)
    scratch = make_volume(plain_user, make_pool(c2, name="scratch-pool", storage_class="scratch-nfs"), name="scratch", quota_gb=5)
    response = start(http_user, volumes=[vol.public_id, scratch.public_id], cluster="lab-c2")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["cluster"] == c2.public_id and body["volumes"] == [vol.public_id, scratch.public_id]  # by name
    vol.refresh_from_db()
    scratch.refresh_from_db()
    assert vol.cluster_id == scratch.cluster_id == c2.pk
    assert vol.claim_name == "gshare-" + vol.public_id.replace("_", "-")
    # The GShareSession applied to lab-c2, read back from its apiserver.
    (gss,) = [o for o in emulated["lab-c2"].objects_of(*GSS) if o["spec"]["sessionId"] == body["id"]]
    assert gss["spec"]["volumes"] == [
        {"volumeId": vol.public_id, "name": "datasets", "claimName": vol.claim_name, "storageClassName": "tank-nfs",
         "size": "50Gi", "mountPath": "/data/datasets"},
        {"volumeId": scratch.public_id, "name": "scratch", "claimName": scratch.claim_name, "storageClassName": "scratch-nfs",
         "size": "5Gi", "mountPath": "/data/scratch"},
    ]
    assert emulated["lab-c1"].objects_of(*GSS) == []
    # From now on the volume keeps its sessions on lab-c2; a session without volumes has no spec.volumes.
    assert start(http_user, volumes=[vol.public_id]).json()["cluster"] == c2.public_id
    plain = start(http_user, cluster="lab-c2").json()
    (gss,) = [o for o in emulated["lab-c2"].objects_of(*GSS) if o["spec"]["sessionId"] == plain["id"]]
    assert "volumes" not in gss["spec"] and plain["volumes"] == []


def test_volumes_held_by_different_clusters_cannot_be_mounted_together(http_user, plain_user, two):
    c1, c2, _ = two
    pool = make_pool(c1)
    a = make_volume(plain_user, pool, name="a", cluster=c1)
    b = make_volume(plain_user, pool, name="b", cluster=c2)
    response = start(http_user, volumes=[a.public_id, b.public_id])
    assert response.status_code == 409
    assert response.json()["code"] == "volumes_on_different_clusters"
    assert "lab-c1" in response.json()["detail"] and "lab-c2" in response.json()["detail"]
    assert Session.objects.count() == 0


def test_a_pool_is_used_only_by_the_clusters_it_is_shared_with(http_user, plain_user, two):
    c1, c2, _ = two
    private = make_pool(c2, name="private", sharing=StoragePool.Sharing.SELECTED)
    vol = make_volume(plain_user, private)
    response = start(http_user, volumes=[vol.public_id], cluster="lab-c1")
    assert response.status_code == 409 and response.json()["code"] == "volume_pool_not_shared"
    assert "private" in response.json()["detail"] and private.public_id in response.json()["detail"]
    assert "lab-c2" in response.json()["detail"]  # who may use it
    # Unpinned, the candidates are narrowed to the pool's clusters: lab-c2, although the tie-break prefers lab-c1.
    assert start(http_user, volumes=[vol.public_id]).json()["cluster"] == c2.public_id
    # Shared with lab-c1 as well (selected): both may use it; the volume now sticks to lab-c2.
    other = make_volume(plain_user, make_pool(c2, name="shared", sharing=StoragePool.Sharing.SELECTED, allowed=[c1]), name="o")
    assert start(http_user, volumes=[other.public_id], cluster="lab-c1").json()["cluster"] == c1.public_id
    # A new volume of a pool lab-c1 may not use, with a volume held by lab-c1: refused, naming the pool.
    fresh = make_volume(plain_user, private, name="fresh")
    held_on_c1 = make_volume(plain_user, make_pool(c1, name="c1-only", sharing=StoragePool.Sharing.SELECTED), name="h", cluster=c1)
    response = start(http_user, volumes=[fresh.public_id, held_on_c1.public_id])
    assert response.status_code == 409 and response.json()["code"] == "volume_pool_not_shared"
    assert "private" in response.json()["detail"] and "lab-c1" in response.json()["detail"]


def register(fleet_cluster, name, *, like, objects=None):
    """An emulated cluster of the demo fleet (``like``), registered as ``name`` with that cluster's inventory."""
    emulated = fleet_cluster(like, objects=objects)
    cluster = cluster_services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated), session_domain=f"{name}.gshare.localhost")
    cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory(like)["snapshot"]["nodes"])
    cluster.refresh_from_db()
    return cluster, emulated


def volume_sync(live_server, cluster, emulated):
    """What the cluster's operator reports: its storage read with the operator's code, posted with its token."""
    with kubernetes.config.new_client_from_config_dict(emulated.kubeconfig("lab")) as api:
        report = collect_storage(api, namespace="gshare-sessions", own_class=fleet.STORAGE_CLASS)
    answer = Http(live_server.url, operator_token_mint(cluster_id=cluster.public_id)).post("/internal/v1/storage", json=report)
    assert answer.status_code == 200, answer.text


@pytest.mark.django_db(transaction=True)
def test_sessions_mount_volumes_only_where_the_pools_storage_class_exists(http_user, plain_user, fleet_cluster, live_server):
    """Reproduced: a cluster attached without storage joined the `sharing: all` pool, a session mounting a new volume
    of it was placed there and waited in Starting forever (unbound immediate PersistentVolumeClaims)."""
    c1, e1 = register(fleet_cluster, "lab-c1", like="lab-c1")
    c3, e3 = register(fleet_cluster, "lab-c3", like="lab-c2", objects=[o for o in fleet.cluster_objects("lab-c2") if o["kind"] != "StorageClass"])
    for cluster, emulated in ((c1, e1), (c3, e3)):
        volume_sync(live_server, cluster, emulated)
    assert ClusterStorageClasses.objects.get(cluster=c3).names == []
    pool = make_pool(c1, storage_class=fleet.STORAGE_CLASS)
    vol = make_volume(plain_user, pool)
    # lab-c3 is the busier cluster, so binpack puts a session without volumes there...
    assert start(http_user, cluster="lab-c3", gpu_memory_mib=1000, gpu_cores=10).status_code == 201
    assert start(http_user, gpu_memory_mib=1000, gpu_cores=10).json()["cluster"] == c3.public_id
    # ...and one mounting the new volume where its pool's StorageClass exists.
    placed = start(http_user, gpu_memory_mib=1000, gpu_cores=10, volumes=[vol.public_id])
    assert placed.status_code == 201 and placed.json()["cluster"] == c1.public_id, placed.text
    before = Session.objects.count()

    fresh = make_volume(plain_user, pool, name="fresh")
    refused = start(http_user, volumes=[fresh.public_id], cluster="lab-c3")
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["code"] == "volume_not_mountable" and body["clusters"] == [c3.public_id]
    assert f"Volume fresh ({fresh.public_id}) is on storage pool tank ({pool.public_id})" in body["detail"]
    assert f'storageclass "{fleet.STORAGE_CLASS}" not found on lab-c3' in body["detail"]
    assert "start the session on lab-c1" in body["detail"] and f"create StorageClass {fleet.STORAGE_CLASS} on lab-c3" in body["detail"]
    # A volume whose PVC lab-c3 holds but cannot provision (left by the bug): refused, with the way out.
    stuck = make_volume(plain_user, pool, name="stuck", cluster=c3, status=Volume.Status.PENDING)
    refused = start(http_user, volumes=[stuck.public_id])
    assert refused.status_code == 409 and refused.json()["code"] == "volume_not_mountable", refused.text
    assert f"DELETE /api/v1/storage/volumes/{stuck.public_id}" in refused.json()["detail"]
    assert Session.objects.count() == before
    fresh.refresh_from_db()
    assert fresh.cluster_id is None
    # A bound volume on lab-c3 has its PersistentVolume already: its sessions still go there.
    bound = make_volume(plain_user, pool, name="bound", cluster=c3)
    assert start(http_user, gpu_memory_mib=1000, gpu_cores=10, volumes=[bound.public_id]).json()["cluster"] == c3.public_id


def test_volumes_of_others_deleted_or_unknown_are_not_found(http, http_user, plain_user, staff_user, two):
    c1, _, _ = two
    pool = make_pool(c1)
    theirs = make_volume(staff_user, pool, name="theirs")
    gone = make_volume(plain_user, pool, name="gone", status=Volume.Status.DELETED)
    for ids in ([theirs.public_id], [gone.public_id], ["vol_doesnotexist000"]):
        response = start(http_user, volumes=ids)
        assert response.status_code == 404, response.text
        assert response.json()["code"] == "volume_not_found"
        assert ids[0] in response.json()["detail"]
    # No existence leak: another user's volume answers exactly like an unknown id (staff included: volumes are per owner).
    mine = make_volume(plain_user, pool, name="mine")
    assert start(http, volumes=[mine.public_id]).json()["code"] == "volume_not_found"
    assert Session.objects.count() == 0


def test_a_moving_volume_and_malformed_lists_are_refused(http_user, plain_user, two):
    c1, _, _ = two
    pool = make_pool(c1)
    moving = make_volume(plain_user, pool, name="moving", cluster=c1)
    Volume.objects.filter(pk=moving.pk).update(status=Volume.Status.MOVING)
    response = start(http_user, volumes=[moving.public_id])
    assert response.status_code == 409 and response.json()["code"] == "volume_moving"
    vol = make_volume(plain_user, pool)
    twice = start(http_user, volumes=[vol.public_id, vol.public_id])
    assert twice.status_code == 400 and "twice" in twice.json()["detail"]
    many = [make_volume(plain_user, pool, name=f"v{i}").public_id for i in range(9)]
    too_many = start(http_user, volumes=many)
    assert too_many.status_code == 400 and "at most 8" in too_many.json()["detail"]
    assert start(http_user, volumes=many[:8]).status_code == 201
    assert Volume.objects.get(pk=moving.pk).status == Volume.Status.MOVING


@pytest.mark.django_db(transaction=True)
def test_two_sessions_racing_for_a_new_volume_on_different_clusters(http_user, plain_user, two):
    """Both requests pass the first check (the volume has no cluster yet) and wait on its row lock, which this
    test holds; once released, the first to lock it claims it and the other sees the claim and is refused."""
    c1, c2, _ = two
    vol = make_volume(plain_user, make_pool(c1))
    results: dict[str, object] = {}

    def attempt(cluster_name):
        try:
            response = start(http_user, volumes=[vol.public_id], cluster=cluster_name)
            results[cluster_name] = (response.status_code, response.json())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(name,)) for name in ("lab-c1", "lab-c2")]
    with transaction.atomic():
        Volume.objects.select_for_update().get(pk=vol.pk)
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                if lock_waiters(cursor) >= 2:
                    break
            time.sleep(0.05)
        else:
            pytest.fail("the two requests never waited on the volume's row lock")
    for thread in threads:
        thread.join(30)
    codes = sorted(status for status, _ in results.values())
    assert codes == [201, 409], results
    (winner,) = [name for name, (status, _) in results.items() if status == 201]
    (loser_body,) = [body for status, body in results.values() if status == 409]
    assert loser_body["code"] == "volume_on_another_cluster" and winner in loser_body["detail"]
    assert "just mounted" in loser_body["detail"]  # decided under the row lock, not by the first check
    vol.refresh_from_db()
    assert vol.cluster.name == winner
    assert Session.objects.count() == 1 and Session.objects.get().cluster.name == winner


def factory_cluster(name):
    cluster = ClusterFactory(name=name)
    for _ in range(2):
        node = NodeFactory(cluster=cluster)
        for i in range(2):
            GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=16000)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster


@pytest.mark.django_db
def test_the_query_count_does_not_grow_with_the_number_of_volumes(django_user_model):
    owner = django_user_model.objects.create_user("alice")
    c1, c2 = factory_cluster("alpha"), factory_cluster("beta")
    pools = [make_pool(c1, name="p1"), make_pool(c1, name="p2", sharing=StoragePool.Sharing.SELECTED, allowed=[c2])]
    one = [make_volume(owner, pools[0], name="one")]
    eight = [make_volume(owner, pools[i % 2], name=f"v{i}", cluster=c2 if i == 3 else None) for i in range(8)]
    counts = []
    for volumes in ([], one, eight):
        with CaptureQueriesContext(connection) as queries:
            session = create.session_create(owner=owner, image="img", gpus=1, gpu_memory_mib=100, gpu_cores=10,
                                              volumes=[v.public_id for v in volumes])
        counts.append(len(queries))
        assert session.volumes.count() == len(volumes)
    assert counts[1] == counts[2], counts
    # The volumes and their pools' clusters (2), where those pools are usable (1), their row locks, the claim of the new
    # ones, the session's links.
    assert counts[1] <= counts[0] + 5, counts
    assert Session.objects.get(volumes=eight[0]).cluster == c2  # held by v3 on beta
    assert set(Volume.objects.filter(pk__in=[v.pk for v in eight]).values_list("cluster", flat=True)) == {c2.pk}


@pytest.mark.django_db
def test_a_claim_made_after_the_first_check_is_seen_under_the_lock(django_user_model, monkeypatch):
    """The service itself, with the race made deterministic: between the first check and the locks, another
    session claims the volume for beta; a request pinned to alpha is then refused, one not pinned goes to beta."""
    owner = django_user_model.objects.create_user("alice")
    alpha, beta = factory_cluster("alpha"), factory_cluster("beta")
    vol = make_volume(owner, make_pool(alpha))
    real = placement.volume_clusters

    def claim_meanwhile(**kwargs):
        allowed = real(**kwargs)
        Volume.objects.filter(pk=vol.pk).update(cluster=beta, claim_name="claimed")
        return allowed

    monkeypatch.setattr(placement, "volume_clusters", claim_meanwhile)
    with pytest.raises(Conflict) as info:
        create.session_create(owner=owner, image="img", gpus=1, cluster="alpha", volumes=[vol.public_id])
    assert info.value.code == "volume_on_another_cluster" and "beta" in info.value.detail
    Volume.objects.filter(pk=vol.pk).update(cluster=None, claim_name="")
    session = create.session_create(owner=owner, image="img", gpus=1, volumes=[vol.public_id])
    assert session.cluster == beta
    vol.refresh_from_db()
    assert (vol.cluster, vol.claim_name) == (beta, "claimed")
