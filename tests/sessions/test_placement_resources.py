"""Placement fits CPU and memory (``sessions.placement``, ``_RESOURCE_FIT``): a node with free GPUs but no room for the
request's CPU or memory (after its pods that are not sessions and the live sessions on it) is not chosen, the no_capacity
message says CPU or memory is what is short, the reservation's fit under the cluster's lock counts the same, and a node
without allocatable figures (an older operator) has no CPU or memory limit."""

import threading
from decimal import Decimal

import pytest
from django.db import connections

from billing.services import policy_set
from core.exceptions import Conflict
from sessions import create, placement
from sessions.lifecycle import outbox, session_fail
from sessions.models import Session
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory

pytestmark = pytest.mark.django_db

IMAGE = "quay.io/jupyter/base-notebook"
GIB = 1024  # MiB


@pytest.fixture(autouse=True)
def no_cluster_calls(monkeypatch):
    monkeypatch.setattr(outbox, "publish_after_commit", lambda *args, **kwargs: None)


@pytest.fixture
def alice(plain_user):
    policy_set(user=plain_user, min_balance_hours=Decimal(0), default_cpu_per_gpu=Decimal(2), default_memory_gib_per_gpu=Decimal(8),
               max_cpu_per_gpu=Decimal(64), max_memory_gib_per_gpu=Decimal(512))
    return plain_user


@pytest.fixture
def cluster():
    return ClusterFactory()


def gpu_node(cluster, name: str, *, gpus: int = 4, cpu: int | None, memory_gib: int | None, requested_cpu: int = 0,
             requested_gib: int = 0):
    node = NodeFactory(cluster=cluster, name=name, cpu_allocatable_millicores=None if cpu is None else cpu * 1000,
                       memory_allocatable_mib=None if memory_gib is None else memory_gib * GIB,
                       cpu_requested_millicores=requested_cpu * 1000, memory_requested_mib=requested_gib * GIB)
    for i in range(gpus):
        GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=16000, cores=100)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return node


def start(owner, **ask):
    return create.session_create(owner=owner, image=IMAGE, **{"gpus": 1, **ask})


def test_a_node_with_free_gpus_but_no_cpu_room_is_not_chosen(alice, cluster):
    # Binpack breaks the tie on the node's name: a-node first, but its pods that are not sessions took 6 of its 8 cores.
    gpu_node(cluster, "a-node", cpu=8, memory_gib=64, requested_cpu=6)
    gpu_node(cluster, "b-node", cpu=64, memory_gib=512)
    assert start(alice, cpu=2).node == "a-node"  # 2 cores left there: fits
    assert start(alice, cpu=1).node == "b-node"  # none left on a-node now (the live session's 2)
    assert start(alice, cpu="0.5", memory_gib=1).node == "b-node"


def test_memory_is_fitted_too(alice, cluster):
    gpu_node(cluster, "a-node", cpu=64, memory_gib=32, requested_gib=30)
    gpu_node(cluster, "b-node", cpu=64, memory_gib=512)
    assert start(alice, memory_gib=2).node == "a-node"
    assert start(alice, memory_gib="0.001").node == "b-node"  # 1.024 MiB counts as 2 MiB, as the pod asks


def test_no_cpu_room_anywhere_is_no_capacity_saying_cpu_or_memory_is_short(alice, cluster):
    gpu_node(cluster, "a-node", cpu=8, memory_gib=64, requested_cpu=2)
    start(alice, cpu=4)
    with pytest.raises(Conflict) as refused:
        start(alice, cpu=4, memory_gib=4)
    assert refused.value.code == "no_capacity"
    assert "CPU or memory is short" in refused.value.detail and "at most 2 CPU core(s)" in refused.value.detail
    assert Session.objects.count() == 1  # nothing half-made
    with pytest.raises(Conflict) as pinned:
        start(alice, cpu=4, cluster=cluster.public_id)  # pinned: the fit runs once, under the lock (reserve)
    assert pinned.value.code == "no_capacity" and "CPU or memory is short" in pinned.value.detail


