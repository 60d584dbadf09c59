"""``POST /internal/v1/usage``: one GPU-second is stored and charged once even when senders race, and samples must
fit the session they name (not before it began, only on a GPU it holds).

The races go through the live server from real concurrent HTTP senders; the exclusion constraint
``usage_sample_no_overlap`` is also checked on its own, with rows written directly.
"""

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import ingest
from billing.models import CreditAccount, LedgerEntry, Price, UsageSample
from clusters.operator_token.tokens import operator_token_mint
from sessions.models import Allocation, Session
from tests.billing.books import assert_books, billed
from tests.factories import UserFactory
from tests.helpers import T0, Http, device, metered_session, run_threads, sample

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
#: A whole H100 for 60 s at 2.5 credits per GPU-hour.
MINUTE = Decimal("0.041667")


@pytest.fixture
def prices():
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("2.5"))


def send_at_once(url: str, token: str, batches: list[list[dict]]) -> list:
    """POST each batch from its own thread, all released by one barrier; the answers in the batches' order."""
    answers: list = [None] * len(batches)
    errors: list = []
    barrier = threading.Barrier(len(batches))

    def deliver(slot: int) -> None:
        client = Http(url, token)
        try:
            barrier.wait(timeout=30)
            answers[slot] = client.post("/internal/v1/usage", json={"samples": batches[slot]})
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(deliver, [(slot,) for slot in range(len(batches))], timeout=120)
    assert not errors and all(answer is not None for answer in answers), errors
    return answers


def overlapping(a: tuple, b: tuple) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.django_db(transaction=True)
def test_concurrent_senders_of_one_window_under_new_ids_store_and_charge_it_once(live_server, lab_c1, whole_session, prices):
    """Eight senders post the same session, GPU and window, each under its own sample_id, at the same moment, in
    several rounds: each round stores one sample and charges it once; the others are refused (400, index 0)."""
    token = operator_token_mint(cluster_id=lab_c1.public_id)
    h100 = device(lab_c1, "NVIDIA H100")
    rounds = 6
    for round_ in range(rounds):
        start = T0 + timedelta(minutes=10 * round_)
        batches = [[sample(whole_session, h100, start=start, sample_id=f"r{round_}-sender{n}")] for n in range(8)]
        answers = send_at_once(live_server.url, token, batches)
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [200] + [400] * 7, [answer.text for answer in answers]
        for answer in answers:
            if answer.status_code == 200:
                assert answer.json()["accepted"] == 1 and answer.json()["charged"] == {whole_session.public_id: str(MINUTE)}
            else:
                body = answer.json()
                assert (body["code"], body["index"], body["reason"]) == ("invalid_usage_sample", 0, "usage_window_overlap"), body
        assert UsageSample.objects.filter(session=whole_session, start=start).count() == 1, f"round {round_}"
    assert UsageSample.objects.filter(session=whole_session).count() == rounds
    assert billed(whole_session) == MINUTE * rounds  # one hour: accrued, not charged yet
    account = CreditAccount.objects.get(user=whole_session.owner)
    assert account.balance - account.accrued == -MINUTE * rounds
    assert_books()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 240), st.integers(1, 120), st.booleans()), min_size=2, max_size=6))
@pytest.mark.django_db(transaction=True)
def test_whatever_the_windows_and_the_interleaving_no_gpu_second_is_stored_twice(live_server, lab_c1, prices, windows):
    """Property: senders racing with windows of one session and GPU (some overlapping, some sent twice under the same
    id) never store two samples covering one instant; each refused sample overlaps one that was stored; an exact
    replay is a duplicate, never a second charge; the balance is the ledger's sum."""
    session = metered_session(lab_c1, owner=UserFactory())
    h100 = device(lab_c1, "NVIDIA H100")
    batches, spans = [], {}
    for n, (offset, seconds, replayed) in enumerate(windows):
        one = sample(session, h100, start=T0 + timedelta(seconds=offset), seconds=seconds, sample_id=f"{session.public_id}:w{n}")
        spans[one["sample_id"]] = (T0 + timedelta(seconds=offset), T0 + timedelta(seconds=offset + seconds))
        batches += [[one], [dict(one)]] if replayed else [[one]]
    answers = send_at_once(live_server.url, operator_token_mint(cluster_id=lab_c1.public_id), batches)

    rows = list(UsageSample.objects.filter(session=session))
    stored = {row.sample_id: (row.start, row.end) for row in rows}
    kept = list(stored.values())
    assert not any(overlapping(a, b) for i, a in enumerate(kept) for b in kept[i + 1:]), stored
    accepted = 0
    for batch, answer in zip(batches, answers, strict=True):
        sample_id = batch[0]["sample_id"]
        if answer.status_code == 200:
            accepted += answer.json()["accepted"]
            assert stored[sample_id] == spans[sample_id]
        else:
            body = answer.json()
            assert (answer.status_code, body["reason"]) == (400, "usage_window_overlap"), body
            assert sample_id not in stored and any(overlapping(spans[sample_id], window) for window in kept)
    assert accepted == len(stored)  # a replay that raced its original is a duplicate, never a second row
    for sample_id, span in spans.items():  # a window that overlaps no other is always stored
        if not any(overlapping(span, other) for other_id, other in spans.items() if other_id != sample_id):
            assert sample_id in stored
    account = CreditAccount.objects.get(user=session.owner)
    assert account.accrued - account.balance == sum((row.cost for row in rows), Decimal(0))
    assert_books()


