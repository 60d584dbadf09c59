"""Attacks on the rule that a new request is placed as usual on the clusters no queued session is pinned to
(``sessions.queue.enqueue.uncontested_clusters`` in ``sessions.create``): it must never take GPUs a queued session
ahead of it waits for, jump the queue, skip billing or answer 500, alone or racing. On a frozen clock, then threads on
real PostgreSQL."""

import threading
from decimal import Decimal

import pytest
from django.db import connections

from clusters.models import Cluster, GpuDevice
from core.exceptions import ApplicationError
from sessions import create, placement
from sessions.models import Session
from sessions.queue.admit import queue_pass
from storage.models import StoragePool
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory
from tests.helpers import run_threads
from tests.sessions.queue.helpers import end, queue_user, start
from tests.sessions.test_placement import recount, stored
from tests.sessions.test_volumes import make_pool, make_volume

pytestmark = pytest.mark.usefixtures("no_background")



def _node(cluster, *, gpus=4, model="NVIDIA H100 80GB HBM3", memory=81559):
    node = NodeFactory(cluster=cluster)
    for i in range(gpus):
        GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=memory, cores=100, model=model)
    return node


def _cluster(name, **node):
    cluster = ClusterFactory(name=name)
    _node(cluster, **node)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster


def _refused(**body):
    with pytest.raises(create.Conflict) as refused:
        start(body.pop("owner", None) or queue_user(), **body)
    return refused.value


@pytest.fixture
def two(frozen):
    """lab-a and lab-b, four H100s each, both full; lab-a's session waits for... nothing yet."""
    a, b = _cluster("lab-a"), _cluster("lab-b")
    on_a = start(queue_user(), gpus=4, cluster="lab-a", runtime_hours=2)
    on_b = start(queue_user(), gpus=4, cluster="lab-b", runtime_hours=2)
    return a, b, on_a, on_b


# --------------------------------------------------------------------------- one request at a time


@pytest.mark.django_db
def test_an_unpinned_queued_session_keeps_the_freed_cluster_from_an_unpinned_request(two):
    a, b, on_a, on_b = two
    start(queue_user(), gpus=4, cluster="lab-a", queue=True)
    waiting = start(queue_user(), gpus=4, queue=True)  # unpinned: it may use lab-b
    end(on_b)  # lab-b is free, no pass has run: the unpinned queued session is owed it
    assert _refused(gpus=1, runtime_hours=8).code == "no_capacity"
    assert _refused(gpus=1, cluster="lab-b", runtime_hours=8).code == "no_capacity"  # pinned to it: still behind the queue
    assert _refused(gpus=1, cluster="lab-b", queue=False).code == "no_capacity"
    queued = start(queue_user(), gpus=1, queue=True)
    assert queued.phase == Session.Phase.QUEUED
    assert Session.objects.get(pk=waiting.pk).phase == Session.Phase.QUEUED
    queue_pass()
    assert Session.objects.get(pk=waiting.pk).cluster_id == b.pk


@pytest.mark.django_db
def test_a_policy_limited_to_the_contested_cluster_is_planned_behind_the_queue(two):
    a, b, on_a, on_b = two
    start(queue_user(), gpus=4, cluster="lab-b", queue=True)  # waits for lab-b only
    end(on_b)
    allowed_b = queue_user(allowed_clusters=[b])
    assert _refused(owner=allowed_b, gpus=1, runtime_hours=8).code == "no_capacity"
    assert _refused(owner=allowed_b, gpus=1, runtime_hours=8, cluster="lab-b").code == "no_capacity"
    assert not Session.objects.filter(owner=allowed_b).exists()


@pytest.mark.django_db
def test_a_policy_that_forbids_the_uncontested_cluster_is_not_placed_there(two):
    a, b, on_a, on_b = two
    c = _cluster("lab-c")
    start(queue_user(), gpus=4, cluster="lab-b", queue=True)
    end(on_b)
    only_b = queue_user(allowed_clusters=[b])  # lab-c is free and uncontested, but not this user's
    assert _refused(owner=only_b, gpus=1).code == "no_capacity"
    with pytest.raises(ApplicationError) as refused:
        start(only_b, gpus=1, cluster="lab-c")
    assert refused.value.code == "cluster_not_allowed"
    assert not Session.objects.filter(owner=only_b, cluster=c).exists()


