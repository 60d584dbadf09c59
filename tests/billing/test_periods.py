"""Billing periods (``billing.periods``): one charge per session and period, usage accrued in between and held against
the balance, exact to the sample whatever the order, the replays, the batch boundaries and the closes in between.

Ingestion runs in process against the real PostgreSQL (``billing.ingest.usage_ingest``); the concurrency test from
threads, each with its own connection.
"""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections
from django.db.models import Count, Sum
from django_celery_beat.models import PeriodicTask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import admission, ingest, periods, pricing, tasks
from billing.exceptions import InsufficientCredits
from billing.models import Accrual, CreditAccount, LedgerEntry, Price, UsageSample
from billing.services import account_for, credit_grant
from sessions import overdrawn
from sessions.models import Session
from tests.billing.books import assert_books, billed
from tests.clock import period_text
from tests.factories import UserFactory
from tests.helpers import T0, device, metered_session, run_threads, sample

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
#: A whole H100 for 60 s at 2.5 credits per GPU-hour.
MINUTE = Decimal("0.041667")
HOUR = timedelta(hours=1)


@pytest.fixture
def prices():
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("2.5"))


def minutes(session, gpu, first: int, count: int, *, prefix: str = "m") -> list[dict]:
    """``count`` consecutive 60 s samples from ``T0 + first`` minutes, with ids naming their minute."""
    return [sample(session, gpu, start=T0 + timedelta(minutes=m), sample_id=f"{prefix}:{session.public_id}:{gpu.uuid}:{m}")
            for m in range(first, first + count)]


def charges(session) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(session=session, kind="charge").order_by("period_start"))


def test_a_sample_of_a_later_period_closes_the_open_one(lab_c1, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(whole_session, h100, 0, 60))
    assert not charges(whole_session) and billed(whole_session) == 60 * MINUTE
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(whole_session, h100, 60, 2))
    [charge] = charges(whole_session)
    assert (charge.period_start, charge.period_end, charge.sample_count, charge.amount) == (T0, T0 + HOUR, 60, -60 * MINUTE)
    assert (charge.window_start, charge.window_end, charge.gpu_seconds) == (T0, T0 + HOUR, Decimal(3600))
    assert charge.idempotency_key == f"period:{whole_session.public_id}:{T0.isoformat()}" and charge.created_by == "usage"
    accrual = Accrual.objects.get(session=whole_session)
    assert (accrual.period_start, accrual.samples, accrual.amount) == (T0 + HOUR, 2, 2 * MINUTE)
    account = CreditAccount.objects.get(user=whole_session.owner)
    assert (account.balance, account.accrued) == (-60 * MINUTE, 2 * MINUTE)
    assert_books()


def test_a_late_sample_of_a_charged_period_goes_with_the_next(lab_c1, whole_session, prices):
    """A charge never changes: a sample of a period already charged is accrued into the open period and charged with
    it (its ``billing_period`` says so); no second charge of the old period."""
    h100 = device(lab_c1, "NVIDIA H100")
    stream = minutes(whole_session, h100, 0, 62)
    late = stream.pop(30)
    ingest.usage_ingest(cluster=lab_c1, samples=stream)
    assert charges(whole_session)[0].sample_count == 59
    ingest.usage_ingest(cluster=lab_c1, samples=[late])
    assert UsageSample.objects.get(sample_id=late["sample_id"]).billing_period == T0 + HOUR
    assert len(charges(whole_session)) == 1 and Accrual.objects.get(session=whole_session).samples == 3
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(whole_session, h100, 120, 1))
    second = charges(whole_session)[1]
    assert (second.period_start, second.sample_count, second.window_start) == (T0 + HOUR, 3, T0 + timedelta(minutes=30))
    assert_books()


def test_a_batch_that_catches_up_on_several_periods_charges_each_once(lab_c1, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(whole_session, h100, 0, 5 * 60 + 10))
    assert [(c.period_start, c.sample_count) for c in charges(whole_session)] == [(T0 + n * HOUR, 60) for n in range(5)]
    assert Accrual.objects.get(session=whole_session).samples == 10
    assert_books()


