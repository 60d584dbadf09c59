"""``POST /internal/v1/usage`` through HTTP with real operator tokens: charges once whatever the network does
(replays, duplicates, reordering, concurrent deliveries), scope 403 and malformed 400 store nothing, pricing of whole
and shared GPUs of the demo fleet's real models, constant queries."""

import threading
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from billing import ingest, pricing
from billing.models import Accrual, CreditAccount, LedgerEntry, Price, UsageSample
from clusters.operator_token.tokens import operator_token_mint
from sessions.models import Session
from tests.billing.books import assert_books
from tests.factories import SessionFactory, UserFactory
from tests.helpers import T0, Http, device, iso, metered_session, run_threads, sample

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def prices():
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1.2"))
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("2.5"))
    Price.objects.create(gpu_model="Tesla T4", credits_per_gpu_hour=Decimal("0.35"))


def post(operator: Http, samples: list[dict]):
    return operator.post("/internal/v1/usage", json={"samples": samples})


def ledger_state() -> tuple:
    return (
        list(LedgerEntry.objects.order_by("id").values_list("id", "amount", "balance_after")),
        list(CreditAccount.objects.order_by("id").values_list("id", "balance", "accrued")),
        list(Accrual.objects.order_by("session_id").values_list("session_id", "period_start", "amount", "samples")),
        UsageSample.objects.count(),
    )


def test_samples_are_stored_priced_and_charged_per_session(operator_c1, lab_c1, whole_session, shared_session, prices, owner):
    h100, v100 = device(lab_c1, "NVIDIA H100"), device(lab_c1, "Tesla V100")
    batch = [
        sample(whole_session, h100, start=T0),
        sample(whole_session, h100, start=T0 + timedelta(seconds=60)),
        sample(shared_session, h100, start=T0, seconds=30),
        sample(shared_session, v100, start=T0 + timedelta(seconds=30), seconds=45.5, gpu_util_percent=None, memory_used_mib=None),
    ]
    response = post(operator_c1, batch)
    assert response.status_code == 200, response.text
    answer = response.json()
    # Whole H100, 2 × 60 s at 2.5/h: 2 × 0.041667. Shared 20000 MiB / 10 % cores: H100 81559 MiB -> 0.245221, 30 s
    # at 2.5/h = 0.005108854.. -> 0.005109; V100 32768 MiB -> 0.610352, 45.5 s at the default 1.2/h = 0.0092570053.. -> 0.009258 (up)
    assert answer["accepted"] == 4 and answer["duplicates"] == 0 and "server_time" in answer
    assert answer["charged"] == {whole_session.public_id: "0.083334", shared_session.public_id: "0.014367"}
    shared = {s.device_uuid: s for s in UsageSample.objects.filter(session=shared_session)}
    assert (shared[h100.uuid].gpu_model, shared[h100.uuid].share, shared[h100.uuid].cost) == (H100, Decimal("0.245221"), Decimal("0.005109"))
    assert (shared[v100.uuid].gpu_model, shared[v100.uuid].share, shared[v100.uuid].cost) == ("Tesla V100-PCIE-32GB", Decimal("0.610352"),
                                                                                          Decimal("0.009258"))
    assert shared[v100.uuid].gpu_util_percent is None and shared[h100.uuid].gpu_util_percent == Decimal("42.50")
    # The period (T0's hour) is open: nothing is charged yet, all of it is accrued and held against the balance.
    assert not LedgerEntry.objects.exists()
    whole = Accrual.objects.get(session=whole_session)
    assert (whole.period_start, whole.amount, whole.samples) == (T0, Decimal("0.083334"), 2)
    assert (whole.first_start, whole.last_end, whole.gpu_seconds) == (T0, T0 + timedelta(seconds=120), Decimal("120"))
    shared = Accrual.objects.get(session=shared_session)
    assert shared.gpu_seconds == Decimal("0.245221") * 30 + Decimal("0.610352") * Decimal("45.5")
    assert (shared.first_start, shared.last_end) == (T0, T0 + timedelta(seconds=75.5))
    account = CreditAccount.objects.get(user=owner)
    assert (account.balance, account.accrued) == (Decimal(0), Decimal("0.097701")) and account.below_zero_since is not None
    assert set(UsageSample.objects.values_list("billing_period", flat=True)) == {T0}
    assert_books()


