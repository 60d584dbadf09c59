"""The console's view of GPU activity and the idle policy, through Django's test client: the session page's Activity
section (a reading per GPU, unknown with its reason, no reading yet, the idle warning's banner, the idle stop's
message, connections not flushed yet), the list's Activity column and filter, the exemption form (staff exempt and
end it through ``session_idle_exempt``, its refusals shown on the form, researchers never see it), and bounded
queries. ``SessionActivity`` rows are made directly: the operator's report path is tested in tests/sessions/."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditRecord
from billing.services import policy_set
from sessions import activity as session_activity
from sessions.models import Session, SessionActivity
from tests.console_checks import page_text
from tests.factories import ClusterFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db

LIST = "/gpu_sessions/session/"
GIB = 1024 ** 3


def gpu(uuid: str, *, kernel_seconds: float | None, utilization: float | None, used_gib: float, limit_gib: float, at: datetime) -> dict:
    """One GPU of a reading, as ``SessionActivity.gpus`` stores it."""
    return {"device_uuid": uuid, "last_kernel_seconds": kernel_seconds, "utilization_percent": utilization,
            "memory_used_bytes": int(used_gib * GIB), "memory_limit_bytes": int(limit_gib * GIB), "sampled_at": at.isoformat()}


def reading(session: Session, *, gpus: list[dict], at: datetime, state: str = "ok", reason: str = "", **fields) -> SessionActivity:
    """The session's activity row as the report path would leave it."""
    kernels = [at - timedelta(seconds=g["last_kernel_seconds"]) for g in gpus if g["last_kernel_seconds"] is not None]
    return SessionActivity.objects.create(session=session, state=state, reason=reason, sampled_at=at, gpus=gpus,
                                          last_kernel_at=max(kernels) if kernels else None, **fields)


@pytest.fixture(autouse=True)
def _no_pending_connections():
    session_activity._redis().delete(session_activity._hash_key())
    yield
    session_activity._redis().delete(session_activity._hash_key())


@pytest.fixture
def running():
    """bob's Running session on lab-c1, started two hours ago."""
    now = timezone.now()
    return SessionFactory(owner=UserFactory(username="bob"), cluster=ClusterFactory(name="lab-c1"), started_at=now - timedelta(hours=2),
                          gpus=2)


def page(console, session) -> str:
    response = console.get(f"{LIST}{session.pk}/change/")
    assert response.status_code == 200
    return page_text(response)


# --- the session page ------------------------------------------------------------------------------------------------

def test_a_reading_shows_each_gpu_with_kernel_utilization_memory_and_time(console, running):
    at = timezone.now() - timedelta(seconds=20)
    reading(running, at=at, gpus=[
        gpu("GPU-aaaa1111", kernel_seconds=12, utilization=87.4, used_gib=12.5, limit_gib=40, at=at),
        gpu("GPU-bbbb2222", kernel_seconds=600, utilization=0, used_gib=0.25, limit_gib=40, at=at),
    ])
    text = page(console, running)
    assert 'id="gs-activity"' in text and 'data-state="ok"' in text and "gs-idle-banner" not in text
    stamp = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    for expected in ("GPU-aaaa1111", "12 s ago", "87 %", "12.5 / 40.0 GiB", "GPU-bbbb2222", "10 min ago", "0 %", "0.3 / 40.0 GiB",
                     stamp, "the default policy: 60 min without a GPU kernel, warned 15 min before"):
        assert expected in text, expected
    assert "last connected" in text and ">never<" in text


def test_unknown_shows_its_reason_and_no_reading_says_so(console, running):
    other = SessionFactory(cluster=running.cluster, started_at=timezone.now())
    reading(running, at=timezone.now(), gpus=[], state="unknown", reason="the vGPU monitor of node gpu-a1 timed out")
    text = page(console, running)
    assert 'data-state="unknown"' in text and "the vGPU monitor of node gpu-a1 timed out" in text
    text = page(console, other)
    assert 'data-state="none"' in text and "no reading yet" in text


def test_a_stale_reading_is_unknown(console, running, settings):
    at = timezone.now() - timedelta(seconds=settings.GSHARE_ACTIVITY_STALE_SECONDS + 30)
    reading(running, at=at, gpus=[gpu("GPU-aaaa1111", kernel_seconds=1, utilization=50, used_gib=1, limit_gib=2, at=at)])
    text = page(console, running)
    assert 'data-state="unknown"' in text and "the last reading of HAMi's vGPU monitor is" in text
    assert "GPU-aaaa1111" in text  # the last reading is still shown


