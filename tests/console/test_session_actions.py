"""The console offers Open and Stop by one rule (``sessions.permissions.SessionRights``): on a session's row, on its
page and in the status its page polls, the same buttons for the same user."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from sessions.models import Session
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def permission(codename: str) -> Permission:
    return Permission.objects.get(content_type__app_label="gpu_sessions", codename=codename)


def offered(client, session: Session) -> dict[str, tuple[bool, bool]]:
    listing = client.get("/gpu_sessions/session/").content.decode()
    page = client.get(f"/gpu_sessions/session/{session.pk}/change/").content.decode()
    status = client.get(f"/gpu_sessions/session/{session.pk}/status/").json()
    return {
        "row": ("gs-open" in listing, "gs-stop" in listing),
        "page": ("gs-open" in page, "gs-stop" in page),
        "status": (status["can_open"], status["can_stop"]),
    }


@pytest.fixture
def running(django_user_model):
    owner = django_user_model.objects.create_user("owner")
    return Session.objects.create(owner=owner, cluster=ClusterFactory(), image="img", gpus=1, phase=Session.Phase.RUNNING)


def test_view_only_staff_are_offered_neither_anywhere(client, django_user_model, running):
    staff = django_user_model.objects.create_user("viewer", is_staff=True)
    staff.user_permissions.add(permission("view_session"))
    client.force_login(staff)
    assert offered(client, running) == {"row": (False, False), "page": (False, False), "status": (False, False)}


def test_staff_who_may_change_sessions_are_offered_both_everywhere(client, django_user_model, running):
    staff = django_user_model.objects.create_user("operator", is_staff=True)
    staff.user_permissions.add(permission("view_session"), permission("change_session"))
    client.force_login(staff)
    assert offered(client, running) == {"row": (True, True), "page": (True, True), "status": (True, True)}


def test_a_stopping_session_offers_neither(client, django_user_model, running):
    Session.objects.filter(pk=running.pk).update(phase=Session.Phase.STOPPING)
    running.refresh_from_db()
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.test", "Pw-123456789!"))
    assert offered(client, running) == {"row": (False, False), "page": (False, False), "status": (False, False)}


def test_the_owner_researcher_is_offered_both_everywhere(client, running):
    client.force_login(running.owner)
    assert offered(client, running) == {"row": (True, True), "page": (True, True), "status": (True, True)}


def test_the_status_poll_reads_no_ledger_and_the_page_reads_the_session_once(client, running):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.force_login(running.owner)
    with CaptureQueriesContext(connection) as polled:
        assert client.get(f"/gpu_sessions/session/{running.pk}/status/").status_code == 200
    assert not [q for q in polled.captured_queries if "ledger" in q["sql"]]
    with CaptureQueriesContext(connection) as page:
        assert client.get(f"/gpu_sessions/session/{running.pk}/change/").status_code == 200
    reads = [q for q in page.captured_queries if q["sql"].startswith("SELECT") and 'FROM "gpu_sessions_session"' in q["sql"]
             and "ledger" in q["sql"]]
    assert len(reads) == 1
