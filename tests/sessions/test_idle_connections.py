"""Connections and the idle policy (``sessions.idle``): with every GPU of a session reported by HAMi's vGPU monitor only
a kernel resets the idle clock, and a connection during the warning postpones the stop once, by one warning period;
with GPU activity unknown, or reported for part of its GPUs, connections keep the session as before. The policy runs
on a controlled clock (``idle_enforce(now=...)``); connections go through ``connection_note`` (what verify and
ext-authz call) and ``connections_flush`` (beat), readings straight into ``SessionActivity``."""

from datetime import UTC, datetime, timedelta

import pytest

from identity.tokens import api_token_create
from sessions import activity, idle
from sessions.models import Session, SessionActivity
from tests.factories import SessionFactory
from tests.helpers import iso

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)  # the last kernel
MINUTE = timedelta(minutes=1)
TIMEOUT, WARNING = 60 * MINUTE, 15 * MINUTE  # the default policy (settings)
EVERY = timedelta(seconds=30)  # an open JupyterLab tab polls far more often; verify notes once a policy minute


@pytest.fixture(autouse=True)
def _clean(settings):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 300
    activity._redis().delete(activity._hash_key())
    activity.forget_noted()
    yield
    activity._redis().delete(activity._hash_key())


def make_session(*, devices=("GPU-a",)):
    session = SessionFactory(gpus=len(devices), devices=list(devices))
    Session.objects.filter(pk=session.pk).update(started_at=T0 - 2 * TIMEOUT)
    return Session.objects.get(pk=session.pk)


def report(session, *, at, kernel_at=T0, uuids=("GPU-a",)):
    """The operator's reading at ``at``: each GPU in ``uuids`` last ran a kernel at ``kernel_at`` (as
    ``activity_report_apply`` stores it: the last kernel never moves back)."""
    gpus = [{"device_uuid": u, "last_kernel_seconds": (at - kernel_at).total_seconds(), "utilization_percent": 0.0,
             "memory_used_bytes": 0, "memory_limit_bytes": 1 << 30, "sampled_at": iso(at)} for u in uuids]
    row, _ = SessionActivity.objects.get_or_create(session=session)
    row.state, row.sampled_at, row.gpus = "ok", at, gpus
    row.last_kernel_at = max(row.last_kernel_at or kernel_at, kernel_at)
    row.save()


def connect(session, at):
    """Someone let into the session at ``at`` (the per-process dedup is wall-clock based: forget it first)."""
    activity.forget_noted()
    activity.connection_note(session.public_id, now=at)


def run_until_stopped(session, *, until, uuids=("GPU-a",), connect_every=EVERY, kernel_at=T0, start=T0):
    """Every ``EVERY`` from ``start``: a connection (when ``connect_every``), a fresh reading, the policy's run; beat's
    flush each minute. Returns the moment the session was stopped, or None when it still runs at ``until``."""
    t = start
    while t <= until:
        if connect_every and (t - start) % connect_every == timedelta(0):
            connect(session, t)
        if (t - start) % MINUTE == timedelta(0):
            activity.connections_flush()
        report(session, at=t, kernel_at=kernel_at, uuids=uuids)
        if idle.idle_enforce(now=t)["stopped"]:
            return t
        t += EVERY
    return None


def test_connections_every_30_s_do_not_keep_a_session_whose_gpus_ran_no_kernel():
    """The issue: a tab polling the session kept it Running past four times the timeout. Now it stops at the timeout
    plus the one postponement its connections earn during the warning."""
    session = make_session()
    stopped = run_until_stopped(session, until=T0 + 4 * TIMEOUT + MINUTE)
    assert stopped == T0 + TIMEOUT + WARNING
    session.refresh_from_db()
    assert session.stop_reason == "idle"
    assert "Connections do not keep a session whose GPUs HAMi's vGPU monitor reports" in session.message
    assert "postponed the stop once" in session.message


def test_without_connections_it_stops_at_the_timeout_and_a_connection_before_the_warning_earns_nothing():
    quiet = make_session()
    assert run_until_stopped(quiet, until=T0 + 2 * TIMEOUT, connect_every=None) == T0 + TIMEOUT
    early = make_session()
    connect(early, T0 + TIMEOUT - WARNING - timedelta(seconds=1))  # a second before the warning starts
    activity.connections_flush()
    assert run_until_stopped(early, until=T0 + 2 * TIMEOUT, connect_every=None) == T0 + TIMEOUT


