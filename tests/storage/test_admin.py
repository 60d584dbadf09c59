"""Console pages for storage: the Resources → Volumes group, constant queries, cluster filters, actions via services."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from storage import services
from storage.models import GIB, StoragePool, Volume
from tests.factories import ClusterFactory, SessionFactory, StorageCapacityReadingFactory, VolumeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def console(client, staff_user):
    client.force_login(staff_user)
    return client


def _grow():
    cluster = ClusterFactory()
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
    cluster = ClusterFactory()
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
