"""The queue's pass admitting the sessions it starts together (``sessions.queue.admit._admit_many``): every admitted
session complete (allocations, fields, one audit row), the queries a pass costs, an owner's second session and quotas,
credits, a reservation that races (all rolled back, then one by one), the batched reads and writes it is built on
(``admission_read_many``, ``accounts_lock``, ``audit_record_many``), the due sessions (``queue_expire``), and passes
racing with each other, with a cancel and with the billing jobs' account locks. On a frozen clock, real PostgreSQL."""

import threading
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from audit.models import AuditRecord
from audit.services import Action, audit_record, audit_record_many
from billing import admission
from billing.models import CreditAccount, Price
from billing.services import credit_grant, policy_set
from clusters.models import Cluster, GpuDevice
from clusters.services import cluster_deregister
from sessions import lifecycle, placement
from sessions.models import Allocation, Session
from sessions.queue import admit
from sessions.queue.admit import queue_expire, queue_pass
from sessions.queue.snapshot import queued_sessions
from sessions.volume_claims import PlacementRaced
from tests.factories import SessionFactory, UserFactory
from tests.helpers import lock_waiters, run_threads, wait_for
from tests.sessions.queue.helpers import H100, HOUR, NOW, end, one_node_cluster, queue_user, start
from tests.sessions.test_placement import recount, stored
from tests.sessions.test_volumes import make_pool, make_volume

pytestmark = pytest.mark.usefixtures("frozen", "no_background")

ENDED = Session.HOLDING_EXCLUDED_PHASES


def _fresh(*sessions):
    return [Session.objects.select_related("cluster").get(pk=s.pk) for s in sessions]


@pytest.fixture
def calls(monkeypatch):
    """The sessions the pass admitted one by one (``_admit``), and what the batch (``_admit_many``) answered."""
    seen = {"one": [], "many": []}
    one, many = admit._admit, admit._admit_many

    def spy_one(session, outcome, *, now):
        seen["one"].append(session.pk)
        return one(session, outcome, now=now)

    def spy_many(items, *, now):
        verdicts = many(items, now=now)
        seen["many"].append(verdicts)
        return verdicts

    monkeypatch.setattr(admit, "_admit", spy_one)
    monkeypatch.setattr(admit, "_admit_many", spy_many)
    return seen


def _admitted_completely(session, *, cluster: Cluster, hours: float):
    """``session`` (fresh) is Scheduled on ``cluster`` with its GPUs, its fields, and one admission audit row."""
    assert session.phase == Session.Phase.SCHEDULED and session.cluster_id == cluster.pk, (session.phase, session.waiting_for)
    assert session.admitted_at == NOW and session.ends_at == NOW + hours * HOUR
    assert (session.queue_position, session.estimated_start, session.waiting_for, session.alternatives, session.message) == (
        None, None, "", [], "")
    allocations = list(Allocation.objects.filter(session=session).select_related("device__node"))
    assert len(allocations) == session.gpus
    assert {(a.device.cluster_id, a.device.node.name) for a in allocations} == {(cluster.pk, session.node)}
    [record] = AuditRecord.objects.filter(action=Action.SESSION_ADMIT, object_id=session.public_id)
    assert (record.cluster, record.cluster_name, record.object_type) == (cluster.public_id, cluster.name, "session")
    assert record.changes["phase"] == {"old": "Queued", "new": "Scheduled"}
    assert record.changes["node"] == {"old": "", "new": session.node}
    assert record.details == {"owner": session.owner.username, "waited_seconds": 0}
    return {a.device_id for a in allocations}


def _counters_recounted(clusters):
    before = stored()
    placement.usage_recompute(cluster_ids=[c.pk for c in clusters])
    assert stored() == before == recount()


# =========================================================================== admitting several owners together


