"""``ClusterGpuModel``: the per-cluster GPU model summary admission prices requests with, kept by triggers on the GPU rows."""

import threading

import pytest
from django.db import connection, connections, transaction

from billing import admission
from clusters import services
from clusters.models import ClusterGpuModel, GpuDevice
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory
from tests.helpers import lock_waiters, run_threads, wait_for


def _summary() -> set[tuple[int, str, int]]:
    return set(ClusterGpuModel.objects.values_list("cluster_id", "model", "memory_mib"))


def _recount() -> set[tuple[int, str, int]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT cluster_id, model, MIN(memory_mib) FROM clusters_gpudevice GROUP BY 1, 2")
        return set(cursor.fetchall())


def _node(name: str, devices: list[tuple[str, str, int]]) -> dict:
    return {"name": name, "labels": {}, "ready": True, "devices": [
        {"uuid": uuid, "index": i, "model": model, "memory_mib": memory, "split_count": 10, "cores": 100, "health": True}
        for i, (uuid, model, memory) in enumerate(devices)
    ]}


@pytest.mark.django_db
def test_inventory_snapshots_keep_the_summary_equal_to_the_gpu_rows():
    cluster, other = ClusterFactory(), ClusterFactory()
    services.inventory_apply(cluster=other, nodes=[_node("o-1", [("GPU-o1", "NVIDIA L4", 23034)])])
    services.inventory_apply(cluster=cluster, nodes=[
        _node("n-1", [("GPU-a1", "NVIDIA H100 80GB HBM3", 81559), ("GPU-a2", "NVIDIA H100 80GB HBM3", 81000)]),
        _node("n-2", [("GPU-b1", "NVIDIA A100-PCIE-40GB", 40960)]),
    ])
    assert _summary() == _recount() == {
        (other.pk, "NVIDIA L4", 23034), (cluster.pk, "NVIDIA H100 80GB HBM3", 81000), (cluster.pk, "NVIDIA A100-PCIE-40GB", 40960)}

    # A GPU re-registered with more memory (the smallest goes up), one changing model, a node gone.
    services.inventory_apply(cluster=cluster, nodes=[
        _node("n-1", [("GPU-a1", "NVIDIA H100 80GB HBM3", 81559), ("GPU-a2", "NVIDIA L4", 23034)]),
    ])
    assert _summary() == _recount() == {
        (other.pk, "NVIDIA L4", 23034), (cluster.pk, "NVIDIA H100 80GB HBM3", 81559), (cluster.pk, "NVIDIA L4", 23034)}

    services.inventory_apply(cluster=cluster, nodes=[])
    assert _summary() == _recount() == {(other.pk, "NVIDIA L4", 23034)}

    services.cluster_deregister(cluster=other)
    assert _summary() == set()


@pytest.mark.django_db
def test_orm_writes_of_gpu_rows_keep_the_summary():
    device = GpuDeviceFactory(model="NVIDIA L4", memory_mib=23034)
    moved_to = NodeFactory()
    GpuDeviceFactory(node=device.node, model="NVIDIA L4", memory_mib=22000)
    assert _summary() == _recount() == {(device.cluster_id, "NVIDIA L4", 22000)}

    GpuDevice.objects.filter(pk=device.pk).update(node=moved_to, cluster=moved_to.cluster, memory_mib=24000)
    assert _summary() == _recount() == {(device.cluster_id, "NVIDIA L4", 22000), (moved_to.cluster_id, "NVIDIA L4", 24000)}

    GpuDevice.objects.filter(used_count=0).update(used_count=0, health=False)  # no summary column: nothing to recompute
    assert _summary() == _recount()

    device.node.delete()  # cascades to its GPUs
    assert _summary() == _recount() == {(moved_to.cluster_id, "NVIDIA L4", 24000)}


@pytest.mark.django_db
def test_admission_prices_on_the_summary():
    cluster = ClusterFactory()
    GpuDeviceFactory(node=NodeFactory(cluster=cluster), model="NVIDIA L4", memory_mib=23034)
    GpuDeviceFactory(node=NodeFactory(cluster=cluster), model="NVIDIA H100 80GB HBM3", memory_mib=81559)
    bare = ClusterFactory()  # no GPUs
    _, models = admission._prices_and_models([cluster.pk, bare.pk])
    assert sorted(models) == [("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA L4", 23034)]
    assert admission._prices_and_models([bare.pk])[1] == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_of_one_clusters_gpus_leave_a_summary_of_both():
    """Two transactions add GPUs of one model to one cluster at once (no cluster lock): the second one's recount
    waits for the first's commit (advisory lock) and then sees its GPU, so it replaces the first's summary row
    (without that wait, it would insert a second row of the model and fail on the unique constraint)."""
    node = NodeFactory()
    first_inserted = threading.Event()
    errors = []

    def first() -> None:
        try:
            with transaction.atomic():
                GpuDeviceFactory(node=node, model="NVIDIA L4", memory_mib=23034)
                first_inserted.set()
                with connection.cursor() as cursor:
                    wait_for(lambda: lock_waiters(cursor) > 0, what="the second writer's recount waiting")
        except Exception as error:  # recorded for the assertion below
            errors.append(error)
        finally:
            first_inserted.set()
            connections.close_all()

    def second() -> None:
        try:
            first_inserted.wait(30)
            with transaction.atomic():
                GpuDeviceFactory(node=node, model="NVIDIA L4", memory_mib=22000)
        except Exception as error:  # recorded for the assertion below
            errors.append(error)
        finally:
            connections.close_all()

    run_threads(lambda role: role(), [(first,), (second,)])
    assert errors == []
    assert _summary() == _recount() == {(node.cluster_id, "NVIDIA L4", 22000)}


@pytest.mark.django_db
def test_every_summary_trigger_runs_once_per_statement():
    """A snapshot may change the memory of every GPU of a cluster in one statement: a row trigger would recompute the
    cluster once per row (8,000 times for a 1,000-node cluster). Bit 0 of ``tgtype`` is set for row triggers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname, tgtype & 1 FROM pg_trigger WHERE tgrelid = 'clusters_gpudevice'::regclass AND tgname LIKE 'gpudevice_models_%'")
        triggers = dict(cursor.fetchall())
    assert set(triggers) == {"gpudevice_models_insert", "gpudevice_models_delete", "gpudevice_models_update"}
    assert set(triggers.values()) == {0}


@pytest.mark.django_db
def test_one_update_of_many_gpus_memory_refreshes_the_summary():
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster)
    for index in range(40):
        GpuDeviceFactory(node=node, cluster=cluster, index=index, model="NVIDIA H100", memory_mib=81559)
    GpuDevice.objects.filter(cluster=cluster).update(memory_mib=40000)
    GpuDevice.objects.filter(cluster=cluster).update(used_count=0)  # counters only: nothing to recompute
    assert _summary() == _recount()
    assert (cluster.pk, "NVIDIA H100", 40000) in _summary()
