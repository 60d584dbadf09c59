"""Attacks on the batched reservation of the queue's plan (``sessions.queue.reserve.planned_reserve``), on what it
writes and prices, and on the refusal at once in ``sessions.create`` of a request the queue may be in the way of when
the fit query finds nothing ("Nothing fits now even before the queue's claims").

The reservation's oracle is ``placement.reserve`` (the SQL reservation, the one-by-one path ``_admit`` takes) on the
same GPUs, session after session: whatever it refuses, the batch must refuse (``PlacementRaced``, never another
error); whatever it accepts, the batch must write the same ``Allocation`` rows, node and ``gpu_cores``. Each test says
in its docstring what it attacks and whether the attack held. On a frozen clock, real PostgreSQL."""

from decimal import Decimal

import pytest
from django.db import transaction

from billing.models import Price
from billing.services import credit_grant, policy_set
from clusters.models import GpuDevice, Node
from sessions import create, placement
from sessions.models import Allocation, Session
from sessions.queue import admit
from sessions.queue.admit import queue_pass
from sessions.queue.reserve import planned_reserve
from sessions.queue.snapshot import fleet_read
from sessions.volume_claims import PlacementRaced
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory
from tests.sessions.queue.helpers import H100, HOUR, NOW, end, planned_outcome, queued_session, start
from tests.sessions.test_volumes import make_pool, make_volume

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("frozen", "no_background")]


# --------------------------------------------------------------------------- planned_reserve against placement.reserve


def _gpus(node, *, n=2, split=4, memory=40000, model=H100):
    for i in range(n):
        GpuDeviceFactory(node=node, cluster=node.cluster, index=i, split_count=split, memory_mib=memory, cores=100, model=model)
    placement.usage_recompute(node_ids=[node.pk])
    return list(GpuDevice.objects.filter(node=node).order_by("index"))


@pytest.fixture
def node():
    """lab-r's node: 2 H100s split 4 of 40000 MiB, 16 cores and 64 GiB allocatable."""
    node = NodeFactory(cluster=ClusterFactory(name="lab-r"), cpu_allocatable_millicores=16000, memory_allocatable_mib=65536)
    _gpus(node)
    return node


class _Undo(Exception):
    pass


def _undone(work):
    """``work()``'s answer, with everything it wrote rolled back."""
    answer = []
    try:
        with transaction.atomic():
            answer.append(work())
            raise _Undo
    except _Undo:
        pass
    return answer[0]


def _rows(sessions):
    return sorted(Allocation.objects.filter(session__in=sessions).values_list("session_id", "device_id", "memory_mib", "cores",
                                                                               "exclusive"))


def _sql_says(items):
    """What ``placement.reserve`` (the SQL reservation) does with ``[(session, node, devices)]`` one after the other:
    None when it refuses one, else ``(allocations, {session pk: (node, gpu_cores)})``."""
    def work():
        for session, node, devices in items:
            request = placement.Request(gpus=session.gpus, memory_mib=session.gpu_memory_mib, cores=session.gpu_cores,
                                        models=tuple(session.gpu_models or ()), cpu=session.cpu, memory_gib=session.memory_gib)
            reserved = placement.reserve(session_id=session.pk, request=request, cluster_id=node.cluster_id, node_id=node.pk,
                                         device_ids=[d.pk for d in devices])
            if reserved is None or set(reserved.device_ids) & set(reserved.over):
                return None
        sessions = [s for s, _, _ in items]
        return _rows(sessions), {s.pk: (s.node, s.gpu_cores) for s in Session.objects.filter(pk__in=[s.pk for s in sessions])}
    return _undone(work)


def _batch_says(items):
    """What ``planned_reserve`` does with the same items: None when it raises ``PlacementRaced``, else what
    ``_sql_says`` answers (the node and cores it returns for each session, as ``_admit_many_locked`` writes them)."""
    def work():
        try:
            reserved = planned_reserve([(session, planned_outcome(node, session, devices)) for session, node, devices in items])
        except PlacementRaced:
            return None
        sessions = [s for s, _, _ in items]
        return _rows(sessions), {s.pk: (reserved[s.pk].node_name, s.gpu_cores if reserved[s.pk].cores is None else reserved[s.pk].cores)
                                 for s in sessions}
    return _undone(work)