@pytest.mark.django_db
def test_a_pass_admits_the_sessions_of_several_owners_together_each_complete(calls):
    lab_a, lab_b = one_node_cluster("lab-a"), one_node_cluster("lab-b")
    fillers = [start(queue_user(), gpus=4, runtime_hours=2, cluster=name) for name in ("lab-a", "lab-b")]
    a = start(queue_user(), gpus=2, runtime_hours=1, cluster="lab-a", queue=True)
    b = start(queue_user(), gpus=3, runtime_hours=3, cluster="lab-b", queue=True)
    c = start(queue_user(), gpus=1, runtime_hours=1, queue=True)  # anywhere: binpack puts it beside a on lab-a
    for filler in fillers:
        end(filler)
    assert queue_pass() == {"queued": 3, "admitted": 3, "expired": 0, "dropped": 0}
    assert calls["one"] == [] and calls["many"] == [{a.pk: "admitted", b.pk: "admitted", c.pk: "admitted"}]
    a, b, c = _fresh(a, b, c)
    taken = [_admitted_completely(a, cluster=lab_a, hours=1), _admitted_completely(b, cluster=lab_b, hours=3),
             _admitted_completely(c, cluster=c.cluster, hours=1)]
    assert len(set().union(*taken)) == 6  # nobody's GPU is another's
    assert AuditRecord.objects.filter(action=Action.SESSION_ADMIT).count() == 3
    _counters_recounted([lab_a, lab_b])


@pytest.mark.django_db
@pytest.mark.parametrize("limits", [(None, None), (None, 1)])
def test_sessions_without_a_time_limit_are_admitted_together_with_no_end(calls, limits):
    lab = one_node_cluster("lab-a")
    filler = start(queue_user(), gpus=4, runtime_hours=2)
    queued = [start(queue_user(max_runtime_hours=Decimal(0)), queue=True, **({"runtime_hours": h} if h else {})) for h in limits]
    end(filler)
    assert queue_pass()["admitted"] == 2 and calls["one"] == []
    for session, hours in zip(_fresh(*queued), limits, strict=True):
        assert session.phase == Session.Phase.SCHEDULED and session.cluster_id == lab.pk
        assert session.ends_at == (None if hours is None else NOW + hours * HOUR)


@pytest.mark.django_db
def test_the_estimate_counts_on_a_holders_credits_running_out_from_the_holders_read():
    one_node_cluster("lab-a")
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal(1))
    rich, broke = queue_user(max_runtime_hours=Decimal(0)), queue_user(max_runtime_hours=Decimal(0))
    credit_grant(user=rich, amount=Decimal(6), reason="test", idempotency_key=f"{rich.pk}:g", created_by="test")
    burning = start(rich, gpus=3)  # 3 GPUs at 1/h, 6 credits: out at 14:00
    unlimited = start(broke)  # no account row: read as none, not as out of credits
    CreditAccount.objects.filter(user=broke).delete()
    Session.objects.filter(pk__in=[burning.pk, unlimited.pk]).update(phase=Session.Phase.RUNNING)
    queued = start(queue_user(), gpus=3, queue=True)
    queue_pass()
    queued.refresh_from_db()
    assert queued.estimated_start == NOW + 2 * HOUR and burning.public_id in queued.waiting_for, queued.waiting_for


def _release_and_pass(cluster, n: int) -> tuple[int, dict]:
    """Fill ``cluster`` (8 GPUs), queue ``n`` one-GPU sessions of ``n`` owners, release: the queries of the pass then."""
    filler = start(queue_user(), gpus=8, runtime_hours=2)
    queued = [start(queue_user(), runtime_hours=1, queue=True) for _ in range(n)]
    end(filler)
    with CaptureQueriesContext(connection) as queries:
        result = queue_pass()
    for session in queued:
        end(session)
    return len(queries), result


@pytest.mark.django_db
def test_admitting_more_owners_together_costs_no_more_queries(calls):
    """A pass after a release that admits 2 sessions of 2 owners is 19 queries: the pass lock, the queued read, the
    policies, the fleet (nodes, GPUs, holders, prices), the batch (savepoint, accounts, sessions, admission reads,
    clusters, the reservation's three: the chosen GPUs, the allocations, the recount; the sessions' rows, the audit
    rows, release savepoint: the savepoint pair is the test's transaction, outside one it is BEGIN/COMMIT, not
    counted), the unlock; nothing waits, so no estimates are written. 4 owners: the same 19."""
    cluster = one_node_cluster("lab-a", gpus=8)
    _release_and_pass(cluster, 2)  # warm: the prepared statements and the caches the first pass fills
    two, result_two = _release_and_pass(cluster, 2)
    four, result_four = _release_and_pass(cluster, 4)
    assert result_two["admitted"] == 2 and result_four["admitted"] == 4 and calls["one"] == []
    assert four == two == 19, (two, four)


