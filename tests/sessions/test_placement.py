"""Placement: HAMi sharing semantics, policies, determinism, and no double-booking under threads."""

import threading

import pytest
import yaml
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from clusters.models import Cluster
from gshare.exceptions import Conflict
from sessions import placement, services
from sessions.models import Allocation, Session
from tests.conftest import silent_kubeconfig
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory

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
    a = services.session_create(owner=user, image="img", gpus=1)
    b = services.session_create(owner=user, image="img", gpus=1)
    assert a.phase == Session.Phase.SCHEDULED
    assert {x.device_id for x in a.allocations.all()} != {x.device_id for x in b.allocations.all()}
    with pytest.raises(Conflict) as info:
        services.session_create(owner=user, image="img", gpus=1)
    assert info.value.code == "no_capacity"
    assert "2 healthy GPU(s)" in info.value.detail and "0 with nothing on them" in info.value.detail


def test_shares_respect_split_memory_and_cores(user):
    fleet(nodes=1, gpus=1, split=3, memory=10000, cores=100)
    for _ in range(2):
        services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=4000, gpu_cores=40)
    with pytest.raises(Conflict):  # memory: 8000 + 4000 > 10000
        services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=4000, gpu_cores=10)
    with pytest.raises(Conflict):  # cores: 80 + 30 > 100
        services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=30)
    services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=2000, gpu_cores=20)
    with pytest.raises(Conflict):  # split count 3 reached
        services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1, gpu_cores=1)
    with pytest.raises(Conflict):  # whole GPU needs an empty device
        services.session_create(owner=user, image="img", gpus=1)


def test_multi_gpu_sessions_stay_on_one_node(user):
    fleet(nodes=2, gpus=2)
    session = services.session_create(owner=user, image="img", gpus=2)
    nodes = {a.device.node_id for a in session.allocations.select_related("device")}
    assert len(nodes) == 1 and session.allocations.count() == 2
    with pytest.raises(Conflict):
        services.session_create(owner=user, image="img", gpus=3)


def test_binpack_fills_the_busy_node_and_spread_the_idle_one(user, settings):
    fleet(nodes=2, gpus=4)
    first = services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000)
    second = services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000)
    assert first.node == second.node
    assert first.allocations.get().device_id == second.allocations.get().device_id  # same GPU: binpack
    settings.GSHARE_PLACEMENT_POLICY = "spread"
    third = services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000)
    assert third.node != first.node


def test_decisions_are_deterministic(user):
    fleet(nodes=3, gpus=2, name="zeta")
    fleet(nodes=3, gpus=2, name="alpha")
    picks = []
    for _ in range(2):
        session = services.session_create(owner=user, image="img", gpus=1)
        picks.append((session.cluster.name, session.node, session.allocations.get().device.index))
        services.session_fail(session=session, message="test")
    assert picks[0] == picks[1]
    assert picks[0][0] == "alpha"


def test_unhealthy_devices_unready_nodes_and_other_clusters_are_skipped(user):
    cluster = fleet(nodes=1, gpus=1)
    cluster.devices.update(health=False)
    with pytest.raises(Conflict):
        services.session_create(owner=user, image="img", gpus=1)
    cluster.devices.update(health=True)
    cluster.nodes.update(ready=False)
    with pytest.raises(Conflict):
        services.session_create(owner=user, image="img", gpus=1)
    cluster.nodes.update(ready=True)
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.DEGRADED)
    with pytest.raises(Conflict):
        services.session_create(owner=user, image="img", gpus=1)


def test_ending_releases_the_gpus(user):
    fleet(nodes=1, gpus=1)
    session = services.session_create(owner=user, image="img", gpus=1)
    services.session_fail(session=session, message="gone")
    assert Allocation.objects.count() == 0
    services.session_create(owner=user, image="img", gpus=1)


def test_query_count_is_bounded(user):
    fleet(nodes=5, gpus=4)
    with CaptureQueriesContext(connection) as queries:
        services.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=100)
    assert len(queries) <= 10, [q["sql"][:80] for q in queries]


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
            session = services.session_create(owner=owner, image="img", gpus=1, gpu_memory_mib=3000)
            results.append(session.public_id)
        except Conflict as exc:
            results.append(exc.code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(1 for r in results if r.startswith("ses_")) == 3  # 3 x 3000 MiB fit in 10000 MiB
    assert results.count("no_capacity") == 5
    # Afterwards each admitted session failed its apply, which released its GPUs.
    assert Session.objects.filter(phase=Session.Phase.FAILED).count() == 3
    assert "did not answer" in Session.objects.first().message
    assert Allocation.objects.count() == 0