def test_the_postponement_happens_once():
    session = make_session()
    warned_from = T0 + TIMEOUT - WARNING
    report(session, at=warned_from)
    assert idle.idle_enforce(now=warned_from)["warned"] == 1
    assert SessionActivity.objects.get(session=session).stops_at == T0 + TIMEOUT
    connect(session, warned_from)  # the very first instant of the warning counts
    assert idle.idle_enforce(now=warned_from)["stopped"] == 0
    assert SessionActivity.objects.get(session=session).stops_at == T0 + TIMEOUT + WARNING
    # However many more connections come, in the warning, at the first stop or after it, the stop stays put.
    for at in (T0 + TIMEOUT - MINUTE, T0 + TIMEOUT, T0 + TIMEOUT + WARNING - timedelta(seconds=1)):
        connect(session, at)
        activity.connections_flush()
        report(session, at=at)
        assert idle.idle_enforce(now=at) == {"checked": 1, "warned": 1, "stopped": 0}
        row = SessionActivity.objects.get(session=session)
        assert (row.idle_since, row.stops_at) == (T0, T0 + TIMEOUT + WARNING)
    connect(session, T0 + TIMEOUT + WARNING)
    report(session, at=T0 + TIMEOUT + WARNING)
    assert idle.idle_enforce(now=T0 + TIMEOUT + WARNING)["stopped"] == 1


def test_the_api_shows_the_stop_the_policy_decides_at_its_own_now(http_for):
    """The API judges at the moment it answers (``idle_status``), not at the policy's last run: the warning shows and
    the postponement a connection earned shows before beat ran. Times are minutes from the moment read here, so how
    fast the test runs does not matter."""
    from django.utils import timezone

    now = timezone.now().replace(microsecond=0)
    kernel = now - 50 * MINUTE  # in the warning (from 45 min), 10 min before the stop
    session = make_session()
    owner = http_for(api_token_create(username=session.owner.username)[1])
    report(session, at=now, kernel_at=kernel)
    shown = owner.get(f"/api/v1/sessions/{session.public_id}").json()
    assert (shown["idle_since"], shown["stops_at"]) == (iso(kernel), iso(kernel + TIMEOUT))
    assert shown["activity"]["stop_postponed"] is False and shown["activity"]["connections_count"] is False
    connect(session, now)  # noted in Redis, not flushed, no policy run
    shown = owner.get(f"/api/v1/sessions/{session.public_id}").json()
    assert (shown["idle_since"], shown["stops_at"]) == (iso(kernel), iso(kernel + TIMEOUT + WARNING))
    assert shown["activity"]["stop_postponed"] is True
    listed = owner.get("/api/v1/sessions").json()["results"]
    assert [(s["idle_since"], s["stops_at"]) for s in listed] == [(iso(kernel), iso(kernel + TIMEOUT + WARNING))]
    idle.idle_enforce(now=now)
    row = SessionActivity.objects.get(session=session)
    assert (row.idle_since, row.stops_at) == (kernel, kernel + TIMEOUT + WARNING)  # what the stop task acts on
    Session.objects.filter(pk=session.pk).update(phase="Stopping")
    gone = owner.get(f"/api/v1/sessions/{session.public_id}").json()
    assert (gone["idle_since"], gone["stops_at"]) == (None, None)


def test_a_kernel_starts_a_new_stretch_with_its_own_single_postponement():
    session = make_session()
    kernel = T0 + 70 * MINUTE  # ran during the postponed stretch: the clock restarts there
    assert run_until_stopped(session, until=kernel - EVERY) is None
    assert SessionActivity.objects.get(session=session).stops_at == T0 + TIMEOUT + WARNING
    assert run_until_stopped(session, until=kernel + 4 * TIMEOUT, kernel_at=kernel, start=kernel) == kernel + TIMEOUT + WARNING