# =========================================================================== an owner's second session, quotas


@pytest.mark.django_db
def test_an_owners_second_session_is_admitted_after_the_batch_one_by_one(calls):
    lab = one_node_cluster("lab-a")
    filler = start(queue_user(), gpus=4, runtime_hours=2)
    bob = queue_user()
    first, second = start(bob, runtime_hours=1, queue=True), start(bob, runtime_hours=1, queue=True)
    other = start(queue_user(), runtime_hours=1, queue=True)
    end(filler)
    assert queue_pass()["admitted"] == 3
    assert calls["one"] == [second.pk] and calls["many"] == [{first.pk: "admitted", other.pk: "admitted"}]
    for session in _fresh(first, second, other):
        _admitted_completely(session, cluster=lab, hours=1)
    _counters_recounted([lab])


@pytest.mark.django_db
@pytest.mark.parametrize(("policy", "limit"), [({"max_sessions": 1}, "max_sessions"), ({"max_gpus": 2}, "max_gpus")])
def test_an_owners_quota_holds_across_the_batch_and_the_one_by_one_path(calls, policy, limit):
    one_node_cluster("lab-a")
    filler = start(queue_user(), gpus=4, runtime_hours=2)
    bob = queue_user(**policy)
    first, second = start(bob, gpus=2, runtime_hours=1, queue=True), start(bob, runtime_hours=1, queue=True)
    other = start(queue_user(), runtime_hours=1, queue=True)
    end(filler)
    assert queue_pass() == {"queued": 3, "admitted": 2, "expired": 0, "dropped": 0}
    first, second, other = _fresh(first, second, other)
    assert first.phase == other.phase == Session.Phase.SCHEDULED
    assert second.phase == Session.Phase.QUEUED and not Allocation.objects.filter(session=second).exists()
    assert "your policy holds it back" in second.waiting_for and limit in second.waiting_for, second.waiting_for
    assert queue_pass()["admitted"] == 0  # still over: it keeps waiting, pass after pass
    end(first)
    assert queue_pass()["admitted"] == 1
    assert Session.objects.get(pk=second.pk).phase == Session.Phase.SCHEDULED


@pytest.mark.django_db
def test_an_owners_first_session_in_the_queue_starts_first_even_when_it_mounts_volumes(calls):
    """The batch skips sessions with volumes; the owner's session behind one must not jump it (max_sessions=1: the
    head starts, the other waits)."""
    lab = one_node_cluster("lab-a")
    filler = start(queue_user(), gpus=4, runtime_hours=2)
    bob = queue_user(max_sessions=1)
    volume = make_volume(bob, make_pool(lab), name="data", cluster=lab)
    head = start(bob, runtime_hours=1, volumes=[volume.public_id], queue=True)
    behind = start(bob, runtime_hours=1, queue=True)
    other = start(queue_user(), runtime_hours=1, queue=True)
    end(filler)
    assert queue_pass()["admitted"] == 2
    head, behind, other = _fresh(head, behind, other)
    assert head.phase == other.phase == Session.Phase.SCHEDULED, (head.phase, head.waiting_for)
    assert behind.phase == Session.Phase.QUEUED and "max_sessions" in behind.waiting_for


# =========================================================================== credits


