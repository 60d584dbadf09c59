"""Every second a session held GPUs is billed (``billing.held``): from the moment placement reserved them (its
creation) to its end, whether or not a usage sample fell inside; late and replayed samples never bill a second twice.

Prices are chosen so a GPU-millisecond costs an exact number of credits (H100 3.6 credits per GPU-hour: 0.000001 per
ms), so "held seconds × the session's hourly rate" is exact to the last decimal and the assertions need no tolerance.
Sessions end through the session services (the operator's terminal status report, or a failure), which release their
reservations as in production; time is the tests' clock (``T0`` and explicit ``now``), never the wall clock, except
where the service stamps ``ended_at`` itself (read back from the row).
"""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import ROUND_CEILING, Decimal
from types import SimpleNamespace

import pytest
from django.db import connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contract
from billing import held, ingest, periods, selectors
from billing.models import CREDITS, HeldGpu, LedgerEntry, Price, UsageSample
from billing.usage import parse_samples
from core.exceptions import ApplicationError
from sessions import lifecycle
from sessions.models import Allocation, Session
from tests.billing.books import assert_books, billed
from tests.factories import SessionFactory, UserFactory
from tests.helpers import T0, device, run_threads, sample

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
SETTLE = timedelta(seconds=120)


@pytest.fixture
def exact_prices(settings):
    settings.GSHARE_BILLING_SETTLE_SECONDS = 120
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("3.6"))
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("7.2"))


def reserved_session(cluster, *, owner=None, gpus, created, devices=None, **fields) -> Session:
    """A Running session created at ``created`` with ``gpus`` (``GpuDevice`` rows) reserved for it as placement
    reserves them (``Allocation``); ``devices`` (default: the same GPUs) is what HAMi gave its Pod as the operator
    reported it."""
    session = SessionFactory(cluster=cluster, owner=owner or UserFactory(), gpus=len(gpus), **fields)
    for gpu in gpus:
        Allocation.objects.create(session=session, device=gpu, memory_mib=fields.get("gpu_memory_mib") or gpu.memory_mib,
                                  cores=fields.get("gpu_cores") or 100, exclusive=session.whole_gpus)
    Session.objects.filter(pk=session.pk).update(created_at=created, started_at=created,
                                                 devices=[g.uuid for g in (gpus if devices is None else devices)])
    session.refresh_from_db()
    return session


def end(session, at) -> Session:
    """The operator's report that the session's Pod ended at ``at`` (``session_status_apply``: releases its GPUs)."""
    lifecycle.session_status_apply(cluster=session.cluster, reports=[{
        "session": session.public_id, "phase": contract.PHASE_TERMINATED, "node": "", "devices": [], "message": None,
        "observed_at": at,
    }])
    session.refresh_from_db()
    assert session.ended_at == at and not session.allocations.exists()
    return session


def rate(session) -> Decimal:
    """The session's credits per hour (``billing.selectors.session_hourly_cost``), read while its GPUs are reserved."""
    return selectors.session_hourly_cost(Session.objects.prefetch_related("allocations__device").get(pk=session.pk))


