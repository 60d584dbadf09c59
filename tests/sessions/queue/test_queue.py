"""The fleet-wide queue (``sessions.queue``): queueing when nothing fits, ``never_fits``, the order (priority, then
arrival), backfill that delays nobody ahead, admission when capacity frees (credits re-checked), positions, estimates,
``waiting_for``, alternatives, the limits, cancelling, ``GET /api/v1/queue`` and staff's priority. On a frozen clock."""

from decimal import Decimal

import pytest

from audit.models import AuditRecord
from billing.services import policy_set
from clusters.models import Node
from identity.tokens import api_token_create
from metrics.fleet import render_inventory
from sessions import create, lifecycle, placement, runtime, selectors
from sessions.models import Allocation, Session
from sessions.queue.admit import queue_pass
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, UserFactory
from tests.sessions.queue.helpers import HOUR, IMAGE, NOW, end, start

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("frozen", "no_background")]



def _node(cluster, *, gpus=4, model="NVIDIA H100 80GB HBM3", memory=81559, name=None):
    node = NodeFactory(cluster=cluster, **({"name": name} if name else {}))
    for i in range(gpus):
        GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=memory, cores=100, model=model)
    return node


@pytest.fixture
def cluster():
    cluster = ClusterFactory(name="lab-a")
    _node(cluster)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster


def _user(**policy):
    user = UserFactory()
    policy_set(user=user, min_balance_hours=Decimal(0), **{"max_runtime_hours": Decimal(24), **policy})
    return user


# --------------------------------------------------------------------------- queueing and never_fits


def test_a_full_fleet_queues_the_request_with_its_position_estimate_and_reason(cluster):
    alice, bob = _user(), _user()
    running = start(alice, gpus=4, runtime_hours=2)
    queued = start(bob, gpus=2, runtime_hours=1, queue=True)
    assert queued.phase == Session.Phase.QUEUED and queued.cluster_id is None and queued.ends_at is None
    assert not Allocation.objects.filter(session=queued).exists()
    assert queued.queue_position == 1 and queued.queued_at == NOW
    assert queued.estimated_start == running.ends_at == NOW + 2 * HOUR == queued.first_estimated_start
    assert running.public_id in queued.waiting_for and "reaches its time limit" in queued.waiting_for
    assert queued.queue_expires_at == NOW + 72 * HOUR
    record = AuditRecord.objects.filter(action="session_create", object_id=queued.public_id).get()
    assert record.changes["phase"] == {"old": None, "new": "Queued"}


def test_without_queue_a_full_fleet_still_answers_no_capacity(cluster):
    start(_user(), gpus=4)
    with pytest.raises(create.Conflict) as refused:
        start(_user(), gpus=1)
    assert refused.value.code == "no_capacity"
    assert not Session.objects.queued().exists()


@pytest.mark.parametrize(("body", "says"), [
    ({"gpus": 5}, "no node in the fleet has more than 4 GPU(s)"),
    ({"gpus": 1, "gpu_memory_mib": 90_000, "gpu_cores": 10}, "has 90000 MiB"),
])
def test_a_request_that_can_never_fit_is_refused_never_queued(cluster, body, says):
    start(_user(), gpus=4)
    with pytest.raises(create.Conflict) as refused:
        start(_user(), queue=True, **body)
    assert refused.value.code == "never_fits" and says in refused.value.detail
    assert not Session.objects.queued().exists()


def test_a_pinned_cluster_without_the_model_never_fits(cluster):
    other = ClusterFactory(name="lab-t4")
    _node(other, model="Tesla T4", memory=15360)
    placement.usage_recompute(cluster_ids=[other.pk])
    start(_user(), gpus=4, cluster="lab-t4")
    with pytest.raises(create.Conflict) as refused:
        start(_user(), gpu_models=["H100"], cluster="lab-t4", queue=True)
    assert refused.value.code == "never_fits" and "no GPU of model NVIDIA H100 80GB HBM3" in refused.value.detail


def test_max_queued_sessions_is_a_403_with_a_code(cluster):
    bob = _user(max_queued_sessions=1)
    start(_user(), gpus=4)
    start(bob, queue=True)
    with pytest.raises(create.ApplicationError) as refused:
        start(bob, queue=True)
    assert refused.value.code == "queue_limit_reached" and refused.value.status == 403
    assert Session.objects.queued().filter(owner=bob).count() == 1


def test_queued_sessions_hold_no_quota_or_credits(cluster):
    bob = _user(max_sessions=1, max_gpus=1)
    start(_user(), gpus=4)
    start(bob, queue=True)  # a queued session counts against neither max_sessions nor max_gpus
    assert Session.objects.queued().filter(owner=bob).count() == 1


