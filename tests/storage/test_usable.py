"""Volumes land only where they can be mounted, through HTTP against emulated clusters: pool registration reads the
StorageClass on the pool's cluster, each operator's volume-sync lists the StorageClasses of its cluster, a pool shows
where it is usable, and volumes (creation, move) use only pools usable where they will be mounted.

``lab-c1`` is the demo fleet's cluster with the shared StorageClass ``gshare-nfs``; ``lab-c3`` is attached without
storage (lab-c2's objects without any StorageClass).
"""

from datetime import timedelta

import kubernetes
import pytest
import yaml
from django.utils import timezone

from clusters import services as cluster_services
from clusters.operator_token.tokens import operator_token_mint
from demo import fleet
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.reporters.storage import report_storage
from storage.models import ClusterStorageClasses, StoragePool, Volume
from tests.factories import ClusterFactory, VolumeFactory
from tests.helpers import kubeconfig_text, silent_kubeconfig

pytestmark = pytest.mark.django_db

CLASS = fleet.STORAGE_CLASS


def without_storage(name: str = "lab-c2") -> list[dict]:
    """A demo cluster's objects with no StorageClass (attached without storage)."""
    return [o for o in fleet.cluster_objects(name) if o["kind"] != "StorageClass"]


@pytest.fixture
def clusters(fleet_cluster):
    """``{"lab-c1": (Cluster, EmulatedCluster), "lab-c3": ...}``, registered through the service (probe included)."""
    made = {}
    for name, objects in (("lab-c1", None), ("lab-c3", without_storage())):
        emulated = fleet_cluster("lab-c1" if objects is None else "lab-c2", objects=objects)
        cluster = cluster_services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated),
                                                    session_domain=f"{name}.gshare.localhost")
        made[name] = (cluster, emulated)
    return made


def volume_sync(live_server, cluster, emulated, tmp_path) -> None:
    """One volume-sync tick of the real operator code against ``emulated``, posting to the live server."""
    token = tmp_path / f"token-{cluster.public_id}"
    token.write_text(operator_token_mint(cluster_id=cluster.public_id))
    config = OperatorConfig(cluster_id=cluster.public_id, control_plane_url=live_server.url, token_file=str(token),
                            http_timeout=10.0, backoff_max=0.1, volume_storage_class=CLASS)
    client = ControlPlaneClient(config, max_attempts=1)
    with api_client(emulated) as api:
        assert report_storage(api, client, config) is True
    client.session.close()


def api_client(emulated) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config_dict(emulated.kubeconfig("lab"))


def register_pool(http, cluster, **extra):
    return http.post("/api/v1/storage/pools", json={"name": "lab-nfs", "cluster": cluster.public_id, "storage_class": CLASS,
                                                    "manual_capacity_gb": 1024, **extra})


# --------------------------------------------------------------------------- registration


def test_a_pool_is_registered_only_with_a_storage_class_its_cluster_has(http, clusters):
    c1, _ = clusters["lab-c1"]
    c3, _ = clusters["lab-c3"]
    missing = register_pool(http, c3)
    assert missing.status_code == 400, missing.text
    body = missing.json()
    assert body["code"] == "storage_class_missing"
    assert f'StorageClass "{CLASS}" does not exist on cluster lab-c3 ({c3.public_id})' in body["detail"]
    assert (body["cluster"], body["storage_class"]) == (c3.public_id, CLASS)
    typo = register_pool(http, c1, storage_class="gshare-nsf")
    assert typo.status_code == 400 and typo.json()["code"] == "storage_class_missing" and "gshare-nsf" in typo.json()["detail"]
    assert not StoragePool.objects.exists()

    created = register_pool(http, c1)
    assert created.status_code == 201, created.text
    pool = created.json()
    # A change to a cluster or StorageClass that lacks it is refused the same way, and nothing changes.
    for change, named in (({"cluster": "lab-c3"}, "lab-c3"), ({"storage_class": "gshare-nsf"}, "gshare-nsf")):
        refused = http.patch(f"/api/v1/storage/pools/{pool['id']}", json=change)
        assert refused.status_code == 400 and refused.json()["code"] == "storage_class_missing", refused.text
        assert named in refused.json()["detail"]
    stored = StoragePool.objects.get()
    assert (stored.cluster_id, stored.storage_class) == (c1.pk, CLASS)
    # A change that keeps cluster and class does not dial the apiserver (nothing to check).
    assert http.patch(f"/api/v1/storage/pools/{pool['id']}", json={"manual_capacity_gb": 2048}).status_code == 200


