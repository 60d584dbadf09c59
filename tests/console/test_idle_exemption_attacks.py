"""Attacks on the console's idle exemption form (``POST <session>/idle-exemption/``, ``console.pages.sessions.actions.IdleExemptionForm``,
``sessions.idle.session_idle_exempt``) through Django's test client: no CSRF token, users who may not exempt (a
researcher for their own and others' sessions, staff without ``gpu_sessions.change_session``, a deactivated staff
user's old login), ended sessions, object ids that are not a session's, malformed ``until`` values, a reason carrying
HTML (escaped on the session page and in the audit trail), and ten concurrent posts (one audit row each, serialized).
"""

from __future__ import annotations

import threading
from datetime import UTC, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connections
from django.test import Client
from django.utils import timezone

from audit.models import AuditRecord
from sessions.models import Session, SessionActivity
from tests.console_checks import page_text
from tests.factories import ClusterFactory, SessionFactory, UserFactory

LIST = "/gpu_sessions/session/"
SCRIPT = '<script>alert("x")</script><img src=x onerror=alert(1)>'
#: In a page: how many elements the reason could have injected (a script calling alert, the img).
INJECTED = ("() => [...document.querySelectorAll('script')].filter(s => s.textContent.includes('alert(')).length"
            " + document.querySelectorAll('img[src=x]').length")


def tomorrow() -> str:
    return (timezone.now() + timedelta(days=1)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def exempt_url(pk) -> str:
    return f"{LIST}{pk}/idle-exemption/"


def nothing_changed(session: Session) -> None:
    assert not SessionActivity.objects.filter(session=session, exempt_until__isnull=False).exists()
    assert not AuditRecord.objects.filter(action="session_idle_exempt").exists()


@pytest.fixture
def running(db):
    return SessionFactory(owner=UserFactory(username="bob"), cluster=ClusterFactory(name="lab-c1"),
                          started_at=timezone.now() - timedelta(hours=2))


# --- who may post ----------------------------------------------------------------------------------------------------------

def test_a_post_without_the_csrf_token_is_refused(staff_user, running):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_user)
    response = client.post(exempt_url(running.pk), {"until": tomorrow(), "reason": "r", "exempt": "1"})
    assert response.status_code == 403
    nothing_changed(running)
    # The same client with the token the form carries is let through: the refusal was the token's.
    form = client.get(exempt_url(running.pk))
    token = form.context["csrf_token"]
    response = client.post(exempt_url(running.pk), {"until": tomorrow(), "reason": "r", "exempt": "1", "csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302


def test_a_researcher_may_not_exempt_their_own_session_and_does_not_see_anothers(client, running):
    client.force_login(running.owner)
    assert client.post(exempt_url(running.pk), {"until": tomorrow(), "reason": "mine", "exempt": "1"}).status_code == 403
    assert client.post(exempt_url(running.pk), {"end": "1"}).status_code == 403
    other = SessionFactory(cluster=running.cluster, started_at=timezone.now())
    assert client.post(exempt_url(other.pk), {"until": tomorrow(), "reason": "theirs", "exempt": "1"}).status_code == 404
    assert client.get(exempt_url(other.pk)).status_code == 404
    nothing_changed(running)
    nothing_changed(other)


@pytest.mark.parametrize("perms", [[], ["view_session"], ["view_session", "add_session", "delete_session"]])
def test_staff_without_change_session_are_refused(client, running, django_user_model, perms):
    staff = django_user_model.objects.create_user("ops", "ops@example.test", "pw", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=perms, content_type__app_label="gpu_sessions"))
    client.force_login(staff)
    response = client.post(exempt_url(running.pk), {"until": tomorrow(), "reason": "r", "exempt": "1"})
    assert response.status_code in (403, 404)
    nothing_changed(running)


def test_a_deactivated_staff_users_old_login_is_not_honoured(client, running, staff_user):
    client.force_login(staff_user)
    assert client.get(exempt_url(running.pk)).status_code == 200
    type(staff_user).objects.filter(pk=staff_user.pk).update(is_active=False)
    response = client.post(exempt_url(running.pk), {"until": tomorrow(), "reason": "r", "exempt": "1"})
    assert response.status_code == 302 and "/login/" in response["Location"]
    nothing_changed(running)


def test_staff_who_lost_the_permission_mid_session_are_refused(client, running, django_user_model):
    staff = django_user_model.objects.create_user("ops", "ops@example.test", "pw", is_staff=True)
    change = Permission.objects.get(codename="change_session", content_type__app_label="gpu_sessions")
    staff.user_permissions.add(change)
    client.force_login(staff)
    assert client.get(exempt_url(running.pk)).status_code == 200
    staff.user_permissions.remove(change)
    assert client.post(exempt_url(running.pk), {"until": tomorrow(), "reason": "r", "exempt": "1"}).status_code == 403
    nothing_changed(running)


# --- which session ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("phase", [Session.Phase.TERMINATED, Session.Phase.FAILED])
def test_an_ended_session_is_refused_and_its_form_ends_nothing(console, running, phase):
    Session.objects.filter(pk=running.pk).update(phase=phase, ended_at=timezone.now())
    for data in ({"until": tomorrow(), "reason": "r", "exempt": "1"}, {"end": "1"}):
        response = console.post(exempt_url(running.pk), data)
        assert response.status_code == 200 and "has ended; there is nothing to exempt" in page_text(response)
    nothing_changed(running)


@pytest.mark.parametrize("object_id", [
    "abc", "99999999999999999999999", "9223372036854775808", "-1", "0", "1.0", "0x1", "1%00", "%20", "1/stop",
    "../../auth/user/1", "1/change/../..", "ses_abc", "1e3", "٣",
])
def test_object_ids_that_are_no_session_are_404(console, running, object_id):
    # 404, or 400 where Django refuses the URL itself (an escaped NUL)
    response = console.post(f"{LIST}{object_id}/idle-exemption/", {"until": tomorrow(), "reason": "r", "exempt": "1"})
    assert response.status_code in (404, 400) if "%00" in object_id else response.status_code == 404
    response = console.get(f"{LIST}{object_id}/idle-exemption/")
    assert response.status_code in (404, 400) if "%00" in object_id else response.status_code == 404
    nothing_changed(running)


def test_a_researcher_probing_object_ids_gets_404_not_403(client, running):
    client.force_login(running.owner)
    for object_id in ("abc", "99999999999999999999999", "-1"):
        assert client.post(f"{LIST}{object_id}/idle-exemption/", {"until": tomorrow(), "reason": "r"}).status_code == 404


# --- what is posted ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("until", "words"), [
    ("2020-01-01T10:00", "until must be in the future"),
    ("9999-12-31T23:59", "at most 365 days ahead"),
    ("10000-01-01T00:00", "Enter a valid date/time"),
    ("2027-02-30T10:00", "Enter a valid date/time"),
    ("\x00", "Enter a valid date/time"),
    ("9" * 100_000, "Enter a valid date/time"),
    ("2026-12-03T25:00", "Enter a valid date/time"),
    ("  ", "Enter a valid date/time"),
])
def test_malformed_until_is_refused_on_the_form(console, running, until, words):
    response = console.post(exempt_url(running.pk), {"until": until, "reason": "a reason", "exempt": "1"})
    assert response.status_code == 200
    text = page_text(response)
    assert words in text and 'id="gs-exempt-form"' in text
    nothing_changed(running)