# --------------------------------------------------------------------------- admission and order


def test_a_release_admits_the_head_of_the_queue_on_the_freed_gpus(cluster):
    alice, bob = _user(), _user()
    running = start(alice, gpus=4, runtime_hours=2)
    queued = start(bob, gpus=2, runtime_hours=1, queue=True)
    assert queue_pass() == {"queued": 1, "admitted": 0, "expired": 0, "dropped": 0}
    end(running)
    assert queue_pass()["admitted"] == 1
    queued.refresh_from_db()
    assert queued.phase == Session.Phase.SCHEDULED and queued.cluster_id == cluster.pk and queued.admitted_at == NOW
    assert queued.ends_at == NOW + HOUR and queued.first_estimated_start == NOW + 2 * HOUR
    assert Allocation.objects.filter(session=queued).count() == 2
    assert AuditRecord.objects.filter(action="session_admit", object_id=queued.public_id).exists()


def test_priority_then_arrival_decides_the_order(cluster, frozen):
    running = start(_user(), gpus=4, runtime_hours=1)
    first = start(_user(), gpus=4, runtime_hours=1, queue=True)
    frozen.shift(60)
    second = start(_user(priority=5), gpus=4, runtime_hours=1, queue=True)
    for s in (first, second):
        s.refresh_from_db()
    queue_pass()
    first.refresh_from_db(), second.refresh_from_db()
    assert (second.queue_position, first.queue_position) == (1, 2)
    assert second.estimated_start == NOW + HOUR and first.estimated_start == NOW + 2 * HOUR
    end(running)
    queue_pass()
    first.refresh_from_db(), second.refresh_from_db()
    assert second.phase == Session.Phase.SCHEDULED and first.phase == Session.Phase.QUEUED


def test_backfill_starts_a_short_request_only_where_it_delays_nobody_ahead(cluster):
    two_hours = start(_user(), gpus=2, runtime_hours=2)  # 2 of the 4 GPUs until 14:00
    head = start(_user(), gpus=4, runtime_hours=1, queue=True)  # needs the node whole: from 14:00
    short = start(_user(), gpus=1, runtime_hours=1, queue=True)  # ends 13:00, before the head starts: backfilled
    long = start(_user(), gpus=1, runtime_hours=3, queue=True)  # would hold a GPU past 14:00: waits
    queue_pass()
    for s in (head, short, long):
        s.refresh_from_db()
    assert short.phase == Session.Phase.SCHEDULED
    assert head.phase == long.phase == Session.Phase.QUEUED
    assert head.estimated_start == two_hours.ends_at == NOW + 2 * HOUR
    assert long.estimated_start == NOW + 3 * HOUR  # after the head's hour
    assert short.public_id not in head.waiting_for


def test_a_new_request_that_would_delay_the_queue_does_not_jump_it(cluster):
    start(_user(), gpus=2, runtime_hours=2)
    start(_user(), gpus=4, runtime_hours=1, queue=True)
    with pytest.raises(create.Conflict) as refused:  # fits now, but past 14:00: the queued head would wait longer
        start(_user(), gpus=1, runtime_hours=5)
    assert refused.value.code == "no_capacity" and '"queue": true' in refused.value.detail
    placed = start(_user(), gpus=1, runtime_hours=1)  # ends before the head starts: placed at once
    assert placed.phase == Session.Phase.SCHEDULED


def test_a_request_nothing_could_host_now_is_refused_without_planning_the_queue(cluster, monkeypatch):
    start(_user(), gpus=4, runtime_hours=2)  # the node is full
    start(_user(), gpus=2, runtime_hours=1, queue=True)
    planned = []
    real = create.queue_enqueue.place_behind_queue
    monkeypatch.setattr(create.queue_enqueue, "place_behind_queue", lambda **kwargs: planned.append(1) or real(**kwargs))
    with pytest.raises(create.Conflict) as refused:  # nothing is free: the queue is not why, and is not planned
        start(_user(), gpus=1, runtime_hours=1)
    assert refused.value.code == "no_capacity" and '"queue": true' not in refused.value.detail and planned == []
    queued = start(_user(), gpus=1, runtime_hours=1, queue=True)  # queueing plans once, for its estimate
    assert queued.phase == Session.Phase.QUEUED and queued.estimated_start == NOW + 2 * HOUR and planned == [1]