def test_registration_on_an_unreachable_or_refusing_cluster(http, fleet_cluster, silent_listener, settings):
    settings.GSHARE_PROBE_TIMEOUT = 0.5
    silent = ClusterFactory(name="lab-silent", apiserver_url=f"http://{silent_listener}",
                            kubeconfig=yaml.safe_dump(silent_kubeconfig(silent_listener)))
    unreachable = register_pool(http, silent)
    assert unreachable.status_code == 504 and unreachable.json()["code"] == "cluster_unreachable", unreachable.text
    assert "lab-silent" in unreachable.json()["detail"] and CLASS in unreachable.json()["detail"]

    emulated = fleet_cluster("lab-c1", token="the-real-token")
    wrong = emulated.kubeconfig("lab")
    wrong["users"][0]["user"]["token"] = "a-revoked-token"
    refused_by = ClusterFactory(name="lab-revoked", apiserver_url=emulated.url, kubeconfig=yaml.safe_dump(wrong))
    refused = register_pool(http, refused_by)
    assert refused.status_code == 400 and refused.json()["code"] == "cluster_auth_failed", refused.text
    assert "storageclasses.storage.k8s.io" in refused.json()["detail"]
    assert not StoragePool.objects.exists()


# --------------------------------------------------------------------------- where a pool is usable


@pytest.mark.django_db(transaction=True)
def test_volume_sync_tells_where_a_pool_is_usable(http, http_user, live_server, clusters, tmp_path):
    (c1, e1), (c3, e3) = clusters["lab-c1"], clusters["lab-c3"]
    pool = register_pool(http, c1).json()
    # Before any report nothing is known of lab-c3's StorageClasses: assumed usable, and said so.
    uses = {u["name"]: u for u in http_user.get(f"/api/v1/storage/pools/{pool['id']}").json()["usable_on"]}
    assert set(uses) == {"lab-c1", "lab-c3"} and "has not listed its StorageClasses" in uses["lab-c3"]["reason"]

    for cluster, emulated in ((c1, e1), (c3, e3)):
        volume_sync(live_server, cluster, emulated, tmp_path)
    assert ClusterStorageClasses.objects.get(cluster=c1).names == [CLASS]
    assert ClusterStorageClasses.objects.get(cluster=c3).names == []

    shown = http_user.get(f"/api/v1/storage/pools/{pool['id']}").json()
    assert [(u["cluster"], u["name"]) for u in shown["usable_on"]] == [(c1.public_id, "lab-c1")]
    assert f"StorageClass {CLASS} exists on lab-c1" in shown["usable_on"][0]["reason"]
    [lacking] = shown["not_usable_on"]
    assert (lacking["cluster"], lacking["name"]) == (c3.public_id, "lab-c3")
    assert lacking["reason"].startswith(f'storageclass "{CLASS}" not found on lab-c3 (its operator listed none')
    listed = http_user.get("/api/v1/storage/pools").json()["results"][0]
    assert listed["not_usable_on"] == shown["not_usable_on"]
    # Pools "that lab-c3 may use" are the pools usable there: none.
    assert http_user.get("/api/v1/storage/pools?cluster=lab-c3").json()["count"] == 0
    assert http_user.get("/api/v1/storage/summary?cluster=lab-c3").json()["pools"] == []
    assert http_user.get("/api/v1/storage/pools?cluster=lab-c1").json()["count"] == 1

    # The StorageClass installed on lab-c3: the next tick makes the pool usable there.
    e3.add(next(o for o in fleet.cluster_objects("lab-c2") if o["kind"] == "StorageClass"))
    volume_sync(live_server, c3, e3, tmp_path)
    shown = http_user.get(f"/api/v1/storage/pools/{pool['id']}").json()
    assert [u["name"] for u in shown["usable_on"]] == ["lab-c1", "lab-c3"] and shown["not_usable_on"] == []