@pytest.mark.django_db
def test_an_owner_who_cannot_pay_is_dropped_from_the_batch_and_the_others_start(calls):
    lab = one_node_cluster("lab-a")
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal(2))
    filler = start(queue_user(), gpus=4, runtime_hours=2)
    alice, bob, carol = queue_user(), queue_user(), queue_user(min_balance_hours=Decimal(1))
    credit_grant(user=carol, amount=Decimal(5), reason="test", idempotency_key=f"{carol.pk}:g", created_by="test")
    hers, broke, paid = (start(alice, runtime_hours=1, queue=True), start(bob, runtime_hours=1, queue=True),
                         start(carol, runtime_hours=1, queue=True))
    policy_set(user=bob, min_balance_hours=Decimal(1))  # now needs an hour of credits, and has a zero balance
    end(filler)
    assert queue_pass() == {"queued": 3, "admitted": 2, "expired": 0, "dropped": 1}
    assert calls["one"] == [] and calls["many"] == [{hers.pk: "admitted", broke.pk: "dropped", paid.pk: "admitted"}]
    hers, broke, paid = _fresh(hers, broke, paid)
    _admitted_completely(hers, cluster=lab, hours=1)
    _admitted_completely(paid, cluster=lab, hours=1)
    assert broke.phase == Session.Phase.TERMINATED and broke.stop_reason == "credits" and "credits" in broke.message
    assert not Allocation.objects.filter(session=broke).exists()
    assert not AuditRecord.objects.filter(action=Action.SESSION_ADMIT, object_id=broke.public_id).exists()
    assert AuditRecord.objects.filter(action=Action.SESSION_STOP, object_id=broke.public_id).count() == 1
    _counters_recounted([lab])


# =========================================================================== a reservation that races


def _nothing_half_applied(pks):
    """Right after a rolled-back batch: every session still queued, holding nothing, with no admission row."""
    sessions = Session.objects.filter(pk__in=pks)
    assert {s.phase for s in sessions} == {Session.Phase.QUEUED}
    assert all(s.cluster_id is None and s.admitted_at is None and s.ends_at is None and s.node == "" for s in sessions)
    assert not Allocation.objects.filter(session__in=pks).exists()
    assert not AuditRecord.objects.filter(action=Action.SESSION_ADMIT, object_id__in=[s.public_id for s in sessions]).exists()


@pytest.mark.django_db
def test_a_reservation_failing_once_rolls_the_batch_back_and_each_is_admitted_one_by_one(calls, monkeypatch):
    lab = one_node_cluster("lab-a")
    filler = start(queue_user(), gpus=4, runtime_hours=2)
    queued = [start(queue_user(), runtime_hours=1, queue=True) for _ in range(3)]
    end(filler)
    reserve, count = admit.planned_reserve, []

    def writes_then_races(items):
        count.append(1)
        reserve(items)  # the allocations and counters written, then found raced: all of it must roll back
        raise PlacementRaced

    monkeypatch.setattr(admit, "planned_reserve", writes_then_races)
    many = admit._admit_many
    monkeypatch.setattr(admit, "_admit_many", lambda items, *, now: (many(items, now=now), _nothing_half_applied([s.pk for s in queued]))[0])
    assert queue_pass()["admitted"] == 3
    assert calls["one"] == [s.pk for s in queued]  # the batch answered {}: all one by one
    assert len(count) == 1
    for session in _fresh(*queued):
        _admitted_completely(session, cluster=lab, hours=1)
    _counters_recounted([lab])


@pytest.mark.django_db
def test_a_gpu_taken_between_plan_and_admission_rolls_back_then_what_fits_starts(calls, monkeypatch):
    lab = one_node_cluster("lab-a")
    filler = start(queue_user(), gpus=4, runtime_hours=2)
    first, raced = start(queue_user(), runtime_hours=1, queue=True), start(queue_user(), runtime_hours=1, queue=True)
    end(filler)
    intruder = SessionFactory(cluster=lab, phase=Session.Phase.SCHEDULED, gpus=1)
    plan = admit.plan

    def plan_then_take(fleet, jobs):
        outcomes = plan(fleet, jobs)
        planned = next(o for o in outcomes if o.job.key == raced.pk)
        with transaction.atomic():  # another placement takes the raced session's planned GPU meanwhile
            Cluster.objects.select_for_update().get(pk=lab.pk)
            assert placement.reserve(session_id=intruder.pk, request=placement.Request(gpus=1), cluster_id=lab.pk,
                                     node_id=planned.node.pk, device_ids=[planned.devices[0].pk]) is not None
        return outcomes

    monkeypatch.setattr(admit, "plan", plan_then_take)
    many = admit._admit_many
    monkeypatch.setattr(admit, "_admit_many", lambda items, *, now: (many(items, now=now), _nothing_half_applied([first.pk, raced.pk]))[0])
    assert queue_pass() == {"queued": 2, "admitted": 1, "expired": 0, "dropped": 0}
    assert calls["many"] == [{}] and calls["one"] == [first.pk, raced.pk]
    first, raced = _fresh(first, raced)
    _admitted_completely(first, cluster=lab, hours=1)
    assert raced.phase == Session.Phase.QUEUED and not Allocation.objects.filter(session=raced).exists()
    assert not AuditRecord.objects.filter(action=Action.SESSION_ADMIT, object_id=raced.public_id).exists()
    _counters_recounted([lab])
    monkeypatch.setattr(admit, "plan", plan)
    monkeypatch.setattr(admit, "_admit_many", many)
    assert queue_pass()["admitted"] == 1  # the next pass plans again: 2 GPUs are still free
    _admitted_completely(Session.objects.get(pk=raced.pk), cluster=lab, hours=1)
    _counters_recounted([lab])