def held_cost(session, hourly: Decimal) -> Decimal:
    """Held seconds × the hourly rate: what the session must be billed, exactly (the prices make it exact)."""
    seconds = Decimal((session.ended_at - session.created_at) // timedelta(microseconds=1)) / Decimal(1_000_000)
    return hourly * seconds / 3600


def test_a_session_created_and_ended_between_two_ticks_is_charged_its_held_seconds(lab_c1, exact_prices):
    """The issue's case: 3.7 s of a whole H100 with no sample at all. Before billing.held it cost nothing."""
    h100 = device(lab_c1, "NVIDIA H100")
    session = reserved_session(lab_c1, gpus=[h100], created=T0 + timedelta(seconds=10))
    hourly = rate(session)
    end(session, T0 + timedelta(seconds=13.7))
    assert periods.periods_close(now=session.ended_at + SETTLE - timedelta(microseconds=1)) == 0  # not settled yet
    assert periods.periods_close(now=session.ended_at + SETTLE) == 1
    [charge] = LedgerEntry.objects.filter(session=session, kind="charge")
    assert charge.amount == -Decimal("0.003700") == -held_cost(session, hourly)
    assert (charge.gpu_seconds, charge.sample_count, charge.window_start, charge.window_end) == (
        Decimal("3.7"), 1, session.created_at, session.ended_at)
    [gap] = UsageSample.objects.filter(session=session)
    assert gap.gap and gap.sample_id.startswith("gap:") and (gap.device_uuid, gap.start, gap.end) == (h100.uuid, T0 + timedelta(seconds=10),
                                                                                                       T0 + timedelta(seconds=13.7))
    assert HeldGpu.objects.get(session=session).billed_at == session.ended_at + SETTLE
    assert periods.periods_close(now=T0 + timedelta(days=1)) == 0  # idempotent
    assert_books()


def test_a_failed_session_is_billed_from_its_reservation_to_its_failure(lab_c1, exact_prices):
    """Placement reserved the GPUs at creation; a session that fails before it ever ran held them until then."""
    h100 = device(lab_c1, "NVIDIA H100")
    session = reserved_session(lab_c1, gpus=[h100], created=T0, phase=Session.Phase.SCHEDULED)
    hourly = rate(session)
    lifecycle.session_fail(session=session, message="Could not apply the session.")
    session.refresh_from_db()
    periods.periods_close(now=session.ended_at + SETTLE)
    assert billed(session) == held_cost(session, hourly).quantize(CREDITS, rounding=ROUND_CEILING) > 0  # ended_at: the service's clock, µs
    assert_books()


def test_the_first_and_last_seconds_of_a_sampled_session_are_charged(lab_c1, exact_prices):
    """Samples cover [60 s, 240 s) of a session held [5 s, 250.5 s) on two H100s: the 55 s before the first tick and
    the 10.5 s after the last are billed on both GPUs, and a window sticking out before its creation counts from it."""
    gpus = _h100s(lab_c1, 2)
    session = reserved_session(lab_c1, gpus=gpus, created=T0 + timedelta(seconds=5))
    hourly = rate(session)
    stream = [sample(session, gpu, start=T0 + timedelta(seconds=s), seconds=60) for s in (60, 120, 180) for gpu in gpus]
    early = sample(session, gpus[0], start=T0 + timedelta(seconds=1), seconds=20)  # the node's clock a little ahead: 5..21 s
    assert ingest.usage_ingest(cluster=lab_c1, samples=[*stream, early])["accepted"] == 7
    assert UsageSample.objects.get(sample_id=early["sample_id"]).start == session.created_at
    end(session, T0 + timedelta(seconds=250.5))
    periods.periods_close(now=session.ended_at + SETTLE)
    assert billed(session) == held_cost(session, hourly) == Decimal("0.491000")  # 2 × 245.5 s × 0.001
    gaps = sorted((g.device_uuid == gpus[0].uuid, g.start, g.end) for g in UsageSample.objects.filter(session=session, gap=True))
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731
    assert gaps == sorted([(True, at(21), at(60)), (True, at(240), at(250.5)), (False, at(5), at(60)), (False, at(240), at(250.5))])
    assert_books()


def _h100s(cluster, count: int) -> list:
    from clusters.models import GpuDevice

    return list(GpuDevice.objects.filter(cluster=cluster, model=H100).order_by("index", "pk")[:count])


def test_late_replayed_and_outside_samples_charge_no_second_twice(lab_c1, exact_prices):
    """After the held time was billed, the operator's last samples arrive (covering seconds a gap row billed), the
    batches are replayed, and a window after the end: nothing is stored or charged again."""
    [h100] = _h100s(lab_c1, 1)
    session = reserved_session(lab_c1, gpus=[h100], created=T0)
    hourly = rate(session)
    first = [sample(session, h100, start=T0 + timedelta(minutes=m)) for m in range(2)]
    assert ingest.usage_ingest(cluster=lab_c1, samples=first)["accepted"] == 2
    end(session, T0 + timedelta(minutes=3, seconds=30))
    # Before the settle time: a window beginning before the end counts up to it; one after the end is not stored.
    within = sample(session, h100, start=T0 + timedelta(minutes=2), seconds=60)
    after = sample(session, h100, start=T0 + timedelta(minutes=3, seconds=30), seconds=60)
    assert ingest.usage_ingest(cluster=lab_c1, samples=[within, after]) == {
        "accepted": 1, "duplicates": 1, "charged": {session.public_id: "0.060000"}}
    periods.periods_close(now=session.ended_at + SETTLE)
    assert billed(session) == held_cost(session, hourly) == Decimal("0.210000")
    late = sample(session, h100, start=T0 + timedelta(minutes=3), seconds=30)  # the 30 s a gap row billed
    for batch in ([late], first, [within, after, late]):
        assert ingest.usage_ingest(cluster=lab_c1, samples=batch) == {"accepted": 0, "duplicates": len(batch), "charged": {}}
    periods.periods_close(now=T0 + timedelta(days=1))
    assert billed(session) == Decimal("0.210000") and not UsageSample.objects.filter(sample_id=late["sample_id"]).exists()
    assert_books()


def test_other_gpus_than_reserved_count_once(lab_c1, exact_prices):
    """HAMi gave the Pod another H100 than placement reserved: its samples cover the session's one GPU, and only the
    time they leave uncovered is billed on the reserved one (one GPU at a time, never two)."""
    reserved, given_gpu = _h100s(lab_c1, 2)
    session = reserved_session(lab_c1, gpus=[reserved], devices=[given_gpu], created=T0)
    hourly = rate(session)
    ingest.usage_ingest(cluster=lab_c1, samples=[sample(session, given_gpu, start=T0 + timedelta(seconds=30), seconds=60)])
    end(session, T0 + timedelta(seconds=100))
    periods.periods_close(now=session.ended_at + SETTLE)
    assert billed(session) == held_cost(session, hourly) == Decimal("0.100000")
    assert {(g.device_uuid, g.start, g.end) for g in UsageSample.objects.filter(session=session, gap=True)} == {
        (reserved.uuid, T0, T0 + timedelta(seconds=30)), (reserved.uuid, T0 + timedelta(seconds=90), T0 + timedelta(seconds=100))}
    assert_books()


def test_stop_start_loops_pay_every_held_second(lab_c1, exact_prices):
    """Forty sessions, each created and ended between two ticks (no sample), one after the other on one account:
    the account pays the sum of their held seconds, and a shared GPU pays its share."""
    owner = UserFactory()
    [h100] = _h100s(lab_c1, 1)
    sessions, expected = [], Decimal(0)
    for n in range(40):
        fields = {"gpu_memory_mib": 1000, "gpu_cores": 10} if n % 2 else {}
        created = T0 + timedelta(seconds=10 * n)
        session = reserved_session(lab_c1, owner=owner, gpus=[h100], created=created, **fields)
        hourly = rate(session)
        sessions.append(end(session, created + timedelta(seconds=1 + n % 7)))
        expected += held_cost(session, hourly)
    periods.periods_close(now=T0 + timedelta(hours=1))
    assert sum((billed(s) for s in sessions), Decimal(0)) == expected == Decimal("0.085700")
    assert LedgerEntry.objects.filter(account__user=owner, kind="charge").count() == 40
    assert_books()


def test_operators_may_not_send_gap_ids():
    body = sample(SimpleNamespace(public_id="ses_x"), "GPU-1", sample_id="gap:ses_x:GPU-1:0")
    with pytest.raises(ApplicationError) as refused:
        parse_samples([body], max_window_seconds=600)
    assert refused.value.code == "invalid_usage_sample" and "gap:" in refused.value.detail
    import jsonschema

    assert not jsonschema.Draft202012Validator(contract.USAGE_SAMPLE_SCHEMA).is_valid(body)


# --------------------------------------------------------------------------- properties

_windows = st.lists(st.tuples(st.integers(0, 1), st.integers(-200, 1900), st.integers(1, 600)), max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(created_ms=st.integers(0, 600_000), held_ms=st.integers(1, 1_800_000), windows=_windows, shared=st.booleans(),
       seed=st.randoms(use_true_random=False))
def test_the_ledger_equals_held_seconds_times_the_rate_whatever_the_samples(
        lab_c1, exact_prices, created_ms: int, held_ms: int, windows, shared: bool, seed: random.Random):
    """Property: a session held two GPUs for a random interval (to the millisecond); random sample windows (in whole
    seconds, disjoint per GPU, some sticking out before its creation or after its end) arrive in random batches, some
    replayed, some after its end, some after the held time was billed, with periodic closes at random times: once
    everything settled, its charges plus its accrual equal the held seconds × its hourly rate, exactly.

    Each example runs in a savepoint rolled back at its end: the function-scoped fixtures are shared by every example
    hypothesis runs, and one example's session, samples and ledger rows must not be the next one's starting point."""
    with transaction.atomic():
        _one_held_session(lab_c1, created_ms, held_ms, windows, shared, seed)
        transaction.set_rollback(True)


def _one_held_session(lab_c1, created_ms: int, held_ms: int, windows, shared: bool, seed: random.Random) -> None:
    gpus = _h100s(lab_c1, 2)
    if shared:  # a tenth of an H100 costs 0.0000001 credits per ms: whole seconds keep "held seconds × rate" exact
        created_ms, held_ms = created_ms // 1000 * 1000, max(1000, held_ms // 1000 * 1000)
    created = T0 + timedelta(milliseconds=created_ms)
    ended = created + timedelta(milliseconds=held_ms)
    session = reserved_session(lab_c1, gpus=gpus, created=created, **({"gpu_memory_mib": 1000, "gpu_cores": 10} if shared else {}))
    hourly = rate(session)
    stream, taken = [], {0: set(), 1: set()}
    for gpu, second, length in windows:
        start = T0 + timedelta(seconds=second)
        if not (created - timedelta(seconds=300) <= start <= ended + timedelta(seconds=300)):
            continue  # refused by the endpoint (before the session or after its end, beyond the clock skew)
        span = set(range(second, second + length))
        if span & taken[gpu]:
            continue  # the operator's windows of one GPU never overlap
        taken[gpu] |= span
        stream.append(sample(session, gpus[gpu], start=start, seconds=length, sample_id=f"{session.public_id}:{gpu}:{second}"))
    seed.shuffle(stream)
    cut = seed.randint(0, len(stream))
    # While the session runs, the operator reports windows up to its own clock: some reach past the end the session
    # gets later (a node clock ahead of the control plane's); the held time's billing cuts them to the end.
    before_end, after_end = stream[:cut], stream[cut:]
    for batch in _batches(before_end, seed):
        ingest.usage_ingest(cluster=lab_c1, samples=batch)
    end(session, ended)
    for batch in _batches(after_end, seed):
        for _ in range(1 + (seed.random() < 0.3)):
            ingest.usage_ingest(cluster=lab_c1, samples=batch)
        if seed.random() < 0.4:
            periods.periods_close(now=ended + timedelta(seconds=seed.randint(0, 400)))
    periods.periods_close(now=ended + timedelta(days=1))
    for batch in _batches(stream, seed):  # everything replayed after the held time was billed
        assert ingest.usage_ingest(cluster=lab_c1, samples=batch)["accepted"] == 0
    assert billed(session) == held_cost(session, hourly)
    assert_books()


def _batches(stream: list, seed: random.Random) -> list[list]:
    batches, at = [], 0
    while at < len(stream):
        size = seed.randint(1, 8)
        batches.append(stream[at:at + size])
        at += size
    return batches


@pytest.mark.django_db(transaction=True)
def test_concurrent_end_ingest_and_close_bill_each_held_second_once(lab_c1, exact_prices):
    """The operator's terminal report, three ingesting threads (their samples cover the held time on both GPUs, each
    batch sent twice) and two periodic closes run at once: whatever the order, each held second is billed once."""
    gpus = _h100s(lab_c1, 2)
    owner = UserFactory()
    sessions = [reserved_session(lab_c1, owner=owner, gpus=gpus if n == 0 else [gpus[n - 1]], created=T0 + timedelta(seconds=n))
                for n in range(2)]
    # Placement would not put two whole-GPU sessions on one GPU; the second shares one for this test's purpose only.
    hourly = {s.pk: rate(s) for s in sessions}
    ended = T0 + timedelta(minutes=20, seconds=30)
    stream = [sample(s, gpu, start=T0 + timedelta(minutes=m, seconds=1)) for s in sessions for gpu in gpus[:len(s.devices)]
              for m in range(20)]
    random.Random(25).shuffle(stream)
    batches = [stream[i:i + 10] for i in range(0, len(stream), 10)]
    errors: list = []

    def work(kind: str, n: int) -> None:
        try:
            if kind == "send":
                for batch in batches[n::3]:
                    ingest.usage_ingest(cluster=lab_c1, samples=batch)
            elif kind == "end":
                for session in sessions:
                    end(session, ended)
            else:
                for _ in range(5):
                    periods.periods_close(now=ended + SETTLE)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(work, [("send", n % 3) for n in range(6)] + [("end", 0), ("close", 0), ("close", 1)], timeout=180)
    assert not errors, errors
    periods.periods_close(now=T0 + timedelta(days=1))
    for session in sessions:
        session.refresh_from_db()
        assert billed(session) == held_cost(session, hourly[session.pk])
    assert_books()


def test_held_gaps_count_gpus_not_names():
    """The shortfall at each instant is billed on the reserved GPUs no sample covers, in their order."""
    at = lambda s: T0 + timedelta(seconds=s)  # noqa: E731
    gaps = held.held_gaps(held_from=at(0), held_until=at(100), reserved=["A", "B"],
                          covered={"A": [(at(10), at(20))], "C": [(at(0), at(50)), (at(-30), at(0))], "B": [(at(90), at(200))]})
    # 0..50: C (not reserved) covers one of the two GPUs, so one is short, billed on A; 10..20 A and C cover both.
    # 50..90: nothing covers either; 90..100: B is covered, A short.
    assert gaps == [("A", at(0), at(10)), ("A", at(20), at(100)), ("B", at(50), at(90))]


def test_billing_held_time_takes_the_same_queries_for_few_and_many_sessions(lab_c1, exact_prices):
    """The periodic close bills the held time of many ended sessions in a constant number of queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    [h100] = _h100s(lab_c1, 1)
    counts = []
    for round_, many in enumerate((3, 30)):
        base = T0 + timedelta(hours=round_)
        for n in range(many):
            session = reserved_session(lab_c1, gpus=[h100], created=base + timedelta(seconds=2 * n))
            ingest.usage_ingest(cluster=lab_c1, samples=[sample(session, h100, start=base + timedelta(seconds=2 * n), seconds=0.5)])
            end(session, base + timedelta(seconds=2 * n + 1))
        with CaptureQueriesContext(connection) as queries:
            assert held.held_gaps_bill(now=base + timedelta(minutes=30)) == many
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
    assert_books()


@pytest.mark.parametrize("behind", [300, 3600])
def test_an_operator_clock_behind_beyond_the_tolerance_bills_every_held_second(lab_c1, exact_prices, behind):
    """The operator's clock is ``behind`` seconds late and its inventory said so (``clock_offset_seconds``). A session
    held 120 s of the control plane's time ends with a report stamped by that clock: before, its end went into the
    past (before its creation when the clock is more than 120 s behind), and the held time billed was 0 s."""
    lab_c1.clock_offset_seconds = float(behind)
    lab_c1.save(update_fields=["clock_offset_seconds"])
    h100 = device(lab_c1, "NVIDIA H100")
    session = reserved_session(lab_c1, gpus=[h100], created=T0)
    hourly = rate(session)
    received = T0 + timedelta(seconds=120)
    lifecycle.session_status_apply(cluster=lab_c1, received_at=received, reports=[{
        "session": session.public_id, "phase": contract.PHASE_TERMINATED, "node": "", "devices": [], "message": None,
        "observed_at": received - timedelta(seconds=behind),
    }])
    session.refresh_from_db()
    assert session.ended_at == received
    periods.periods_close(now=received + SETTLE)
    assert billed(session) == held_cost(session, hourly) == Decimal("0.120000")
    assert_books()


def test_an_operator_clock_behind_within_the_tolerance_keeps_its_own_times(lab_c1, exact_prices):
    """An offset within the tolerance is the estimate's noise (Cristian's algorithm): reports keep their own times, so
    two reports a few milliseconds apart are never reordered by a changed estimate."""
    lab_c1.clock_offset_seconds = 20.0
    lab_c1.save(update_fields=["clock_offset_seconds"])
    h100 = device(lab_c1, "NVIDIA H100")
    session = reserved_session(lab_c1, gpus=[h100], created=T0)
    observed = T0 + timedelta(seconds=100)
    lifecycle.session_status_apply(cluster=lab_c1, received_at=observed + timedelta(seconds=20), reports=[{
        "session": session.public_id, "phase": contract.PHASE_TERMINATED, "node": "", "devices": [], "message": None,
        "observed_at": observed,
    }])
    session.refresh_from_db()
    assert session.ended_at == observed


def test_windows_too_short_to_cost_a_credit_quantum_still_pay_their_held_seconds(lab_c1, exact_prices):
    """An operator that cuts a 10 % share's 4 s into a thousand 4 ms windows: each cost 0.0000004 credits, which
    rounded half to even to 0, and the windows covered every held second, so no gap row billed them: 4 s for free."""
    [h100] = _h100s(lab_c1, 1)
    session = reserved_session(lab_c1, gpus=[h100], created=T0, gpu_memory_mib=1000, gpu_cores=10)
    hourly = rate(session)
    micro = [sample(session, h100, start=T0 + timedelta(milliseconds=4 * n), seconds=0.004) for n in range(1000)]
    ingest.usage_ingest(cluster=lab_c1, samples=micro)
    end(session, T0 + timedelta(seconds=4))
    periods.periods_close(now=session.ended_at + SETTLE)
    assert billed(session) >= held_cost(session, hourly) == Decimal("0.000400")
    assert_books()
