"""Placement: HAMi sharing semantics, policies, determinism, and no double-booking under threads."""

import random
import threading
import time

import pytest
import yaml
from django.db import IntegrityError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import contract
from clusters import services as cluster_services
from clusters.models import Cluster, GpuDevice, Node
from core.exceptions import Conflict
from sessions import create, lifecycle, placement
from sessions.lifecycle import outbox
from sessions.models import Allocation, Session
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory
from tests.helpers import run_threads, silent_kubeconfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice")


def fleet(nodes=2, gpus=2, split=4, memory=16000, cores=100, name=None):
    cluster = ClusterFactory(**({"name": name} if name else {}))
    for _ in range(nodes):
        node = NodeFactory(cluster=cluster)
        for i in range(gpus):
            GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=split, memory_mib=memory, cores=cores)
    placement.usage_recompute(cluster_ids=[cluster.pk])  # rows made by factories, not by inventory_apply
    return cluster


def test_whole_gpus_are_exclusive(user):
    fleet(nodes=1, gpus=2)
    a = create.session_create(owner=user, image="img", gpus=1)
    b = create.session_create(owner=user, image="img", gpus=1)
    assert a.phase == Session.Phase.SCHEDULED
    assert {x.device_id for x in a.allocations.all()} != {x.device_id for x in b.allocations.all()}
    with pytest.raises(Conflict) as info:
        create.session_create(owner=user, image="img", gpus=1)
    assert info.value.code == "no_capacity"
    assert "2 healthy GPU(s)" in info.value.detail and "0 with nothing on them" in info.value.detail


def test_shares_respect_split_memory_and_cores(user):
    fleet(nodes=1, gpus=1, split=3, memory=10000, cores=200)  # HAMi's core scaling 2: 200 % of cores registered
    for _ in range(2):
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=4000, gpu_cores=80)
    with pytest.raises(Conflict):  # memory: 8000 + 4000 > 10000
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=4000, gpu_cores=10)
    with pytest.raises(Conflict):  # cores: 160 + 50 > 200
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=50)
    third = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=2000, gpu_cores=20)
    # A share takes at least one of the 3 split slots' worth of cores: ceil(100 / 3) = 34 %, reserved and kept.
    assert third.gpu_cores == 34 and third.allocations.get().cores == 34
    assert Session.objects.get(pk=third.pk).gpu_cores == 34
    with pytest.raises(Conflict):  # split count 3 reached
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1, gpu_cores=1)
    with pytest.raises(Conflict):  # whole GPU needs an empty device
        create.session_create(owner=user, image="img", gpus=1)


def test_multi_gpu_sessions_stay_on_one_node(user):
    fleet(nodes=2, gpus=2)
    session = create.session_create(owner=user, image="img", gpus=2)
    nodes = {a.device.node_id for a in session.allocations.select_related("device")}
    assert len(nodes) == 1 and session.allocations.count() == 2
    with pytest.raises(Conflict):
        create.session_create(owner=user, image="img", gpus=3)


def test_binpack_fills_the_busy_node_and_spread_the_idle_one(user, settings):
    fleet(nodes=2, gpus=4)
    first = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=10)
    second = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=10)
    assert first.node == second.node
    assert first.allocations.get().device_id == second.allocations.get().device_id  # same GPU: binpack
    settings.GSHARE_PLACEMENT_POLICY = "spread"
    third = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=10)
    assert third.node != first.node


def test_decisions_are_deterministic(user):
    fleet(nodes=3, gpus=2, name="zeta")
    fleet(nodes=3, gpus=2, name="alpha")
    picks = []
    for _ in range(2):
        session = create.session_create(owner=user, image="img", gpus=1)
        picks.append((session.cluster.name, session.node, session.allocations.get().device.index))
        lifecycle.session_fail(session=session, message="test")
    assert picks[0] == picks[1]
    assert picks[0][0] == "alpha"


def test_unhealthy_devices_unready_nodes_and_other_clusters_are_skipped(user):
    cluster = fleet(nodes=1, gpus=1)
    cluster.devices.update(health=False)
    with pytest.raises(Conflict):
        create.session_create(owner=user, image="img", gpus=1)
    cluster.devices.update(health=True)
    cluster.nodes.update(ready=False)
    with pytest.raises(Conflict):
        create.session_create(owner=user, image="img", gpus=1)
    cluster.nodes.update(ready=True)
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.DEGRADED)
    with pytest.raises(Conflict):
        create.session_create(owner=user, image="img", gpus=1)