@pytest.mark.parametrize(("suffix", "hours"), [("+05:00", -5), ("Z", 0), ("-02:30", 2.5), ("\x00", 0)])
def test_an_until_with_its_own_offset_is_the_instant_it_names(console, running, suffix, hours):
    # Django's DateTimeField reads ISO 8601 before the form's formats: an offset is honoured, not taken for UTC.
    local = (timezone.now() + timedelta(days=2)).astimezone(UTC).replace(second=0, microsecond=0, tzinfo=None)
    response = console.post(exempt_url(running.pk), {"until": f"{local:%Y-%m-%dT%H:%M}{suffix}", "reason": "r", "exempt": "1"})
    assert response.status_code == 302
    row = SessionActivity.objects.get(session=running)
    assert row.exempt_until == local.replace(tzinfo=UTC) + timedelta(hours=hours)


@pytest.mark.parametrize(("reason", "words"), [
    ("", "reason must say why"), ("   \n\t ", "reason must say why"), ("x" * 501, "at most 500 characters"),
    ("why\x00not", "Null characters are not allowed"),
])
def test_malformed_reasons_are_refused(console, running, reason, words):
    response = console.post(exempt_url(running.pk), {"until": tomorrow(), "reason": reason, "exempt": "1"})
    assert response.status_code == 200 and words in page_text(response)
    nothing_changed(running)