def _same(items, *, accepted: bool):
    """The batch answers as the SQL reservation does for ``items``, which ``accepted`` says it does (the attack's premise)."""
    sql, batch = _sql_says(items), _batch_says(items)
    assert (sql is not None) == accepted, sql
    assert batch == sql, (batch, sql)
    return batch


def test_a_whole_gpu_and_a_share_on_one_gpu_in_one_batch_are_refused_in_either_order(node):
    """Attack: a whole GPU and a share of the same GPU in one batch (the share first, then the whole one; and the other
    way). Held: the counters the first one leaves make the second unfit, as in SQL."""
    gpu = GpuDevice.objects.filter(node=node).order_by("index").first()
    whole, share = queued_session(), queued_session(gpu_memory_mib=1000, gpu_cores=10)
    _same([(share, node, [gpu]), (whole, node, [gpu])], accepted=False)
    _same([(whole, node, [gpu]), (share, node, [gpu])], accepted=False)
    _same([(whole, node, [gpu])], accepted=True)


def test_shares_over_memory_cores_or_split_count_in_one_batch_are_refused(node):
    """Attack: shares on one GPU that fit one by one but not together: over its memory, its cores, its split count (2),
    and three shares whose asked cores fit but whose split slots (ceil(100/2) = 50 each) do not. Held."""
    gpu = GpuDevice.objects.filter(node=node).order_by("index").first()
    over_memory = [queued_session(gpu_memory_mib=30000, gpu_cores=10), queued_session(gpu_memory_mib=20000, gpu_cores=10)]
    over_cores = [queued_session(gpu_memory_mib=1000, gpu_cores=60), queued_session(gpu_memory_mib=1000, gpu_cores=50)]
    for pair in (over_memory, over_cores):
        _same([(s, node, [gpu]) for s in pair], accepted=False)
        _same([(pair[0], node, [gpu])], accepted=True)
    GpuDevice.objects.filter(pk=gpu.pk).update(split_count=2)
    placement.usage_recompute(node_ids=[node.pk])
    gpu.refresh_from_db()  # the plan reads the split count too (what the share is priced at)
    tiny = [queued_session(gpu_memory_mib=100, gpu_cores=1) for _ in range(3)]
    _same([(s, node, [gpu]) for s in tiny], accepted=False)
    rows, sessions = _same([(s, node, [gpu]) for s in tiny[:2]], accepted=True)
    assert [r[3] for r in rows] == [50, 50] and {c for _, c in sessions.values()} == {50}


def test_a_share_on_a_gpu_held_whole_or_split_one_is_refused(node):
    """Attack: a share on a GPU whose ``used_exclusive`` is set (a whole-GPU holder), and two shares of a GPU split 1
    (each takes its one slot, 100 % of the cores). Held."""
    first, second = GpuDevice.objects.filter(node=node).order_by("index")
    holder = SessionFactory(cluster=node.cluster, node=node.name)
    Allocation.objects.create(session=holder, device=first, memory_mib=first.memory_mib, cores=100, exclusive=True)
    GpuDevice.objects.filter(pk=second.pk).update(split_count=1)
    placement.usage_recompute(node_ids=[node.pk])
    second.refresh_from_db()
    share, other = queued_session(gpu_memory_mib=1000, gpu_cores=1), queued_session(gpu_memory_mib=1000, gpu_cores=1)
    _same([(share, node, [first])], accepted=False)
    _same([(share, node, [second]), (other, node, [second])], accepted=False)
    rows, sessions = _same([(share, node, [second])], accepted=True)
    assert rows == [(share.pk, second.pk, 1000, 100, False)] and sessions[share.pk] == (node.name, 100)


def test_a_device_of_another_node_or_cluster_or_one_that_does_not_exist_is_refused(node):
    """Attack: an outcome naming a GPU of another node of the same cluster, of another cluster, a GPU id that does not
    exist, and GPUs spread over two nodes. Held: each raises ``PlacementRaced`` (the SQL fit only looks at the node's
    own GPUs) and nothing is written."""
    sibling = NodeFactory(cluster=node.cluster)
    elsewhere = NodeFactory(cluster=ClusterFactory(name="lab-s"))
    (theirs,), (far,) = _gpus(sibling, n=1), _gpus(elsewhere, n=1)
    mine = GpuDevice.objects.filter(node=node).order_by("index").first()
    waiting, pair = queued_session(), queued_session(gpus=2)
    for devices in ([theirs], [far], [GpuDevice(pk=10**9, model=H100, memory_mib=1, cores=100, split_count=1)]):
        _same([(waiting, node, devices)], accepted=False)
    _same([(pair, node, [mine, theirs])], accepted=False)
    assert not Allocation.objects.exists()