# =========================================================================== the batched reads and writes


@pytest.mark.django_db
def test_admission_read_many_answers_what_admission_read_answers_for_each_user():
    lab, other = one_node_cluster("lab-a"), one_node_cluster("lab-b")
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal(3))
    users = [queue_user(max_sessions=3, max_gpus=4), queue_user(min_balance_hours=Decimal(2)), UserFactory(),
             queue_user(allowed_clusters=[lab], min_balance_hours=Decimal(1))]
    users += [queue_user(max_sessions=i) for i in range(1, 9)]  # 12 requests: the 11th's parameter names are not the 1st's
    for user in users[:2]:
        credit_grant(user=user, amount=Decimal(100), reason="test", idempotency_key=f"{user.pk}:g", created_by="test")
    start(users[0], gpus=2, cluster="lab-a")
    start(users[1], gpu_memory_mib=1000, gpu_cores=20, cluster="lab-b")
    start(users[10], cluster="lab-b")
    scopes = [[lab.pk], None, [other.pk], [lab.pk, other.pk]]
    requests = [(user.pk, scopes[i % len(scopes)]) for i, user in enumerate(users)]
    many = admission.admission_read_many(requests=requests, ended_phases=ENDED)
    one = [admission.admission_read(user=user, scope=scope, ended_phases=ENDED) for user, (_, scope) in zip(users, requests, strict=True)]
    assert many == one
    assert [len(state.live) for state in many[:3]] == [1, 1, 0] and many[1].models and many[1].policy.min_balance_hours == 2
    assert admission.admission_read_many(requests=[], ended_phases=ENDED) == []


@pytest.mark.django_db
def test_accounts_lock_creates_a_missing_account_and_returns_each_users():
    funded, bare = queue_user(), UserFactory()
    credit_grant(user=funded, amount=Decimal(7), reason="test", idempotency_key=f"{funded.pk}:g", created_by="test")
    CreditAccount.objects.filter(user=bare).delete()
    with transaction.atomic():
        accounts = admission.accounts_lock(user_ids=[bare.pk, funded.pk, funded.pk])
        assert set(accounts) == {funded.pk, bare.pk}
        assert accounts[funded.pk].balance == 7 and accounts[bare.pk].balance == 0
        assert accounts[bare.pk].pk == CreditAccount.objects.get(user=bare).pk
    assert admission.accounts_lock(user_ids=[]) == {}


