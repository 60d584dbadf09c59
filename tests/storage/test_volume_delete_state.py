"""``volume_delete`` holds no row lock while it calls the apiserver: the volume is ``deleting`` meanwhile, concurrent
deletions of one volume end with one deletion, and a failure puts the status back."""

import threading
import time

import kubernetes
import pytest
import yaml
from django.db import OperationalError, connections, transaction

from audit.models import AuditRecord
from clusters.probe import ClusterUnreachable
from core.exceptions import Conflict
from sessions import create
from storage import services
from storage.models import Volume
from tests.factories import ClusterFactory, UserFactory, VolumeFactory
from tests.helpers import kubeconfig_text, run_threads, silent_kubeconfig

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_row_is_not_locked_while_the_pvc_is_deleted(silent_listener, settings):
    settings.GSHARE_PROBE_TIMEOUT = 2.0
    cluster = ClusterFactory(apiserver_url=f"http://{silent_listener}", kubeconfig=yaml.safe_dump(silent_kubeconfig(silent_listener)))
    volume = VolumeFactory(cluster=cluster, status=Volume.Status.BOUND)
    failures = []

    def delete():
        try:
            services.volume_delete(volume=volume)
        except ClusterUnreachable as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=delete)
    thread.start()
    seen = None
    for _ in range(100):  # while the silent apiserver keeps the deletion waiting
        time.sleep(0.02)
        try:
            with transaction.atomic():  # NOWAIT raises at once if the deletion holds the row lock
                seen = Volume.objects.select_for_update(nowait=True).filter(pk=volume.pk).values_list("status", flat=True).get()
        except OperationalError:  # the short transaction that marks the row deleting (on a loaded machine it shows)
            continue
        if seen == Volume.Status.DELETING:  # locked by us while the deletion waits on the apiserver: it holds no lock
            break
    assert seen == Volume.Status.DELETING
    with pytest.raises(Conflict) as refused:  # a session cannot mount it meanwhile
        create.session_create(owner=volume.owner, image="img", gpus=1, volumes=[volume.public_id])
    assert refused.value.code == "volume_deleting"
    with pytest.raises(services.VolumeDeleting):
        services.volume_update_quota(volume=volume, quota_gb=volume.quota_gb + 1)
    thread.join(30)
    assert failures and failures[0].code == "cluster_unreachable"
    volume.refresh_from_db()
    assert volume.status == Volume.Status.BOUND and volume.deleted_at is None  # the failure put the status back


def test_concurrent_deletions_delete_once(fleet_cluster, settings):
    emulated = fleet_cluster("lab-c1")
    cluster = ClusterFactory(apiserver_url=emulated.url, kubeconfig=kubeconfig_text(emulated))
    volume = VolumeFactory(cluster=cluster, status=Volume.Status.BOUND, owner=UserFactory())
    api = kubernetes.config.new_client_from_config_dict(emulated.kubeconfig("lab"))
    kubernetes.client.CoreV1Api(api).create_namespaced_persistent_volume_claim(settings.GSHARE_SESSION_NAMESPACE, {
        "metadata": {"name": volume.claim_name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "nfs-a"},
    })
    api.close()
    barrier = threading.Barrier(4)
    results = []

    def delete():
        try:
            barrier.wait()
            results.append(services.volume_delete(volume=volume).status)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            results.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(delete, [()] * 4, timeout=30)
    assert results == ["deleted"] * 4
    volume.refresh_from_db()
    assert volume.status == Volume.Status.DELETED and volume.deleted_at is not None
    rows = AuditRecord.objects.filter(action="volume_delete", object_id=volume.public_id)
    assert rows.count() == 1 and rows.get().changes["status"] == {"old": "bound", "new": "deleted"}
