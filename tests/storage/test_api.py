"""The storage API through HTTP (live server): pools, summary, volumes, the capacity gate and every refusal."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.operator_token.tokens import operator_token_mint
from storage.models import GIB, StorageCapacityReading, StoragePool, Volume
from tests.factories import ClusterFactory, SessionFactory, StoragePoolFactory, UserFactory, VolumeFactory
from tests.storage.kube import pool_cluster, reachable

pytestmark = pytest.mark.django_db
TIB = 1024 * GIB


def create_pool(http, cluster, name="nfs-a", **extra):
    reachable(cluster)  # registration reads the StorageClass on the pool's cluster
    body = {"name": name, "cluster": cluster.public_id, "storage_class": "nfs-a", **extra}
    response = http.post("/api/v1/storage/pools", json=body)
    assert response.status_code == 201, response.text
    return response.json()


# --------------------------------------------------------------------------- pools


def test_pool_create_list_show_change_delete(http, http_user):
    home, other = ClusterFactory(name="lab-c1"), ClusterFactory(name="lab-c2")
    pool = create_pool(http, home, sharing="selected", allowed_clusters=["lab-c2"], manual_capacity_gb=2048, storage_node="nas-1")
    assert pool["id"].startswith("pool_") and pool["cluster"] == home.public_id
    assert pool["allowed_clusters"] == [other.public_id]
    assert pool["capacity"]["bytes"] == 2048 * GIB and pool["capacity"]["source"] == "manual"
    assert "stated capacity" in pool["capacity"]["note"] and pool["capacity"]["updated_at"]
    assert pool["allocated_bytes"] == 0 and pool["volumes"] == 0

    listed = http_user.get("/api/v1/storage/pools").json()  # every authenticated user may read
    assert listed["count"] == 1 and listed["results"][0]["id"] == pool["id"]
    assert http_user.get(f"/api/v1/storage/pools/{pool['id']}").json()["name"] == "nfs-a"
    assert http.get("/api/v1/storage/pools?cluster=lab-c2").json()["count"] == 1
    assert http.get(f"/api/v1/storage/pools?cluster={ClusterFactory().public_id}").json()["count"] == 0

    changed = http.patch(f"/api/v1/storage/pools/{pool['id']}", json={"manual_capacity_gb": 4096, "sharing": "all"}).json()
    assert changed["capacity"]["bytes"] == 4096 * GIB and changed["sharing"] == "all" and changed["allowed_clusters"] == []

    assert http.delete(f"/api/v1/storage/pools/{pool['id']}").status_code == 204
    assert http.get(f"/api/v1/storage/pools/{pool['id']}").json()["code"] == "pool_not_found"


def test_pool_writes_are_staff_only(http_user):
    cluster = ClusterFactory()
    response = http_user.post("/api/v1/storage/pools", json={"name": "x", "cluster": cluster.public_id, "storage_class": "nfs-a"})
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    pool = StoragePoolFactory(cluster=cluster)
    assert http_user.patch(f"/api/v1/storage/pools/{pool.public_id}", json={"manual_capacity_gb": 1}).status_code == 403
    assert http_user.delete(f"/api/v1/storage/pools/{pool.public_id}").status_code == 403
    assert StoragePool.objects.get().manual_capacity_gb == 1024


def test_pool_refusals(http):
    cluster = ClusterFactory()
    create_pool(http, cluster)
    taken = http.post("/api/v1/storage/pools", json={"name": "nfs-a", "cluster": cluster.public_id, "storage_class": "nfs-a"})
    assert taken.status_code == 409 and taken.json()["code"] == "pool_name_taken"
    unknown = http.post("/api/v1/storage/pools", json={"name": "b", "cluster": "clu_nope", "storage_class": "nfs-a"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "cluster_not_found"
    mixed = http.post("/api/v1/storage/pools", json={
        "name": "c", "cluster": cluster.public_id, "storage_class": "nfs-a", "allowed_clusters": [ClusterFactory().public_id],
    })
    assert mixed.status_code == 400 and mixed.json()["code"] == "invalid_request" and "selected" in mixed.json()["detail"]
    bad = http.post("/api/v1/storage/pools", json={"name": "d", "cluster": cluster.public_id, "storage_class": "NFS_A", "manual_capacity_gb": 0})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"
    pool = StoragePool.objects.get(name="nfs-a")
    readonly = http.patch(f"/api/v1/storage/pools/{pool.public_id}", json={"capacity_bytes": 1})
    assert readonly.status_code == 400 and readonly.json()["code"] == "invalid_request"


def test_pool_in_use_refuses_deletion(http):
    pool = create_pool(http, ClusterFactory(), manual_capacity_gb=100)
    volume = VolumeFactory(pool=StoragePool.objects.get(public_id=pool["id"]), quota_gb=30)
    shown = http.get(f"/api/v1/storage/pools/{pool['id']}").json()
    assert shown["allocated_bytes"] == 30 * GIB and shown["volumes"] == 1
    response = http.delete(f"/api/v1/storage/pools/{pool['id']}")
    assert response.status_code == 409 and response.json()["code"] == "pool_in_use" and volume.public_id in response.json()["detail"]
    assert StoragePool.objects.filter(public_id=pool["id"]).exists()


# --------------------------------------------------------------------------- capacity sources through HTTP


def test_source_precedence_and_stale_fallback_through_http(http, http_for, settings):
    settings.STORAGE_POOL_CAPACITY_GB = None
    c1 = ClusterFactory(name="lab-c1")
    operator = http_for(operator_token_mint(cluster_id=c1.public_id))
    pool = create_pool(http, c1, storage_node="nas-1")
    summary = http.get("/api/v1/storage/summary").json()
    assert summary["pools"][0]["source"] == "none" and summary["capacity_bytes"] is None

    now = timezone.now()
    operator.post("/internal/v1/storage", json={"read_at": now.isoformat(), "nodes": [{"name": "nas-1", "disk_bytes": 500 * GIB}]})
    assert http.get("/api/v1/storage/summary").json()["source"] == "node_disk"

    http.patch(f"/api/v1/storage/pools/{pool['id']}", json={"manual_capacity_gb": 2048})
    assert http.get("/api/v1/storage/summary").json()["source"] == "manual"

    operator.post("/internal/v1/storage", json={
        "read_at": (now + timedelta(seconds=1)).isoformat(), "storage_classes": [{"storage_class": "nfs-a", "capacity_bytes": 5 * TIB, "objects": 2}],
    })
    summary = http.get("/api/v1/storage/summary").json()
    assert (summary["capacity_bytes"], summary["source"]) == (5 * TIB, "csi")

    StorageCapacityReading.objects.update(read_at=timezone.now() - timedelta(seconds=700))
    summary = http.get("/api/v1/storage/summary").json()
    assert (summary["capacity_bytes"], summary["source"]) == (2048 * GIB, "manual")
    assert summary["pools"][0]["note"].startswith("CSI reading from lab-c1 is 70")
    assert "(limit 600 s): using the stated capacity" in summary["pools"][0]["note"]


def test_summary_fleet_wide_and_per_cluster(http_user):
    c1, c2, c3 = ClusterFactory(name="lab-c1"), ClusterFactory(name="lab-c2"), ClusterFactory(name="lab-c3")
    from storage import services

    shared = services.pool_create(name="shared", cluster=reachable(c1), storage_class="nfs-a", manual_capacity_gb=2048)
    own = services.pool_create(name="own", cluster=reachable(c2), storage_class="nfs-b", sharing="selected", manual_capacity_gb=4096)
    VolumeFactory(pool=own, quota_gb=1000)
    fleet = http_user.get("/api/v1/storage/summary").json()
    assert fleet["cluster"] is None
    assert fleet["capacity_bytes"] == 4096 * GIB and fleet["pool"] == own.public_id  # the largest pool, never 6 TiB
    assert fleet["allocated_bytes"] == 1000 * GIB and fleet["largest_free_bytes"] == 3096 * GIB
    assert {p["id"] for p in fleet["pools"]} == {shared.public_id, own.public_id}
    flags = {p["name"]: p["shared_across_clusters"] for p in fleet["pools"]}
    assert flags == {"shared": True, "own": False} and fleet["shared_across_clusters"] is True

    on_c2 = http_user.get("/api/v1/storage/summary?cluster=lab-c2").json()
    assert {p["name"]: p["shared_across_clusters"] for p in on_c2["pools"]} == {"shared": True, "own": False}
    on_c3 = http_user.get(f"/api/v1/storage/summary?cluster={c3.public_id}").json()
    assert [p["name"] for p in on_c3["pools"]] == ["shared"]
    assert on_c3["capacity_bytes"] == 2048 * GIB and on_c3["shared_across_clusters"] is True
    on_c1 = http_user.get("/api/v1/storage/summary?cluster=lab-c1").json()
    assert [p["name"] for p in on_c1["pools"]] == ["shared"] and on_c1["shared_across_clusters"] is False
    missing = http_user.get("/api/v1/storage/summary?cluster=nope")
    assert missing.status_code == 404 and missing.json()["code"] == "cluster_not_found"


# --------------------------------------------------------------------------- volumes


def test_volume_create_list_show(http_user, plain_user):
    from storage import services

    pool = services.pool_create(name="p", cluster=pool_cluster(), storage_class="nfs-a", manual_capacity_gb=100)
    response = http_user.post("/api/v1/storage/volumes", json={"name": "datasets", "quota_gb": 10})
    assert response.status_code == 201, response.text
    volume = response.json()
    assert volume["id"].startswith("vol_") and volume["pool"] == pool.public_id and volume["cluster"] is None
    assert volume["claim_name"] == "gshare-" + volume["id"].replace("_", "-")
    assert volume["status"] == "available" and volume["quota_gb"] == 10 and volume["owner"] == plain_user.username
    assert set(volume) >= {"id", "name", "quota_gb", "pool", "cluster", "claim_name", "status", "status_message", "created_at"}
    assert http_user.get(f"/api/v1/storage/volumes/{volume['id']}").json()["name"] == "datasets"
    named = http_user.post("/api/v1/storage/volumes", json={"name": "other", "quota_gb": 1, "pool": pool.public_id})
    assert named.status_code == 201 and named.json()["pool"] == pool.public_id
    assert http_user.get("/api/v1/storage/volumes").json()["count"] == 2


def test_volume_refusals(http_user):
    from storage import services

    services.pool_create(name="p", cluster=pool_cluster(), storage_class="nfs-a", manual_capacity_gb=100)
    http_user.post("/api/v1/storage/volumes", json={"name": "datasets", "quota_gb": 10})
    taken = http_user.post("/api/v1/storage/volumes", json={"name": "datasets", "quota_gb": 10})
    assert taken.status_code == 409 and taken.json()["code"] == "volume_name_taken"
    bad_name = http_user.post("/api/v1/storage/volumes", json={"name": "Data_Sets", "quota_gb": 10})
    assert bad_name.status_code == 400 and bad_name.json()["code"] == "invalid_request" and "DNS label" in bad_name.json()["detail"]
    zero = http_user.post("/api/v1/storage/volumes", json={"name": "zero", "quota_gb": 0})
    assert zero.status_code == 400 and zero.json()["code"] == "invalid_request"
    no_pool = http_user.post("/api/v1/storage/volumes", json={"name": "x", "quota_gb": 1, "pool": "pool_nope"})
    assert no_pool.status_code == 404 and no_pool.json()["code"] == "pool_not_found"


def test_two_2tb_pools_refuse_a_4tb_volume_through_http(http, http_user, settings):
    settings.GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB = 0  # about the pools, not the per-user total (tests/storage/test_volume_total.py)
    for name, cluster in (("nas-a", ClusterFactory()), ("nas-b", ClusterFactory())):
        create_pool(http, cluster, name=name, manual_capacity_gb=2048)
    response = http_user.post("/api/v1/storage/volumes", json={"name": "huge", "quota_gb": 4096})
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "pool_full" and body["capacity_bytes"] == 2048 * GIB and body["requested_bytes"] == 4096 * GIB
    assert "does not add up" in body["detail"] and "2048 GiB" in body["detail"]
    fits = http_user.post("/api/v1/storage/volumes", json={"name": "large", "quota_gb": 2048})
    assert fits.status_code == 201, fits.text
    second = http_user.post("/api/v1/storage/volumes", json={"name": "large-2", "quota_gb": 2048})
    assert second.status_code == 201 and second.json()["pool"] != fits.json()["pool"]
    full = http_user.post("/api/v1/storage/volumes", json={"name": "one-more", "quota_gb": 1})
    assert full.status_code == 409 and full.json()["code"] == "pool_full"


def test_pool_capacity_unknown_and_no_pool(http, http_user, settings):
    settings.STORAGE_POOL_CAPACITY_GB = None
    none = http_user.post("/api/v1/storage/volumes", json={"name": "a", "quota_gb": 1})
    assert none.status_code == 409 and none.json()["code"] == "no_storage_pool"
    pool = create_pool(http, ClusterFactory())
    unknown = http_user.post("/api/v1/storage/volumes", json={"name": "a", "quota_gb": 1, "pool": pool["id"]})
    assert unknown.status_code == 409 and unknown.json()["code"] == "pool_capacity_unknown"
    assert "manual_capacity_gb" in unknown.json()["detail"]
    settings.STORAGE_POOL_CAPACITY_GB = 10  # the fleet default applies to a pool without a stated capacity
    assert http_user.post("/api/v1/storage/volumes", json={"name": "a", "quota_gb": 10, "pool": pool["id"]}).status_code == 201


def test_quota_grows_through_the_gate_and_never_shrinks(http_user):
    from storage import services

    services.pool_create(name="p", cluster=pool_cluster(), storage_class="nfs-a", manual_capacity_gb=100)
    volume = http_user.post("/api/v1/storage/volumes", json={"name": "v", "quota_gb": 50}).json()
    path = f"/api/v1/storage/volumes/{volume['id']}"
    shrink = http_user.patch(path, json={"quota_gb": 10})
    assert shrink.status_code == 409 and shrink.json()["code"] == "volume_shrink_unsupported"
    too_big = http_user.patch(path, json={"quota_gb": 101})
    assert too_big.status_code == 409 and too_big.json()["code"] == "pool_full"
    assert http_user.patch(path, json={"quota_gb": 100}).json()["quota_gb"] == 100
    other = http_user.patch(path, json={"name": "renamed"})
    assert other.status_code == 400 and other.json()["code"] == "invalid_request"


def test_users_see_their_own_volumes_staff_see_all(http, http_user, plain_user):
    c1 = ClusterFactory(name="lab-c1")
    mine = VolumeFactory(owner=plain_user, cluster=c1)
    unplaced = VolumeFactory(owner=plain_user)
    theirs = VolumeFactory(owner=UserFactory(username="bob"))
    VolumeFactory(owner=plain_user, status=Volume.Status.DELETED)
    assert {v["id"] for v in http_user.get("/api/v1/storage/volumes").json()["results"]} == {mine.public_id, unplaced.public_id}
    assert http_user.get(f"/api/v1/storage/volumes/{theirs.public_id}").json()["code"] == "volume_not_found"
    assert [v["id"] for v in http_user.get("/api/v1/storage/volumes?cluster=lab-c1").json()["results"]] == [mine.public_id]
    assert http.get("/api/v1/storage/volumes").json()["count"] == 3
    assert [v["id"] for v in http.get("/api/v1/storage/volumes?owner=bob").json()["results"]] == [theirs.public_id]
    assert http_user.get("/api/v1/storage/volumes?owner=bob").json()["count"] == 2  # ?owner= is for staff only
    assert http.get(f"/api/v1/storage/volumes?cluster={c1.public_id}").json()["count"] == 1


def test_volume_delete_refused_while_a_live_session_mounts_it(http_user, plain_user):
    volume = VolumeFactory(owner=plain_user)
    session = SessionFactory(owner=plain_user, volumes=[volume], phase="Running")
    response = http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}")
    assert response.status_code == 409 and response.json()["code"] == "volume_in_use"
    assert session.public_id in response.json()["detail"] and response.json()["sessions"] == [session.public_id]
    session.phase = "Failed"
    session.save()
    deleted = http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}")
    assert deleted.status_code == 200 and deleted.json()["status"] == "deleted"
    assert http_user.get(f"/api/v1/storage/volumes/{volume.public_id}").status_code == 404


def test_volume_of_another_user_cannot_be_deleted(http_user):
    volume = VolumeFactory()
    response = http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}")
    assert response.status_code == 404 and response.json()["code"] == "volume_not_found"
    volume.refresh_from_db()
    assert volume.status == "available"


def test_move_is_refused_while_disabled(http_user, plain_user, settings):
    settings.GSHARE_VOLUME_MOVE_ENABLED = False
    volume = VolumeFactory(owner=plain_user, cluster=ClusterFactory())
    target = ClusterFactory()
    response = http_user.post(f"/api/v1/storage/volumes/{volume.public_id}/move", json={"cluster": target.public_id})
    assert response.status_code == 409 and response.json()["code"] == "volume_move_disabled"
    assert "GSHARE_VOLUME_MOVE_ENABLED" in response.json()["detail"]
    volume.refresh_from_db()
    assert volume.cluster_id != target.pk


def test_anonymous_is_refused(anon):
    assert anon.get("/api/v1/storage/pools").status_code == 401
    assert anon.get("/api/v1/storage/volumes").status_code == 401
    assert anon.get("/api/v1/storage/summary").status_code == 401


def test_openapi_schema_lists_the_storage_routes(http):
    schema = http.get("/api/v1/schema/", headers={"Accept": "application/json"}).text
    for path in ("/api/v1/storage/pools", "/api/v1/storage/volumes", "/api/v1/storage/summary", "/api/v1/storage/volumes/{public_id}/move"):
        assert path in schema


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v1/storage/pools", "/api/v1/storage/volumes", "/api/v1/storage/summary", "/api/v1/storage/summary?cluster=lab-x"])
def test_list_query_count_does_not_grow(client, staff_token, path):
    from storage import services

    headers = {"HTTP_AUTHORIZATION": f"Bearer {staff_token}"}
    ClusterFactory(name="lab-x")
    client.get("/api/v1/storage/pools", **headers)  # the first use of a token records last_used_at (one UPDATE)
    counts = []
    for round_ in range(2):
        for i in range(3):
            cluster = pool_cluster()
            pool = services.pool_create(name=f"p-{round_}-{i}", cluster=cluster, storage_class=f"nfs-{i}", sharing="selected",
                                        allowed_clusters=[ClusterFactory()], manual_capacity_gb=100, storage_node="nas")
            StorageCapacityReading.objects.create(cluster=cluster, storage_class=f"nfs-{i}", capacity_bytes=GIB, read_at=timezone.now())
            VolumeFactory.create_batch(2, pool=pool, cluster=cluster)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path, **headers).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_volume_delete_refusals_of_the_holding_cluster(http_user, plain_user, silent_listener, settings):
    import yaml

    from tests.helpers import silent_kubeconfig

    settings.GSHARE_PROBE_TIMEOUT = 0.5
    silent = ClusterFactory(apiserver_url=f"http://{silent_listener}", kubeconfig=yaml.safe_dump(silent_kubeconfig(silent_listener)))
    volume = VolumeFactory(owner=plain_user, cluster=silent, status=Volume.Status.BOUND)
    unreachable = http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}")
    assert unreachable.status_code == 504 and unreachable.json()["code"] == "cluster_unreachable"
    assert volume.claim_name in unreachable.json()["detail"]
    volume.refresh_from_db()
    assert volume.status == "bound"
    Volume.objects.filter(pk=volume.pk).update(status=Volume.Status.MOVING)
    moving = http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}")
    assert moving.status_code == 409 and moving.json()["code"] == "volume_moving"
    grow = http_user.patch(f"/api/v1/storage/volumes/{volume.public_id}", json={"quota_gb": 20})
    assert grow.status_code == 409 and grow.json()["code"] == "volume_moving"


def test_pool_on_a_deregistered_cluster_is_refused(http):
    from clusters.models import Cluster

    gone = ClusterFactory(status=Cluster.Status.DEREGISTERED)
    response = http.post("/api/v1/storage/pools", json={"name": "p", "cluster": gone.public_id, "storage_class": "nfs-a"})
    assert response.status_code == 409 and response.json()["code"] == "cluster_deregistered"


def test_a_stated_capacity_beyond_a_bigint_is_refused_not_500(http):
    from billing.models import MAX_CAPACITY_GB

    cluster = pool_cluster()
    response = http.post("/api/v1/storage/pools", json={"name": "huge", "cluster": cluster.public_id, "storage_class": "nfs-a",
                                                        "manual_capacity_gb": MAX_CAPACITY_GB + 1})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"
    assert create_pool(http, cluster, name="largest", manual_capacity_gb=MAX_CAPACITY_GB)["id"].startswith("pool_")


def test_another_clusters_reading_of_the_same_class_does_not_override_the_pools_own(http, http_for):
    home, other = ClusterFactory(name="lab-c1"), ClusterFactory(name="lab-c2")
    pool = create_pool(http, home, manual_capacity_gb=100)
    now = timezone.now().isoformat()
    for cluster, size in ((home, 2 * TIB), (other, 2**63 - 1)):
        operator = http_for(operator_token_mint(cluster_id=cluster.public_id))
        answer = operator.post("/internal/v1/storage", json={
            "read_at": now, "storage_classes": [{"storage_class": "nfs-a", "capacity_bytes": size, "objects": 1}]})
        assert answer.status_code == 200, answer.text
    [shown] = [p for p in http.get("/api/v1/storage/summary").json()["pools"] if p["id"] == pool["id"]]
    assert (shown["capacity_bytes"], shown["source"]) == (2 * TIB, "csi")


def test_pool_wiring_is_for_staff_only(http, http_user):
    pool = StoragePoolFactory(cluster=ClusterFactory(), storage_node="nas-1")
    for path in ("/api/v1/storage/pools", f"/api/v1/storage/pools/{pool.public_id}"):
        staff, user = http.get(path).json(), http_user.get(path).json()
        staff, user = (body["results"][0] if "results" in body else body for body in (staff, user))
        assert staff["storage_class"] == pool.storage_class and staff["storage_node"] == "nas-1"
        assert "storage_class" not in user and "storage_node" not in user
        assert set(staff) - set(user) == {"storage_class", "storage_node"}