@pytest.mark.django_db(transaction=True)
def test_volumes_are_created_only_on_pools_usable_where_they_will_be_mounted(http, http_user, live_server, clusters, tmp_path):
    (c1, e1), (c3, e3) = clusters["lab-c1"], clusters["lab-c3"]
    pool = register_pool(http, c1).json()
    for cluster, emulated in ((c1, e1), (c3, e3)):
        volume_sync(live_server, cluster, emulated, tmp_path)

    for body in ({"cluster": "lab-c3"}, {"cluster": c3.public_id, "pool": pool["id"]}):
        refused = http_user.post("/api/v1/storage/volumes", json={"name": "datasets", "quota_gb": 10, **body})
        assert refused.status_code == 409, refused.text
        answer = refused.json()
        assert answer["code"] == "volume_not_mountable" and answer["cluster"] == c3.public_id
        assert f"cluster lab-c3 ({c3.public_id})" in answer["detail"]
        assert f'storageclass "{CLASS}" not found on lab-c3' in answer["detail"]
        assert f"create StorageClass {CLASS} on lab-c3" in answer["detail"]
    assert not Volume.objects.exists()

    # For lab-c1, or anywhere: the pool (usable on lab-c1).
    for body in ({"cluster": "lab-c1"}, {}):
        made = http_user.post("/api/v1/storage/volumes", json={"name": f"v-{len(body)}", "quota_gb": 10, **body})
        assert made.status_code == 201 and made.json()["pool"] == pool["id"], made.text

    # The StorageClass removed from lab-c1 too: the pool is usable nowhere, so nothing is created on it.
    with api_client(e1) as api:
        kubernetes.client.StorageV1Api(api).delete_storage_class(CLASS, _preload_content=False).release_conn()
    volume_sync(live_server, c1, e1, tmp_path)
    nowhere = http_user.post("/api/v1/storage/volumes", json={"name": "late", "quota_gb": 10})
    assert nowhere.status_code == 409 and nowhere.json()["code"] == "volume_not_mountable", nowhere.text
    assert "No storage pool can provision a volume on any cluster" in nowhere.json()["detail"]
    assert "lab-c1" in nowhere.json()["detail"] and "lab-c3" in nowhere.json()["detail"]


def test_a_pool_is_usable_on_its_cluster_right_after_registration(http, http_user, http_for, clusters):
    """The registration's live read of the StorageClass counts at once, not after the operator's next report."""
    c3, e3 = clusters["lab-c3"]
    operator = http_for(operator_token_mint(cluster_id=c3.public_id))
    before = timezone.now() - timedelta(seconds=60)
    listed = operator.post("/internal/v1/storage", json={"read_at": before.isoformat(), "existing_storage_classes": ["local-path"]})
    assert listed.status_code == 200, listed.text
    e3.add(next(o for o in fleet.cluster_objects("lab-c2") if o["kind"] == "StorageClass"))  # installed after that list
    pool = register_pool(http, c3).json()
    assert ClusterStorageClasses.objects.get(cluster=c3).names == [CLASS, "local-path"]
    shown = http_user.get(f"/api/v1/storage/pools/{pool['id']}").json()
    assert "lab-c3" in [u["name"] for u in shown["usable_on"]] and shown["not_usable_on"] == []
    made = http_user.post("/api/v1/storage/volumes", json={"name": "datasets", "quota_gb": 10, "cluster": "lab-c3", "pool": pool["id"]})
    assert made.status_code == 201, made.text

    # A list the operator read before the registration's check arrives late: older, so it does not undo the check.
    late = operator.post("/internal/v1/storage", json={"read_at": (before + timedelta(seconds=30)).isoformat(),
                                                       "existing_storage_classes": ["local-path"]})
    assert late.status_code == 200, late.text
    assert CLASS in ClusterStorageClasses.objects.get(cluster=c3).names
    # A newer list is the operator's word again: the class deleted since is gone, and the pool with it.
    newer = operator.post("/internal/v1/storage", json={"read_at": timezone.now().isoformat(), "existing_storage_classes": ["local-path"]})
    assert newer.status_code == 200, newer.text
    refused = http_user.post("/api/v1/storage/volumes", json={"name": "more", "quota_gb": 10, "cluster": "lab-c3", "pool": pool["id"]})
    assert refused.status_code == 409 and refused.json()["code"] == "volume_not_mountable", refused.text


