"""A volume ``deleting`` over HTTP: what refuses it (409 JSON ``volume_deleting``), what ignores it (the operator's
storage report), and a deletion that died half-way (the row left ``deleting``) taken over by the next DELETE."""

from __future__ import annotations

import kubernetes
import pytest
import yaml
from django.utils import timezone

import contract
from audit.models import AuditRecord
from clusters.operator_token.tokens import operator_token_mint
from storage.models import Volume
from tests.factories import ClusterFactory, VolumeFactory
from tests.helpers import Http, kubeconfig_text, silent_kubeconfig

pytestmark = pytest.mark.django_db(transaction=True)


def assert_conflict(response, code: str) -> None:
    assert response.status_code == 409, response.text[:300]
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json()["code"] == code


def pvc_names(emulated, namespace: str) -> set[str]:
    api = kubernetes.config.new_client_from_config_dict(emulated.kubeconfig("lab"))
    try:
        return {c.metadata.name for c in kubernetes.client.CoreV1Api(api).list_namespaced_persistent_volume_claim(namespace).items}
    finally:
        api.close()


def test_a_volume_left_deleting_by_a_dead_deletion_is_taken_over_by_the_next_delete(http_user, plain_user, fleet_cluster, settings):
    emulated = fleet_cluster("lab-c1")
    cluster = ClusterFactory(apiserver_url=emulated.url, kubeconfig=kubeconfig_text(emulated))
    volume = VolumeFactory(cluster=cluster, status=Volume.Status.DELETING, owner=plain_user)
    api = kubernetes.config.new_client_from_config_dict(emulated.kubeconfig("lab"))
    kubernetes.client.CoreV1Api(api).create_namespaced_persistent_volume_claim(settings.GSHARE_SESSION_NAMESPACE, {
        "metadata": {"name": volume.claim_name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "nfs-a"},
    })
    api.close()
    response = http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "deleted"
    assert volume.claim_name not in pvc_names(emulated, settings.GSHARE_SESSION_NAMESPACE)
    rows = AuditRecord.objects.filter(action="volume_delete", object_id=volume.public_id)
    assert rows.count() == 1
    assert http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}").status_code in (200, 404)  # idempotent, no 500


def test_a_takeover_that_fails_leaves_the_volume_pending_for_the_operator_to_correct(http_user, plain_user, silent_listener, settings, live_server):
    settings.GSHARE_PROBE_TIMEOUT = 0.5
    cluster = ClusterFactory(apiserver_url=f"http://{silent_listener}", kubeconfig=yaml.safe_dump(silent_kubeconfig(silent_listener)))
    volume = VolumeFactory(cluster=cluster, status=Volume.Status.DELETING, owner=plain_user)
    response = http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}")
    assert response.status_code == 504 and response.json()["code"] == "cluster_unreachable", response.text
    volume.refresh_from_db()
    assert volume.status == Volume.Status.PENDING and volume.deleted_at is None
    operator = Http(live_server.url, operator_token_mint(cluster_id=cluster.public_id))
    report = {"read_at": timezone.now().isoformat(), "storage_classes": [], "nodes": [], "volumes": [
        {"volume_id": volume.public_id, "claim_name": volume.claim_name, "phase": "Bound", "volume_name": "pv-1", "message": ""}]}
    assert operator.post(contract.STORAGE_PATH, json=report).status_code == 200
    volume.refresh_from_db()
    assert volume.status == Volume.Status.BOUND


def test_a_deleting_volume_is_refused_as_json_everywhere_and_the_report_leaves_it_alone(http_user, plain_user, live_server, settings):
    settings.GSHARE_VOLUME_MOVE_ENABLED = True
    cluster, other = ClusterFactory(name="lab-c1"), ClusterFactory(name="lab-c2")
    volume = VolumeFactory(cluster=cluster, status=Volume.Status.DELETING, owner=plain_user)
    path = f"/api/v1/storage/volumes/{volume.public_id}"
    assert_conflict(http_user.post("/api/v1/sessions", json={"image": "img", "gpus": 1, "volumes": [volume.public_id]}), "volume_deleting")
    assert_conflict(http_user.patch(path, json={"quota_gb": volume.quota_gb + 5}), "volume_deleting")
    assert_conflict(http_user.post(path + "/move", json={"cluster": other.public_id}), "volume_deleting")
    operator = Http(live_server.url, operator_token_mint(cluster_id=cluster.public_id))
    report = {"read_at": timezone.now().isoformat(), "storage_classes": [], "nodes": [], "volumes": [
        {"volume_id": volume.public_id, "claim_name": volume.claim_name, "phase": "Bound", "volume_name": "pv-1", "message": ""}]}
    assert operator.post(contract.STORAGE_PATH, json=report).status_code == 200
    volume.refresh_from_db()
    assert (volume.status, volume.quota_gb, volume.cluster_id) == (Volume.Status.DELETING, 10, cluster.pk)


def test_a_session_cannot_mount_a_volume_without_a_pvc_while_it_is_being_deleted(django_user_model, monkeypatch):
    """A volume no cluster holds yet has no PVC to delete, so it is never marked ``deleting``: a session created between
    the deletion's check and its marking would mount a deleted volume. The other request runs on its own connection,
    started at that point and given a second to get through."""
    import threading

    from django.db import connections

    from sessions import create, placement
    from sessions.models import Session
    from storage import services
    from tests.factories import GpuDeviceFactory, NodeFactory, StoragePoolFactory

    owner = django_user_model.objects.create_user("alice")
    cluster = ClusterFactory(name="alpha")
    node = NodeFactory(cluster=cluster)
    GpuDeviceFactory(node=node, cluster=cluster, index=0, split_count=4, memory_mib=16000)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    pool = StoragePoolFactory(cluster=cluster)
    volume = Volume.objects.create(owner=owner, pool=pool, name="fresh", quota_gb=10, cluster=None, claim_name="",
                                   status=Volume.Status.AVAILABLE)
    outcome = []

    def create_session():
        try:
            outcome.append(create.session_create(owner=owner, image="img", gpus=1, gpu_memory_mib=100, gpu_cores=10,
                                                           volumes=[volume.public_id]))
        except Exception as exc:  # noqa: BLE001 - a refusal is a correct outcome
            outcome.append(exc)
        finally:
            connections.close_all()

    real_finish = services._delete_finish

    def finish_after_a_concurrent_create(**kwargs):
        thread = threading.Thread(target=create_session)
        thread.start()
        thread.join(1)
        finishing = real_finish(**kwargs)
        finish_after_a_concurrent_create.thread = thread
        return finishing

    monkeypatch.setattr(services, "_delete_finish", finish_after_a_concurrent_create)
    try:
        services.volume_delete(volume=volume)
    except services.VolumeInUse:
        pass
    finish_after_a_concurrent_create.thread.join(10)
    volume.refresh_from_db()
    created = [o for o in outcome if isinstance(o, Session)]  # (its eager apply to a factory cluster fails it later)
    assert not (volume.status == Volume.Status.DELETED and created), (volume.status, outcome)