def test_ending_releases_the_gpus(user):
    fleet(nodes=1, gpus=1)
    session = create.session_create(owner=user, image="img", gpus=1)
    lifecycle.session_fail(session=session, message="gone")
    assert Allocation.objects.count() == 0
    create.session_create(owner=user, image="img", gpus=1)


def test_query_count_is_bounded(user):
    fleet(nodes=5, gpus=4)
    with CaptureQueriesContext(connection) as queries:
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=100)
    assert len(queries) <= 11, [q["sql"][:80] for q in queries]  # 11: the audit row (its cluster by subqueries, no query)


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_never_take_the_last_capacity_twice(django_user_model, silent_listener, settings):
    owner = django_user_model.objects.create_user("racer")
    cluster = fleet(nodes=1, gpus=1, split=10, memory=10000)
    # Its apiserver accepts and never answers: each admitted session's apply (after commit) hangs for
    # the probe budget, so no GPU is released while the other threads place theirs.
    settings.GSHARE_PROBE_TIMEOUT = 2.0
    Cluster.objects.filter(pk=cluster.pk).update(kubeconfig=yaml.safe_dump(silent_kubeconfig(silent_listener)))
    barrier = threading.Barrier(8)
    results = []

    def attempt():
        try:
            barrier.wait()
            session = create.session_create(owner=owner, image="img", gpus=1, gpu_memory_mib=3000, gpu_cores=10)
            results.append(session.public_id)
        except Conflict as exc:
            results.append(exc.code)
        finally:
            connections.close_all()

    run_threads(attempt, [()] * 8, timeout=60)
    assert sum(1 for r in results if r.startswith("ses_")) == 3  # 3 x 3000 MiB fit in 10000 MiB
    assert results.count("no_capacity") == 5
    # Afterwards each admitted session failed its apply, which released its GPUs.
    assert Session.objects.filter(phase=Session.Phase.FAILED).count() == 3
    assert "did not answer" in Session.objects.first().message
    assert Allocation.objects.count() == 0


# --- Usage counters (clusters.GpuDevice.used_*, clusters.Node summary), kept by placement and release ---


def recount() -> tuple[dict, dict]:
    """The counters as they should be, computed here from the allocations and the inventory (not by SQL of placement)."""
    devices = {}
    for device in GpuDevice.objects.all():
        mine = [a for a in Allocation.objects.filter(device=device)]
        devices[device.pk] = (len(mine), sum(a.memory_mib for a in mine), sum(a.cores for a in mine), any(a.exclusive for a in mine))
    nodes = {}
    for node in Node.objects.prefetch_related("devices"):
        gpus = list(node.devices.all())
        use = [devices[d.pk] for d in gpus]
        open_ = [(d, u) for d, u in zip(gpus, use, strict=True) if d.health and not u[3] and u[0] < d.split_count]
        nodes[node.pk] = (
            sum(u[0] for u in use),
            sum(1 for d, u in zip(gpus, use, strict=True) if d.health and u[0] == 0),
            len(open_),
            max((max(d.memory_mib - u[1], 0) for d, u in open_), default=0),
            max((max(d.cores - u[2], 0) for d, u in open_), default=0),
        )
    return devices, nodes


def stored() -> tuple[dict, dict]:
    devices = {pk: (n, mem, cores, excl) for pk, n, mem, cores, excl in GpuDevice.objects.values_list(
        "pk", "used_count", "used_memory_mib", "used_cores", "used_exclusive")}
    nodes = {pk: rest for pk, *rest in Node.objects.values_list(
        "pk", "load", "free_devices", "open_devices", "max_free_memory_mib", "max_free_cores")}
    return devices, {pk: tuple(rest) for pk, rest in nodes.items()}


def test_counters_equal_a_recount_after_random_creates_and_ends(user, settings):
    first = fleet(nodes=3, gpus=4, split=4, memory=16000, name="alpha")
    fleet(nodes=2, gpus=2, split=2, memory=8000, name="beta")
    rng = random.Random(7)
    live: list[Session] = []
    placed = refused = 0
    for step in range(120):
        settings.GSHARE_PLACEMENT_POLICY = rng.choice(["binpack", "spread"])
        if live and rng.random() < 0.4:
            session = live.pop(rng.randrange(len(live)))
            how = rng.choice(["fail", "terminate", "status"])
            if how == "fail":
                lifecycle.session_fail(session=session, message="test")
            elif how == "terminate":
                lifecycle.session_terminate(session=session, message="test")
            else:
                lifecycle.session_status_apply(cluster=session.cluster, reports=[
                    {"session": session.public_id, "phase": contract.PHASE_SUCCEEDED, "observed_at": timezone.now()}])
        else:
            gpus = rng.choice([1, 1, 2, 3])
            memory, cores = rng.choice([(None, None), (None, None), (2000, 10), (4000, 25), (None, 50), (3000, None)])
            try:
                live.append(create.session_create(owner=user, image="img", gpus=gpus, gpu_memory_mib=memory, gpu_cores=cores,
                                                    cluster=first.name if step % 5 == 0 else None))
                placed += 1
            except Conflict as exc:
                assert exc.code == "no_capacity"
                refused += 1
        assert stored() == recount(), f"after step {step}"
    assert placed > 30 and refused > 5  # the sequence both filled the fleet and freed it
    for session in live:
        lifecycle.session_fail(session=session, message="test")
    assert Allocation.objects.count() == 0
    devices, nodes = stored()
    assert set(devices.values()) == {(0, 0, 0, False)}
    assert stored() == recount()