def test_an_operator_that_does_not_list_storage_classes_changes_nothing(http, http_for, clusters):
    c1, _ = clusters["lab-c1"]
    c3, _ = clusters["lab-c3"]
    pool = register_pool(http, c1).json()
    operator = http_for(operator_token_mint(cluster_id=c3.public_id))
    now = timezone.now()
    listed = operator.post("/internal/v1/storage", json={"read_at": now.isoformat(), "existing_storage_classes": ["local-path"]})
    assert listed.status_code == 200 and listed.json()["existing_storage_classes"] == 1, listed.text
    old = operator.post("/internal/v1/storage", json={"read_at": (now + timedelta(seconds=5)).isoformat(),
                                                      "storage_classes": []})
    assert old.status_code == 200 and old.json()["existing_storage_classes"] is None, old.text
    assert ClusterStorageClasses.objects.get(cluster=c3).names == ["local-path"]  # kept: the old operator said nothing
    assert [u["name"] for u in http.get(f"/api/v1/storage/pools/{pool['id']}").json()["not_usable_on"]] == ["lab-c3"]
    twice = operator.post("/internal/v1/storage", json={"read_at": now.isoformat(), "existing_storage_classes": ["a", "a"]})
    assert twice.status_code == 400 and twice.json()["code"] == "invalid_storage_report"
    assert "existing_storage_classes[1]: 'a' appears twice" in twice.json()["detail"]


def test_a_pending_volume_says_its_storage_class_is_missing_on_its_cluster(http, http_user, plain_user, http_for, clusters):
    c1, _ = clusters["lab-c1"]
    c3, _ = clusters["lab-c3"]
    register_pool(http, c1)
    volume = VolumeFactory(owner=plain_user, pool=StoragePool.objects.get(), cluster=c3, status=Volume.Status.PENDING)
    operator = http_for(operator_token_mint(cluster_id=c3.public_id))
    event = f'storageclass.storage.k8s.io "{CLASS}" not found'
    answer = operator.post("/internal/v1/storage", json={"read_at": timezone.now().isoformat(), "volumes": [
        {"volume_id": volume.public_id, "claim_name": volume.claim_name, "phase": "Pending", "volume_name": "", "message": event}]})
    assert answer.status_code == 200, answer.text
    message = http_user.get(f"/api/v1/storage/volumes/{volume.public_id}").json()["status_message"]
    assert message.startswith(f'storageclass "{CLASS}" not found on lab-c3: the PVC {volume.claim_name} of volume {volume.name}')
    assert message.endswith(f"(event: {event})")


@pytest.mark.django_db(transaction=True)
def test_a_volume_is_not_moved_where_it_cannot_be_mounted(http, http_user, plain_user, live_server, clusters, tmp_path, settings):
    settings.GSHARE_VOLUME_MOVE_ENABLED = True
    (c1, _), (c3, e3) = clusters["lab-c1"], clusters["lab-c3"]
    register_pool(http, c1)
    volume_sync(live_server, c3, e3, tmp_path)
    volume = VolumeFactory(owner=plain_user, pool=StoragePool.objects.get(), cluster=c1, status=Volume.Status.BOUND,
                           claim_name="gshare-datasets")
    refused = http_user.post(f"/api/v1/storage/volumes/{volume.public_id}/move", json={"cluster": "lab-c3"})
    assert refused.status_code == 409 and refused.json()["code"] == "volume_not_mountable", refused.text
    assert f'storageclass "{CLASS}" not found on lab-c3' in refused.json()["detail"]
    volume.refresh_from_db()
    assert (volume.cluster_id, volume.status) == (c1.pk, Volume.Status.BOUND)
    # Nothing was written on lab-c3 (the probe's SelfSubjectAccessReview is a question, never stored).
    assert not [r for r in e3.requests_seen() if r["method"] != "GET" and not r["path"].endswith("/selfsubjectaccessreviews")]


def test_a_pool_moved_while_its_new_cluster_was_checked_is_not_changed(http, clusters, monkeypatch):
    """The StorageClass is read before the pool's row is locked; should another change give the pool another
    cluster meanwhile, the checked (cluster, StorageClass) is not the one that would be stored: refused, nothing
    more changed."""
    from storage import services

    (c1, e1), (c3, _) = clusters["lab-c1"], clusters["lab-c3"]
    pool = register_pool(http, c1).json()
    e1.add({**next(o for o in fleet.cluster_objects("lab-c1") if o["kind"] == "StorageClass"), "metadata": {"name": "nfs-b"}})
    real = services.pool_check_storage_class

    def meanwhile(**kwargs):
        real(**kwargs)
        StoragePool.objects.filter(public_id=pool["id"]).update(cluster=c3)  # another change, committed meanwhile

    monkeypatch.setattr(services, "pool_check_storage_class", meanwhile)
    refused = http.patch(f"/api/v1/storage/pools/{pool['id']}", json={"storage_class": "nfs-b"})
    assert refused.status_code == 409 and refused.json()["code"] == "pool_changed", refused.text
    stored = StoragePool.objects.get(public_id=pool["id"])
    assert (stored.cluster_id, stored.storage_class) == (c3.pk, CLASS)  # nfs-b was checked on lab-c1, not lab-c3
    monkeypatch.setattr(services, "pool_check_storage_class", real)
    StoragePool.objects.filter(public_id=pool["id"]).update(cluster=c1)
    assert http.patch(f"/api/v1/storage/pools/{pool['id']}", json={"storage_class": "nfs-b"}).json()["storage_class"] == "nfs-b"