def test_a_device_named_twice_in_one_outcome_is_refused_as_a_race_not_an_integrity_error(node):
    """Attack: a 2-GPU session whose outcome lists one GPU twice (a whole pair, and a share pair: both fit on the GPU's
    counters read before either is taken). Worked: the duplicate passed the Python fit and the bulk INSERT broke the
    ``allocation_once_per_device`` constraint: an ``IntegrityError`` out of the pass (neither ``PlacementRaced``, which
    the pass falls back on, nor the SQL reservation's refusal: it takes distinct GPUs and finds only one). Fixed:
    ``planned_reserve`` refuses an outcome that does not name ``gpus`` distinct GPUs."""
    gpu = GpuDevice.objects.filter(node=node).order_by("index").first()
    whole_pair, share_pair = queued_session(gpus=2), queued_session(gpus=2, gpu_memory_mib=1000, gpu_cores=10)
    for session in (whole_pair, share_pair):
        _same([(session, node, [gpu, gpu])], accepted=False)
    assert not Allocation.objects.exists()


def test_capacity_lowered_below_what_is_held_takes_no_share_and_the_recount_guards(node):
    """Attack: HAMi's capacity lowered by an inventory below what is held (memory 40000 -> 5000 under a 10000 MiB
    share): a share no longer fits; a whole GPU does not either (something is on it). Held, as in SQL."""
    gpu = GpuDevice.objects.filter(node=node).order_by("index").first()
    holder = SessionFactory(cluster=node.cluster, node=node.name, gpu_memory_mib=10000, gpu_cores=25)
    Allocation.objects.create(session=holder, device=gpu, memory_mib=10000, cores=25, exclusive=False)
    GpuDevice.objects.filter(pk=gpu.pk).update(memory_mib=5000)
    assert placement.usage_recompute(node_ids=[node.pk]) == [gpu.pk]
    _same([(queued_session(gpu_memory_mib=1, gpu_cores=1), node, [gpu])], accepted=False)
    _same([(queued_session(), node, [gpu])], accepted=False)


def test_a_share_without_memory_takes_the_whole_memory_and_one_without_cores_all_cores(node):
    """Attack: a share asking cores only (no memory: HAMi gives it the whole memory) then another share of the same GPU;
    a share asking memory only (no cores: 100 %). Held: the rows carry the whole memory / all cores, and the second
    share does not fit, as in SQL."""
    gpu = GpuDevice.objects.filter(node=node).order_by("index").first()
    cores_only, memory_only, small = queued_session(gpu_cores=10), queued_session(gpu_memory_mib=1000), queued_session(gpu_memory_mib=1000, gpu_cores=10)
    rows, _ = _same([(cores_only, node, [gpu])], accepted=True)
    assert rows == [(cores_only.pk, gpu.pk, 40000, 25, False)]
    rows, sessions = _same([(memory_only, node, [gpu])], accepted=True)
    assert rows == [(memory_only.pk, gpu.pk, 1000, 100, False)] and sessions[memory_only.pk] == (node.name, 100)
    _same([(cores_only, node, [gpu]), (small, node, [gpu])], accepted=False)
    _same([(memory_only, node, [gpu]), (small, node, [gpu])], accepted=False)


def test_cpu_and_memory_of_the_node_null_or_set_and_of_its_sessions_count_as_in_sql(node):
    """Attack: a node reporting memory but no CPU (CPU NULL: no CPU limit, memory still limited), and the CPU of the
    sessions already on a node. Held: accepted and refused as in SQL."""
    Node.objects.filter(pk=node.pk).update(cpu_allocatable_millicores=None)
    first, second = GpuDevice.objects.filter(node=node).order_by("index")
    greedy = [queued_session(cpu=Decimal(50), memory_gib=Decimal(10)), queued_session(cpu=Decimal(50), memory_gib=Decimal(10))]
    _same([(greedy[0], node, [first]), (greedy[1], node, [second])], accepted=True)
    hungry = [queued_session(memory_gib=Decimal(40)), queued_session(memory_gib=Decimal(30))]
    _same([(hungry[0], node, [first]), (hungry[1], node, [second])], accepted=False)
    Node.objects.filter(pk=node.pk).update(cpu_allocatable_millicores=16000, cpu_requested_millicores=2000)
    holder = SessionFactory(cluster=node.cluster, node=node.name, cpu=Decimal(10), gpu_memory_mib=1000, gpu_cores=10)
    Allocation.objects.create(session=holder, device=first, memory_mib=1000, cores=10, exclusive=False)
    placement.usage_recompute(node_ids=[node.pk])
    _same([(queued_session(cpu=Decimal(5)), node, [second])], accepted=False)  # 16 - 2 - 10 = 4 cores left
    _same([(queued_session(cpu=Decimal(4)), node, [second])], accepted=True)


