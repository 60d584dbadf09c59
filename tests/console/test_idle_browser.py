"""GPU activity and the idle policy in Chromium: a session in its idle warning shows the banner and its GPUs' readings;
staff exempt it through the form (the banner goes, the exemption shows) and end the exemption; a refusal shows the
service's words on the form; the session's researcher sees the Activity section but no form; the dashboard's Idle
GPUs tile counts and links to the idle sessions. Every request stays on loopback (``tests/console/conftest.py``).
``SessionActivity`` rows are made directly: the operator's report path is tested in tests/sessions/."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from playwright.sync_api import expect

from billing.models import Price
from sessions import activity as session_activity
from sessions.models import Allocation, SessionActivity
from tests.console.conftest import login, shot
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/gpu_sessions/session/"
GIB = 1024 ** 3


@pytest.fixture
def warned(console_users):
    """alice's Running session on lab-c1 holding an H100 whole (4 credits/h), quiet for 50 minutes: its warning runs
    (stops in 10 minutes under the default 60-minute policy)."""
    from django.utils import timezone

    session_activity._redis().delete(session_activity._hash_key())
    now = timezone.now()
    cluster = ClusterFactory(name="lab-c1", session_domain="lab-c1.gshare.localhost")
    device = GpuDeviceFactory(node=NodeFactory(cluster=cluster, name="gpu-c1"), uuid="GPU-c1a00000-1111-2222-3333-444455556666")
    Price.objects.create(gpu_model=device.model, credits_per_gpu_hour=Decimal("4"))
    session = SessionFactory(owner=console_users["alice"][0], cluster=cluster, node="gpu-c1", devices=[device.uuid],
                             started_at=now - timedelta(hours=3))
    Allocation.objects.create(session=session, device=device, memory_mib=device.memory_mib, cores=100, exclusive=True)
    at = now - timedelta(seconds=8)
    SessionActivity.objects.create(
        session=session, state="ok", sampled_at=at, last_kernel_at=now - timedelta(minutes=50),
        gpus=[{"device_uuid": device.uuid, "last_kernel_seconds": 3000 - 8, "utilization_percent": 0, "memory_used_bytes": 3 * GIB,
               "memory_limit_bytes": 80 * GIB, "sampled_at": at.isoformat()}],
        idle_since=now - timedelta(minutes=50), stops_at=now + timedelta(minutes=10),
    )
    yield {"session": session, "device": device, "stops_at": now + timedelta(minutes=10)}
    session_activity._redis().delete(session_activity._hash_key())


def test_staff_see_the_banner_and_exempt_the_session_through_the_form(live_server, console_users, page, warned):
    session = warned["session"]
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}{LIST}{session.pk}/change/")
    banner = page.get_by_role("alert").filter(has_text="will stop at")
    expect(banner).to_be_visible()
    stops = warned["stops_at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"This session will stop at {stops}" in banner.inner_text()
    assert "Policy: the default policy: 60 min without a GPU kernel, warned 15 min before" in banner.inner_text()
    assert "ask staff" not in banner.inner_text()  # staff see the exemption form instead
    row = page.locator(f'#gs-activity-gpus tr[data-gpu-uuid="{warned["device"].uuid}"]')
    assert "49 min ago" in row.inner_text() and "0 %" in row.inner_text() and "3.0 / 80.0 GiB" in row.inner_text()
    shot(page, "console-session-activity")

    form = page.get_by_role("form", name="Exempt from idle policy")
    expect(form).to_be_visible()
    form.get_by_label("Reason").fill("a week-long benchmark")
    form.get_by_role("button", name="Exempt", exact=True).click()
    page.wait_for_load_state()
    # No time given: the form's own refusal, on the form's page; nothing changed.
    expect(page.locator(".errorlist")).to_contain_text("Say until when")
    assert not SessionActivity.objects.filter(session=session, exempt_until__isnull=False).exists()

    page.goto(f"{live_server.url}{LIST}{session.pk}/change/")
    until = (warned["stops_at"] + timedelta(days=2)).astimezone(UTC).replace(second=0, microsecond=0)
    form.get_by_label("Until (UTC)").fill(until.strftime("%Y-%m-%dT%H:%M"))
    form.get_by_label("Reason").fill("a week-long benchmark")
    form.get_by_role("button", name="Exempt", exact=True).click()
    page.wait_for_url(f"{live_server.url}{LIST}{session.pk}/change/")
    expect(page.locator(".messagelist")).to_contain_text(f"exempt from the idle policy until {until:%Y-%m-%d %H:%M:%S} UTC")
    assert page.locator("#gs-idle-banner").count() == 0
    expect(page.locator("#gs-idle-exempt")).to_contain_text("a week-long benchmark")
    row = SessionActivity.objects.get(session=session)
    assert (row.exempt_until, row.exempt_by, row.stops_at) == (until, "admin", None)

    page.get_by_role("button", name="End exemption").click()
    page.wait_for_url(f"{live_server.url}{LIST}{session.pk}/change/")
    expect(page.locator(".messagelist")).to_contain_text("no longer exempt")
    ended = SessionActivity.objects.get(session=session)
    assert ended.exempt_until <= datetime.now(UTC) and ended.exempt_reason == ""  # ended now: the idle clock restarts there


def test_the_owner_connected_during_the_warning_is_told_the_session_stops_and_why(live_server, console_users, page, warned):
    """alice has the session open (a connection noted just now, during the warning): her session page says when it
    stops and why, that her connections do not keep it, that the stop was postponed once, and how to keep it."""
    from django.utils import timezone

    session = warned["session"]
    session_activity.forget_noted()
    session_activity.connection_note(session.public_id, now=timezone.now())
    login(page, live_server.url, "alice", console_users["alice"][1])
    page.goto(f"{live_server.url}{LIST}{session.pk}/change/")
    notice = page.get_by_role("alert").filter(has_text="will stop at")
    expect(notice).to_be_visible()
    kernel = (warned["stops_at"] - timedelta(hours=1)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    postponed = (warned["stops_at"] + timedelta(minutes=15)).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = " ".join(notice.inner_text().split())
    assert f"This session will stop at {postponed} because its GPUs have run no kernel since {kernel}." in text
    assert "Browser connections do not keep it alive" in text
    assert "has already postponed the stop once; it will not be postponed again" in text
    assert "To keep it, run GPU work in it" in text and "ask staff for an idle exemption" in text
    expect(page.locator("#gs-last-connected")).not_to_have_text("never")
    box = notice.bounding_box()
    assert box is not None and box["width"] > 200 and box["height"] > 20
    shot(page, "console-session-idle-notice")


def test_the_researcher_sees_the_activity_but_no_form(live_server, console_users, page, warned):
    session = warned["session"]
    login(page, live_server.url, "alice", console_users["alice"][1])
    page.goto(f"{live_server.url}{LIST}{session.pk}/change/")
    expect(page.locator("#gs-idle-banner")).to_be_visible()
    assert page.get_by_role("form", name="Exempt from idle policy").count() == 0
    assert page.get_by_role("button", name="Exempt", exact=True).count() == 0 and page.get_by_role("button", name="End exemption").count() == 0
    page.goto(f"{live_server.url}{LIST}")
    cell = page.locator("#result_list td.field-activity_cell")
    assert cell.inner_text().startswith("idle · stops ")
    assert page.goto(f"{live_server.url}{LIST}{session.pk}/idle-exemption/").status == 403


def test_the_dashboard_tile_counts_idle_gpus_and_links_to_them(live_server, console_users, page, warned):
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}/")
    tile = page.locator("#tile-idle")
    assert tile.locator('[data-stat="idle_gpus"]').inner_text() == "1"
    assert tile.locator('[data-stat="idle_sessions"]').inner_text() == "1"
    assert tile.locator('[data-stat="idle_burn"]').inner_text() == "4"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(page, "console-dashboard-idle")
    tile.get_by_role("link", name="Idle GPUs").click()
    page.wait_for_load_state()
    assert page.url.endswith(f"{LIST}?activity=idle")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and warned["session"].public_id in rows.first.inner_text()