def test_the_idle_warning_shows_a_banner_with_the_stop_and_the_users_policy(console, running):
    policy_set(user=running.owner, max_sessions=None, max_gpus=None, allowed_clusters=[], min_balance_hours=0, grace_seconds=900,
               idle_timeout_minutes=30, idle_warning_minutes=10)
    at = timezone.now() - timedelta(seconds=5)
    since = at - timedelta(seconds=1500)  # the last kernel: the page judges from the reading, not from a stored warning
    stops = since + timedelta(minutes=30)
    reading(running, at=at, gpus=[gpu(uuid, kernel_seconds=1500, utilization=0, used_gib=1, limit_gib=2, at=at) for uuid in ("GPU-a", "GPU-b")],
            idle_since=since, stops_at=stops)
    text = page(console, running)
    fmt = "%Y-%m-%d %H:%M:%S UTC"
    banner = (f"This session will stop at {stops.astimezone(UTC):{fmt}} because its GPUs have run no kernel since "
              f"{since.astimezone(UTC):{fmt}}. Browser connections do not keep it alive: an open notebook tab is not GPU work. "
              "To keep it, run GPU work in it (any kernel on its GPUs restarts the idle clock). "  # staff: the exemption form follows
              "Policy: bob's own policy: 30 min without a GPU kernel, warned 10 min before.")
    found = re.search(r'<div class="gs-idle-banner".*?</div>', text, re.S)
    assert found and " ".join(re.sub(r"<[^>]+>", "", found.group(0)).split()) == banner


def test_a_session_reported_for_part_of_its_gpus_warns_that_connections_still_count(console, running):
    now = timezone.now()
    at = now - timedelta(seconds=5)
    reading(running, at=at, gpus=[gpu("GPU-a", kernel_seconds=3000, utilization=0, used_gib=1, limit_gib=2, at=at)])
    found = re.search(r'<div class="gs-idle-banner".*?</div>', page(console, running), re.S)
    text = " ".join(re.sub(r"<[^>]+>", "", found.group(0)).split()) if found else ""
    assert "nothing ran on its GPUs and nobody connected since" in text
    assert "Connections still count because HAMi's vGPU monitor reported 1 of the session's 2 GPUs" in text


def test_a_policy_minute_of_other_than_60_s_is_said(console, running, settings):
    settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS = 2
    assert "60 policy minutes of 2 s without a GPU kernel" in page(console, running)


def test_a_connection_not_flushed_yet_counts_as_last_connected(console, running):
    at = timezone.now().replace(microsecond=0) - timedelta(seconds=3)
    session_activity.connection_note(running.public_id, now=at)
    assert at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in page(console, running).split('id="gs-last-connected"')[1][:80]


def test_a_session_stopped_idle_shows_the_policys_message(console, running):
    message = "Stopped by the idle policy (the default policy: 60 min without a GPU kernel). Last GPU kernel: none seen."
    Session.objects.filter(pk=running.pk).update(phase=Session.Phase.TERMINATED, stop_reason=Session.StopReason.IDLE, message=message,
                                                 ended_at=timezone.now())
    text = page(console, running)
    assert 'id="gs-idle-stopped"' in text and message in text.split('id="gs-idle-stopped"')[1]
    assert "idle policy" in text  # the stop reason field
    assert 'id="gs-exempt-form"' not in text  # nothing to exempt once it ended