def test_a_session_asking_no_cpu_does_not_lift_the_nodes_cpu_limit_for_the_next(node):
    """Attack: two sessions on one node in one batch, the first asking no CPU (a policy whose default is 0), the
    second more CPU than the node has left (and the same with memory). Worked: after a session asking none, the room
    left on the node was set to None ("no limit") instead of kept, so the second was reserved past the node's
    allocatable CPU, which the SQL reservation refuses. Reachable without a race: the plan counts the room from the
    healthy GPUs only (``snapshot.fleet_read``), so a session on a GPU gone unhealthy is not subtracted there. Fixed:
    a session that asks none leaves the room as it is."""
    first, second = GpuDevice.objects.filter(node=node).order_by("index")
    light, heavy = queued_session(), queued_session(cpu=Decimal(20))
    _same([(light, node, [first]), (heavy, node, [second])], accepted=False)
    light, heavy = queued_session(), queued_session(memory_gib=Decimal(70))
    _same([(light, node, [first]), (heavy, node, [second])], accepted=False)
    light, fits = queued_session(), queued_session(cpu=Decimal(16), memory_gib=Decimal(64))
    _same([(light, node, [first]), (fits, node, [second])], accepted=True)


def test_a_memory_only_request_on_a_node_over_its_cpu_is_refused_as_in_sql(node):
    """Attack: a node whose other pods request more CPU than it now has (allocatable lowered) and a session asking
    memory but no CPU. Worked: the batch skipped the CPU check (nothing asked) and reserved, while the SQL reservation
    (``_RESOURCE_FIT``: a request asking CPU or memory needs both rooms >= what it asks, 0 for the one not asked)
    refuses it, so the batch and the one-by-one path disagreed. Fixed: a session asking CPU or memory checks both
    rooms, the one not asked at 0 (placement's rule). A session asking neither is not checked, as in SQL."""
    Node.objects.filter(pk=node.pk).update(cpu_requested_millicores=17000)
    gpu = GpuDevice.objects.filter(node=node).order_by("index").first()
    _same([(queued_session(memory_gib=Decimal(1)), node, [gpu])], accepted=False)
    _same([(queued_session(), node, [gpu])], accepted=True)


# --------------------------------------------------------------------------- money: priced as reserved


def queue_user(**policy):
    user = UserFactory()
    policy_set(user=user, **{"min_balance_hours": Decimal(0), "max_runtime_hours": Decimal(24), "max_queued_sessions": 10, **policy})
    return user


@pytest.fixture
def lab():
    """lab-m: one node, two H100s split 10 of 81559 MiB."""
    cluster = ClusterFactory(name="lab-m")
    node = NodeFactory(cluster=cluster, name="lab-m-node")
    _gpus(node, n=2, split=10, memory=81559)
    return cluster


