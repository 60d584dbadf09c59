"""Moving a volume between two emulated clusters (``storage.move.volume_move`` through
``POST /api/v1/storage/volumes/{id}/move``): a CSI and an NFS PersistentVolume carried over, pre-bound, Retain,
nothing deleted on the pool; the setting, the preconditions, an unreachable target, and retries."""

import threading
import time

import pytest
import yaml
from django.db import connections

from clusters import services as cluster_services
from clusters.models import Cluster
from core.exceptions import Conflict
from sessions.models import Session
from storage.models import StoragePool, Volume
from storage.move import moved_pv_name, volume_move
from tests.helpers import kubeconfig_text, silent_kubeconfig

pytestmark = pytest.mark.django_db

NS = "gshare-sessions"
PVCS = ("persistentvolumeclaims",)
PVS = ("persistentvolumes",)
CSI = {"driver": "org.democratic-csi.nfs", "volumeHandle": "pvc-6f1c", "fsType": "nfs",
       "volumeAttributes": {"node_attach_driver": "nfs", "provisioner_driver": "freenas-nfs", "server": "10.20.0.5",
                            "share": "/mnt/tank/k8s/pvc-6f1c"}}
NFS = {"server": "10.20.0.5", "path": "/mnt/tank/k8s/datasets"}


@pytest.fixture
def pair(fleet_cluster, settings):
    """lab-c1 (A) and lab-c2 (B), registered through the service (probe included), with the move enabled."""
    settings.GSHARE_VOLUME_MOVE_ENABLED = True
    made = []
    for name in ("lab-c1", "lab-c2"):
        emulated = fleet_cluster(name)
        cluster = cluster_services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated),
                                                    session_domain=f"{name}.gshare.localhost")
        made.append((cluster, emulated))
    return made


def seed_bound_claim(emulated, volume, *, source, policy="Delete", pv_name="pvc-6f1c-a"):
    """A PVC bound to a PersistentVolume on the emulated cluster, as its CSI provisioner would have left them."""
    claim_uid = "0f4b2c1e-5a8d-4d7e-9c3b-6f1c00000001"
    emulated.add({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": {"pv.kubernetes.io/provisioned-by": CSI["driver"]}},
        "spec": {"capacity": {"storage": f"{volume.quota_gb}Gi"}, "accessModes": ["ReadWriteMany"],
                 "persistentVolumeReclaimPolicy": policy, "storageClassName": volume.pool.storage_class,
                 "mountOptions": ["nfsvers=4.1", "hard"], "volumeMode": "Filesystem", **source,
                 "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": NS,
                              "name": volume.claim_name, "uid": claim_uid}},
        "status": {"phase": "Bound"},
    })
    emulated.add({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": volume.claim_name, "namespace": NS, "uid": claim_uid,
                     "labels": {"app.kubernetes.io/managed-by": "gshare", "gshare.io/volume-id": volume.public_id,
                                "gshare.io/volume-name": volume.name, "team": "vision"}},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": volume.pool.storage_class,
                 "resources": {"requests": {"storage": f"{volume.quota_gb}Gi"}}, "volumeName": pv_name,
                 "volumeMode": "Filesystem"},
        "status": {"phase": "Bound", "accessModes": ["ReadWriteMany"], "capacity": {"storage": f"{volume.quota_gb}Gi"}},
    })
    return pv_name


def make_volume(owner, cluster, *, sharing=StoragePool.Sharing.ALL, name="datasets", quota_gb=20):
    pool = StoragePool.objects.create(name=f"tank-{name}", cluster=cluster, storage_class="tank-nfs", sharing=sharing)
    return Volume.objects.create(owner=owner, pool=pool, name=name, quota_gb=quota_gb, cluster=cluster,
                                 claim_name=f"gshare-{name}-claim", status=Volume.Status.BOUND, pv_name="pvc-6f1c-a")


def move(http, volume, cluster):
    return http.post(f"/api/v1/storage/volumes/{volume.public_id}/move", json={"cluster": cluster.public_id})


def named(objects, name, namespace=None):
    found = [o for o in objects if o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace]
    return found[0] if found else None