def test_pricing_on_lab_c2_shares_of_an_h20_and_a_whole_t4(operator_c2, lab_c2, prices):
    user = UserFactory()
    h20, t4 = device(lab_c2, "NVIDIA H20"), device(lab_c2, "Tesla T4")
    shared = metered_session(lab_c2, owner=user, gpu_memory_mib=4096, gpu_cores=1)
    whole = metered_session(lab_c2, owner=user)
    answer = post(operator_c2, [sample(shared, h20, seconds=600), sample(whole, t4, seconds=600)]).json()
    # H20 registered at 258787 MiB: 4096 MiB is a share of 0.015828, priced at the default 1.2/h for 600 s.
    expected_h20 = pricing.window_cost(price=Decimal("1.2"), share=Decimal("0.015828"), seconds=600)
    assert expected_h20 == Decimal("0.003166")
    assert answer["charged"] == {shared.public_id: "0.003166", whole.public_id: "0.058334"}  # T4: 0.35 × 600 / 3600, up
    assert_books()


def test_a_replayed_batch_changes_nothing(operator_c1, lab_c1, whole_session, shared_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    batch = [sample(whole_session, h100, start=T0 + timedelta(minutes=i)) for i in range(5)] + [sample(shared_session, h100)]
    assert post(operator_c1, batch).json()["accepted"] == 6
    before = ledger_state()
    for _ in range(3):
        answer = post(operator_c1, batch).json()
        assert (answer["accepted"], answer["duplicates"], answer["charged"]) == (0, 6, {})
    assert ledger_state() == before
    assert_books()


def test_duplicates_within_a_batch_count_once(operator_c1, lab_c1, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    one = sample(whole_session, h100)
    answer = post(operator_c1, [one, dict(one), dict(one, gpu_util_percent=99)]).json()
    assert (answer["accepted"], answer["duplicates"]) == (1, 2)
    assert answer["charged"] == {whole_session.public_id: "0.041667"}
    assert UsageSample.objects.get().gpu_util_percent == Decimal("42.50")  # the first copy counts
    assert_books()


def test_reordered_and_overlapping_batches_charge_only_new_samples(operator_c1, lab_c1, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    samples = [sample(whole_session, h100, start=T0 + timedelta(minutes=i)) for i in range(6)]
    assert post(operator_c1, samples[:4]).json()["accepted"] == 4
    assert post(operator_c1, list(reversed(samples[:4]))).json()["accepted"] == 0
    # Reordered and overlapping: two old, two new, the new ones first.
    answer = post(operator_c1, [samples[5], samples[2], samples[4], samples[0]]).json()
    assert (answer["accepted"], answer["duplicates"], answer["charged"]) == (2, 2, {whole_session.public_id: "0.083334"})
    accrual = Accrual.objects.get()
    assert (accrual.first_start, accrual.last_end) == (T0, T0 + timedelta(minutes=6))
    assert accrual.amount == Decimal("0.041667") * 6 and accrual.samples == 6
    assert not LedgerEntry.objects.exists()
    assert UsageSample.objects.count() == 6
    assert_books()


@pytest.mark.django_db(transaction=True)
def test_concurrent_deliveries_of_one_batch_charge_once(live_server, lab_c1, prices):
    """Five operators' retries of the same batch at the same moment (at-least-once delivery): one charge."""
    token = operator_token_mint(cluster_id=lab_c1.public_id)
    users = [UserFactory() for _ in range(3)]
    gpus = list(lab_c1.devices.filter(model=H100).order_by("pk")[:6])
    sessions = [metered_session(lab_c1, owner=users[i % 3]) for i in range(6)]
    batch = [sample(s, g, start=T0 + timedelta(minutes=m)) for m in range(20) for s, g in zip(sessions, gpus, strict=True)]
    answers, errors = [], []
    barrier = threading.Barrier(5)

    def deliver():
        try:
            barrier.wait()
            answers.append(Http(live_server.url, token).post("/internal/v1/usage", json={"samples": batch}))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(deliver, [()] * 5, timeout=120)
    assert not errors and all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert sum(a.json()["accepted"] for a in answers) == 120
    assert UsageSample.objects.count() == 120 and not LedgerEntry.objects.exists() and Accrual.objects.count() == 6
    for account in CreditAccount.objects.all():
        assert account.accrued == Decimal("0.041667") * 40  # two sessions × 20 whole minutes at 2.5/h
    assert_books()


def test_a_sample_of_another_clusters_session_refuses_the_whole_batch(operator_c1, lab_c1, lab_c2, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    foreign = SessionFactory(cluster=lab_c2)
    response = post(operator_c1, [sample(whole_session, h100), sample(foreign, h100)])
    assert response.status_code == 403
    body = response.json()
    assert body["code"] == "forbidden_cluster_scope" and body["index"] == 1 and foreign.public_id in body["detail"]
    assert ledger_state() == ([], [], [], 0)


@pytest.mark.parametrize("which", ["other cluster", "unknown"])
def test_a_gpu_that_is_not_the_clusters_refuses_the_whole_batch(operator_c1, lab_c1, lab_c2, whole_session, prices, which):
    h100 = device(lab_c1, "NVIDIA H100")
    uuid = device(lab_c2, "Tesla T4").uuid if which == "other cluster" else "GPU-00000000-0000-0000-0000-000000000000"
    response = post(operator_c1, [sample(whole_session, h100), sample(whole_session, h100), sample(whole_session, uuid)])
    assert response.status_code == 403 and response.json()["code"] == "forbidden_cluster_scope" and response.json()["index"] == 2
    assert uuid in response.json()["detail"]
    assert ledger_state() == ([], [], [], 0)


def test_a_session_without_a_cluster_is_out_of_scope(operator_c1, lab_c1, prices):
    unplaced = SessionFactory(cluster=None, phase="Pending")
    response = post(operator_c1, [sample(unplaced, device(lab_c1, "NVIDIA H100"))])
    assert response.status_code == 403 and response.json()["code"] == "forbidden_cluster_scope"


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda s: s.pop("end"), "end missing"),
        (lambda s: s.pop("sample_id"), "sample_id missing"),
        (lambda s: s.update(end=s["start"]), "must be after start"),
        (lambda s: s.update(start=iso(T0 + timedelta(minutes=5)), end=iso(T0)), "must be after start"),
        (lambda s: s.update(end=iso(datetime.fromisoformat(s["start"]) + timedelta(seconds=600, microseconds=1))), "longer than 600 s"),
        (lambda s: s.update(start="2026-11-29T16:00:00"), "start must be an ISO 8601 time with a zone"),
        (lambda s: s.update(end="yesterday"), "end must be an ISO 8601 time with a zone"),
        (lambda s: s.update(start=1764432000), "start must be an ISO 8601 time with a zone"),
        (lambda s: s.update(session_id="ses_doesnotexist"), "no session 'ses_doesnotexist' exists"),
        (lambda s: s.update(sample_id=""), "sample_id must be 1 to 128 characters"),
        (lambda s: s.update(sample_id="x" * 129), "sample_id must be 1 to 128 characters"),
        (lambda s: s.update(sample_id="a\x00b"), "NUL"),
        (lambda s: s.update(device_uuid=7), "device_uuid must be a string"),
        (lambda s: s.update(gpu_util_percent=101), "gpu_util_percent must be a number from 0 to 100"),
        (lambda s: s.update(gpu_util_percent="50"), "gpu_util_percent must be a number from 0 to 100"),
        (lambda s: s.update(memory_used_mib=-1), "memory_used_mib must be a whole number"),
        (lambda s: s.update(memory_used_mib=1.5), "memory_used_mib must be a whole number"),
    ],
)
def test_a_malformed_sample_refuses_the_batch_with_its_index(operator_c1, lab_c1, whole_session, prices, mutate, fragment):
    h100 = device(lab_c1, "NVIDIA H100")
    batch = [sample(whole_session, h100, start=T0 + timedelta(minutes=i)) for i in range(5)]
    mutate(batch[3])
    response = post(operator_c1, batch)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "invalid_usage_sample" and body["index"] == 3, body
    assert fragment in body["detail"], body["detail"]
    assert ledger_state() == ([], [], [], 0)


def test_the_window_limit_is_a_setting(operator_c1, lab_c1, whole_session, prices, settings):
    settings.GSHARE_USAGE_MAX_WINDOW_SECONDS = 60
    h100 = device(lab_c1, "NVIDIA H100")
    assert post(operator_c1, [sample(whole_session, h100, seconds=60)]).status_code == 200
    response = post(operator_c1, [sample(whole_session, h100, seconds=61)])
    assert response.status_code == 400 and "longer than 60 s" in response.json()["detail"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"samples": "nope"}, 400, "invalid_request"),
        ({"nothing": []}, 400, "invalid_request"),
        ([], 400, "invalid_request"),
        ({"samples": [1]}, 400, "invalid_usage_sample"),
    ],
)
def test_malformed_bodies(operator_c1, body, status, code):
    response = operator_c1.post("/internal/v1/usage", json=body)
    assert (response.status_code, response.json()["code"]) == (status, code)


