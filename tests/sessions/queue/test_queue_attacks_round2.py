"""Round-2 attacks on the queue's batch admission (``planned_reserve`` with its raw INSERT and recount,
``_admit_many_locked`` without the pinned cluster joined, ``fleet_read``'s outside GPUs and tie naming)."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from clusters.models import GpuDevice, Node
from sessions import placement
from sessions.models import Allocation, Session
from sessions.queue.admit import _clusters_lock, queue_pass
from sessions.queue.reserve import planned_reserve
from sessions.queue.snapshot import fleet_read
from sessions.volume_claims import PlacementRaced
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory
from tests.helpers import run_threads
from tests.sessions.queue.helpers import H100, NOW, end, one_node_cluster, planned_outcome, queue_user, queued_session, start
from tests.sessions.test_placement import recount, stored

pytestmark = pytest.mark.usefixtures("frozen", "no_background")


def _node(name="lab-x", *, n=2, split=4, memory=40000):
    node = NodeFactory(cluster=ClusterFactory(name=name), name=f"{name}-node", cpu_allocatable_millicores=64000,
                       memory_allocatable_mib=262144)
    for i in range(n):
        GpuDeviceFactory(node=node, cluster=node.cluster, index=i, split_count=split, memory_mib=memory, cores=100, model=H100)
    placement.usage_recompute(node_ids=[node.pk])
    return node, list(GpuDevice.objects.filter(node=node).order_by("index"))


def _invariants():
    for d in GpuDevice.objects.all():
        assert d.used_count <= d.split_count and d.used_memory_mib <= d.memory_mib and d.used_cores <= d.cores, d.__dict__
        assert not (d.used_exclusive and d.used_count > 1)
    assert recount() == stored()


# ------------------------------------------------------------------ concurrency: two batches on the same GPUs


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shape", ["shares", "whole_vs_share"])
def test_two_batches_reserving_at_once_on_the_same_gpus_never_overfill(shape):
    """Attack: two threads each run a batch (cluster lock + ``planned_reserve``) on the same GPUs, each batch fitting
    alone but not together (3 shares each on split 4; or whole GPUs against shares). Invariant: one commits, the other
    raises ``PlacementRaced`` with nothing written; counters equal a recount."""
    node, gpus = _node()
    if shape == "shares":
        batches = [[queued_session(gpus=2, gpu_memory_mib=1000, gpu_cores=10) for _ in range(3)] for _ in range(2)]
    else:
        batches = [[queued_session(gpus=2, gpu_memory_mib=None, gpu_cores=None)],
                   [queued_session(gpus=1, gpu_memory_mib=1000, gpu_cores=10)]]
    barrier, results = threading.Barrier(2), []

    def work(sessions):
        try:
            barrier.wait()
            with transaction.atomic():
                _clusters_lock({node.cluster_id})
                planned_reserve([(s, planned_outcome(node, s, gpus[: s.gpus])) for s in sessions])
            results.append("ok")
        except PlacementRaced:
            results.append("raced")
        except Exception as exc:  # noqa: BLE001
            results.append(exc)
        finally:
            connections.close_all()

    run_threads(work, [(b,) for b in batches])
    assert sorted(map(str, results)) == ["ok", "raced"], results
    _invariants()


# ------------------------------------------------------------------ changes between plan and admission


@pytest.mark.django_db
@pytest.mark.parametrize("change", ["unhealthy", "split_lowered", "node_not_ready", "duplicate"])
def test_a_change_between_plan_and_admission_is_refused_with_nothing_written(change):
    node, gpus = _node(split=4)
    holder = queued_session(gpus=1, gpu_memory_mib=1000, gpu_cores=25)
    with transaction.atomic():
        planned_reserve([(holder, planned_outcome(node, holder, [gpus[0]]))])
    before = stored()
    sessions = [queued_session(gpus=1, gpu_memory_mib=1000, gpu_cores=25) for _ in range(2)]
    items = [(s, planned_outcome(node, s, [gpus[0]])) for s in sessions]
    if change == "unhealthy":
        GpuDevice.objects.filter(pk=gpus[0].pk).update(health=False)
    elif change == "split_lowered":
        GpuDevice.objects.filter(pk=gpus[0].pk).update(split_count=2)  # held 1: one more fits, two do not
    elif change == "node_not_ready":
        Node.objects.filter(pk=node.pk).update(ready=False)
    else:
        s = queued_session(gpus=2, gpu_memory_mib=1000, gpu_cores=25)
        items = [(s, planned_outcome(node, s, [gpus[1], gpus[1]]))]
    with pytest.raises(PlacementRaced):
        with transaction.atomic():
            planned_reserve(items)
    assert stored() == before
    assert Allocation.objects.count() == 1


@pytest.mark.django_db
def test_a_split_raised_since_the_plan_takes_fewer_cores_than_priced_never_more():
    """Attack (money, other way): split count raised from 2 to 4 after the plan: the share takes 25 cores, priced at 50.
    Held if the session's gpu_cores is what it holds (25), never more than priced."""
    node, gpus = _node(split=2)
    s = queued_session(gpus=1, gpu_memory_mib=1000, gpu_cores=10)
    outcome = planned_outcome(node, s, [gpus[0]])
    GpuDevice.objects.filter(pk=gpus[0].pk).update(split_count=4)
    with transaction.atomic():
        reserved = planned_reserve([(s, outcome)])
    assert reserved[s.pk].cores == 25
    assert list(Allocation.objects.values_list("cores", flat=True)) == [25]
    _invariants()