# --- the list ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def four(running):
    """bob's ``running`` busy at 87 / 41 %, an idle one (quiet for an hour), one in its warning, one unknown."""
    now = timezone.now()
    at = now - timedelta(seconds=10)
    reading(running, at=at, gpus=[gpu("GPU-1", kernel_seconds=2, utilization=87, used_gib=1, limit_gib=2, at=at),
                                  gpu("GPU-2", kernel_seconds=2, utilization=41, used_gib=1, limit_gib=2, at=at)])
    idle = SessionFactory(cluster=running.cluster, started_at=now - timedelta(hours=3))
    reading(idle, at=at, gpus=[gpu("GPU-3", kernel_seconds=3600, utilization=0, used_gib=1, limit_gib=2, at=at)])
    warned = SessionFactory(cluster=running.cluster, started_at=now - timedelta(hours=3))
    stops = (now + timedelta(minutes=7)).replace(second=0, microsecond=0)
    reading(warned, at=at, gpus=[gpu("GPU-4", kernel_seconds=3000, utilization=0, used_gib=1, limit_gib=2, at=at)],
            idle_since=now - timedelta(minutes=50), stops_at=stops)
    unknown = SessionFactory(cluster=running.cluster, started_at=now - timedelta(hours=3))
    reading(unknown, at=at, gpus=[], state="unknown", reason="monitor unreachable")
    silent = SessionFactory(cluster=running.cluster, started_at=now - timedelta(hours=3))  # no reading at all
    ended = SessionFactory(cluster=running.cluster, phase=Session.Phase.TERMINATED, ended_at=now)
    reading(ended, at=at, gpus=[gpu("GPU-5", kernel_seconds=3600, utilization=0, used_gib=1, limit_gib=2, at=at)])
    return {"busy": running, "idle": idle, "warned": warned, "unknown": unknown, "silent": silent, "ended": ended, "stops": stops}


def _cell(text: str, session: Session) -> str:
    row = re.search(rf"<tr[^>]*>(?:(?!</tr>).)*{session.public_id}(?:(?!</tr>).)*</tr>", text, re.S).group(0)
    return re.sub(r"<[^>]+>", "", re.search(r'<td class="field-activity_cell">(.*?)</td>', row, re.S).group(1)).strip()


def test_the_list_says_busy_idle_warned_and_unknown(console, four):
    text = page_text(console.get(LIST))
    assert _cell(text, four["busy"]) == "busy 64 %"
    assert _cell(text, four["idle"]).startswith("idle 6")  # quiet for an hour: "idle 60 min"
    assert _cell(text, four["warned"]) == f"idle · stops {four['stops'].astimezone(UTC):%H:%M}"
    assert _cell(text, four["unknown"]) == "unknown"
    assert 'title="monitor unreachable"' in text
    assert _cell(text, four["silent"]) == "no reading"
    assert _cell(text, four["ended"]) == "—"


@pytest.mark.parametrize(("value", "expected"), [("idle", {"idle", "warned"}), ("busy", {"busy"}), ("unknown", {"unknown", "silent"}),
                                               ("", {"busy", "idle", "warned", "unknown", "silent", "ended"})])
def test_the_activity_filter(console, four, value, expected):
    text = page_text(console.get(f"{LIST}?activity={value}" if value else LIST))
    shown = {name for name in ("busy", "idle", "warned", "unknown", "silent", "ended") if four[name].public_id in text}
    assert shown == expected


def test_list_and_page_queries_do_not_grow_with_rows(console, running):
    cluster, owner = running.cluster, running.owner
    now = timezone.now()

    def add(count: int) -> None:
        sessions = Session.objects.bulk_create([Session(owner=owner, cluster=cluster, image="img", gpus=1, phase="Running",
                                                        started_at=now - timedelta(hours=1)) for _ in range(count)])
        SessionActivity.objects.bulk_create([
            SessionActivity(session=s, state="ok", sampled_at=now, gpus=[gpu(f"GPU-{s.pk}", kernel_seconds=5, utilization=30, used_gib=1,
                                                                         limit_gib=2, at=now)], last_kernel_at=now)
            for s in sessions
        ])

    counts = []
    for total in (5, 60):
        add(total - Session.objects.count())
        with CaptureQueriesContext(connection) as queries:
            assert console.get(LIST).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
    with CaptureQueriesContext(connection) as first:
        page(console, running)
    reading_gpus = [gpu(f"GPU-x{i}", kernel_seconds=1, utilization=1, used_gib=1, limit_gib=2, at=now) for i in range(8)]
    SessionActivity.objects.filter(session=running).update(gpus=reading_gpus)
    with CaptureQueriesContext(connection) as second:
        page(console, running)
    assert len(first) == len(second), (len(first), len(second))


# --- the exemption form -------------------------------------------------------------------------------------------------