@pytest.mark.django_db
def test_audit_record_many_writes_the_rows_audit_record_writes():
    lab = one_node_cluster("lab-a")
    session = start(queue_user())
    session = Session.objects.select_related("cluster").get(pk=session.pk)
    entries = [
        {"action": Action.SESSION_ADMIT, "obj": session, "changes": {"phase": ("Queued", "Scheduled"), "ends_at": (None, NOW)},
         "details": {"owner": "x", "waited_seconds": 3}},
        {"action": Action.SESSION_ADMIT, "obj": session, "cluster": lab, "actor": "console:bob"},
        {"action": Action.CLUSTER_UPDATE, "obj": lab, "changes": {"name": ("a", "b")}},
        {"action": Action.SESSION_STOP, "object_type": "token", "object_id": "jti-1", "object_repr": "a token"},
    ]
    fields = ["at", "actor", "action", "object_type", "object_id", "object_repr", "cluster", "cluster_name", "changes", "details",
              "source_address"]
    single = [audit_record(**entry).pk for entry in entries]
    bulk = [record.pk for record in audit_record_many(entries)]
    assert None not in bulk
    rows = {r["id"]: r for r in AuditRecord.objects.filter(pk__in=single + bulk).values("id", *fields)}
    assert [{f: rows[pk][f] for f in fields} for pk in bulk] == [{f: rows[pk][f] for f in fields} for pk in single]
    assert rows[bulk[0]]["cluster"] == lab.public_id and rows[bulk[3]]["cluster"] == ""
    written = AuditRecord.objects.count()
    with pytest.raises(ValueError, match="unknown audit action"):
        audit_record_many([entries[0], {**entries[1], "action": "session_teleport"}])
    with pytest.raises(ValueError, match="cluster loaded"):
        audit_record_many([{"action": Action.SESSION_ADMIT, "obj": Session.objects.get(pk=session.pk)}])
    assert AuditRecord.objects.count() == written


# =========================================================================== due sessions


@pytest.mark.django_db
def test_queue_expire_checks_each_due_session_again_under_its_lock(frozen):
    one_node_cluster("lab-a")
    start(queue_user(), gpus=4, runtime_hours=24)
    queued = start(queue_user(queue_timeout_hours=Decimal(2)), queue=True)
    later = NOW + 2 * HOUR
    [row] = queued_sessions(now=later)
    assert row.due and not queued_sessions(now=NOW)[0].due and not queued_sessions()[0].due
    Session.objects.filter(pk=queued.pk).update(queue_expires_at=NOW + 5 * HOUR)  # e.g. a staff member extended it
    assert queue_expire(now=later, pks=[row.pk]) == 0
    assert Session.objects.get(pk=queued.pk).phase == Session.Phase.QUEUED
    frozen.move_to(NOW + 5 * HOUR)
    assert queue_pass() == {"queued": 0, "admitted": 0, "expired": 1, "dropped": 0}
    queued.refresh_from_db()
    assert queued.phase == Session.Phase.TERMINATED and queued.stop_reason == "queue_timeout" and "5.0 hours" in queued.message
    assert not Allocation.objects.filter(session=queued).exists()


@pytest.mark.django_db
def test_a_pass_drops_the_sessions_pinned_to_a_deregistered_cluster_and_admits_the_rest():
    lab, lab_b = one_node_cluster("lab-a"), one_node_cluster("lab-b")
    fillers = [start(queue_user(), gpus=4, runtime_hours=2, cluster=name) for name in ("lab-a", "lab-b")]
    pinned = start(queue_user(), cluster="lab-b", queue=True)
    waiting = [start(queue_user(), runtime_hours=1, cluster="lab-a", queue=True) for _ in range(2)]
    for filler in fillers:
        end(filler)
    cluster_deregister(cluster=lab_b)
    assert [row.due for row in queued_sessions(now=NOW)] == [True, False, False]
    assert queue_pass() == {"queued": 2, "admitted": 2, "expired": 1, "dropped": 0}
    pinned.refresh_from_db()
    assert pinned.phase == Session.Phase.TERMINATED and "deregistered" in pinned.message
    for session in _fresh(*waiting):
        _admitted_completely(session, cluster=lab, hours=1)


# =========================================================================== concurrency