def test_a_csi_volume_moves_with_its_data_untouched(http_user, plain_user, pair):
    (a, ea), (b, eb) = pair
    volume = make_volume(plain_user, a)
    old_pv = seed_bound_claim(ea, volume, source={"csi": CSI})
    response = move(http_user, volume, b)
    assert response.status_code == 200, response.text
    assert response.json()["id"] == volume.public_id
    new_pv = moved_pv_name(volume, b)
    assert new_pv == f"gshare-{volume.public_id.replace('_', '-')}-{b.public_id[4:12]}"
    # B: a Retain PersistentVolume with the same CSI source, pre-bound to the PVC, and that PVC.
    pv = named(eb.objects_of(*PVS), new_pv)
    assert pv["spec"]["csi"] == CSI
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["capacity"] == {"storage": "20Gi"} and pv["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["storageClassName"] == "tank-nfs" and pv["spec"]["mountOptions"] == ["nfsvers=4.1", "hard"]
    assert (pv["spec"]["claimRef"]["namespace"], pv["spec"]["claimRef"]["name"]) == (NS, volume.claim_name)
    pvc = named(eb.objects_of(*PVCS), volume.claim_name, NS)
    assert pvc["spec"]["volumeName"] == new_pv
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["storageClassName"] == "tank-nfs"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert pvc["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gshare", "gshare.io/volume-id": volume.public_id,
                                         "gshare.io/volume-name": "datasets", "team": "vision"}
    assert named(eb.objects_of(*PVS), old_pv) is None  # B's provisioner made nothing of its own
    # A: the PVC is gone, its PersistentVolume kept with reclaim policy Retain (the pool's data is not deleted).
    assert named(ea.objects_of(*PVCS), volume.claim_name, NS) is None
    kept = named(ea.objects_of(*PVS), old_pv)
    assert kept is not None and kept["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert kept["spec"]["csi"] == CSI
    # The record: on B, pending until B's operator reports the PVC bound.
    volume.refresh_from_db()
    assert (volume.cluster, volume.status, volume.pv_name) == (b, Volume.Status.PENDING, new_pv)
    assert "lab-c1" in volume.status_message
    # B's PV controller binds the pre-bound pair; A's releases the old PV and deletes nothing.
    # The two emulated controllers run in their own threads: wait for both (a generous poll, not a time budget).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pvc = named(eb.objects_of(*PVCS), volume.claim_name, NS)
        released = (named(ea.objects_of(*PVS), old_pv).get("status") or {}).get("phase") == "Released"
        if (pvc.get("status") or {}).get("phase") == "Bound" and released:
            break
        time.sleep(0.05)
    assert pvc["status"]["phase"] == "Bound" and pvc["spec"]["volumeName"] == new_pv
    assert named(ea.objects_of(*PVS), old_pv)["status"]["phase"] == "Released"
    # Moving it again to where it is: nothing to do.
    again = move(http_user, volume, b)
    assert again.status_code == 409 and again.json()["code"] == "volume_already_there"


def test_an_nfs_volume_moves_too_and_back(http_user, plain_user, pair):
    (a, ea), (b, eb) = pair
    volume = make_volume(plain_user, a)
    seed_bound_claim(ea, volume, source={"nfs": NFS}, policy="Retain")
    assert move(http_user, volume, b).status_code == 200
    pv = named(eb.objects_of(*PVS), moved_pv_name(volume, b))
    assert pv["spec"]["nfs"] == NFS and "csi" not in pv["spec"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    # And back to A, once B's PVC is bound: A gets a PersistentVolume of its own with the same export.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (named(eb.objects_of(*PVCS), volume.claim_name, NS).get("status") or {}).get(
            "phase") != "Bound":
        time.sleep(0.05)
    back = move(http_user, volume, a)
    assert back.status_code == 200, back.text
    assert named(ea.objects_of(*PVS), moved_pv_name(volume, a))["spec"]["nfs"] == NFS
    assert named(ea.objects_of(*PVCS), volume.claim_name, NS)["spec"]["volumeName"] == moved_pv_name(volume, a)
    assert named(eb.objects_of(*PVCS), volume.claim_name, NS) is None
    assert named(eb.objects_of(*PVS), moved_pv_name(volume, b)) is not None  # kept, Released
    volume.refresh_from_db()
    assert volume.cluster == a


def test_the_move_is_off_unless_enabled(http_user, plain_user, pair, settings):
    (a, ea), (b, eb) = pair
    settings.GSHARE_VOLUME_MOVE_ENABLED = False
    volume = make_volume(plain_user, a)
    seed_bound_claim(ea, volume, source={"csi": CSI})
    response = move(http_user, volume, b)
    assert response.status_code == 409 and response.json()["code"] == "volume_move_disabled"
    assert "GSHARE_VOLUME_MOVE_ENABLED" in response.json()["detail"]
    with pytest.raises(Conflict) as info:  # the service refuses on its own too
        volume_move(volume=volume, cluster=b)
    assert info.value.code == "volume_move_disabled"
    assert eb.objects_of(*PVCS) == [] and named(ea.objects_of(*PVCS), volume.claim_name, NS) is not None


def test_preconditions(http_user, plain_user, pair):
    (a, ea), (b, eb) = pair
    volume = make_volume(plain_user, a)
    seed_bound_claim(ea, volume, source={"csi": CSI})
    session = Session.objects.create(owner=plain_user, cluster=a, image="img", gpus=1, phase=Session.Phase.RUNNING)
    session.volumes.add(volume)
    in_use = move(http_user, volume, b)
    assert in_use.status_code == 409 and in_use.json()["code"] == "volume_in_use"
    assert session.public_id in in_use.json()["detail"]
    Session.objects.filter(pk=session.pk).update(phase=Session.Phase.TERMINATED)  # an ended session does not count
    assert move(http_user, volume, a).json()["code"] == "volume_already_there"
    unplaced = Volume.objects.create(owner=plain_user, pool=volume.pool, name="fresh", quota_gb=1, claim_name="gshare-fresh")
    not_placed = move(http_user, unplaced, b)
    assert not_placed.status_code == 409 and not_placed.json()["code"] == "volume_not_placed"
    private = make_volume(plain_user, a, sharing=StoragePool.Sharing.SELECTED, name="private")
    refused = move(http_user, private, b)
    assert refused.status_code == 409 and refused.json()["code"] == "volume_pool_not_shared"
    assert "tank-private" in refused.json()["detail"]
    # Nothing was touched anywhere, and every volume kept its status.
    assert eb.objects_of(*PVCS) == [] and eb.objects_of(*PVS) == []
    assert {v.status for v in Volume.objects.all()} == {Volume.Status.BOUND, Volume.Status.AVAILABLE}


def test_an_unreachable_target_leaves_the_volume_on_a_with_its_pvc(http_user, plain_user, pair, silent_listener, settings):
    (a, ea), (b, _) = pair
    settings.GSHARE_PROBE_TIMEOUT = 1.0
    Cluster.objects.filter(pk=b.pk).update(kubeconfig=yaml.safe_dump(silent_kubeconfig(silent_listener)))
    volume = make_volume(plain_user, a)
    old_pv = seed_bound_claim(ea, volume, source={"csi": CSI})
    response = move(http_user, volume, b)
    assert response.status_code == 504, response.text
    body = response.json()
    assert body["code"] == "cluster_unreachable"
    assert "lab-c2" in body["detail"] and "stays on cluster lab-c1" in body["detail"] and "retry" in body["detail"]
    volume.refresh_from_db()
    assert (volume.cluster, volume.status) == (a, Volume.Status.BOUND)
    assert named(ea.objects_of(*PVCS), volume.claim_name, NS)["spec"]["volumeName"] == old_pv
    assert named(ea.objects_of(*PVS), old_pv)["spec"]["persistentVolumeReclaimPolicy"] == "Delete"  # untouched


def test_a_retry_reuses_what_an_earlier_attempt_made_and_refuses_a_stranger(http_user, plain_user, pair):
    (a, ea), (b, eb) = pair
    volume = make_volume(plain_user, a)
    seed_bound_claim(ea, volume, source={"csi": CSI})
    new_pv = moved_pv_name(volume, b)
    # A stranger under the PV's name on B (another source): refused, nothing changed on A.
    eb.add({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": new_pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "nfs": {"server": "x", "path": "/y"}}})
    refused = move(http_user, volume, b)
    assert refused.status_code == 502 and refused.json()["code"] == "volume_move_failed"
    assert f"kubectl delete pv {new_pv}" in refused.json()["detail"]
    volume.refresh_from_db()
    assert (volume.cluster, volume.status) == (a, Volume.Status.BOUND)
    assert named(ea.objects_of(*PVCS), volume.claim_name, NS) is not None
    # What an interrupted attempt leaves (the right PV and PVC on B; A untouched): the retry completes the move.
    eb.add({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": new_pv},
            "spec": {"capacity": {"storage": "20Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "tank-nfs",
                     "persistentVolumeReclaimPolicy": "Retain", "csi": CSI,
                     "claimRef": {"namespace": NS, "name": volume.claim_name}}})
    eb.add({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": volume.claim_name, "namespace": NS},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "tank-nfs", "volumeName": new_pv,
                     "resources": {"requests": {"storage": "20Gi"}}}})
    done = move(http_user, volume, b)
    assert done.status_code == 200, done.text
    volume.refresh_from_db()
    assert volume.cluster == b and named(ea.objects_of(*PVCS), volume.claim_name, NS) is None


def test_a_move_that_died_after_releasing_a_is_finished_by_the_next(http_user, plain_user, pair):
    """A's PVC already deleted and B's pre-bound pair in place, the volume still recorded on A and left
    ``moving`` (the process died): the next move takes over and records B."""
    (a, ea), (b, eb) = pair
    volume = make_volume(plain_user, a)
    Volume.objects.filter(pk=volume.pk).update(status=Volume.Status.MOVING)
    new_pv = moved_pv_name(volume, b)
    eb.add({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": new_pv},
            "spec": {"capacity": {"storage": "20Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "tank-nfs",
                     "persistentVolumeReclaimPolicy": "Retain", "csi": CSI,
                     "claimRef": {"namespace": NS, "name": volume.claim_name}}})
    eb.add({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": volume.claim_name, "namespace": NS},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "tank-nfs", "volumeName": new_pv,
                     "resources": {"requests": {"storage": "20Gi"}}}})
    response = move(http_user, volume, b)
    assert response.status_code == 200, response.text
    volume.refresh_from_db()
    assert (volume.cluster, volume.status, volume.pv_name) == (b, Volume.Status.PENDING, new_pv)
    # Without B's pair there is nothing to carry over: refused, the volume stays where it was.
    other = make_volume(plain_user, a, name="orphan")
    lost = move(http_user, other, b)
    assert lost.status_code == 502 and lost.json()["code"] == "volume_move_failed"
    assert "is not on cluster lab-c1" in lost.json()["detail"]
    other.refresh_from_db()
    assert (other.cluster, other.status) == (a, Volume.Status.BOUND)


@pytest.mark.django_db(transaction=True)
def test_two_moves_of_one_volume_never_interleave(plain_user, pair):
    """A move holds the volume's advisory lock from start to end: a second one meanwhile is refused at once."""
    (a, ea), (b, _) = pair
    volume = make_volume(plain_user, a)
    seed_bound_claim(ea, volume, source={"csi": CSI})
    holding, release = threading.Event(), threading.Event()

    def hold():
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(%s, %s)", [0x67536D76, volume.pk])
                holding.set()
                release.wait(10)
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [0x67536D76, volume.pk])
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(10)
    with pytest.raises(Conflict) as info:
        volume_move(volume=volume, cluster=b)
    assert info.value.code == "volume_moving"
    release.set()
    thread.join(10)
    assert volume_move(volume=volume, cluster=b).cluster == b


def test_a_step_refused_half_way_is_reported_and_the_retry_finishes(http_user, plain_user, fleet_cluster, settings):
    """B has no session namespace: its PV is made, its PVC refused (404). The error says what was done; once the
    namespace exists the same request finishes, reusing the PV."""
    from demo import fleet

    settings.GSHARE_VOLUME_MOVE_ENABLED = True
    ea = fleet_cluster("lab-c1")
    eb = fleet_cluster("lab-c2", objects=[o for o in fleet.cluster_objects("lab-c2")
                                          if not (o["kind"] == "Namespace" and o["metadata"]["name"] == NS)])
    a = cluster_services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(ea), session_domain="a.gshare.localhost")
    b = cluster_services.cluster_register(name="lab-c2", kubeconfig=kubeconfig_text(eb), session_domain="b.gshare.localhost")
    volume = make_volume(plain_user, a)
    old_pv = seed_bound_claim(ea, volume, source={"csi": CSI})
    response = move(http_user, volume, b)
    assert response.status_code == 502, response.text
    detail = response.json()["detail"]
    assert response.json()["code"] == "volume_move_failed"
    assert f"could not create the PVC {volume.claim_name} on cluster lab-c2 (404" in detail
    assert f"created PersistentVolume {moved_pv_name(volume, b)} (Retain) on lab-c2" in detail
    assert "stays on cluster lab-c1 with its PVC" in detail and "retry" in detail
    volume.refresh_from_db()
    assert (volume.cluster, volume.status) == (a, Volume.Status.BOUND)
    assert named(ea.objects_of(*PVCS), volume.claim_name, NS) is not None
    assert named(ea.objects_of(*PVS), old_pv)["spec"]["persistentVolumeReclaimPolicy"] == "Delete"  # not reached
    eb.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    again = move(http_user, volume, b)
    assert again.status_code == 200, again.text
    assert named(eb.objects_of(*PVCS), volume.claim_name, NS)["spec"]["volumeName"] == moved_pv_name(volume, b)
    assert named(ea.objects_of(*PVS), old_pv)["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