def _row(session, gpu, *, start, seconds=60, sample_id):
    return UsageSample(cluster=session.cluster, sample_id=sample_id, session=session, device_uuid=gpu.uuid, start=start,
                       end=start + timedelta(seconds=seconds), share=Decimal(1), cost=Decimal(0))


def test_the_database_refuses_an_overlapping_row_written_directly(lab_c1, whole_session, shared_session):
    """``usage_sample_no_overlap`` holds without the service: an overlapping row of the same session and GPU is an
    IntegrityError; touching windows, another GPU and another session are not overlaps."""
    h100, other = device(lab_c1, "NVIDIA H100"), device(lab_c1, "Tesla V100")
    _row(whole_session, h100, start=T0, seconds=600, sample_id="first").save()
    for start, seconds in ((T0 + timedelta(minutes=5), 60), (T0 - timedelta(seconds=30), 60), (T0, 600), (T0 - timedelta(hours=1), 7200)):
        with pytest.raises(IntegrityError, match="usage_sample_no_overlap"), transaction.atomic():
            _row(whole_session, h100, start=start, seconds=seconds, sample_id=f"again-{start:%H%M%S}-{seconds}").save()
    _row(whole_session, h100, start=T0 + timedelta(minutes=10), sample_id="touching-after").save()
    _row(whole_session, h100, start=T0 - timedelta(minutes=1), sample_id="touching-before").save()
    _row(whole_session, other, start=T0, sample_id="another-gpu").save()
    _row(shared_session, h100, start=T0, sample_id="another-session").save()
    assert UsageSample.objects.count() == 5


def _skip_the_check(monkeypatch, times: int) -> None:
    """Make ``_refuse_overlaps`` pass its next ``times`` calls without looking, as if a writer had slipped past it."""
    real, calls = ingest._refuse_overlaps, []

    def check(**kwargs):
        calls.append(1)
        return None if len(calls) <= times else real(**kwargs)

    monkeypatch.setattr(ingest, "_refuse_overlaps", check)


def test_an_overlap_the_check_did_not_see_is_refused_by_the_database(operator_c1, lab_c1, whole_session, prices, monkeypatch):
    """The check under the account locks is what answers; the constraint is the last word. When the check misses an
    overlap (as if a writer had slipped past it), the constraint refuses the row, the whole batch rolls back, and the
    check run again names the sample: 400, nothing stored or charged."""
    h100 = device(lab_c1, "NVIDIA H100")
    assert operator_c1.post("/internal/v1/usage", json={"samples": [sample(whole_session, h100, sample_id="first")]}).status_code == 200
    before = (list(LedgerEntry.objects.values_list("id", "amount")), CreditAccount.objects.values_list("balance", "accrued").get(),
              UsageSample.objects.count())
    batch = [sample(whole_session, h100, start=T0 + timedelta(minutes=1), sample_id="next"),
             sample(whole_session, h100, start=T0 + timedelta(seconds=30), sample_id="re-sampled")]
    _skip_the_check(monkeypatch, times=1)
    response = operator_c1.post("/internal/v1/usage", json={"samples": batch})
    assert response.status_code == 400, response.text
    body = response.json()
    assert (body["code"], body["index"], body["reason"]) == ("invalid_usage_sample", 1, "usage_window_overlap")
    assert "overlaps sample 'first'" in body["detail"]
    assert (list(LedgerEntry.objects.values_list("id", "amount")), CreditAccount.objects.values_list("balance", "accrued").get(),
            UsageSample.objects.count()) == before
    # Two new samples of one batch that overlap each other: the constraint sees the first while inserting the second.
    inside = [sample(whole_session, h100, start=T0 + timedelta(minutes=20), sample_id="a"),
              sample(whole_session, h100, start=T0 + timedelta(minutes=20, seconds=30), sample_id="b")]
    _skip_the_check(monkeypatch, times=1)
    response = operator_c1.post("/internal/v1/usage", json={"samples": inside})
    assert (response.status_code, response.json().get("index")) == (400, 1), response.text
    # If the check cannot find it again either, the batch is refused as a conflict to retry (409), still whole.
    _skip_the_check(monkeypatch, times=2)
    response = operator_c1.post("/internal/v1/usage", json={"samples": batch})
    assert (response.status_code, response.json()["code"]) == (409, "usage_conflict"), response.text
    assert UsageSample.objects.count() == 1
    # A replay is still a duplicate.
    monkeypatch.undo()
    answer = operator_c1.post("/internal/v1/usage", json={"samples": [sample(whole_session, h100, sample_id="first")]}).json()
    assert (answer["accepted"], answer["duplicates"]) == (0, 1)
    assert (list(LedgerEntry.objects.values_list("id", "amount")), CreditAccount.objects.values_list("balance", "accrued").get(),
            UsageSample.objects.count()) == before