def test_staff_exempt_a_session_and_end_the_exemption(console, running, staff_user):
    now = timezone.now()
    reading(running, at=now, gpus=[], idle_since=now - timedelta(minutes=50), stops_at=now + timedelta(minutes=10))
    text = page(console, running)
    assert 'id="gs-exempt-form"' in text and "End exemption" not in text
    until = (now + timedelta(days=1)).astimezone(UTC).replace(second=0, microsecond=0)
    response = console.post(f"{LIST}{running.pk}/idle-exemption/", {"until": until.strftime("%Y-%m-%dT%H:%M"), "reason": "a long training run",
                                                                   "exempt": "1"})
    assert response.status_code == 302 and response["Location"] == f"{LIST}{running.pk}/change/"
    row = SessionActivity.objects.get(session=running)
    assert (row.exempt_until, row.exempt_reason, row.exempt_by, row.idle_since, row.stops_at) == (until, "a long training run", "admin", None, None)
    assert AuditRecord.objects.filter(action="session_idle_exempt").count() == 1
    text = page_text(console.get(f"{LIST}{running.pk}/change/"))
    assert "is exempt from the idle policy until" in text and "gs-idle-banner" not in text
    assert f"Exempt from the idle policy until {until:%Y-%m-%d %H:%M:%S} UTC (set by admin): a long training run" in " ".join(
        text.replace("<strong>", "").replace("</strong>", "").split())
    assert "End exemption" in text

    response = console.post(f"{LIST}{running.pk}/idle-exemption/", {"until": "", "reason": "", "end": "1"})
    assert response.status_code == 302
    row.refresh_from_db()
    # Ended now: the moment is kept (the idle clock restarts from it), the reason and who set it are cleared.
    assert row.exempt_until <= timezone.now() and (row.exempt_reason, row.exempt_by) == ("", "")
    assert "is no longer exempt" in page_text(console.get(f"{LIST}{running.pk}/change/"))


@pytest.mark.parametrize(("data", "words"), [
    ({"until": "2020-01-01T10:00", "reason": "late"}, "until must be in the future"),
    ({"until": "+1d", "reason": ""}, "reason must say why"),
    ({"until": "", "reason": "no end"}, "Say until when"),
    ({"until": "not a time", "reason": "x"}, "Enter a valid date/time"),
])
def test_a_refused_exemption_is_shown_on_the_form_and_changes_nothing(console, running, data, words):
    if data["until"] == "+1d":
        data = {**data, "until": (timezone.now() + timedelta(days=1)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M")}
    response = console.post(f"{LIST}{running.pk}/idle-exemption/", {**data, "exempt": "1"})
    assert response.status_code == 200
    text = page_text(response)
    assert words in text and 'id="gs-exempt-form"' in text
    assert not SessionActivity.objects.filter(session=running, exempt_until__isnull=False).exists()


def test_an_ended_session_is_refused_with_the_services_words(console, running):
    form_page = console.get(f"{LIST}{running.pk}/idle-exemption/")
    assert form_page.status_code == 200
    Session.objects.filter(pk=running.pk).update(phase=Session.Phase.TERMINATED, ended_at=timezone.now())
    until = (timezone.now() + timedelta(days=1)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M")
    response = console.post(f"{LIST}{running.pk}/idle-exemption/", {"until": until, "reason": "x", "exempt": "1"})
    assert response.status_code == 200 and "has ended; there is nothing to exempt" in page_text(response)


def test_researchers_and_staff_without_the_permission_never_see_the_form(client, running, django_user_model):
    client.force_login(running.owner)
    text = page(client, running)
    assert 'id="gs-activity"' in text and 'id="gs-exempt-form"' not in text and "idle-exemption" not in text
    assert client.post(f"{LIST}{running.pk}/idle-exemption/", {"until": "2030-01-01T00:00", "reason": "x", "exempt": "1"}).status_code == 403
    assert client.get(f"{LIST}{running.pk}/idle-exemption/").status_code == 403

    viewer = django_user_model.objects.create_user("viewer", "v@example.test", "pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_session", content_type__app_label="gpu_sessions"))
    client.force_login(viewer)
    text = page(client, running)
    assert 'id="gs-activity"' in text and 'id="gs-exempt-form"' not in text
    assert client.post(f"{LIST}{running.pk}/idle-exemption/", {"until": "2030-01-01T00:00", "reason": "x", "exempt": "1"}).status_code == 403
    assert not SessionActivity.objects.filter(session=running, exempt_until__isnull=False).exists()


def test_a_researchers_list_has_the_activity_column(client, running):
    client.force_login(running.owner)
    at = timezone.now()
    reading(running, at=at, gpus=[gpu("GPU-1", kernel_seconds=2, utilization=50, used_gib=1, limit_gib=2, at=at)])
    text = page_text(client.get(LIST))
    assert _cell(text, running) == "busy 50 %"
