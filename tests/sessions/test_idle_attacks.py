"""Attacks on the idle policy and ``/api/v1/sessions/{id}/idle-exemption``: who may exempt, hostile ids and bodies,
a report or an exemption racing a stop, runs racing each other and the owner's stop, Redis going away. A wrong
stop, two end entries, a half-applied exemption or a 500 is a failure."""

import socket
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connections

from audit.models import AuditRecord
from billing.models import LedgerEntry
from clusters.operator_token.tokens import operator_token_mint
from identity.tokens import api_token_create
from sessions import activity, idle
from sessions.models import Session, SessionActivity
from tests.factories import ClusterFactory, SessionFactory, UserFactory
from tests.helpers import iso, lock_waiters, run_threads, wait_for
from tests.sessions.test_activity import entry, gpu

pytestmark = pytest.mark.django_db
HOUR = timedelta(hours=1)


def exemption_path(session) -> str:
    return f"/api/v1/sessions/{session.public_id}/idle-exemption"


def exemption_body(hours=8):
    return {"until": iso(datetime.now(UTC) + timedelta(hours=hours)), "reason": "overnight training run"}


def idle_for(session, *, minutes):
    """Give ``session`` a fresh reading whose last kernel ran ``minutes`` ago, and a start long before."""
    now = datetime.now(UTC)
    Session.objects.filter(pk=session.pk).update(started_at=now - 5 * HOUR)
    SessionActivity.objects.update_or_create(session=session, defaults={
        "state": "ok", "reason": "", "sampled_at": now, "last_kernel_at": now - timedelta(minutes=minutes),
        "gpus": [{"device_uuid": "GPU-a", "last_kernel_seconds": minutes * 60.0, "utilization_percent": 0.0,
                  "memory_used_bytes": 0, "memory_limit_bytes": 1 << 30, "sampled_at": iso(now)}],
    })


@pytest.fixture(autouse=True)
def _no_pending_connections():
    activity._redis().delete(activity._hash_key())
    activity.forget_noted()


# --- who may exempt ------------------------------------------------------------------------------------------------


def test_only_active_staff_holding_change_session_may_exempt(http_for, staff_token):
    session = SessionFactory()
    owner_token = api_token_create(username=session.owner.username)[1]
    bare_staff = UserFactory(is_staff=True)
    holder = UserFactory(is_staff=True)
    holder.user_permissions.add(Permission.objects.get(codename="change_session", content_type__app_label="gpu_sessions"))
    holder_token = api_token_create(username=holder.username)[1]
    bare_token = api_token_create(username=bare_staff.username)[1]
    for token, method in [(owner_token, "post"), (owner_token, "delete"), (bare_token, "post"), (bare_token, "delete")]:
        answer = getattr(http_for(token), method)(exemption_path(session), json=exemption_body())
        assert answer.status_code == 403 and answer.json()["code"] == "idle_exemption_forbidden", (method, answer.text)
    assert http_for(holder_token).post(exemption_path(session), json=exemption_body()).status_code == 200
    type(holder).objects.filter(pk=holder.pk).update(is_active=False)
    gone = http_for(holder_token).delete(exemption_path(session))
    assert gone.status_code == 401, gone.text
    assert SessionActivity.objects.get(session=session).exempt_until > datetime.now(UTC)
    assert AuditRecord.objects.filter(action="session_idle_exempt").count() == 1


@pytest.mark.parametrize("raw", [
    "ses_abc%2F..%2F..%2Fclusters", "ses_abc%2Fidle-exemption", "ses_%C3%A9t%C3%A9", "ses_%F0%9F%92%A5", "ses_%ED%A0%80",
    "%20ses_abc", "ses_" + "a" * 5000, "ses_abc%00", "..", "%2E%2E", "ses_abc%0Aidle",
])
def test_hostile_session_ids_are_404_or_400_never_500(http_for, staff_token, raw):
    answer = http_for(staff_token).post(f"/api/v1/sessions/{raw}/idle-exemption", json=exemption_body())
    assert answer.status_code in (400, 404), (raw, answer.status_code, answer.text[:200])
    assert not AuditRecord.objects.filter(action="session_idle_exempt").exists()


