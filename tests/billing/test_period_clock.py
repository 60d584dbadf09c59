"""Billing periods read at the awkward instants, whatever the hour the suite runs: the clock is moved (time-machine,
``controlled_clock``) to a minute before midnight, to a month's last hour and to a year's, and a period charged there
says exactly which hours it covers, the next day's date included; the console's ledger list says the same."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing import ingest, periods
from billing.models import LedgerEntry, Price
from sessions.models import Session
from tests.console_checks import page_text
from tests.factories import UserFactory
from tests.helpers import device, metered_session, sample

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


@pytest.mark.parametrize(("period_start", "period"), [
    (datetime(2026, 11, 26, 23, 0, tzinfo=UTC), "2026-11-26 23:00–2026-11-27 00:00 UTC"),
    (datetime(2026, 11, 30, 23, 0, tzinfo=UTC), "2026-11-30 23:00–2026-12-01 00:00 UTC"),
    (datetime(2026, 12, 31, 23, 0, tzinfo=UTC), "2026-12-31 23:00–2027-01-01 00:00 UTC"),
    (datetime(2026, 11, 30, 22, 0, tzinfo=UTC), "2026-11-30 22:00–23:00 UTC"),
])
def test_a_period_ending_at_midnight_names_the_next_days_date(controlled_clock, client, staff_user, lab_c1, settings, period_start,
                                                          period):
    settings.GSHARE_BILLING_PERIOD_SECONDS = 3600
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1"))
    controlled_clock.move_to(period_start + timedelta(minutes=59, seconds=30))  # 23:59:30 for the midnight cases
    session = metered_session(lab_c1, owner=UserFactory(username="night"))
    Session.objects.filter(pk=session.pk).update(created_at=period_start - HOUR, started_at=period_start - HOUR)
    h100 = device(lab_c1, "NVIDIA H100")
    accepted = ingest.usage_ingest(cluster=lab_c1, samples=[sample(session, h100, start=period_start + timedelta(minutes=m))
                                                            for m in (0, 30, 58)])
    assert accepted["accepted"] == 3
    assert periods.periods_close() == 0  # the period has not ended on the pinned clock
    controlled_clock.move_to(period_start + HOUR + timedelta(minutes=5))
    assert periods.periods_close() == 1
    [charge] = LedgerEntry.objects.filter(session=session, kind="charge")
    assert (charge.period_start, charge.period_end) == (period_start, period_start + HOUR)
    assert charge.reason == f"Usage {period}: 3 sample(s) on lab-c1"
    client.force_login(staff_user)  # on the moved clock (a login of the test's start would have expired by 2027)
    cells = dict(re.findall(r'<a href="/billing/ledgerentry/(\d+)/change/">.*?<td class="field-period">(.*?)</td>',
                            page_text(client.get("/billing/ledgerentry/")), re.S))
    assert cells[str(charge.pk)] == period