@pytest.mark.django_db
def test_gpu_models_only_on_the_contested_cluster_are_not_taken_from_the_queue(frozen):
    a = _cluster("lab-a")
    _cluster("lab-t4", model="Tesla T4", memory=15360)
    on_a = start(queue_user(), gpus=4, cluster="lab-a", runtime_hours=2)
    start(queue_user(), gpus=4, cluster="lab-a", queue=True)
    end(on_a)
    assert _refused(gpus=1, gpu_models=["H100"]).code == "no_capacity"
    placed = start(queue_user(), gpus=1, gpu_models=["T4"])  # the uncontested T4s are fine
    assert placed.phase == Session.Phase.SCHEDULED and placed.cluster.name == "lab-t4"
    assert not Session.objects.filter(cluster=a).exclude(phase__in=Session.TERMINAL_PHASES).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("status", [Cluster.Status.DEGRADED, Cluster.Status.UNREACHABLE, Cluster.Status.PENDING])
def test_a_cluster_that_does_not_take_sessions_is_never_the_uncontested_one(two, status):
    a, b, on_a, on_b = two
    c = _cluster("lab-c")
    Cluster.objects.filter(pk=c.pk).update(status=status)
    start(queue_user(), gpus=4, cluster="lab-a", queue=True)
    assert _refused(gpus=1).code == "no_capacity"
    with pytest.raises(ApplicationError) as refused:
        start(queue_user(), gpus=1, cluster="lab-c")
    assert refused.value.code != "internal_error" and refused.value.status < 500
    assert not Session.objects.filter(cluster=c).exists()


@pytest.mark.django_db
def test_a_placement_on_the_uncontested_cluster_is_admitted_and_billed_as_usual(two):
    a, b, on_a, on_b = two
    start(queue_user(), gpus=4, cluster="lab-a", queue=True)
    end(on_b)
    poor = queue_user(min_balance_hours=Decimal(1))  # no credits: refused before any placement
    with pytest.raises(ApplicationError) as refused:
        start(poor, gpus=1)
    assert refused.value.code == "insufficient_credits"
    capped = queue_user(max_gpus=1)
    with pytest.raises(ApplicationError) as refused:
        start(capped, gpus=2)
    assert refused.value.code == "quota_exceeded"
    assert not Session.objects.filter(owner__in=[poor, capped]).exists()
    placed = start(queue_user(), gpus=2, gpu_memory_mib=1000, gpu_cores=10)  # shares on lab-b: reserved, audited as usual
    assert placed.cluster_id == b.pk and placed.allocations.count() == 2
    assert recount() == stored()


@pytest.mark.django_db
def test_a_higher_priority_queued_session_pinned_elsewhere_loses_nothing(two):
    a, b, on_a, on_b = two
    vip = queue_user(priority=10)
    head = start(vip, gpus=4, cluster="lab-a", queue=True)
    end(on_b)
    placed = start(queue_user(), gpus=4)  # lab-b: the vip never could use it
    assert placed.cluster_id == b.pk
    end(on_a)
    queue_pass()
    assert Session.objects.get(pk=head.pk).cluster_id == a.pk


@pytest.mark.django_db
def test_a_volume_on_the_contested_cluster_keeps_the_request_behind_the_queue(two):
    a, b, on_a, on_b = two
    c = _cluster("lab-c")  # free and uncontested
    start(queue_user(), gpus=4, cluster="lab-b", queue=True)
    end(on_b)
    bob = queue_user()
    bound = make_volume(bob, make_pool(b), name="data", cluster=b)  # its sessions stay on lab-b
    assert _refused(owner=bob, gpus=1, volumes=[bound.public_id]).code == "no_capacity"
    assert _refused(owner=bob, gpus=1, volumes=[bound.public_id], cluster="lab-c").code == "volume_on_another_cluster"
    unbound = make_volume(bob, make_pool(b, name="only-b", sharing=StoragePool.Sharing.SELECTED, allowed=[b]), name="fresh")
    with pytest.raises(ApplicationError) as refused:
        start(bob, gpus=1, volumes=[unbound.public_id])
    assert refused.value.code == "no_capacity", refused.value.code
    with pytest.raises(ApplicationError) as refused:
        start(bob, gpus=1, volumes=[unbound.public_id], cluster="lab-c")
    assert refused.value.status < 500
    assert not Session.objects.filter(owner=bob).exclude(phase__in=Session.TERMINAL_PHASES).exists()
    assert not Session.objects.filter(cluster=c).exists()