def test_an_owner_who_can_no_longer_pay_is_dropped_with_stop_reason_credits(cluster):
    bob = _user()
    running = start(_user(), gpus=4, runtime_hours=1)
    queued = start(bob, queue=True)
    policy_set(user=bob, min_balance_hours=Decimal(1))  # now needs an hour of credits, and has none
    end(running)
    assert queue_pass()["dropped"] == 1
    queued.refresh_from_db()
    assert queued.phase == Session.Phase.TERMINATED and queued.stop_reason == "credits" and "credits" in queued.message
    assert not Allocation.objects.filter(session=queued).exists()


def test_a_session_waiting_past_queue_timeout_hours_leaves_with_a_message(cluster, frozen):
    start(_user(), gpus=4, runtime_hours=24)
    queued = start(_user(queue_timeout_hours=Decimal(2)), queue=True)
    frozen.shift(2 * 3600)
    assert queue_pass()["expired"] == 1
    queued.refresh_from_db()
    assert queued.phase == Session.Phase.TERMINATED and queued.stop_reason == "queue_timeout" and "2.0 hours" in queued.message


def test_stopping_a_queued_session_ends_it_at_once(cluster):
    start(_user(), gpus=4)
    queued = start(_user(), queue=True)
    lifecycle.session_stop(session=queued)
    queued.refresh_from_db()
    assert queued.phase == Session.Phase.TERMINATED and queued.stop_reason == "requested" and queued.ended_at == NOW


def test_no_estimate_when_the_gpus_are_held_without_a_known_end(cluster):
    start(_user(max_runtime_hours=0), gpus=4)
    queued = start(_user(), queue=True)
    assert queued.estimated_start is None and "no estimate" in queued.waiting_for


def test_alternatives_offer_another_model_that_starts_now_with_its_price(cluster):
    other = ClusterFactory(name="lab-b")
    _node(other, model="NVIDIA A100-SXM4-40GB", memory=40960)
    placement.usage_recompute(cluster_ids=[other.pk])
    start(_user(), gpus=4, gpu_models=["H100"], runtime_hours=3)
    queued = start(_user(), gpus=2, gpu_models=["H100"], queue=True)
    offers = {o["why"]: o for o in queued.alternatives}
    assert offers["any GPU model"]["starts"] == "now"
    assert offers["any GPU model"]["gpu_models"] == ["NVIDIA A100-SXM4-40GB"]
    assert Decimal(offers["any GPU model"]["credits_per_hour"]) > 0


# --------------------------------------------------------------------------- the API


@pytest.fixture
def http_of(http_for):
    return lambda user: http_for(api_token_create(username=user.username)[1])


def test_api_queue_flag_queue_listing_and_staff_priority(cluster, http_of, staff_user):
    alice, bob = _user(), _user()
    start(alice, gpus=4, runtime_hours=2)
    answer = http_of(bob).post("/api/v1/sessions", json={"image": IMAGE, "gpus": 1, "queue": True})
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["phase"] == "Queued" and body["queue_position"] == 1 and body["estimated_start"] == "2026-12-01T14:00:00Z"
    assert body["credits_per_hour"] is None and body["cluster"] is None
    assert http_of(alice).get("/api/v1/queue").json()["results"] == []
    mine = http_of(bob).get("/api/v1/queue").json()["results"]
    assert [e["id"] for e in mine] == [body["id"]] and mine[0]["waiting_for"]
    refused = http_of(bob).post(f"/api/v1/sessions/{body['id']}/priority", json={"priority": 9})
    assert refused.status_code == 403 and refused.json()["code"] == "priority_forbidden"
    staff = http_of(staff_user)
    assert staff.post(f"/api/v1/sessions/{body['id']}/priority", json={"priority": 9}).json()["priority"] == 9
    assert staff.post(f"/api/v1/sessions/{body['id']}/priority", json={"priority": "9"}).status_code == 400
    assert staff.get("/api/v1/queue").json()["results"][0]["owner"] == bob.username


@pytest.mark.parametrize("queue", ["yes", 1, None, [], {}])
def test_api_refuses_a_queue_that_is_not_a_boolean(cluster, http_of, queue):
    answer = http_of(_user()).post("/api/v1/sessions", json={"image": IMAGE, "gpus": 1, "queue": queue})
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_request"
    assert not Session.objects.exists()


def test_api_never_fits_is_409_with_its_code(cluster, http_of):
    answer = http_of(_user()).post("/api/v1/sessions", json={"image": IMAGE, "gpus": 9, "queue": True})
    assert answer.status_code == 409 and answer.json()["code"] == "never_fits"
    assert not Session.objects.exists()


def test_the_owner_may_not_extend_while_the_queue_waits_for_such_gpus_but_staff_may(cluster, staff_user):
    alice = _user()
    running = start(alice, gpus=4, runtime_hours=2)
    start(_user(), gpus=1, queue=True)
    with pytest.raises(create.Conflict) as refused:
        runtime.session_extend(session=running, user=alice, hours=1)
    assert refused.value.code == "queue_waiting"
    assert runtime.session_extend(session=running, user=staff_user, hours=1).ends_at == NOW + 3 * HOUR