def test_at_most_5000_samples(operator_c1, lab_c1, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    batch = [sample(whole_session, h100, start=T0 + timedelta(minutes=i), sample_id=f"s{i}") for i in range(5001)]
    response = post(operator_c1, batch)
    assert response.status_code == 400 and response.json()["code"] == "batch_too_large"
    assert post(operator_c1, batch[:5000]).json()["accepted"] == 5000
    assert_books()


def test_an_empty_batch_is_accepted(operator_c1):
    assert post(operator_c1, []).json() | {"server_time": None} == {"server_time": None, "accepted": 0, "duplicates": 0, "charged": {}}


def test_late_samples_of_an_ended_session_are_charged(operator_c1, lab_c1, whole_session, prices):
    Session.objects.filter(pk=whole_session.pk).update(phase="Terminated")
    answer = post(operator_c1, [sample(whole_session, device(lab_c1, "NVIDIA H100"))]).json()
    assert answer["accepted"] == 1 and answer["charged"] == {whole_session.public_id: "0.041667"}


def test_only_operator_tokens(http_for, staff_token):
    assert http_for().post("/internal/v1/usage", json={"samples": []}).status_code == 401
    assert http_for(staff_token).post("/internal/v1/usage", json={"samples": []}).status_code == 401


def _batch(lab_c1, n: int, *, offset: int = 0) -> list[dict]:
    users = [UserFactory() for _ in range(3)]
    gpus = list(lab_c1.devices.order_by("pk"))
    sessions = [metered_session(lab_c1, owner=users[i % 3], gpu_memory_mib=8192 if i % 2 else None, gpu_cores=25 if i % 2 else None)
                for i in range(10)]
    return [sample(sessions[i % 10], gpus[i % len(gpus)], start=T0 + timedelta(minutes=offset + i // 10)) for i in range(n)]


def test_query_count_does_not_grow_with_the_batch(lab_c1, prices, django_assert_max_num_queries):
    counts = []
    for n in (10, 600):  # each within one billing period (an hour): nothing to charge yet
        batch = _batch(lab_c1, n, offset=len(counts) * 120)
        with CaptureQueriesContext(connection) as queries:
            result = ingest.usage_ingest(cluster=lab_c1, samples=batch)
        assert result["accepted"] == n
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
    batch = _batch(lab_c1, 3000, offset=5000)  # 300 minutes over six hours: five periods of each session are charged
    with django_assert_max_num_queries(counts[1] + 2):
        ingest.usage_ingest(cluster=lab_c1, samples=batch)
    assert LedgerEntry.objects.filter(kind="charge").count() == 50
    with django_assert_max_num_queries(counts[1]):  # the replay: nothing new, no more queries
        assert ingest.usage_ingest(cluster=lab_c1, samples=batch)["accepted"] == 0
    # BEGIN, 3 look-ups (sessions, GPUs, prices), the staging tables (IF NOT EXISTS), lock accounts (+2 to create
    # missing ones), the overlapping stored windows, the samples (with the accruals read in the same statement), the
    # accruals' upsert, the balances, COMMIT; +2 when a period closes (the whole accruals, the charges). The COPYs into
    # the staging tables are not queries Django sees.
    assert counts[1] <= 13, "\n".join(q["sql"][:60] for q in queries.captured_queries)
    assert_books()


def test_ids_with_quotes_backslashes_and_control_characters(operator_c1, lab_c1, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    odd = 'a"b\\c,d{e}\tf\ng'
    answer = post(operator_c1, [sample(whole_session, h100, sample_id=odd)]).json()
    assert answer["accepted"] == 1 and UsageSample.objects.get().sample_id == odd
    assert post(operator_c1, [sample(whole_session, h100, sample_id=odd)]).json()["duplicates"] == 1
    unknown = post(operator_c1, [dict(sample(whole_session, h100), session_id='ses_"x\\y{z}')])
    assert unknown.status_code == 400 and unknown.json()["index"] == 0
    foreign = post(operator_c1, [sample(whole_session, 'GPU-"x\\y,{z}')])
    assert foreign.status_code == 403
    assert_books()


@pytest.mark.parametrize(("start", "end"), [
    ("9999-12-31T23:58:00-14:00", "9999-12-31T23:59:00-14:00"),  # year 10000 in UTC: could never be read back
    ("0001-01-01T00:00:00+14:00", "0001-01-01T00:01:00+14:00"),  # before year 1 in UTC
    (None, None),  # ten years ahead
    ("2001-01-01T00:00:00Z", "2001-01-01T00:01:00Z"),  # older than GSHARE_USAGE_MAX_AGE_SECONDS
], ids=["year-10000", "year-0", "future", "too-old"])
def test_windows_outside_the_accepted_range_are_refused(operator_c1, lab_c1, whole_session, prices, start, end):
    h100 = device(lab_c1, "NVIDIA H100")
    batch = [sample(whole_session, h100, start=T0), sample(whole_session, h100, start=T0 + timedelta(minutes=1))]
    if start is None:
        batch[1] = sample(whole_session, h100, start=T0 + timedelta(days=3660))
    else:
        batch[1].update(start=start, end=end)
    response = post(operator_c1, batch)
    assert response.status_code == 400 and response.json()["index"] == 1, response.text
    assert "check the operator node's clock" in response.json()["detail"]
    assert ledger_state() == ([], [], [], 0)


def test_a_sample_overlapping_another_of_the_same_gpu_is_refused_even_with_a_new_id(operator_c1, lab_c1, whole_session, prices):
    h100 = device(lab_c1, "NVIDIA H100")
    first = sample(whole_session, h100, start=T0, seconds=600, sample_id="first")
    assert post(operator_c1, [first]).json()["accepted"] == 1
    charged = ledger_state()
    # Another id for part of the same ten minutes (an operator that lost its state): refused, nothing charged.
    again = sample(whole_session, h100, start=T0 + timedelta(minutes=5), seconds=300, sample_id="re-sampled")
    response = post(operator_c1, [sample(whole_session, h100, start=T0 + timedelta(minutes=10), sample_id="next"), again])
    assert response.status_code == 400 and response.json()["index"] == 1 and "overlaps sample 'first'" in response.json()["detail"]
    assert ledger_state() == charged
    # Within one batch too; the replay of the first id is a duplicate, not an overlap; touching windows are fine.
    inside = [sample(whole_session, h100, start=T0 + timedelta(minutes=20), sample_id="a"),
              sample(whole_session, h100, start=T0 + timedelta(minutes=20, seconds=30), sample_id="b")]
    assert post(operator_c1, inside).json()["index"] == 1
    answer = post(operator_c1, [first, sample(whole_session, h100, start=T0 + timedelta(minutes=10), sample_id="next")]).json()
    assert (answer["accepted"], answer["duplicates"]) == (1, 1)
    assert_books()