def test_another_users_session_is_not_found_for_a_researcher(http_for):
    mine, theirs = SessionFactory(), SessionFactory()
    token = api_token_create(username=mine.owner.username)[1]
    answer = http_for(token).delete(exemption_path(theirs))
    assert answer.status_code == 404 and answer.json()["code"] == "session_not_found"


@pytest.mark.parametrize("body", [
    {"until": "9999-12-31T23:59:59-23:59", "reason": "x"},
    {"until": "0001-01-01T00:00:00+14:00", "reason": "x"},
    {"until": "2026-12-02T10:00:00+99:00", "reason": "x"},
    {"until": ["2026-12-02T10:00:00Z"], "reason": "x"},
    {"until": "2026-12-02T10:00:00Z", "reason": "monitor\x00"},
    {"until": "2026-12-02T10:00:00Z", "reason": {"$gt": ""}},
])
def test_hostile_exemption_bodies_are_400(http_for, staff_token, body):
    session = SessionFactory()
    answer = http_for(staff_token).post(exemption_path(session), json=body)
    assert answer.status_code == 400, answer.text[:300]
    assert not SessionActivity.objects.filter(session=session, exempt_until__isnull=False).exists()


@pytest.mark.parametrize("until, reason", [("soon", '"training \\ud800 run"'), ("1e309", '"x"'), ("NaN", '"x"'),
                                           ("Infinity", '"x"')])
