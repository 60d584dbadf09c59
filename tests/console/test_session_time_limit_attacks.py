"""Attacks on the console's Extend form that hold: a forged cross-site POST (no CSRF token) is refused before
anything changes, and hostile ``hours`` are shown as the service's refusal, never a 500, never half applied."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.test import Client

from audit.models import AuditRecord
from billing.services import policy_set
from sessions.models import Session
from tests.console_checks import page_text
from tests.factories import ClusterFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db

LIST = "/gpu_sessions/session/"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def frozen():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


@pytest.fixture
def running():
    """bob's Running session, reserved now with a 10-hour limit (his policy allows 24)."""
    bob = UserFactory(username="bob")
    policy_set(user=bob, min_balance_hours=Decimal(0), max_runtime_hours=Decimal(24), runtime_warning_minutes=15)
    session = SessionFactory(owner=bob, cluster=ClusterFactory(name="lab-c1"), started_at=NOW)
    Session.objects.filter(pk=session.pk).update(created_at=NOW, ends_at=NOW + 10 * HOUR)
    return Session.objects.get(pk=session.pk)


def test_a_forged_extend_without_the_csrf_token_is_refused(running, staff_user):
    for user in (running.owner, staff_user):
        browser = Client(enforce_csrf_checks=True)
        browser.force_login(user)
        assert browser.post(f"{LIST}{running.pk}/extend/", {"hours": "1"}).status_code == 403
    running.refresh_from_db()
    assert running.ends_at == NOW + 10 * HOUR and not AuditRecord.objects.filter(action="session_extend").exists()


@pytest.mark.parametrize("hours", ["", "-0", "１", "1e999999999", "9" * 5000, "NaN", "1.001", " ", "0x1"])
def test_hostile_hours_are_shown_as_the_refusal(client, running, hours):
    client.force_login(running.owner)
    response = client.post(f"{LIST}{running.pk}/extend/", {"hours": hours}, follow=True)
    assert response.status_code == 200 and "(invalid_request)" in page_text(response)
    running.refresh_from_db()
    assert running.ends_at == NOW + 10 * HOUR and not AuditRecord.objects.filter(action="session_extend").exists()