def test_gpus_short_says_nothing_of_cpu(alice, cluster):
    gpu_node(cluster, "a-node", gpus=1, cpu=8, memory_gib=64)
    with pytest.raises(Conflict) as refused:
        start(alice, gpus=2, cpu=1)
    assert "CPU or memory" not in refused.value.detail


def test_ended_sessions_free_their_cpu(alice, cluster):
    gpu_node(cluster, "a-node", cpu=4, memory_gib=64)
    first = start(alice, cpu=4)
    with pytest.raises(Conflict):
        start(alice, cpu=4)
    # The end releases the allocations (under the cluster's lock): the node's CPU is free again.
    session_fail(session=first, message="ended for the test")
    assert start(alice, cpu=4).node == "a-node"


def test_a_node_without_allocatable_figures_has_no_cpu_or_memory_limit(alice, cluster):
    gpu_node(cluster, "a-node", cpu=None, memory_gib=None)
    assert start(alice, gpus=4, cpu=256, memory_gib=2048).node == "a-node"


def test_old_sessions_without_cpu_count_nothing(alice, cluster):
    node = gpu_node(cluster, "a-node", cpu=4, memory_gib=16)
    old = start(alice, cpu=4, memory_gib=16)
    Session.objects.filter(pk=old.pk).update(cpu=None, memory_gib=None)  # as made before CPU requests
    assert start(alice, cpu=4, memory_gib=16).node == node.name


def test_reserve_under_the_lock_refuses_the_node_without_room(alice, cluster):
    node = gpu_node(cluster, "a-node", cpu=4, memory_gib=16)
    start(alice, cpu=3)
    request = placement.Request(gpus=1, cpu=Decimal(2))
    assert placement.choose(request=request, cluster_ids=[cluster.pk]) is None
    assert placement.choose(request=placement.Request(gpus=1, cpu=Decimal(1)), cluster_ids=[cluster.pk]).node_id == node.pk
    assert placement.choose(request=placement.Request(gpus=1), cluster_ids=[cluster.pk]).node_id == node.pk  # not asked: not checked


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_never_overcommit_a_nodes_cpu(django_user_model, monkeypatch):
    """a-node has free GPUs for all but CPU for one 6-core session at a time: six users ask at once (own connections);
    the fit under the cluster's lock (reserve) counts the sessions committed before it, so exactly one lands on a-node
    and at most two on b-node; the others are refused."""
    from tests.helpers import run_threads  # noqa: PLC0415 -- the threaded tests only

    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    cluster = ClusterFactory()
    gpu_node(cluster, "a-node", gpus=8, cpu=8, memory_gib=512)
    gpu_node(cluster, "b-node", gpus=8, cpu=12, memory_gib=512)
    owners = [django_user_model.objects.create_user(f"racer-{i}") for i in range(6)]
    for owner in owners:
        policy_set(user=owner, min_balance_hours=Decimal(0), max_cpu_per_gpu=Decimal(64))
    barrier = threading.Barrier(len(owners))
    placed, refused, errors = [], [], []

    def worker(owner):
        try:
            barrier.wait()
            placed.append(start(owner, cpu=6).node)
        except Conflict as exc:
            refused.append(exc.code)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(worker, [(owner,) for owner in owners], timeout=60)
    assert errors == []
    # Never over a node's CPU (a request that lost its choice on every attempt may be refused as contended, so fewer may land).
    assert placed.count("a-node") <= 1 and placed.count("b-node") <= 2 and placed and len(placed) + len(refused) == 6, (placed, refused)
    assert set(refused) <= {"no_capacity", "placement_contended"}
    for node, room in (("a-node", 8), ("b-node", 12)):
        assert sum(s.cpu for s in Session.objects.filter(node=node)) <= room