def test_ended_sessions_of_a_status_report_release_their_gpus(user):
    cluster = fleet(nodes=1, gpus=2)
    a = create.session_create(owner=user, image="img", gpus=1)
    b = create.session_create(owner=user, image="img", gpus=1)
    assert Node.objects.get(cluster=cluster).free_devices == 0
    lifecycle.session_status_apply(cluster=cluster, reports=[
        {"session": a.public_id, "phase": contract.PHASE_FAILED, "observed_at": timezone.now()},
        {"session": b.public_id, "phase": contract.PHASE_TERMINATED, "observed_at": timezone.now()},
    ])
    node = Node.objects.get(cluster=cluster)
    assert (node.load, node.free_devices) == (0, 2)
    assert stored() == recount()
    create.session_create(owner=user, image="img", gpus=2)


def snapshot_of(cluster, *, memory=16000, cores=100, split=4, drop=()):
    """The inventory ``fleet()`` made, as the operator would report it (optionally with GPUs changed or gone)."""
    nodes = []
    for node in cluster.nodes.order_by("name"):
        devices = [
            {"uuid": d.uuid, "index": d.index, "model": d.model, "memory_mib": memory, "split_count": split, "cores": cores,
             "health": True}
            for d in node.devices.order_by("index") if d.uuid not in drop
        ]
        nodes.append({"name": node.name, "labels": {"gpu": "on"}, "ready": True, "devices": devices})
    return nodes


def test_inventory_never_overwrites_counters_and_keeps_nodes_right(user):
    cluster = fleet(nodes=1, gpus=3, split=4, memory=16000)
    shared = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=4000, gpu_cores=20)
    whole = create.session_create(owner=user, image="img", gpus=1)
    before = stored()
    cluster_services.inventory_apply(cluster=cluster, nodes=snapshot_of(cluster))  # same inventory again
    assert stored() == before == recount()
    # A GPU with a live reservation disappears: it is kept, missing and unhealthy (placement skips it), with the
    # reservation; the node's summary follows. Once the session ended, the next snapshot removes it.
    gone = whole.allocations.get().device
    cluster_services.inventory_apply(cluster=cluster, nodes=snapshot_of(cluster, drop={gone.uuid}))
    assert Allocation.objects.filter(session=whole, device=gone).exists()
    assert stored() == recount()
    node = Node.objects.get(cluster=cluster)
    assert (node.load, node.free_devices) == (2, 1)
    assert shared.allocations.get().device.used_count == 1
    lifecycle.session_fail(session=whole, message="test")
    cluster_services.inventory_apply(cluster=cluster, nodes=snapshot_of(cluster, drop={gone.uuid}))
    assert not GpuDevice.objects.filter(pk=gone.pk).exists()
    assert stored() == recount()
    node = Node.objects.get(cluster=cluster)
    assert (node.load, node.free_devices) == (1, 1)


def test_inventory_may_shrink_a_gpu_below_what_is_reserved(user):
    cluster = fleet(nodes=1, gpus=1, split=4, memory=16000)
    session = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=12000, gpu_cores=60)
    # HAMi re-registers the GPU with less memory and fewer cores: accepted (the operator reports what is).
    cluster_services.inventory_apply(cluster=cluster, nodes=snapshot_of(cluster, memory=10000, cores=50))
    device = GpuDevice.objects.get()
    assert (device.memory_mib, device.used_memory_mib, device.cores, device.used_cores) == (10000, 12000, 50, 60)
    assert stored() == recount()
    node = Node.objects.get()
    assert (node.max_free_memory_mib, node.max_free_cores) == (0, 0)
    with pytest.raises(Conflict) as info:  # nothing more goes on the over-committed GPU
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1, gpu_cores=1)
    assert info.value.code == "no_capacity"
    assert placement.usage_recompute(cluster_ids=[cluster.pk]) == [device.pk]  # reported as over capacity
    lifecycle.session_fail(session=session, message="test")  # and it is released as usual
    assert stored() == recount()
    create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=10000, gpu_cores=50)