@pytest.mark.django_db
def test_a_full_uncontested_pinned_cluster_is_refused_without_blaming_the_queue(two):
    a, b, on_a, on_b = two
    start(queue_user(), gpus=4, cluster="lab-a", queue=True)  # waits for lab-a only; lab-b is full of a running session
    refused = _refused(gpus=1, cluster="lab-b")
    assert refused.code == "no_capacity"
    assert "waiting in the queue" not in refused.detail, refused.detail


# --------------------------------------------------------------------------- races


def _racer(results, errors, barrier, fn):
    try:
        barrier.wait()
        results.append(fn())
    except ApplicationError as refused:
        results.append(refused.code)
    except Exception as exc:  # noqa: BLE001 - recorded, asserted below
        errors.append(exc)
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_two_requests_for_the_last_uncontested_gpus_never_share_them():
    _cluster("lab-a")
    b = _cluster("lab-b")
    start(queue_user(), gpus=4, cluster="lab-a")
    start(queue_user(), gpus=3, cluster="lab-b")
    start(queue_user(), gpus=4, cluster="lab-a", queue=True)
    users = [queue_user(), queue_user()]
    barrier, results, errors = threading.Barrier(2), [], []
    run_threads(lambda u: _racer(results, errors, barrier, lambda: start(u, gpus=1)), [(u,) for u in users])
    assert not errors, errors
    placed = [r for r in results if isinstance(r, Session)]
    assert len(placed) == 1 and placed[0].cluster_id == b.pk, results
    assert all(r in ("no_capacity", "placement_contended") for r in results if not isinstance(r, Session)), results
    assert max(GpuDevice.objects.values_list("used_count", flat=True)) <= 1
    assert recount() == stored()


@pytest.mark.django_db(transaction=True)
def test_an_unpinned_enqueue_racing_a_request_never_loses_the_freed_cluster_to_a_later_request():
    _cluster("lab-a")
    b = _cluster("lab-b")
    start(queue_user(), gpus=4, cluster="lab-a")
    on_b = start(queue_user(), gpus=4, cluster="lab-b")
    start(queue_user(), gpus=4, cluster="lab-a", queue=True)
    waiter = queue_user()
    barrier, results, errors = threading.Barrier(3), [], []
    jobs = [lambda: start(waiter, gpus=4, queue=True), lambda: end(on_b), lambda: start(queue_user(), gpus=4, queue=True)]
    run_threads(lambda fn: _racer(results, errors, barrier, fn), [(j,) for j in jobs])
    assert not errors, errors
    queue_pass()
    assert max(GpuDevice.objects.values_list("used_count", flat=True)) <= 1
    assert recount() == stored()
    live = Session.objects.filter(cluster=b).exclude(phase__in=[Session.Phase.QUEUED, *Session.TERMINAL_PHASES])
    assert live.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_pinned_request_racing_the_admission_of_the_session_pinned_there_never_takes_its_gpus():
    a = _cluster("lab-a")
    on_a = start(queue_user(), gpus=4, cluster="lab-a")
    head = start(queue_user(), gpus=4, cluster="lab-a", queue=True)
    end(on_a)  # no pass yet: lab-a is owed to head
    barrier, results, errors = threading.Barrier(2), [], []
    jobs = [queue_pass, lambda: start(queue_user(), gpus=4, cluster="lab-a")]
    run_threads(lambda fn: _racer(results, errors, barrier, fn), [(j,) for j in jobs])
    assert not errors, errors
    queue_pass()
    assert Session.objects.get(pk=head.pk).cluster_id == a.pk
    assert not [r for r in results if isinstance(r, Session)], results
    assert recount() == stored()


@pytest.mark.django_db(transaction=True)
def test_a_request_racing_the_cancel_of_the_only_pinned_queued_session_is_not_a_500():
    _cluster("lab-a")
    b = _cluster("lab-b")
    start(queue_user(), gpus=4, cluster="lab-a")
    head = start(queue_user(), gpus=4, cluster="lab-a", queue=True)
    barrier, results, errors = threading.Barrier(2), [], []
    jobs = [lambda: end(head), lambda: start(queue_user(), gpus=2)]
    run_threads(lambda fn: _racer(results, errors, barrier, fn), [(j,) for j in jobs])
    assert not errors, errors
    placed = [r for r in results if isinstance(r, Session)]
    assert len(placed) == 1 and placed[0].cluster_id == b.pk, results
    assert recount() == stored()
