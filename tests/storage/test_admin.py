"""Console pages for storage: the Resources → Volumes group, constant queries, cluster filters, actions via services,
forms that refuse what the API refuses, read-only capacity readings and node disks."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from storage import services
from storage.models import GIB, StoragePool, Volume
from tests.console_checks import assert_read_only, page_text
from tests.factories import ClusterFactory, NodeDiskFactory, SessionFactory, StorageCapacityReadingFactory, VolumeFactory
from tests.storage.kube import pool_cluster

pytestmark = pytest.mark.django_db


def _grow():
    cluster = pool_cluster()
    pool = services.pool_create(name=f"pool-{cluster.name}", cluster=cluster, storage_class="nfs-a", manual_capacity_gb=100)
    for _ in range(3):
        VolumeFactory(pool=pool, cluster=cluster, quota_gb=5)
    return cluster, pool


def test_index_groups_pools_and_volumes_under_resources_volumes(console):
    html = console.get("/").content.decode()
    assert "Resources → Volumes" in html
    assert "Storage pools" in html and "/storage/storagepool/" in html and "/storage/volume/" in html


@pytest.mark.parametrize("path", ["/storage/storagepool/", "/storage/volume/"])
def test_list_pages_have_constant_queries(console, path):
    counts = []
    for _ in range(2):
        _grow()
        with CaptureQueriesContext(connection) as queries:
            response = console.get(path)
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_lists_filter_by_cluster(console):
    (a, _), (b, _) = _grow(), _grow()
    volumes = console.get(f"/storage/volume/?cluster__id__exact={a.pk}").context["cl"].result_list
    assert len(volumes) == 3 and {v.cluster_id for v in volumes} == {a.pk}
    pools = console.get(f"/storage/storagepool/?cluster__id__exact={b.pk}").context["cl"].result_list
    assert [p.cluster_id for p in pools] == [b.pk]
    html = console.get("/storage/storagepool/").content.decode()
    assert "100 GiB" in html and "15 GiB" in html  # capacity and allocated


def test_refresh_capacity_action_calls_the_service(console):
    cluster, pool = _grow()
    StorageCapacityReadingFactory(cluster=cluster, storage_class="nfs-a", capacity_bytes=3000 * GIB)
    response = console.post("/storage/storagepool/", {"action": "refresh_capacity", "_selected_action": [pool.pk]}, follow=True)
    assert response.status_code == 200
    pool.refresh_from_db()
    assert (pool.capacity_bytes, pool.capacity_source) == (3000 * GIB, "csi")
    assert "3000 GiB (csi)" in response.content.decode()


def test_capacity_fields_are_read_only_and_pool_add_goes_through_the_service(console):
    cluster = pool_cluster()
    page = console.get("/storage/storagepool/add/").content.decode()
    assert 'name="capacity_bytes"' not in page and 'name="capacity_source"' not in page
    response = console.post("/storage/storagepool/add/", {
        "name": "nas", "cluster": cluster.pk, "storage_class": "nfs-a", "sharing": "all", "manual_capacity_gb": 2048, "storage_node": "",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    pool = StoragePool.objects.get(name="nas")
    assert pool.public_id.startswith("pool_") and (pool.capacity_bytes, pool.capacity_source) == (2048 * GIB, "manual")
    taken = console.post("/storage/storagepool/add/", {"name": "nas", "cluster": cluster.pk, "storage_class": "nfs-a", "sharing": "all"})
    assert taken.status_code == 200 and "already named" in taken.content.decode()


def test_pool_edit_goes_through_the_service_and_its_refusals(console):
    cluster, pool = _grow()
    ok = console.post(f"/storage/storagepool/{pool.pk}/change/", {
        "name": pool.name, "cluster": cluster.pk, "storage_class": "nfs-a", "sharing": "all", "manual_capacity_gb": 500, "storage_node": "",
    })
    assert ok.status_code == 302
    pool.refresh_from_db()
    assert pool.capacity_bytes == 500 * GIB
    refused = console.post(f"/storage/storagepool/{pool.pk}/change/", {
        "name": pool.name, "cluster": cluster.pk, "storage_class": "nfs-b", "sharing": "all", "manual_capacity_gb": 500, "storage_node": "",
    })
    assert refused.status_code == 200 and "cannot change while they exist" in refused.content.decode()
    assert StoragePool.objects.get(pk=pool.pk).storage_class == "nfs-a"


def test_delete_actions_go_through_the_services(console):
    cluster, pool = _grow()
    response = console.post("/storage/storagepool/", {"action": "delete_pools", "_selected_action": [pool.pk]}, follow=True)
    assert "still holds 3 volume(s)" in response.content.decode()
    assert StoragePool.objects.filter(pk=pool.pk).exists()
    volume = Volume.objects.filter(pool=pool).first()
    volume.cluster = None
    volume.save()
    SessionFactory(volumes=[volume], phase="Running")
    response = console.post("/storage/volume/", {"action": "delete_volumes", "_selected_action": [volume.pk]}, follow=True)
    assert "mounted by session(s)" in response.content.decode()
    assert Volume.objects.get(pk=volume.pk).status == "available"


def test_volume_quota_edit_goes_through_the_gate(console):
    _, pool = _grow()
    volume = Volume.objects.filter(pool=pool).first()
    shrink = console.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": 1})
    assert shrink.status_code == 200 and "can only grow" in shrink.content.decode()
    full = console.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": 200})
    assert full.status_code == 200 and "does not fit" in full.content.decode()
    grown = console.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": 50})
    assert grown.status_code == 302
    assert Volume.objects.get(pk=volume.pk).quota_gb == 50


def test_capacity_readings_and_node_disks_are_read_only(console):
    cluster = ClusterFactory()
    reading = StorageCapacityReadingFactory(cluster=cluster)
    disk = NodeDiskFactory(cluster=cluster)
    assert_read_only(console, "/storage/storagecapacityreading/", reading)
    assert_read_only(console, "/storage/nodedisk/", disk)
    assert "2048 GiB" in console.get("/storage/storagecapacityreading/").content.decode()
    assert "500 GiB" in console.get("/storage/nodedisk/").content.decode()


@pytest.mark.parametrize("path", ["/storage/storagecapacityreading/", "/storage/nodedisk/"])
def test_reading_pages_have_constant_queries(console, path):
    counts = []
    for _ in range(2):
        cluster = ClusterFactory()
        for name in ("nfs-a", "nfs-b", "nfs-c"):
            StorageCapacityReadingFactory(cluster=cluster, storage_class=name)
            NodeDiskFactory(cluster=cluster)
        with CaptureQueriesContext(connection) as queries:
            assert console.get(path).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


#: The phrase of both refusals of a pool name that is not a DNS label (the API's serializer, ``pool_validate``).
NOT_A_DNS_LABEL = "must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit (e.g. nfs-a)"


@pytest.mark.django_db
def test_pool_form_refuses_what_the_api_refuses(console, http):
    """Reproduced: the console saved a pool named ``Bad Name!`` that ``POST /api/v1/storage/pools`` refuses."""
    cluster = pool_cluster()
    api = http.post("/api/v1/storage/pools", json={"name": "Bad Name!", "cluster": cluster.public_id, "storage_class": "nfs-a"})
    assert api.status_code == 400 and api.json()["code"] == "invalid_request" and NOT_A_DNS_LABEL in api.json()["detail"]
    form = {"name": "Bad Name!", "cluster": cluster.pk, "storage_class": "nfs-a", "sharing": "all", "manual_capacity_gb": 100, "storage_node": ""}
    page = console.post("/storage/storagepool/add/", form)
    assert page.status_code == 200 and NOT_A_DNS_LABEL in page_text(page)
    assert not StoragePool.objects.exists()

    other = ClusterFactory()
    for body, refused in (({"storage_class": "NFS_A"}, 400), ({"sharing": "all", "allowed_clusters": [other.pk]}, 400)):
        api_body = {**body, **({"allowed_clusters": [other.public_id]} if "allowed_clusters" in body else {})}
        api = http.post("/api/v1/storage/pools", json={"name": "nas", "cluster": cluster.public_id, "storage_class": "nfs-a", **api_body})
        assert api.status_code == refused, api.text
        page = console.post("/storage/storagepool/add/", {**form, "name": "nas", **body})
        assert page.status_code == 200 and "Please correct the error" in page_text(page)
        assert not StoragePool.objects.exists()

    ok = console.post("/storage/storagepool/add/", {**form, "name": "nas"})
    assert ok.status_code == 302, page_text(ok)[:2000]
    pool = StoragePool.objects.get(name="nas")
    assert (pool.capacity_bytes, pool.capacity_source) == (100 * GIB, "manual")  # resolved by pool_create
    renamed = console.post(f"/storage/storagepool/{pool.pk}/change/", {**form, "name": "Bad Name!"})
    assert renamed.status_code == 200 and NOT_A_DNS_LABEL in page_text(renamed)
    assert StoragePool.objects.get(pk=pool.pk).name == "nas"
    api = http.patch(f"/api/v1/storage/pools/{pool.public_id}", json={"name": "Bad Name!"})
    assert api.status_code == 400 and StoragePool.objects.get(pk=pool.pk).name == "nas"


@pytest.mark.django_db
def test_volume_form_refuses_what_the_api_refuses(console, http_user, plain_user):
    cluster = pool_cluster()
    pool = services.pool_create(name="nas", cluster=cluster, storage_class="nfs-a", manual_capacity_gb=100)
    volume = VolumeFactory(owner=plain_user, pool=pool, quota_gb=10)
    for quota in (5, 500):  # shrink (409 volume_shrink_unsupported), past the pool (409 pool_full)
        api = http_user.patch(f"/api/v1/storage/volumes/{volume.public_id}", json={"quota_gb": quota})
        assert api.status_code == 409, api.text
        page = console.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": quota})
        assert page.status_code == 200 and api.json()["detail"] in page_text(page)
        assert Volume.objects.get(pk=volume.pk).quota_gb == 10
    ok = console.post(f"/storage/volume/{volume.pk}/change/", {"quota_gb": 20})
    assert ok.status_code == 302
    assert Volume.objects.get(pk=volume.pk).quota_gb == 20