def test_the_periodic_close_charges_quiet_and_ended_sessions_once(lab_c1, owner, prices, settings):
    settings.GSHARE_BILLING_SETTLE_SECONDS = 120
    h100, v100 = device(lab_c1, "NVIDIA H100"), device(lab_c1, "Tesla V100")
    quiet = metered_session(lab_c1, owner=owner, gpus=[h100])
    ended = metered_session(lab_c1, owner=owner, gpus=[v100])
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(quiet, h100, 0, 10) + minutes(ended, v100, 0, 10))
    Session.objects.filter(pk=ended.pk).update(phase="Terminated", ended_at=T0 + timedelta(minutes=11))
    before = CreditAccount.objects.get(user=owner)

    assert periods.periods_close(now=T0 + timedelta(minutes=12)) == 0  # neither settled yet
    assert periods.periods_close(now=T0 + timedelta(minutes=13)) == 1  # the ended session's last period
    [end] = charges(ended)
    assert end.reason.endswith("(session ended)") and end.created_by == periods.CLOSED_BY_TASK and end.sample_count == 10
    assert periods.periods_close(now=T0 + HOUR + timedelta(seconds=119)) == 0
    assert periods.periods_close(now=T0 + HOUR + timedelta(seconds=120)) == 1  # the quiet session's period ended
    assert periods.periods_close(now=T0 + 3 * HOUR) == 0  # idempotent
    [charge] = charges(quiet)
    assert (charge.period_start, charge.sample_count, charge.reason) == (
        T0, 10, f"Usage {period_text(T0, T0 + HOUR)} UTC: 10 sample(s) on lab-c1")
    after = CreditAccount.objects.get(user=owner)
    assert after.accrued == 0 and after.balance - after.accrued == before.balance - before.accrued
    assert after.below_zero_since == before.below_zero_since is not None
    # A late sample of the ended session's held time accrues and is charged as the next period; one after its end is not
    # stored (the session held no GPU then).
    assert ingest.usage_ingest(cluster=lab_c1, samples=minutes(ended, v100, 10, 2))["accepted"] == 1
    assert periods.periods_close(now=T0 + 3 * HOUR) == 1 and [c.period_start for c in charges(ended)] == [T0, T0 + HOUR]
    assert_books()


def test_the_periodic_close_is_a_beat_task(lab_c1, whole_session, prices):
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(whole_session, device(lab_c1, "NVIDIA H100"), 0, 3))
    task = PeriodicTask.objects.get(task="billing.close_billing_periods")
    assert (task.interval.every, task.interval.period, task.expire_seconds, task.enabled) == (60, "seconds", 60, True)
    assert tasks.close_billing_periods.delay().get() == 1  # T0 is days ago: its period is over
    assert tasks.close_billing_periods.delay().get() == 0
    assert_books()


def test_admission_and_the_stop_at_zero_count_the_accrued_usage(lab_c1, owner, prices, settings):
    """The usage not charged yet counts to the sample: a balance of 1 with 1.000001 accrued is below zero."""
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = 0
    settings.GSHARE_BILLING_DEFAULT_GRACE_SECONDS = 900
    credit_grant(user=owner, amount=Decimal(1), reason="test", idempotency_key="one", created_by="test")
    session = metered_session(lab_c1, owner=owner, gpus=[device(lab_c1, "NVIDIA H100")])
    h100 = device(lab_c1, "NVIDIA H100")
    stream = minutes(session, h100, 0, 24)  # 24 × 0.041667 = 1.000008
    ingest.usage_ingest(cluster=lab_c1, samples=stream)
    account = CreditAccount.objects.get(user=owner)
    assert (account.balance, account.accrued) == (Decimal(1), Decimal("1.000008")) and account.below_zero_since is not None
    with pytest.raises(InsufficientCredits) as refused:
        admission.admission_check(user=owner, gpus=1, gpu_memory_mib=None, gpu_cores=None, clusters=[lab_c1.pk],
                                  locked_account=account)
    assert (refused.value.extra["balance"], refused.value.extra["accrued"], refused.value.extra["available"]) == ("1", "1.000008", "-0.000008")
    since = account.below_zero_since
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=899)) == 0
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=900)) == 1
    session.refresh_from_db()
    assert session.message.startswith("Stopped: credits ran out (balance -0.000008 since ")
    assert "1.000008 credits of usage not billed yet" in session.message
    # A grant that covers it clears below_zero_since although the balance was never below zero.
    credit_grant(user=owner, amount=Decimal("0.000008"), reason="test", idempotency_key="two", created_by="test")
    assert CreditAccount.objects.get(user=owner).below_zero_since is None
    assert_books()


# --------------------------------------------------------------------------- properties