def test_end_with_until_and_reason_ends_and_keeps_no_reason(console, running):
    assert console.post(exempt_url(running.pk), {"until": tomorrow(), "reason": "first", "exempt": "1"}).status_code == 302
    response = console.post(exempt_url(running.pk), {"until": "9999-12-31T23:59", "reason": SCRIPT, "end": "1", "exempt": "1"})
    assert response.status_code == 302
    row = SessionActivity.objects.get(session=running)
    assert row.exempt_until <= timezone.now() and (row.exempt_reason, row.exempt_by) == ("", "")


def test_a_reason_with_html_is_escaped_on_the_page_and_in_the_audit_trail(console, running):
    response = console.post(exempt_url(running.pk), {"until": tomorrow(), "reason": SCRIPT, "exempt": "1"})
    assert response.status_code == 302
    assert SessionActivity.objects.get(session=running).exempt_reason == SCRIPT  # stored as typed, escaped when shown
    page = raw(console.get(f"{LIST}{running.pk}/change/"))  # the HTML as sent, entities not decoded
    assert "(set by admin): &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;</p>" in page
    assert "<script>alert" not in page and "<img src=x" not in page
    [record] = AuditRecord.objects.filter(action="session_idle_exempt")
    assert record.changes["exempt_reason"]["new"] == SCRIPT
    for url in ("/audit/auditrecord/", f"/audit/auditrecord/{record.pk}/change/", LIST, exempt_url(running.pk)):
        shown = raw(console.get(url))
        assert "<script>alert" not in shown and "<img src=x" not in shown, url
    assert "&lt;script&gt;alert" in raw(console.get(f"/audit/auditrecord/{record.pk}/change/"))
    # Refused (too long), the form shows the posted reason again: escaped too.
    refused = raw(console.post(exempt_url(running.pk), {"until": tomorrow(), "reason": SCRIPT * 10, "exempt": "1"}))
    assert "at most 500 characters" in refused and "<script>alert" not in refused


def raw(response) -> str:
    assert response.status_code == 200
    return response.content.decode()


# --- at once -------------------------------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_ten_concurrent_posts_leave_one_audit_row_each_and_a_consistent_row(staff_user):
    session = SessionFactory(owner=UserFactory(username="carol"), cluster=ClusterFactory(name="lab-c2"), started_at=timezone.now())
    until = tomorrow()
    barrier = threading.Barrier(10)
    statuses: list[int] = []
    lock = threading.Lock()

    def post(index: int) -> None:
        try:
            client = Client()
            client.force_login(staff_user)
            data = {"end": "1"} if index % 3 == 2 else {"until": until, "reason": f"run {index}", "exempt": "1"}
            barrier.wait(10)
            status = client.post(exempt_url(session.pk), data).status_code
            with lock:
                statuses.append(status)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert statuses == [302] * 10
    records = list(AuditRecord.objects.filter(action="session_idle_exempt").order_by("pk"))
    assert len(records) == 10
    # Serialized by the session's row lock: each change starts where the one before ended.
    reasons = [r.changes.get("exempt_reason", {"old": None, "new": None}) for r in records]
    previous = ""
    for record in records:
        change = record.changes.get("exempt_reason")
        if change is not None:
            assert change["old"] == previous, reasons
            previous = change["new"]
    row = SessionActivity.objects.get(session=session)
    assert row.exempt_reason == previous
    assert (row.exempt_by == "admin") == bool(row.exempt_reason)


@pytest.mark.django_db(transaction=True)
def test_in_chromium_a_reason_with_script_is_shown_as_text_and_never_runs(live_server, console_users, page):
    from tests.console.conftest import login

    session = SessionFactory(owner=console_users["alice"][0], cluster=ClusterFactory(name="lab-c3"), started_at=timezone.now())
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}{LIST}{session.pk}/change/")
    form = page.get_by_role("form", name="Exempt from idle policy")
    form.get_by_label("Until (UTC)").fill(tomorrow())
    form.get_by_label("Reason").fill(SCRIPT)
    form.get_by_role("button", name="Exempt", exact=True).click()
    page.wait_for_url(f"{live_server.url}{LIST}{session.pk}/change/")
    note = page.locator("#gs-idle-exempt")
    assert note.inner_text().endswith(f"(set by admin): {SCRIPT}")
    assert note.locator("script, img").count() == 0 and page.evaluate(INJECTED) == 0
    [record] = AuditRecord.objects.filter(action="session_idle_exempt")
    page.goto(f"{live_server.url}/audit/auditrecord/{record.pk}/change/")
    assert "<script>alert(" in page.inner_text("#content")  # the trail shows the reason as text
    # (the admin's own scripts are in #content too: only an injected one would run alert)
    assert page.evaluate(INJECTED) == 0
    assert dialogs == []