def test_the_database_refuses_inconsistent_counters(user):
    fleet(nodes=1, gpus=1)
    session = create.session_create(owner=user, image="img", gpus=1)
    device = session.allocations.get().device
    for change in ({"used_count": 2}, {"used_count": -1}, {"used_count": 0}, {"used_memory_mib": -5}):
        with pytest.raises(IntegrityError), transaction.atomic():
            GpuDevice.objects.filter(pk=device.pk).update(**change)
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=device.node_id).update(load=-1)


def test_a_reservation_that_would_over_commit_is_refused_by_the_database(user):
    fleet(nodes=1, gpus=1, split=4, memory=10000)
    create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=6000, gpu_cores=25)
    # Counters wrong behind placement's back (what a release path without the cluster lock could cause).
    GpuDevice.objects.update(used_count=0, used_memory_mib=0, used_cores=0)
    Node.objects.update(max_free_memory_mib=10000, open_devices=1)
    with pytest.raises(IntegrityError, match="over-commit"):
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=6000, gpu_cores=25)
    assert Allocation.objects.count() == 1  # nothing was reserved
    GpuDevice.objects.update(used_count=0, used_memory_mib=0, used_cores=0, used_exclusive=False)
    Node.objects.update(free_devices=1)
    with pytest.raises(IntegrityError):  # a whole GPU on a shared one: the exclusive constraint refuses
        create.session_create(owner=user, image="img", gpus=1)
    assert Allocation.objects.count() == 1


def test_cluster_name_is_copied_for_the_tie_break():
    cluster = fleet(nodes=1, gpus=1, name="zeta")
    assert Node.objects.get(cluster=cluster).cluster_name == "zeta"
    cluster_services.inventory_apply(cluster=cluster, nodes=snapshot_of(cluster))
    assert Node.objects.get(cluster=cluster).cluster_name == "zeta"


@pytest.mark.django_db(transaction=True)
def test_counters_stay_right_under_concurrent_creates_and_ends(django_user_model, monkeypatch):
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)  # no apply: the threads end their sessions
    owner = django_user_model.objects.create_user("racer")
    fleet(nodes=2, gpus=2, split=3, memory=9000)
    barrier = threading.Barrier(6)
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        try:
            barrier.wait()
            mine = []
            for _ in range(12):
                if mine and rng.random() < 0.5:
                    session = mine.pop(rng.randrange(len(mine)))
                    if rng.random() < 0.5:
                        lifecycle.session_fail(session=session, message="test")
                    else:
                        lifecycle.session_terminate(session=session, message="test")
                    continue
                memory = rng.choice([None, 3000])
                try:
                    mine.append(create.session_create(owner=owner, image="img", gpus=rng.choice([1, 2]), gpu_memory_mib=memory,
                                                           gpu_cores=None if memory is None else 30))
                except Conflict as exc:
                    assert exc.code == "no_capacity"
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(worker, [(seed,) for seed in range(6)], timeout=60)
    assert errors == []
    assert stored() == recount()
    for device in GpuDevice.objects.all():  # and never over capacity
        assert device.used_count <= device.split_count and device.used_memory_mib <= device.memory_mib
        assert not device.used_exclusive or device.used_count == 1


@pytest.mark.django_db(transaction=True)
def test_a_release_and_a_placement_on_one_node_do_not_lose_each_others_change(django_user_model, monkeypatch):
    """A release holds the cluster's row lock from before its delete to its commit, so a placement on the same
    node waits for it and recounts what the release left, not what its own snapshot saw before."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    owner = django_user_model.objects.create_user("racer")
    fleet(nodes=1, gpus=2)
    first = create.session_create(owner=owner, image="img", gpus=1)
    recounted, real = threading.Event(), placement.usage_recompute
    releasing = threading.local()

    def slow_recompute(**kwargs):
        over = real(**kwargs)
        if getattr(releasing, "yes", False):
            recounted.set()
            time.sleep(0.5)  # the release has recounted and not committed yet: the placement starts now
        return over

    monkeypatch.setattr(placement, "usage_recompute", slow_recompute)
    errors = []

    def release():
        releasing.yes = True
        try:
            lifecycle.session_fail(session=first, message="test")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    def place():
        try:
            assert recounted.wait(10)
            create.session_create(owner=owner, image="img", gpus=1)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=release), threading.Thread(target=place)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert Allocation.objects.count() == 1
    assert stored() == recount()
    assert Node.objects.get().free_devices == 1
