"""The console's view of a session's time limit, through Django's test client: the session page's Time limit section
(when it stops, the warning banner before that, the Extend form), extending as the owner within the policy and as
staff past it (``sessions.runtime.session_extend``, audited), refusals shown as messages with the API's code, never a
500, and the session field ``time limit``. On a frozen clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.contrib.auth.models import Permission

from audit.models import AuditRecord
from billing.services import policy_set
from sessions import placement
from sessions.lifecycle import outbox
from sessions.models import Session
from tests.console_checks import page_text
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory

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
    """bob's Running session on lab-c1, reserved now with a 10-hour limit (his policy allows 24)."""
    bob = UserFactory(username="bob")
    policy_set(user=bob, min_balance_hours=Decimal(0), max_runtime_hours=Decimal(24), runtime_warning_minutes=15)
    session = SessionFactory(owner=bob, cluster=ClusterFactory(name="lab-c1"), started_at=NOW)
    Session.objects.filter(pk=session.pk).update(created_at=NOW, ends_at=NOW + 10 * HOUR)
    return Session.objects.get(pk=session.pk)


def page(client, session) -> str:
    response = client.get(f"{LIST}{session.pk}/change/")
    assert response.status_code == 200
    return page_text(response)


def extend(client, session, hours):
    return client.post(f"{LIST}{session.pk}/extend/", {"hours": hours}, follow=True)


def test_the_page_says_when_it_stops_and_warns_before(client, running, frozen):
    client.force_login(running.owner)
    text = page(client, running)
    assert 'id="gs-time-limit"' in text and "2026-12-01 22:00:00 UTC" in text and 'id="gs-time-limit-banner"' not in text
    assert 'id="gs-extend-form"' in text and "within your limit of 24 hours" in text
    frozen.move_to(NOW + 10 * HOUR - timedelta(minutes=15))
    text = page(client, running)
    assert 'id="gs-time-limit-banner"' in text and "This session will stop at 2026-12-01 22:00:00 UTC" in text


def test_the_owner_extends_within_the_policy_and_is_refused_past_it(client, running):
    client.force_login(running.owner)
    done = extend(client, running, "13.5")
    assert done.status_code == 200 and "now ends at 2026-12-02 11:30:00 UTC" in page_text(done)
    running.refresh_from_db()
    assert running.ends_at == NOW + 23.5 * HOUR
    refused = page_text(extend(client, running, "1"))
    assert "Cannot extend" in refused and "(runtime_over_limit)" in refused and "at most 0.50 hours" in refused
    for hostile in ("NaN", "-1", "", "1e400", "0.001", "abc", "1_0"):
        text = page_text(extend(client, running, hostile))
        assert "Cannot extend" in text and "(invalid_request)" in text, hostile
    running.refresh_from_db()
    assert running.ends_at == NOW + 23.5 * HOUR
    assert AuditRecord.objects.filter(action="session_extend", object_id=running.public_id).count() == 1


def test_staff_extend_past_the_policy(console, running):
    text = page(console, running)
    assert 'id="gs-extend-form"' in text and "Staff may extend any session" in text
    done = extend(console, running, "100")
    assert "now ends at 2026-12-06 02:00:00 UTC" in page_text(done)
    record = AuditRecord.objects.get(action="session_extend", object_id=running.public_id)
    assert record.details["by_staff"] is True and record.details["owner"] == "bob"


def test_others_get_no_form_and_cannot_extend(client, running, django_user_model):
    mallory = UserFactory(username="mallory")
    client.force_login(mallory)
    assert client.post(f"{LIST}{running.pk}/extend/", {"hours": "1"}).status_code == 404
    viewer = django_user_model.objects.create_user("viewer", "v@example.test", "pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_session", content_type__app_label="gpu_sessions"))
    client.force_login(viewer)
    text = page(client, running)
    assert 'id="gs-time-limit"' in text and 'id="gs-extend-form"' not in text
    refused = page_text(extend(client, running, "1"))
    assert "(extend_forbidden)" in refused
    assert client.get(f"{LIST}{running.pk}/extend/").status_code == 405
    running.refresh_from_db()
    assert running.ends_at == NOW + 10 * HOUR and not AuditRecord.objects.filter(action="session_extend").exists()


def test_an_ended_or_unlimited_session_shows_no_section(client, running):
    client.force_login(running.owner)
    Session.objects.filter(pk=running.pk).update(ends_at=None)
    assert 'id="gs-time-limit"' not in page(client, running)
    assert "(no_time_limit)" in page_text(extend(client, running, "1"))
    Session.objects.filter(pk=running.pk).update(ends_at=NOW + HOUR, phase="Terminated", stop_reason="time_limit")
    text = page(client, running)
    assert 'id="gs-time-limit"' not in text and "time limit reached" in text and "2026-12-01 13:00:00 UTC" in text


# --- the Start session form -------------------------------------------------------------------------------------------

START = "/gpu_sessions/session/start/"


def _start_data(**fields) -> dict:
    return {"image": "quay.io/jupyter/base-notebook", "name": "", "gpus": "1", "share": "whole", "gpu_memory_mib": "", "gpu_cores": "",
            "cluster": "", "idempotency_key": f"key-{len(fields)}-{sorted(fields.items())}"[:150], **fields}


@pytest.fixture
def bobs_fleet(running):
    node = NodeFactory(cluster=running.cluster)
    for index in range(4):
        GpuDeviceFactory(node=node, cluster=running.cluster, index=index)
    placement.usage_recompute(cluster_ids=[running.cluster.pk])
    return running.owner


def test_the_start_form_offers_the_policys_limit_and_sets_ends_at(client, bobs_fleet, monkeypatch):
    monkeypatch.setattr(outbox, "publish_after_commit", lambda *args, **kwargs: None)
    client.force_login(bobs_fleet)
    text = page_text(client.get(START))
    assert 'name="runtime_hours"' in text and 'value="24"' in text and "at most 24 hours (your limit)" in text
    response = client.post(START, _start_data(runtime_hours="2.5"))
    assert response.status_code == 302
    session = Session.objects.filter(owner=bobs_fleet).latest("pk")
    assert session.ends_at == NOW + 2.5 * HOUR
    assert client.post(START, _start_data(runtime_hours="")).status_code == 302
    assert Session.objects.filter(owner=bobs_fleet).latest("pk").ends_at == NOW + 24 * HOUR


@pytest.mark.parametrize(("hours", "code"), [("30", "runtime_over_limit"), ("NaN", "invalid_request"), ("-1", "invalid_request"),
                                             ("1e400", "invalid_request"), ("0.001", "invalid_request"), ("x" * 32, "invalid_request")])
def test_the_start_form_shows_the_services_refusal(client, bobs_fleet, hours, code):
    client.force_login(bobs_fleet)
    before = Session.objects.count()
    response = client.post(START, _start_data(runtime_hours=hours))
    assert response.status_code == 200 and f'<code class="gs-refusal-code">{code}</code>' in response.content.decode()
    assert Session.objects.count() == before
