"""``POST /internal/v1/usage``: sample times are UTC instants whatever offset the operator wrote, and a window may not
begin after its session ended (plus the clock skew), through the live server.
"""

from datetime import timedelta
from datetime import timezone as tz
from decimal import Decimal

import pytest

from billing.models import LedgerEntry, Price, UsageSample
from sessions.models import Session
from tests.billing.books import billed
from tests.factories import UserFactory
from tests.helpers import T0, device, metered_session, sample

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
#: A whole H100 for 60 s at 2.5 credits per GPU-hour.
MINUTE = Decimal("0.041667")


@pytest.fixture
def prices():
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("2.5"))


def at_offset(body: dict, start, offset: timedelta, seconds: int = 60) -> dict:
    """``body`` with its window ``start`` .. ``start + seconds`` written at UTC offset ``offset``."""
    zone = tz(offset)
    return {**body, "start": start.astimezone(zone).isoformat(), "end": (start + timedelta(seconds=seconds)).astimezone(zone).isoformat()}


def stored(sample_id: str) -> tuple:
    row = UsageSample.objects.get(sample_id=sample_id)
    return row.start, row.end, row.cost


@pytest.mark.parametrize("offset", [
    timedelta(hours=20),
    timedelta(hours=-20),
    timedelta(hours=23, minutes=59),
    -timedelta(hours=23, minutes=59),
    timedelta(hours=5, minutes=45),
], ids=["+20:00", "-20:00", "+23:59", "-23:59", "+05:45"])
def test_an_offset_in_minutes_is_stored_and_charged_at_the_utc_instant_checked(operator_c1, lab_c1, whole_session, prices, offset):
    """An offset PostgreSQL cannot store (beyond ±15:59) is converted to UTC on arrival: 200 (not a 500 that would
    block the operator's queue), stored at the instant charged, and samples adjacent to it in UTC on either side are
    accepted, not refused as overlaps."""
    h100 = device(lab_c1, "NVIDIA H100")
    before = sample(whole_session, h100, start=T0, sample_id="before")
    odd = at_offset(sample(whole_session, h100, sample_id="odd"), T0 + timedelta(seconds=60), offset)
    after = sample(whole_session, h100, start=T0 + timedelta(seconds=120), sample_id="after")

    answer = operator_c1.post("/internal/v1/usage", json={"samples": [odd]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == 1
    assert stored("odd") == (T0 + timedelta(seconds=60), T0 + timedelta(seconds=120), MINUTE)
    for neighbour in (before, after):
        answer = operator_c1.post("/internal/v1/usage", json={"samples": [neighbour]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["accepted"] == 1
    assert UsageSample.objects.filter(session=whole_session).count() == 3
    assert billed(whole_session) == 3 * MINUTE


@pytest.mark.parametrize("offset", [
    timedelta(microseconds=900000),
    -timedelta(microseconds=900000),
    timedelta(seconds=1),
    -timedelta(minutes=30, seconds=1, microseconds=500000),
    timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
], ids=["+00:00:00.9", "-00:00:00.9", "+00:00:01", "-00:30:01.5", "+23:59:59.999999"])
def test_an_offset_with_seconds_is_refused_with_its_index(operator_c1, lab_c1, whole_session, prices, offset):
    """An offset with seconds (not ISO 8601; Python reads ±00:00:00.9 as UTC, PostgreSQL drops the fraction, so the
    instant checked and the one stored differed) is refused as malformed (400 ``invalid_usage_sample``, its index,
    nothing of the batch stored), and the operator's adjacent samples are accepted."""
    h100 = device(lab_c1, "NVIDIA H100")
    before = sample(whole_session, h100, start=T0, sample_id="before")
    odd = at_offset(sample(whole_session, h100, sample_id="odd"), T0 + timedelta(seconds=60), offset)
    after = sample(whole_session, h100, start=T0 + timedelta(seconds=60), sample_id="after")

    answer = operator_c1.post("/internal/v1/usage", json={"samples": [before, odd]})
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert (body["code"], body["index"]) == ("invalid_usage_sample", 1)
    assert "reason" not in body and "offset with seconds" in body["detail"]
    assert not UsageSample.objects.exists()
    end_only = {**sample(whole_session, h100, start=T0 + timedelta(seconds=60), sample_id="end-only"), "end": odd["end"]}
    answer = operator_c1.post("/internal/v1/usage", json={"samples": [end_only]})
    assert answer.status_code == 400 and "end has a UTC offset" in answer.json()["detail"], answer.text

    answer = operator_c1.post("/internal/v1/usage", json={"samples": [before, after]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == 2
    assert stored("after") == (T0 + timedelta(seconds=60), T0 + timedelta(seconds=120), MINUTE)


def test_an_odd_offset_overlapping_a_stored_window_is_refused_with_its_index(operator_c1, lab_c1, whole_session, prices):
    """The overlap check compares UTC instants: a +20:00 sample overlapping a stored one by 1 s is refused (400,
    its index), not a 500; one touching it is accepted."""
    h100 = device(lab_c1, "NVIDIA H100")
    assert operator_c1.post("/internal/v1/usage", json={"samples": [sample(whole_session, h100, start=T0, sample_id="a")]}).status_code == 200
    overlapping = at_offset(sample(whole_session, h100, sample_id="b"), T0 + timedelta(seconds=59), timedelta(hours=20))
    touching = at_offset(sample(whole_session, h100, sample_id="c"), T0 + timedelta(seconds=60), timedelta(hours=20))

    answer = operator_c1.post("/internal/v1/usage", json={"samples": [touching, overlapping]})
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert (body["code"], body["index"], body["reason"]) == ("invalid_usage_sample", 1, "usage_window_overlap")
    answer = operator_c1.post("/internal/v1/usage", json={"samples": [touching]})
    assert answer.status_code == 200, answer.text
    assert stored("c")[:2] == (T0 + timedelta(seconds=60), T0 + timedelta(seconds=120))


def test_a_window_beginning_after_the_session_ended_is_refused(operator_c1, lab_c1, owner, prices):
    """A window beginning more than 300 s after ``ended_at`` is refused (400, its index, ``reason``
    ``usage_window_after_session``) and nothing of the batch is charged; the session now holding that GPU is charged
    for that time alone. Late samples of windows that began before the session ended count up to its end (the time
    it held its GPUs: billing.held); one within the skew after its end is answered as a duplicate and not stored."""
    h100 = device(lab_c1, "NVIDIA H100")
    ended = metered_session(lab_c1, owner=owner, gpus=[h100])
    ended_at = T0 + timedelta(minutes=5)
    Session.objects.filter(pk=ended.pk).update(phase="Terminated", ended_at=ended_at)
    successor = metered_session(lab_c1, owner=UserFactory(), gpus=[h100])
    a_day_later = T0 + timedelta(days=1)

    answer = operator_c1.post("/internal/v1/usage", json={"samples": [
        sample(ended, h100, start=ended_at - timedelta(seconds=30), sample_id="last"),
        sample(ended, h100, start=a_day_later, sample_id="day-later"),
    ]})
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert (body["code"], body["index"], body["reason"]) == ("invalid_usage_sample", 1, "usage_window_after_session")
    assert "ended" in body["detail"]
    just_past = sample(ended, h100, start=ended_at + timedelta(seconds=301), sample_id="past-skew")
    answer = operator_c1.post("/internal/v1/usage", json={"samples": [just_past]})
    assert answer.status_code == 400 and answer.json()["reason"] == "usage_window_after_session", answer.text
    assert not UsageSample.objects.exists()
    assert not LedgerEntry.objects.filter(kind="charge").exists()

    answer = operator_c1.post("/internal/v1/usage", json={"samples": [
        sample(ended, h100, start=ended_at - timedelta(seconds=30), sample_id="last"),  # ends after ended_at: counts up to it
        sample(ended, h100, start=ended_at + timedelta(seconds=300), sample_id="within-skew"),
        sample(successor, h100, start=a_day_later, sample_id="successor"),
    ]})
    assert answer.status_code == 200, answer.text
    assert (answer.json()["accepted"], answer.json()["duplicates"]) == (2, 1)
    assert UsageSample.objects.get(sample_id="last").end == ended_at
    assert billed(ended) == Decimal("0.020834")  # 30 s of an H100 at 2.5 credits per GPU-hour: 0.0208333.., up
    assert billed(successor) == MINUTE
    assert list(UsageSample.objects.filter(start=a_day_later).values_list("session_id", flat=True)) == [successor.pk]