@pytest.mark.parametrize("owners", [1, 2], ids=["one_by_one", "batch"])
def test_a_share_whose_gpu_split_count_drops_after_the_plan_is_not_admitted_at_more_cores_than_priced(lab, monkeypatch, owners):
    """Attack (money): ``_judge`` prices a share at ``share_cores`` on the split counts the plan read (10: 10 % for a
    5 % share); an inventory lowers the split count to 2 before the pass locks the cluster, so the reservation takes
    50 % of the cores, five times the price checked. Owners with 2 credits at 10 credits/GPU-hour and
    ``min_balance_hours`` 1 afford 10 % (1 credit) but not 50 % (5). Worked: admitted at ``gpu_cores`` 50, by the
    batch (``planned_reserve``) and one by one (``placement.reserve``). Fixed: both raise ``PlacementRaced`` when
    they would reserve more cores than the plan's GPUs were priced at; the session waits, and the next pass plans and
    prices on the new split count (here: dropped, its owner cannot pay)."""
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal(10))
    filler = start(queue_user(), gpus=2, runtime_hours=1)
    queued = []
    for _ in range(owners):
        owner = queue_user(min_balance_hours=Decimal(1))
        credit_grant(user=owner, amount=Decimal(2), reason="test", idempotency_key=f"{owner.pk}:g", created_by="test")
        queued.append(start(owner, gpu_memory_mib=1000, gpu_cores=5, runtime_hours=1, queue=True))
    assert all(s.phase == Session.Phase.QUEUED for s in queued)
    end(filler)
    real = admit.plan

    def plan_then_inventory(fleet, jobs):
        outcomes = real(fleet, jobs)
        GpuDevice.objects.filter(cluster=lab).update(split_count=2)  # the inventory, between the plan and the locks
        return outcomes

    monkeypatch.setattr(admit, "plan", plan_then_inventory)
    assert queue_pass()["admitted"] == 0
    for session in Session.objects.filter(pk__in=[s.pk for s in queued]):
        assert session.phase == Session.Phase.QUEUED and session.gpu_cores == 5, (session.phase, session.gpu_cores)
    assert not Allocation.objects.exists()
    monkeypatch.setattr(admit, "plan", real)
    assert queue_pass()["dropped"] == owners  # priced on split count 2 now: 5 credits needed, 2 held
    assert all(s.stop_reason == Session.StopReason.CREDITS for s in Session.objects.filter(pk__in=[s.pk for s in queued]))


def test_a_share_priced_at_its_split_slot_is_admitted_at_it(lab):
    """Attack (money): a 5 % share on GPUs split 10 is priced by ``_judge`` at 10 % (its split slot) and reserved at
    10 %, by the batch and one by one. Held: the cores reserved are the cores priced, and are the session's
    ``gpu_cores`` (what it is billed at)."""
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal(10))
    filler = start(queue_user(), gpus=2, runtime_hours=1)
    queued = [start(queue_user(), gpu_memory_mib=1000, gpu_cores=5, runtime_hours=1, queue=True) for _ in range(3)]
    end(filler)
    assert queue_pass()["admitted"] == 3
    assert sorted(Allocation.objects.values_list("cores", flat=True)) == [10, 10, 10]
    assert {s.gpu_cores for s in Session.objects.filter(pk__in=[s.pk for s in queued])} == {10}


# --------------------------------------------------------------------------- create: refused at once when nothing fits


@pytest.fixture
def busy():
    """lab-a: one node of four H100s split 4; a 2-GPU session for 2 hours on two of them and a 4-GPU session queued
    for the node (so any new request for lab-a is contested: the queue may be in its way)."""
    cluster = ClusterFactory(name="lab-a")
    node = NodeFactory(cluster=cluster, name="lab-a-node", cpu_allocatable_millicores=64000, memory_allocatable_mib=262144)
    _gpus(node, n=4, split=4, memory=81559)
    holder = start(queue_user(), gpus=2, runtime_hours=2)
    waiting = start(queue_user(), gpus=4, runtime_hours=1, queue=True)
    assert waiting.phase == Session.Phase.QUEUED and waiting.estimated_start == NOW + 2 * HOUR
    return cluster, holder, waiting


def test_backfill_into_the_hole_before_the_queued_session_still_starts(busy):
    """Attack: a request the plan backfills (2 free GPUs held for a session planned in 2 hours; a 1-hour request fits
    in that hole), unpinned, pinned, of the node's model, sized in CPU and memory, and a share: the fit query must not
    refuse what the plan starts. Held: all start now; a request longer than the hole is refused (behind the queue) or
    queued with ``"queue": true``."""
    cluster, _, waiting = busy
    for body in ({}, {"cluster": "lab-a"}, {"gpu_models": [H100]}, {"cpu": "4", "memory_gib": "16"},
                 {"gpu_memory_mib": 1000, "gpu_cores": 10}):
        placed = start(queue_user(), runtime_hours=1, **body)
        assert placed.phase == Session.Phase.SCHEDULED and placed.cluster_id == cluster.pk, body
        end(placed)
    with pytest.raises(create.Conflict) as refused:
        start(queue_user(), runtime_hours=3)
    assert refused.value.code == "no_capacity" and '"queue": true' in refused.value.detail
    queued = start(queue_user(), runtime_hours=3, queue=True)
    assert queued.phase == Session.Phase.QUEUED and queued.estimated_start is not None
    assert Session.objects.get(pk=waiting.pk).phase == Session.Phase.QUEUED