# --------------------------------------------------------------------------- samples must fit their session


def test_a_window_beginning_before_the_session_was_created_is_refused(operator_c1, lab_c1, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    created = T0 + timedelta(hours=1)
    Session.objects.filter(pk=whole_session.pk).update(created_at=created, started_at=None)
    after = sample(whole_session, h100, start=created + timedelta(minutes=1))
    before = sample(whole_session, h100, start=created - timedelta(minutes=10))
    response = operator_c1.post("/internal/v1/usage", json={"samples": [after, before]})
    assert response.status_code == 400, response.text
    body = response.json()
    assert (body["code"], body["index"], body["reason"]) == ("invalid_usage_sample", 1, "usage_window_before_session")
    assert whole_session.public_id in body["detail"] and "before the session" in body["detail"]
    assert (UsageSample.objects.count(), LedgerEntry.objects.count(), CreditAccount.objects.count()) == (0, 0, 0)
    # Within the clock skew the endpoint allows (the containers' start is the kubelet's clock), a first window is fine,
    # counted from the creation (when its GPUs were reserved: billing.held); so is one of a session that has not been
    # reported Running yet (started_at empty).
    skewed = sample(whole_session, h100, start=created - timedelta(seconds=30))
    assert operator_c1.post("/internal/v1/usage", json={"samples": [after, skewed]}).json()["accepted"] == 2
    assert UsageSample.objects.get(sample_id=skewed["sample_id"]).start == created


def test_a_gpu_the_session_does_not_hold_is_refused(operator_c1, lab_c1, whole_session, prices):
    gpus = list(lab_c1.devices.filter(model=H100).order_by("pk"))
    Session.objects.filter(pk=whole_session.pk).update(devices=[gpus[0].uuid])
    response = operator_c1.post("/internal/v1/usage", json={"samples": [sample(whole_session, gpus[0]), sample(whole_session, gpus[1])]})
    assert response.status_code == 400, response.text
    body = response.json()
    assert (body["code"], body["index"], body["reason"]) == ("invalid_usage_sample", 1, "usage_device_not_allocated")
    assert gpus[1].uuid in body["detail"] and whole_session.public_id in body["detail"]
    assert (UsageSample.objects.count(), LedgerEntry.objects.count(), CreditAccount.objects.count()) == (0, 0, 0)
    # A GPU placement reserved for it (an Allocation) counts before the operator has reported it.
    Allocation.objects.create(session=whole_session, device=gpus[1], memory_mib=gpus[1].memory_mib, cores=100, exclusive=True)
    assert operator_c1.post("/internal/v1/usage", json={"samples": [sample(whole_session, gpus[0]), sample(whole_session, gpus[1])]}
                            ).json()["accepted"] == 2
    # Late samples of an ended session: its reservations are released, the devices it reported still count.
    Allocation.objects.filter(session=whole_session).delete()
    Session.objects.filter(pk=whole_session.pk).update(phase="Terminated")
    assert operator_c1.post("/internal/v1/usage", json={"samples": [sample(whole_session, gpus[0], start=T0 + timedelta(minutes=5))]}
                            ).json()["accepted"] == 1
    response = operator_c1.post("/internal/v1/usage", json={"samples": [sample(whole_session, gpus[1], start=T0 + timedelta(minutes=5))]})
    assert (response.status_code, response.json()["reason"]) == (400, "usage_device_not_allocated")


def test_a_session_that_holds_no_gpu_is_refused(operator_c1, lab_c1, prices):
    session = metered_session(lab_c1, gpus=[])
    response = operator_c1.post("/internal/v1/usage", json={"samples": [sample(session, device(lab_c1, "NVIDIA H100"))]})
    assert (response.status_code, response.json()["index"], response.json()["reason"]) == (400, 0, "usage_device_not_allocated")