def test_a_connection_stamped_in_the_future_still_postpones_only_once():
    """A verify process whose clock runs ahead notes a connection an hour early: it cannot buy more than the one
    warning period."""
    session = make_session()
    connect(session, T0 + 3 * TIMEOUT)
    activity.connections_flush()
    assert run_until_stopped(session, until=T0 + 4 * TIMEOUT) == T0 + TIMEOUT + WARNING


@pytest.mark.parametrize("reading", ["none", "unknown", "stale"])
def test_unknown_gpu_activity_with_connections_keeps_the_session(reading, settings):
    session = make_session()
    SessionActivity.objects.create(session=session)
    t = T0
    while t <= T0 + 4 * TIMEOUT:
        connect(session, t)
        activity.connections_flush()
        row = SessionActivity.objects.get(session=session)
        if reading == "unknown":
            row.state, row.reason, row.sampled_at = "unknown", "no vGPU monitor pod on node gpu-a", t
        elif reading == "stale":
            row.state, row.sampled_at, row.last_kernel_at = "ok", T0 - MINUTE, T0 - MINUTE
        row.save()
        assert idle.idle_enforce(now=t) == {"checked": 1, "warned": 0, "stopped": 0}
        t += 10 * EVERY
    assert Session.objects.get(pk=session.pk).phase == "Running"


def test_a_multi_gpu_session_reported_in_part_is_kept_by_connections_and_stops_after_the_last_one():
    """The monitor lists GPU-a of a two-GPU session but not GPU-b, which may be busy: connections count again."""
    session = make_session(devices=("GPU-a", "GPU-b"))
    assert run_until_stopped(session, until=T0 + 4 * TIMEOUT, uuids=("GPU-a",)) is None
    last = T0 + 4 * TIMEOUT
    stopped = run_until_stopped(session, until=last + 2 * TIMEOUT, uuids=("GPU-a",), connect_every=None, start=last + EVERY)
    assert stopped == last + TIMEOUT
    session.refresh_from_db()
    assert "Connections counted as activity: HAMi's vGPU monitor reported 1 of the session's 2 GPUs" in session.message


def test_a_reading_of_every_gpu_of_a_multi_gpu_session_ignores_connections():
    session = make_session(devices=("GPU-a", "GPU-b"))
    assert run_until_stopped(session, until=T0 + 4 * TIMEOUT, uuids=("GPU-b", "GPU-a")) == T0 + TIMEOUT + WARNING


@pytest.mark.parametrize("gpus, devices, count, missing", [
    ([{"device_uuid": "GPU-a"}, {"device_uuid": "GPU-b"}], ["GPU-a", "GPU-b"], 2, ""),
    ([{"device_uuid": "GPU-a"}], ["GPU-a", "GPU-b"], 2, "reported 1 of the session's 2 GPUs"),
    ([{"device_uuid": "GPU-a"}, {"device_uuid": "GPU-x"}], ["GPU-a", "GPU-b"], 2, "reported 1 of the session's 2 GPUs"),
    ([{"device_uuid": "GPU-a"}, {"device_uuid": "GPU-a"}], [], 2, "reported 1 of the session's 2 GPUs"),
    ([{"device_uuid": "GPU-a"}], [], 1, ""),
    ([], [], 1, "reported 0 of the session's 1 GPUs"),
    (["GPU-a", None, {"device_uuid": ""}], ["GPU-a"], 1, "reported 0 of the session's 1 GPUs"),
])
def test_which_readings_cover_a_session(gpus, devices, count, missing):
    """A foreign GPU, a GPU listed twice or junk in the stored list never makes a partial reading look complete."""
    found = idle.gpus_unreported(gpus=gpus, devices=devices, count=count)
    assert (missing in found) if missing else found == ""



def test_the_dashboards_idle_sessions_ignore_connections_when_every_gpu_is_reported():
    """``idle_sessions`` (the dashboard, /metrics, the list's filter) follows the rule: a session polled by an open tab
    whose GPUs ran nothing for 20 minutes is idle; one reported for part of its GPUs is not."""
    from sessions.selectors import idle_sessions

    known = make_session()
    partial = make_session(devices=("GPU-a", "GPU-b"))
    at = T0 + 20 * MINUTE
    for session in (known, partial):
        report(session, at=at)
        connect(session, at - MINUTE)
    activity.connections_flush()
    assert set(idle_sessions(now=at).values_list("pk", flat=True)) == {known.pk}