def test_a_request_mounting_a_volume_still_starts_in_the_hole(busy):
    """Attack: a request mounting a volume bound on lab-a (its scope: the volume's cluster) that fits the hole. Held."""
    cluster, _, _ = busy
    owner = queue_user()
    volume = make_volume(owner, make_pool(cluster), cluster=cluster)
    placed = start(owner, runtime_hours=1, volumes=[volume.public_id])
    assert placed.phase == Session.Phase.SCHEDULED and placed.cluster_id == cluster.pk


def test_a_request_nothing_fits_is_refused_at_once_or_queued_with_an_estimate(busy):
    """Attack: requests the fit query finds nothing for (3 GPUs; a model whose only GPU is held; more CPU than the node has): refused
    with ``no_capacity`` without planning, and each queued with ``"queue": true`` with an estimate when it could ever
    start (the 3 GPUs: in 2 hours, after the queued session ahead of it, 3 hours). Held."""
    other = NodeFactory(cluster=ClusterFactory(name="lab-l"), name="lab-l-node")
    _gpus(other, n=1, model="NVIDIA L40S")
    assert start(queue_user(), gpu_models=["NVIDIA L40S"], runtime_hours=1).phase == Session.Phase.SCHEDULED  # lab-l is full now
    for body in ({"gpus": 3}, {"gpu_models": ["NVIDIA L40S"]}, {"cpu": "65", "gpus": 1}):
        with pytest.raises(create.Conflict) as refused:
            start(queue_user(max_cpu_per_gpu=Decimal(100)), runtime_hours=1, **body)
        assert refused.value.code == "no_capacity", body
    queued = start(queue_user(), gpus=3, runtime_hours=1, queue=True)
    assert queued.phase == Session.Phase.QUEUED and queued.estimated_start == NOW + 3 * HOUR


def test_a_request_the_plan_overrates_the_room_for_is_refused_since_its_reservation_would_be(busy):
    """Attack: the plan counts a node's room from its healthy GPUs only (``snapshot.fleet_read``): a session on a GPU
    gone unhealthy keeps its 60 cores on the node but the plan does not subtract them, so it would start a 16-core
    request there, which the fit query (and the SQL reservation after it) refuse. Held: refused at once with
    ``no_capacity``; the plan's start could never have been reserved (the SQL reservation counts every session with a
    GPU on the node), so no request the plan could really start is refused."""
    cluster, holder, _ = busy
    gone = Allocation.objects.filter(session=holder).values_list("device_id", flat=True)
    Session.objects.filter(pk=holder.pk).update(cpu=Decimal(60))
    GpuDevice.objects.filter(pk__in=gone).update(health=False)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    with pytest.raises(create.Conflict) as refused:
        start(queue_user(max_cpu_per_gpu=Decimal(100)), runtime_hours=1, cpu="16")
    assert refused.value.code == "no_capacity"
    assert start(queue_user(), runtime_hours=1, cpu="4").phase == Session.Phase.SCHEDULED


def test_the_plan_still_counts_the_cpu_of_a_session_whose_gpus_went_unhealthy(busy):
    """The plan's picture of a node's room (``snapshot.fleet_read``) subtracts every session holding GPUs there, found by
    its node, not by its GPUs: one whose GPUs went unhealthy keeps its CPU and memory on the node until it ends."""
    cluster, holder, _ = busy
    Session.objects.filter(pk=holder.pk).update(cpu=Decimal(60), memory_gib=Decimal(100))
    (before,) = [n for n in fleet_read(now=NOW).nodes if n.cluster_id == cluster.pk]
    assert (before.cpu_free, before.memory_free) == (64000 - 60000, 262144 - 102400)
    GpuDevice.objects.filter(pk__in=Allocation.objects.filter(session=holder).values("device_id")).update(health=False)
    (after,) = [n for n in fleet_read(now=NOW).nodes if n.cluster_id == cluster.pk]
    assert (after.cpu_free, after.memory_free) == (before.cpu_free, before.memory_free)
    assert len(after.devices) == 2  # the unhealthy GPUs are out of the picture, their holder's CPU and memory are not