@pytest.mark.django_db(transaction=True)
def test_the_console_pool_page_shows_where_it_is_usable(client, staff_user, http, live_server, clusters, tmp_path):
    (c1, e1), (c3, e3) = clusters["lab-c1"], clusters["lab-c3"]
    register_pool(http, c1)
    for cluster, emulated in ((c1, e1), (c3, e3)):
        volume_sync(live_server, cluster, emulated, tmp_path)
    client.force_login(staff_user)
    page = client.get(f"/storage/storagepool/{StoragePool.objects.get().pk}/change/").content.decode()
    assert f"usable on lab-c1: StorageClass {CLASS} exists on lab-c1" in page
    assert "NOT usable on lab-c3: storageclass &quot;gshare-nfs&quot; not found on lab-c3" in page
    # The console's form refuses a StorageClass the cluster lacks with the API's words, and stores nothing.
    form = {"name": "nas-c3", "cluster": c3.pk, "storage_class": CLASS, "sharing": "all", "manual_capacity_gb": 100, "storage_node": ""}
    refused = client.post("/storage/storagepool/add/", form)
    assert refused.status_code == 200 and f"StorageClass &quot;{CLASS}&quot; does not exist on cluster lab-c3" in refused.content.decode()
    assert StoragePool.objects.count() == 1


def test_the_console_volume_form_offers_only_usable_pools_and_clusters(client, plain_user, http, http_for, clusters, settings):
    """A researcher's new-volume form lists only pools usable somewhere and clusters where some pool is usable, and
    shows the price per GiB-month and what the entered size costs."""
    from decimal import Decimal

    from tests.factories import StoragePoolFactory

    settings.GSHARE_STORAGE_PRICE_PER_GB_MONTH = Decimal("0.05")
    (c1, _), (c3, _) = clusters["lab-c1"], clusters["lab-c3"]
    register_pool(http, c1)
    now = timezone.now().isoformat()
    for cluster, names in ((c1, [CLASS]), (c3, ["local-path"])):
        listed = http_for(operator_token_mint(cluster_id=cluster.public_id)).post(
            "/internal/v1/storage", json={"read_at": now, "existing_storage_classes": names})
        assert listed.status_code == 200, listed.text
    StoragePoolFactory(name="dead-pool", cluster=c3, storage_class="nowhere-class", sharing=StoragePool.Sharing.SELECTED)

    client.force_login(plain_user)
    page = client.get("/storage/volume/add/").content.decode()
    pools = page[page.index('name="storage_pool"'):]
    pools = pools[:pools.index("</select>")]
    mounts = page[page.index('name="mount_cluster"'):]
    mounts = mounts[:mounts.index("</select>")]
    assert "lab-nfs" in pools and "dead-pool" not in pools
    assert "lab-c1" in mounts and "lab-c3" not in mounts
    assert "0.050000 credits per GiB-month (30 days)" in page

    shown = client.post("/storage/volume/add/", {"name": "Not_A_Label", "quota_gb": 100, "storage_pool": "", "mount_cluster": ""})
    assert shown.status_code == 200 and "100 GiB cost 5.000000 credits a month" in shown.content.decode()
    offered_elsewhere = client.post("/storage/volume/add/", {"name": "data", "quota_gb": 1, "mount_cluster": c3.pk})
    assert offered_elsewhere.status_code == 200 and not Volume.objects.exists()  # not a choice: refused by the form
    made = client.post("/storage/volume/add/", {"name": "data", "quota_gb": 1, "mount_cluster": c1.pk})
    assert made.status_code == 302 and Volume.objects.get().name == "data"