def test_a_queued_session_admitted_later_counts_its_time_limit_from_its_admission(cluster, frozen):
    running = start(_user(), gpus=4, runtime_hours=1)
    bob = _user(max_runtime_hours=Decimal(2))
    queued = start(bob, gpus=4, runtime_hours=1, queue=True)
    frozen.shift(3600)
    end(running)
    queue_pass()
    queued.refresh_from_db()
    assert queued.admitted_at == NOW + HOUR and queued.ends_at == NOW + 2 * HOUR
    extended = runtime.session_extend(session=queued, user=bob, hours=1)  # 2 h from its admission (3 h from its request)
    assert extended.ends_at == NOW + 3 * HOUR


def test_the_estimates_accuracy_is_recorded_and_exported(cluster, frozen):
    running = start(_user(), gpus=4, runtime_hours=2)
    queued = start(_user(), gpus=4, queue=True)
    assert queued.first_estimated_start == NOW + 2 * HOUR
    frozen.shift(3 * 3600)  # the session ran an hour past its estimate's basis (say, stopped late)
    end(running)
    queue_pass()
    queued.refresh_from_db()
    assert queued.admitted_at == NOW + 3 * HOUR
    figures = selectors.queue_figures(since=NOW)
    assert figures["admitted"] == 1 and figures["error_p50_seconds"] == 3600 and round(figures["error_p50_share"], 4) == round(1 / 3, 4)
    text = render_inventory().decode()
    assert 'gshare_queue_estimate_error_seconds{quantile="0.5"} 3600.0' in text and "gshare_queue_sessions 0.0" in text


def test_the_queue_starts_a_session_only_where_its_cpu_and_memory_fit(frozen):
    cluster = ClusterFactory(name="lab-cpu")
    small = NodeFactory(cluster=cluster, name="a-small", cpu_allocatable_millicores=4000, memory_allocatable_mib=65536)
    big = NodeFactory(cluster=cluster, name="b-big", cpu_allocatable_millicores=64000, memory_allocatable_mib=524288)
    for node in (small, big):
        for i in range(2):
            GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=81559, cores=100, model="NVIDIA H100 80GB HBM3")
    placement.usage_recompute(cluster_ids=[cluster.pk])
    big_run = start(_user(), gpus=2, cpu=2, memory_gib=8, runtime_hours=1, cluster="lab-cpu")
    assert big_run.node in ("a-small", "b-big")
    other = start(_user(), gpus=2, cpu=2, memory_gib=8, runtime_hours=2, cluster="lab-cpu")
    assert {big_run.node, other.node} == {"a-small", "b-big"}
    queued = start(_user(), gpus=2, cpu=16, memory_gib=64, queue=True)  # only b-big has room for 16 cores
    on_small = big_run if big_run.node == "a-small" else other
    end(on_small)  # a-small's GPUs free, but its 4 cores cannot take 16
    queue_pass()
    queued.refresh_from_db()
    assert queued.phase == Session.Phase.QUEUED
    end(big_run if on_small is other else other)
    queue_pass()
    queued.refresh_from_db()
    assert queued.phase == Session.Phase.SCHEDULED and queued.node == "b-big"


def test_cpu_no_node_has_room_for_never_fits(cluster):
    start(_user(), gpus=4)
    Node.objects.filter(cluster=cluster).update(cpu_allocatable_millicores=8000, cpu_requested_millicores=1000)
    with pytest.raises(create.Conflict) as refused:
        start(_user(), cpu=16, queue=True)
    assert refused.value.code == "never_fits" and "16 CPU core(s)" in refused.value.detail


def test_while_the_queue_waits_for_one_cluster_a_request_elsewhere_is_placed_as_usual(cluster):
    other = ClusterFactory(name="lab-b")
    _node(other)
    placement.usage_recompute(cluster_ids=[other.pk])
    start(_user(), gpus=4, cluster="lab-a", runtime_hours=2)
    start(_user(), gpus=4, cluster="lab-a", queue=True)  # waits for lab-a only
    placed = start(_user(), gpus=4, runtime_hours=8)  # lab-b delays nobody: placed without planning the queue
    assert placed.phase == Session.Phase.SCHEDULED and placed.cluster_id == other.pk
    with pytest.raises(create.Conflict) as refused:  # lab-a itself stays the queue's
        start(_user(), gpus=1, cluster="lab-a", runtime_hours=8)
    assert refused.value.code == "no_capacity"