#: Windows of a stream: (GPU index, minute, length in minutes); at most 10 minutes (GSHARE_USAGE_MAX_WINDOW_SECONDS).
_stream = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 300), st.sampled_from([1, 2, 5, 10])), min_size=1, max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(windows=_stream, seed=st.randoms(use_true_random=False), two_owners=st.booleans(), end_after=st.none() | st.integers(0, 400))
def test_charges_plus_accrued_equal_the_samples_whatever_the_order_batches_replays_and_closes(
        lab_c1, prices, windows, seed: random.Random, two_owners: bool, end_after: int | None):
    """Property: a random stream of samples of two sessions (overlapping windows dropped, as the operator's are
    disjoint), shuffled, split into random batches, some replayed, with periodic closes at random times in between
    (and the session perhaps ended): the ledger's charges plus the accrued credits equal the sum of the samples'
    costs to the last decimal (the same as charging every batch), every charge and accrual covers exactly its samples,
    there is at most one charge per session and period, and no charge ever changes once written."""
    owner = UserFactory()
    gpus = [device(lab_c1, "NVIDIA H100"), device(lab_c1, "Tesla V100")]
    sessions = [metered_session(lab_c1, owner=owner, gpus=gpus),
                metered_session(lab_c1, owner=UserFactory() if two_owners else owner, gpus=gpus, gpu_memory_mib=20000, gpu_cores=10)]
    stream, taken = [], {}
    for n, (gpu, minute, length) in enumerate(windows):
        session = sessions[n % 2]
        if session is sessions[0] and end_after is not None and minute > end_after + 5:
            continue  # after its end (plus the clock skew allowed): refused, as it should be
        span = range(minute, minute + length)
        key = (session.pk, gpu)
        if any(m in taken.setdefault(key, set()) for m in span):
            continue
        taken[key].update(span)
        stream.append(sample(session, gpus[gpu], start=T0 + timedelta(minutes=minute), seconds=60 * length,
                             sample_id=f"{session.public_id}:{gpu}:{minute}"))
    seed.shuffle(stream)
    batches, at = [], 0
    while at < len(stream):
        size = seed.randint(1, 12)
        batches.append(stream[at:at + size])
        at += size
    if end_after is not None:
        Session.objects.filter(pk=sessions[0].pk).update(phase="Terminated", ended_at=T0 + timedelta(minutes=end_after))
    prices_by_model = pricing.prices_by_model()
    written: dict[int, tuple] = {}
    for batch in batches:
        for _ in range(1 + (seed.random() < 0.3)):  # replayed now and then
            ingest.usage_ingest(cluster=lab_c1, samples=batch)
        if seed.random() < 0.3:
            periods.periods_close(now=T0 + timedelta(minutes=seed.randint(0, 400)))
        for entry in LedgerEntry.objects.filter(session__in=sessions, kind="charge"):
            state = (entry.period_start, entry.amount, entry.sample_count, entry.balance_after)
            assert written.setdefault(entry.pk, state) == state, "a charge changed"
    if seed.random() < 0.5:
        periods.periods_close(now=T0 + timedelta(days=1))

    # What charging every sample on its own would have taken: the samples' costs, priced here independently.
    # A window is billed only within the time its session held its GPUs: up to its end, if it ended.
    expected, kept = Decimal(0), 0
    for body in stream:
        session = sessions[0] if body["session_id"] == sessions[0].public_id else sessions[1]
        gpu = gpus[0] if body["device_uuid"] == gpus[0].uuid else gpus[1]
        share = pricing.gpu_share(device_memory_mib=gpu.memory_mib, gpu_memory_mib=session.gpu_memory_mib, gpu_cores=session.gpu_cores)
        end = T0.fromisoformat(body["end"])
        if session is sessions[0] and end_after is not None:
            end = min(end, T0 + timedelta(minutes=end_after))
        seconds = Decimal(int((end - T0.fromisoformat(body["start"])).total_seconds()))
        if seconds > 0:
            kept += 1
            expected += pricing.window_cost(price=pricing.price_for_model(gpu.model, prices_by_model), share=share, seconds=seconds)
    assert sum((billed(s) for s in sessions), Decimal(0)) == expected
    assert UsageSample.objects.filter(session__in=sessions).count() == kept
    for session in sessions:
        per_period = LedgerEntry.objects.filter(session=session, kind="charge").values("period_start").annotate(n=Count("id"))
        assert all(row["n"] == 1 for row in per_period)
    assert_books()


@pytest.mark.django_db(transaction=True)
def test_concurrent_ingests_and_closes_of_one_account_keep_the_totals_exact(lab_c1, prices):
    """Six threads post batches of two sessions of one owner at once (their streams cross four periods; every batch is
    sent twice, by two threads), while two more run the periodic close: the totals are exact, each period charged
    once, the balance the ledger's sum."""
    owner = UserFactory()
    h100, v100 = device(lab_c1, "NVIDIA H100"), device(lab_c1, "Tesla V100")
    sessions = [metered_session(lab_c1, owner=owner, gpus=[h100]), metered_session(lab_c1, owner=owner, gpus=[v100])]
    stream = minutes(sessions[0], h100, 0, 240) + minutes(sessions[1], v100, 0, 240)
    random.Random(16).shuffle(stream)
    batches = [stream[i:i + 40] for i in range(0, len(stream), 40)]
    errors: list = []

    def send(part: int) -> None:
        try:
            for batch in batches[part::3]:
                ingest.usage_ingest(cluster=lab_c1, samples=batch)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def close(_: int) -> None:
        try:
            for hour in range(1, 5):
                periods.periods_close(now=T0 + hour * HOUR + timedelta(minutes=5))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(lambda kind, n: (send if kind == "send" else close)(n),
                [("send", n % 3) for n in range(6)] + [("close", n) for n in range(2)], timeout=180)
    assert not errors, errors
    assert UsageSample.objects.count() == 480
    periods.periods_close(now=T0 + timedelta(days=1))
    account = account_for(owner)
    account.refresh_from_db()
    assert account.accrued == 0 and account.balance == -(UsageSample.objects.aggregate(s=Sum("cost"))["s"])
    for session in sessions:
        # A sample of a period the closers charged before it arrived is billed in the next period, so the last
        # hour's samples may make a fifth period's charge; never two charges of one period.
        starts = [c.period_start for c in charges(session)]
        assert len(starts) == len(set(starts)) and {T0 + n * HOUR for n in range(4)} <= set(starts) <= {T0 + n * HOUR for n in range(5)}
    assert_books()
