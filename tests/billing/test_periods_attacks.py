"""Billing periods attacked: a researcher reading another user's account and accrued usage, malformed query
parameters, a user at the edge of their balance starting two sessions at once while usage is ingested and periods
close, and samples arriving after a session's last charge. Real PostgreSQL; the races run in threads, each on its own
connection."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections

from billing import ingest, periods
from billing.exceptions import InsufficientCredits
from billing.models import Accrual, CreditAccount, LedgerEntry, Price
from billing.selectors import account_summary
from billing.services import credit_grant
from sessions.create import session_create
from sessions.lifecycle import outbox
from sessions.models import Session
from tests.billing.books import assert_books
from tests.billing.test_periods import HOUR, minutes
from tests.factories import UserFactory
from tests.helpers import T0, device, metered_session, run_threads

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def prices():
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("2.5"))
    Price.objects.create(gpu_model="Tesla V100-PCIE-32GB", credits_per_gpu_hour=Decimal("2.5"))


@pytest.mark.django_db
@pytest.mark.parametrize("query", [
    "?user=researcher", "?user=researcher&limit=-1", "?limit=abc", "?limit=99999999999999999999999", "?offset=-5",
    "?offset=99999999999999999999999", "?session=" + "\u00e9" * 5000, "?session=ses_\U0001F600", "?user=%ff%fe",
    "?session=%ff", "?limit=1e3", "?since=%F0%9F%98%80", "?session={session}", "?session={session}&user=researcher",
])
@pytest.mark.parametrize("path", ["/api/v1/billing/accruals", "/api/v1/billing/account", "/api/v1/billing/ledger"])
def test_a_researcher_sees_only_their_own_accruals_and_account_whatever_the_query(http_user, plain_user, lab_c1, prices, path, query):
    other = UserFactory(username="researcher")
    credit_grant(user=other, amount=Decimal("123.456789"), reason="t", idempotency_key="g", created_by="t")
    session = metered_session(lab_c1, owner=other)
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(session, device(lab_c1, "NVIDIA H100"), 0, 70))
    assert Accrual.objects.get(session=session).samples == 10 and LedgerEntry.objects.filter(kind="charge").count() == 1
    response = http_user.get(path + query.format(session=session.public_id))
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["code"] and path == "/api/v1/billing/ledger" and "since" in query
        return
    body = response.json()
    if path == "/api/v1/billing/account":
        assert body["user"] == plain_user.username and body["balance"] == body["accrued"] == "0.000000"
    else:
        assert body["results"] == []
    assert "researcher" not in response.text and session.public_id not in response.text and "123.456789" not in response.text


@pytest.mark.django_db(transaction=True)
def test_a_user_at_the_edge_of_their_balance_starting_two_sessions_at_once_gets_one(lab_c1, prices, settings, monkeypatch):
    """Available (balance − accrued − holds) covers one more session's hold and half of another's; two creators race
    while the user's running session's usage is ingested (across a period boundary) and periods close: exactly one is
    admitted, the other is refused with 402, and the books stay exact."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = 1
    owner = UserFactory()
    h100 = device(lab_c1, "NVIDIA H100")
    running = metered_session(lab_c1, owner=owner, gpus=[h100])
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(running, h100, 0, 50))
    with pytest.raises(InsufficientCredits) as refused:
        session_create(owner=owner, image="img", gpus=1, cluster="lab-c1")
    required = Decimal(refused.value.extra["required"])
    available = Decimal(refused.value.extra["available"])
    credit_grant(user=owner, amount=required * Decimal("1.5") - available, reason="edge", idempotency_key="edge", created_by="t")
    assert account_summary(owner)["available"] == required * Decimal("1.5")
    barrier = threading.Barrier(4)
    outcomes, errors = [], []

    def create():
        try:
            barrier.wait()
            outcomes.append(session_create(owner=owner, image="img", gpus=1, cluster="lab-c1").public_id)
        except InsufficientCredits as exc:
            outcomes.append(exc.code)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    def meter():
        try:
            barrier.wait()
            for first in (50, 55, 60, 65):  # crosses into the next period: the first one is charged
                ingest.usage_ingest(cluster=lab_c1, samples=minutes(running, h100, first, 5))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    def close():
        try:
            barrier.wait()
            for hour in (1, 2):
                periods.periods_close(now=T0 + hour * HOUR + timedelta(minutes=5))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(lambda f: f(), [(create,), (create,), (meter,), (close,)], timeout=120)
    assert errors == []
    assert sorted(o.startswith("ses_") for o in outcomes) == [False, True] and "insufficient_credits" in outcomes
    summary = account_summary(owner)
    # The new session's hold is one hour of a 2.5-credit GPU; 20 minutes of usage (0.833340) came since.
    assert summary["available"] == required * Decimal("0.5") - 20 * Decimal("0.041667")
    assert summary["available"] >= 0
    # The first hour is charged; the second (the meter's last windows) only when they arrived before the close of
    # T0 + 2 h 5 min ran: the threads' order decides, and either way each period is charged once.
    charged = sorted(c.period_start for c in LedgerEntry.objects.filter(session=running, kind="charge"))
    assert charged in ([T0], [T0, T0 + HOUR]), charged
    assert_books()


@pytest.mark.django_db(transaction=True)
def test_samples_after_a_sessions_last_charge_are_charged_once_more_or_refused(lab_c1, prices, settings):
    """The session ends, its last period is charged by the periodic close; then late samples arrive: those within its
    end plus the clock skew are charged once more (the next period's key), later ones are refused (400), replays of
    either change nothing, and concurrent closes write each charge once."""
    settings.GSHARE_BILLING_SETTLE_SECONDS = 120
    owner = UserFactory()
    h100 = device(lab_c1, "NVIDIA H100")
    session = metered_session(lab_c1, owner=owner, gpus=[h100])
    ingest.usage_ingest(cluster=lab_c1, samples=minutes(session, h100, 0, 20))
    Session.objects.filter(pk=session.pk).update(phase="Terminated", ended_at=T0 + timedelta(minutes=21))
    assert periods.periods_close(now=T0 + timedelta(minutes=30)) == 1
    late = minutes(session, h100, 20, 1)
    after = minutes(session, h100, 40, 1)
    with pytest.raises(Exception) as refused:
        ingest.usage_ingest(cluster=lab_c1, samples=after)
    assert getattr(refused.value, "code", None) == "invalid_usage_sample"
    errors, written = [], []

    def send_and_close():
        try:
            ingest.usage_ingest(cluster=lab_c1, samples=late)
            written.append(periods.periods_close(now=T0 + timedelta(minutes=40)))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(lambda: send_and_close(), [()] * 4, timeout=60)
    assert errors == [] and sum(written) == 1
    charges = list(LedgerEntry.objects.filter(session=session, kind="charge").order_by("period_start"))
    assert [(c.period_start, c.sample_count) for c in charges] == [(T0, 20), (T0 + HOUR, 1)]
    assert sum(-c.amount for c in charges) == 21 * Decimal("0.041667")
    account = CreditAccount.objects.get(user=owner)
    assert (account.balance, account.accrued) == (-21 * Decimal("0.041667"), 0)
    assert_books()