def test_a_lone_surrogate_or_a_non_finite_number_is_a_400(http_for, staff_token, until, reason):
    session = SessionFactory()
    until = f'"{iso(datetime.now(UTC) + HOUR)}"' if until == "soon" else until
    text = f'{{"until": {until}, "reason": {reason}}}'  # raw JSON: requests refuses to write these
    answer = http_for(staff_token).post(exemption_path(session), data=text, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text[:300]
    assert not AuditRecord.objects.filter(action="session_idle_exempt").exists()


def test_no_secret_reaches_the_exemption_audit_row(http_for, staff_token):
    session = SessionFactory()
    http_for(staff_token).post(exemption_path(session), json=exemption_body())
    record = AuditRecord.objects.get(action="session_idle_exempt")
    assert staff_token not in str(record.changes) + str(record.details) + record.actor
    assert staff_token.split(".")[-1] not in str(record.changes) + str(record.details)


# --- ending an exemption -------------------------------------------------------------------------------------------


def test_ending_an_exemption_early_restarts_the_clock_instead_of_stopping_at_once(http_for, staff_token, settings):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 10**9  # the last step judges an hour ahead
    session = SessionFactory()
    idle_for(session, minutes=240)
    staff = http_for(staff_token)
    assert staff.post(exemption_path(session), json=exemption_body()).status_code == 200
    assert idle.idle_enforce()["stopped"] == 0
    ended = staff.delete(exemption_path(session))
    assert ended.status_code == 200
    assert idle.idle_enforce()["stopped"] == 0, "a session whose exemption just ended has its whole timeout again"
    session.refresh_from_db()
    assert session.phase == "Running"
    row = SessionActivity.objects.get(session=session)
    assert row.exempt_until <= datetime.now(UTC) and row.exempt_reason == ""
    assert idle.idle_enforce(now=row.exempt_until + HOUR + timedelta(seconds=1))["stopped"] == 1
    assert LedgerEntry.objects.filter(session=session, kind="end").count() == 1


# --- races with a stop ---------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("news", ["kernel", "connection"])
def test_activity_arriving_while_a_stop_waits_for_its_lock_keeps_the_session(http_for, live_server, news):
    """The run judges the session due, then waits for the session's row (held here); meanwhile the operator reports
    a kernel that ran just now, or a connection during the warning is noted and flushed (which starts no policy run of
    its own, and postpones the stop once). Once the lock is released the run must not stop the session."""
    cluster = ClusterFactory()
    session = SessionFactory(cluster=cluster, gpus=1, devices=["GPU-a"])
    idle_for(session, minutes=240 if news == "kernel" else 61)  # a minute past its stop, within the postponement
    operator = http_for(operator_token_mint(cluster_id=cluster.public_id))
    results = []
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SELECT id FROM gpu_sessions_session WHERE id = %s FOR UPDATE", [session.pk])

        def enforce():
            try:
                results.append(idle.idle_enforce())
            finally:
                connections["default"].close()

        import threading

        runner = threading.Thread(target=enforce, daemon=True)
        runner.start()
        with holder.cursor() as cursor:
            wait_for(lambda: lock_waiters(cursor) >= 1, timeout=20, what="the run waiting on the session's lock")
        now = datetime.now(UTC)
        if news == "kernel":
            body = {"sessions": [entry(session, at=now, gpus=[gpu("GPU-a", kernel=0.0, at=now)])]}
            answer = operator.post("/internal/v1/activity", json=body)
            assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
        else:
            activity.connection_note(session.public_id, now=now)
            assert activity.connections_flush() == 1
        holder.rollback()
        runner.join(30)
        assert not runner.is_alive()
    finally:
        holder.close()
    assert results and results[0]["stopped"] == 0, results
    session.refresh_from_db()
    assert session.phase == "Running" and session.stop_reason == ""
    assert not LedgerEntry.objects.filter(session=session, kind="end").exists()


@pytest.mark.django_db(transaction=True)
def test_runs_an_exemption_and_the_owners_stop_racing_leave_one_end_entry_and_no_stop_while_exempt(http_for, live_server, staff_user):
    staff_token = api_token_create(username=staff_user.username)[1]
    for _round in range(4):
        session = SessionFactory(gpus=1, devices=["GPU-a"])
        idle_for(session, minutes=240)
        owner_token = api_token_create(username=session.owner.username)[1]
        answers, errors = {}, []

        def act(kind, session=session, owner_token=owner_token, answers=answers, errors=errors):
            try:
                if kind.startswith("enforce"):
                    answers[kind] = idle.idle_enforce()
                elif kind == "exempt":
                    answers[kind] = http_for(staff_token).post(exemption_path(session), json=exemption_body()).status_code
                else:
                    answers[kind] = http_for(owner_token).delete(f"/api/v1/sessions/{session.public_id}").status_code
            except Exception as exc:
                errors.append(repr(exc))
            finally:
                connections["default"].close()

        run_threads(act, [("enforce-1",), ("exempt",), ("enforce-2",), ("delete",)])
        assert not errors, errors
        assert answers["delete"] == 202 and answers["exempt"] in (200, 409), answers
        session.refresh_from_db()
        ends = LedgerEntry.objects.filter(session=session, kind="end").count()
        assert ends == (1 if session.stop_reason == "idle" else 0), (session.stop_reason, ends)
        assert answers["enforce-1"]["stopped"] + answers["enforce-2"]["stopped"] == ends
        stops = list(AuditRecord.objects.filter(action="session_stop", object_id=session.public_id).order_by("pk"))
        assert len(stops) == 1, "one stop, by whoever came first"
        exempt = AuditRecord.objects.filter(action="session_idle_exempt", object_id=session.public_id).first()
        if exempt is not None and exempt.pk < stops[0].pk:
            assert session.stop_reason == "requested", "stopped by the idle policy after an exemption was granted"


# --- Redis going away during a run ---------------------------------------------------------------------------------


@pytest.fixture
def closed_port() -> str:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    host_port = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()
    return host_port


def test_while_redis_is_down_nobody_is_stopped_but_warnings_still_show(settings, closed_port, http_for, staff_token):
    """Verify cannot note connections while Redis is down: an unconnected-looking session may be in use."""
    due, warned = SessionFactory(), SessionFactory()
    idle_for(due, minutes=240)
    idle_for(warned, minutes=50)
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://{closed_port}/0"}}
    assert idle.idle_enforce() == {"checked": 2, "warned": 2, "stopped": 0}
    assert Session.objects.filter(phase="Running").count() == 2
    assert SessionActivity.objects.get(session=warned).stops_at is not None
    shown = http_for(staff_token).get(f"/api/v1/sessions/{due.public_id}")
    assert shown.status_code == 200 and shown.json()["stops_at"] is not None
