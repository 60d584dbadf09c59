"""Reserving the plan's GPUs for several queued sessions at once (``sessions.queue.reserve.planned_reserve``): the fit
is checked session after session on the counters read under the locks, with the same rules as a reservation alone;
anything that no longer fits raises ``PlacementRaced`` before a row is written."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import transaction

from clusters.models import GpuDevice, Node
from sessions import placement
from sessions.models import Allocation
from sessions.queue.plan import Fleet, Job
from sessions.queue.plan import Node as PlanNode
from sessions.queue.reserve import planned_reserve
from sessions.volume_claims import PlacementRaced
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory
from tests.sessions.queue.helpers import planned_outcome, queued_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    cluster = ClusterFactory(name="lab-r")
    node = NodeFactory(cluster=cluster, cpu_allocatable_millicores=16000, memory_allocatable_mib=65536)
    for i in range(2):
        GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=40000, cores=100)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return node


def _devices(node):
    return list(GpuDevice.objects.filter(node=node).order_by("index"))


def test_two_shares_on_one_gpu_are_reserved_together_with_the_cores_a_share_takes(node):
    first, second = queued_session(gpu_memory_mib=10000, gpu_cores=10), queued_session(gpu_memory_mib=20000, gpu_cores=50)
    gpu = _devices(node)[0]
    with transaction.atomic():
        reserved = planned_reserve([(first, planned_outcome(node, first, [gpu])), (second, planned_outcome(node, second, [gpu]))])
    # A share takes at least one of the GPU's 4 split slots (25 %).
    assert reserved[first.pk].cores == 25 and reserved[second.pk].cores == 50
    assert reserved[first.pk].node_name == node.name
    rows = sorted(Allocation.objects.filter(device=gpu).values_list("session_id", "memory_mib", "cores", "exclusive"))
    assert rows == [(first.pk, 10000, 25, False), (second.pk, 20000, 50, False)]
    gpu.refresh_from_db()
    assert (gpu.used_count, gpu.used_memory_mib, gpu.used_cores) == (2, 30000, 75)


def test_a_second_session_that_no_longer_fits_after_the_first_raises_and_writes_nothing(node):
    first, second = queued_session(gpu_memory_mib=30000, gpu_cores=50), queued_session(gpu_memory_mib=20000, gpu_cores=50)
    gpu = _devices(node)[0]
    with pytest.raises(PlacementRaced), transaction.atomic():
        planned_reserve([(first, planned_outcome(node, first, [gpu])), (second, planned_outcome(node, second, [gpu]))])
    assert not Allocation.objects.exists()


def test_a_whole_gpu_taken_meanwhile_raises(node):
    holder = SessionFactory(cluster=node.cluster, node=node.name)
    gpu = _devices(node)[0]
    Allocation.objects.create(session=holder, device=gpu, memory_mib=gpu.memory_mib, cores=100, exclusive=True)
    placement.usage_recompute(node_ids=[node.pk])
    waiting = queued_session()
    with pytest.raises(PlacementRaced), transaction.atomic():
        planned_reserve([(waiting, planned_outcome(node, waiting, [gpu]))])
    assert not Allocation.objects.filter(session=waiting).exists()


def test_a_node_without_room_for_the_cpu_left_raises(node):
    big = queued_session(cpu=Decimal(12))
    other = queued_session(cpu=Decimal(8))
    first, second = _devices(node)
    with pytest.raises(PlacementRaced), transaction.atomic():
        planned_reserve([(big, planned_outcome(node, big, [first])), (other, planned_outcome(node, other, [second]))])
    assert not Allocation.objects.exists()
    with transaction.atomic():
        reserved = planned_reserve([(big, planned_outcome(node, big, [first]))])
    assert set(reserved) == {big.pk}


def test_an_unhealthy_gpu_or_a_node_not_ready_raises(node):
    waiting = queued_session()
    first, second = _devices(node)
    GpuDevice.objects.filter(pk=first.pk).update(health=False)
    with pytest.raises(PlacementRaced), transaction.atomic():
        planned_reserve([(waiting, planned_outcome(node, waiting, [first]))])
    Node.objects.filter(pk=node.pk).update(ready=False)
    with pytest.raises(PlacementRaced), transaction.atomic():
        planned_reserve([(waiting, planned_outcome(node, waiting, [second]))])
    assert not Allocation.objects.exists()


def test_a_model_the_session_does_not_accept_raises(node):
    waiting = queued_session(gpu_models=["NVIDIA L40S"])
    with pytest.raises(PlacementRaced), transaction.atomic():
        planned_reserve([(waiting, planned_outcome(node, waiting, _devices(node)[:1]))])
    assert not Allocation.objects.exists()


def test_the_counters_after_a_batch_equal_the_recount(node):
    sessions = [queued_session(gpu_memory_mib=8000, gpu_cores=25) for _ in range(3)]
    first, second = _devices(node)
    with transaction.atomic():
        planned_reserve([(s, planned_outcome(node, s, [first if i < 2 else second])) for i, s in enumerate(sessions)])
    before = list(GpuDevice.objects.filter(node=node).order_by("pk").values_list("used_count", "used_memory_mib", "used_cores"))
    assert placement.usage_recompute(node_ids=[node.pk]) == []
    after = list(GpuDevice.objects.filter(node=node).order_by("pk").values_list("used_count", "used_memory_mib", "used_cores"))
    assert before == after == [(2, 16000, 50), (1, 8000, 25)]


@pytest.mark.django_db(databases=[])
def test_the_plan_judges_a_nodes_room_as_placement_does():
    """``Fleet._room`` is placement's ``_RESOURCE_FIT``: a job asking CPU or memory needs room for both (0 for the one it
    does not ask), so a node already over its CPU takes no memory-only job; a job asking neither is not checked; a node
    without allocatable figures has no limit."""
    over_cpu = PlanNode(pk=1, name="n1", cluster_id=1, cluster_name="c", devices=[], cpu_free=-500, memory_free=4096)
    unreported = PlanNode(pk=2, name="n2", cluster_id=1, cluster_name="c", devices=[], cpu_free=None, memory_free=None)
    Fleet([over_cpu, unreported], now=datetime(2026, 12, 1, tzinfo=UTC))
    memory_only, nothing = Job(key=1, public_id="", gpus=1, ram_mib=1024), Job(key=2, public_id="", gpus=1)
    assert Fleet._room(memory_only, over_cpu) is False
    assert Fleet._room(nothing, over_cpu) is True
    assert Fleet._room(Job(key=3, public_id="", gpus=1, cpu_milli=10**6, ram_mib=10**6), unreported) is True
    assert Fleet._room(Job(key=4, public_id="", gpus=1, ram_mib=4096), PlanNode(pk=3, name="n3", cluster_id=1, cluster_name="c",
                                                                              devices=[], cpu_free=0, memory_free=4096)) is True