# ------------------------------------------------------------------ pinned sessions in a batch


@pytest.mark.django_db
@pytest.mark.parametrize("pinned", [False, True], ids=["free", "pinned"])
def test_pinned_queued_sessions_admitted_in_a_batch_look_up_no_cluster_and_land_on_their_cluster(pinned):
    """Attack: ``_admit_many_locked`` no longer joins the pinned cluster; anything reading ``session.requested_cluster``
    later would cost a query per session. Both pinned sessions must land on their pinned cluster (the other one free)."""
    lab, other = one_node_cluster("lab-p", gpus=2), one_node_cluster("lab-q", gpus=2)
    filler = start(queue_user(), gpus=2, runtime_hours=1, cluster=lab.name)
    start(queue_user(), gpus=2, runtime_hours=1, cluster=other.name)
    body = {"cluster": lab.name} if pinned else {}
    queued = [start(queue_user(), gpus=1, runtime_hours=1, queue=True, **body) for _ in range(2)]
    assert all(s.phase == Session.Phase.QUEUED for s in queued)
    end(filler)
    with CaptureQueriesContext(connection) as queries:
        assert queue_pass()["admitted"] == 2
    for s in Session.objects.filter(pk__in=[s.pk for s in queued]):
        assert s.phase == Session.Phase.SCHEDULED and s.cluster_id == lab.pk
    # No lookup of a session's pinned cluster after the lock (the batch locks the clusters it admits on, FOR ...).
    lone = [q["sql"] for q in queries.captured_queries if 'FROM "clusters_cluster"' in q["sql"] and "FOR " not in q["sql"]]
    assert not lone, lone


# ------------------------------------------------------------------ fleet_read


@pytest.mark.django_db
@pytest.mark.parametrize("order", [0, 1])
def test_holders_ending_together_name_the_largest_session_id_whatever_the_order(order):
    node, gpus = _node(n=1, split=4)
    ends = NOW + timedelta(hours=1)
    sessions = [SessionFactory(cluster=node.cluster, phase=Session.Phase.RUNNING, gpus=1, gpu_memory_mib=1000, gpu_cores=25,
                               ends_at=ends, owner=queue_user()) for _ in range(3)]
    if order:
        sessions.reverse()
    for s in sessions:
        Allocation.objects.create(session=s, device=gpus[0], memory_mib=1000, cores=25, exclusive=False)
    placement.usage_recompute(node_ids=[node.pk])
    fleet = fleet_read(now=NOW)
    device = fleet.nodes[0].devices[0]
    assert device.free_at == ends
    assert device.freed_by[0] == max(s.public_id for s in sessions)


@pytest.mark.django_db
def test_a_holder_of_an_unhealthy_gpu_still_counts_its_cpu_and_price_and_the_gpu_is_not_offered():
    node, gpus = _node(n=2, split=4)
    s = SessionFactory(cluster=node.cluster, phase=Session.Phase.RUNNING, gpus=2, gpu_memory_mib=None, gpu_cores=None,
                       cpu=4, memory_gib=8, ends_at=NOW + timedelta(hours=1), owner=queue_user())
    for d in gpus:
        Allocation.objects.create(session=s, device=d, memory_mib=d.memory_mib, cores=100, exclusive=True)
    placement.usage_recompute(node_ids=[node.pk])
    GpuDevice.objects.filter(pk=gpus[0].pk).update(health=False)
    fleet = fleet_read(now=NOW)
    (plan_node,) = fleet.nodes
    assert [d.pk for d in plan_node.devices] == [gpus[1].pk]
    assert plan_node.cpu_free == 64000 - 4000 - plan_node_requested(node)
    assert plan_node.devices[0].free_at == NOW + timedelta(hours=1)


def plan_node_requested(node):
    return Node.objects.get(pk=node.pk).cpu_requested_millicores


# ------------------------------------------------------------------ billing


@pytest.mark.django_db
@pytest.mark.parametrize("gpus_each", [1, 2])
def test_an_owner_affording_one_queued_session_never_gets_two_started_in_one_pass(gpus_each):
    """Attack (money): one owner with two queued sessions, credits for one (``min_balance_hours`` 1 at 10 credits per
    GPU-hour). The batch takes an owner's first; the second goes one by one in the same pass. Invariant: the owner
    never holds more GPUs than its balance covers at admission time."""
    from decimal import Decimal

    from billing.models import Price
    from billing.services import credit_grant

    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal(10))
    lab = one_node_cluster("lab-b", gpus=4)
    filler = start(queue_user(), gpus=4, runtime_hours=1)
    owner = queue_user(min_balance_hours=Decimal(1))
    credit_grant(user=owner, amount=Decimal(10 * gpus_each + 5), reason="t", idempotency_key=f"{owner.pk}:g", created_by="t")
    queued = [start(owner, gpus=gpus_each, runtime_hours=1, queue=True) for _ in range(2)]
    assert all(s.phase == Session.Phase.QUEUED for s in queued)
    end(filler)
    queue_pass()
    queue_pass()
    held = Allocation.objects.filter(session__owner=owner).count()
    assert held == gpus_each, (held, list(Session.objects.filter(owner=owner).values_list("phase", "stop_reason")))
    placement.usage_recompute(cluster_ids=[lab.pk])
    _invariants()