def _in_thread(errors, fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - recorded, asserted by the test
        errors.append(exc)
    finally:
        connections.close_all()


def _each_admitted_once_or_never():
    """No session admitted twice, no GPU over-reserved, the counters a recount's."""
    for session in Session.objects.all():
        admissions = AuditRecord.objects.filter(action=Action.SESSION_ADMIT, object_id=session.public_id).count()
        held = Allocation.objects.filter(session=session).count()
        assert admissions <= 1, session.public_id
        if session.phase in Session.TERMINAL_PHASES:
            assert held == 0, session.phase
        elif session.phase == Session.Phase.QUEUED:
            assert (admissions, held) == (0, 0)
        else:
            assert held == session.gpus, (session.phase, held)
    assert all(d.used_count <= 1 for d in GpuDevice.objects.all())  # whole GPUs: one session each
    assert recount() == stored()


@pytest.mark.django_db(transaction=True)
def test_two_passes_at_once_never_admit_a_session_twice_nor_share_a_gpu(monkeypatch):
    """One pass through ``queue_pass`` (its advisory lock), the other straight through ``_pass`` (no lock): only the
    admissions' own row locks keep them apart."""
    lab = one_node_cluster("lab-a", gpus=6)
    filler = start(queue_user(), gpus=6, runtime_hours=2)
    queued = [start(queue_user(), gpus=1 + i % 2, runtime_hours=1, queue=True) for i in range(6)]
    end(filler)
    barrier, errors = threading.Barrier(2), []
    run_threads(lambda fn: _in_thread(errors, lambda: (barrier.wait(), fn(now=None))), [(queue_pass,), (admit._pass,)])
    assert not errors, errors
    queue_pass()
    _each_admitted_once_or_never()
    assert Allocation.objects.count() == 6 and Session.objects.filter(pk__in=[s.pk for s in queued], phase="Scheduled").count() >= 4
    placement.usage_recompute(cluster_ids=[lab.pk])
    assert recount() == stored()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(4))
def test_a_pass_racing_with_a_cancel_admits_with_gpus_or_ends_without(round_):
    one_node_cluster("lab-a")
    filler = start(queue_user(), gpus=4, runtime_hours=2)
    queued = [start(queue_user(), runtime_hours=1, queue=True) for _ in range(3)]
    cancelled = queued[round_ % 3]
    end(filler)
    barrier, errors = threading.Barrier(2), []

    def cancel():
        barrier.wait()
        lifecycle.session_stop(session=Session.objects.get(pk=cancelled.pk))

    def passes():
        barrier.wait()
        queue_pass()

    run_threads(lambda fn: _in_thread(errors, fn), [(cancel,), (passes,)] if round_ % 2 else [(passes,), (cancel,)])
    assert not errors, errors
    cancelled.refresh_from_db()
    held = Allocation.objects.filter(session=cancelled).count()
    admissions = AuditRecord.objects.filter(action=Action.SESSION_ADMIT, object_id=cancelled.public_id).count()
    if cancelled.admitted_at is None:  # the cancel came first: it left the queue holding nothing
        assert (cancelled.phase, held, admissions) == (Session.Phase.TERMINATED, 0, 0)
    else:  # the pass came first: admitted whole, then stopping (its GPUs are released when its pod is gone)
        assert cancelled.phase in (Session.Phase.SCHEDULED, Session.Phase.STOPPING) and (held, admissions) == (1, 1)
    _each_admitted_once_or_never()


@pytest.mark.django_db(transaction=True)
def test_the_batch_locks_accounts_in_the_order_the_billing_jobs_do():
    """The billing jobs lock several credit accounts in primary-key order (``sessions.overdrawn``, ``billing.periods``,
    ``billing.held``): a batch locking them in another order would deadlock with one of them."""
    low, high = UserFactory(), UserFactory()  # low.pk < high.pk; high's account is made first: the lower account pk
    for user in (high, low):
        credit_grant(user=user, amount=Decimal(1), reason="test", idempotency_key=f"{user.pk}:g", created_by="test")
    first, second = (CreditAccount.objects.get(user=high), CreditAccount.objects.get(user=low))
    assert first.pk < second.pk and low.pk < high.pk
    holds_first, errors = threading.Event(), []

    def billing_job():  # locks first, then (once the batch waits) second: as one ``ORDER BY pk FOR UPDATE`` proceeds
        with transaction.atomic():
            CreditAccount.objects.select_for_update().get(pk=first.pk)
            holds_first.set()
            with connection.cursor() as cursor:
                wait_for(lambda: lock_waiters(cursor) > 0, timeout=30, what="the batch waiting on an account")
            CreditAccount.objects.select_for_update().get(pk=second.pk)

    def batch():
        holds_first.wait(30)
        with transaction.atomic():
            admission.accounts_lock(user_ids=[low.pk, high.pk])

    run_threads(lambda fn: _in_thread(errors, fn), [(billing_job,), (batch,)])
    assert not errors, errors
