"""The idle policy (``sessions.idle``): warned, then stopped with reason ``idle``; busy, connected, unknown and exempt
sessions are not; the ledger's end entry says what the idle time cost."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditRecord
from billing.models import LedgerEntry, Policy, UsageSample
from billing.services import policy_set
from clusters.operator_token.tokens import operator_token_mint
from core.exceptions import ApplicationError
from sessions import activity, idle
from sessions.models import Session, SessionActivity
from tests.billing.conftest import fleet_cluster_row
from tests.factories import SessionFactory, UserFactory
from tests.helpers import device, iso, metered_session, sample

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def judge(**overrides):
    args = {"now": NOW, "started_at": NOW - 3 * HOUR, "last_kernel_at": None, "last_connected_at": None, "exempt_until": None,
            "unknown": "", "partial": "", "timeout": HOUR, "warning": timedelta(minutes=15)}
    return idle.idle_judge(**{**args, **overrides})


def test_judge_counts_from_the_latest_activity():
    assert judge().due and judge().idle_since == NOW - 3 * HOUR and judge().stops_at == NOW - 2 * HOUR
    busy = judge(last_kernel_at=NOW - timedelta(minutes=10))
    assert (busy.idle_since, busy.due) == (None, False)
    warned = judge(last_kernel_at=NOW - timedelta(minutes=50))
    assert warned.idle_since == NOW - timedelta(minutes=50) and warned.stops_at == NOW + timedelta(minutes=10) and not warned.due
    # With every GPU reported, a connection resets nothing: the clock runs from the last kernel.
    connected = judge(last_kernel_at=NOW - timedelta(minutes=50), last_connected_at=NOW - timedelta(minutes=20))
    assert connected.idle_since == NOW - timedelta(minutes=50) and connected.stops_at == NOW + timedelta(minutes=10)
    assert not connected.postponed and not connected.connections_count
    # While connections count (part of its GPUs unreported) the clock runs from the last connection as before.
    partial = "HAMi's vGPU monitor reported 1 of the session's 2 GPUs"
    assert judge(partial=partial, last_connected_at=NOW - timedelta(minutes=44)).idle_since is None
    assert judge(partial=partial, last_connected_at=NOW - timedelta(minutes=45)).idle_since == NOW - timedelta(minutes=45)


def test_judge_postpones_once_by_the_clipped_warning_and_never_with_no_warning():
    kernel = NOW - timedelta(minutes=61)  # the planned stop was a minute ago
    at_the_edge = judge(last_kernel_at=kernel, last_connected_at=kernel + timedelta(minutes=45))
    assert at_the_edge.postponed and at_the_edge.stops_at == kernel + timedelta(minutes=75) and not at_the_edge.due
    a_second_early = judge(last_kernel_at=kernel, last_connected_at=kernel + timedelta(minutes=45) - timedelta(seconds=1))
    assert not a_second_early.postponed and a_second_early.due
    no_warning = judge(last_kernel_at=kernel, last_connected_at=NOW, warning=timedelta(0))
    assert not no_warning.postponed and no_warning.stops_at == kernel + HOUR and no_warning.due
    clipped = judge(last_kernel_at=NOW - timedelta(minutes=11), last_connected_at=NOW, timeout=timedelta(minutes=10),
                    warning=HOUR)  # a warning longer than the timeout is clipped to it, the postponement too
    assert clipped.postponed and clipped.stops_at == NOW + timedelta(minutes=9)


def test_judge_never_idles_on_unknown_activity_a_zero_timeout_or_an_exemption():
    unknown = judge(unknown="the monitor of gpu-a timed out")
    assert (unknown.idle_since, unknown.due, unknown.unknown) == (None, False, "the monitor of gpu-a timed out")
    assert not judge(timeout=timedelta(0)).due
    assert not judge(exempt_until=NOW + timedelta(minutes=1)).due
    after = judge(exempt_until=NOW - timedelta(minutes=50))  # the clock restarts where the exemption ended
    assert after.idle_since == NOW - timedelta(minutes=50) and not after.due
    assert judge(warning=2 * HOUR, last_kernel_at=NOW - timedelta(minutes=1)).idle_since == NOW - timedelta(minutes=1)


@pytest.fixture
def lab_c1():
    return fleet_cluster_row("lab-c1")


def reading(session, *, kernel_at, at):
    SessionActivity.objects.update_or_create(session=session, defaults={
        "state": "ok", "sampled_at": at, "last_kernel_at": kernel_at,
        "gpus": [{"device_uuid": "GPU-a", "last_kernel_seconds": (at - kernel_at).total_seconds(), "utilization_percent": 0.0,
                  "memory_used_bytes": 0, "memory_limit_bytes": 1 << 30, "sampled_at": iso(at)}],
    })


@pytest.fixture
def sessions_at(django_user_model):
    def make(n=1, **fields):
        made = [SessionFactory(**fields) for _ in range(n)]
        Session.objects.filter(pk__in=[s.pk for s in made]).update(started_at=NOW - 3 * HOUR)
        return [Session.objects.get(pk=s.pk) for s in made]
    return make


def test_a_session_is_warned_then_stopped_and_its_end_entry_says_what_idle_cost(lab_c1, http_for, staff_token, settings):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 10**9  # the test's clock is fixed in the past
    h100 = device(lab_c1, "NVIDIA H100")
    session = metered_session(lab_c1, gpus=[h100])
    operator = http_for(operator_token_mint(cluster_id=lab_c1.public_id))
    kernel = NOW - timedelta(minutes=50)
    # Usage across the idle time: 60 s windows from 70 min before NOW, the first 20 before the last kernel.
    start = NOW - timedelta(minutes=70)
    samples = [sample(session, h100, start=start + timedelta(minutes=i), seconds=60) for i in range(70)]
    assert operator.post("/internal/v1/usage", json={"samples": samples}).status_code == 200
    reading(session, kernel_at=kernel, at=NOW - timedelta(seconds=20))

    result = idle.idle_enforce(now=NOW)
    assert result == {"checked": 1, "warned": 1, "stopped": 0}
    shown = http_for(staff_token).get(f"/api/v1/sessions/{session.public_id}").json()
    assert datetime.fromisoformat(shown["idle_since"]) == kernel
    assert datetime.fromisoformat(shown["stops_at"]) == kernel + HOUR
    assert shown["phase"] == "Running"

    later = kernel + HOUR + timedelta(seconds=1)
    assert idle.idle_enforce(now=later)["stopped"] == 1
    session.refresh_from_db()
    assert session.phase in ("Stopping", "Terminated") and session.stop_reason == "idle"
    assert "idle policy (the default policy (settings): 60 min without a GPU kernel)" in session.message
    assert kernel.strftime("%Y-%m-%d %H:%M:%S UTC") in session.message and "last connection: none" in session.message
    end = LedgerEntry.objects.get(session=session, kind="end")
    charged_per_second = sum(UsageSample.objects.filter(session=session).values_list("cost", flat=True)) / (70 * 60)
    assert end.amount == 0 and (end.window_start, end.window_end) == (kernel, later)
    # 50 of the 70 minutes of samples lie in the idle window (from the last kernel to NOW, where the samples end).
    expected = (charged_per_second * 50 * 60).quantize(Decimal("0.000001"))
    assert abs(end.idle_credits - expected) <= Decimal("0.000002"), (end.idle_credits, expected)
    assert f"Burned {end.idle_credits} credits while idle." in end.reason
    assert end.balance_after == session.owner.credit_account.balance
    from identity.tokens import api_token_create

    owner_http = http_for(api_token_create(username=session.owner.username)[1])
    listed = owner_http.get(f"/api/v1/billing/ledger?session={session.public_id}").json()["results"]
    shown_end = [e for e in listed if e["kind"] == "end"]
    assert len(shown_end) == 1 and shown_end[0]["idle_credits"] == format(end.idle_credits, "f") and shown_end[0]["amount"] == "0.000000"
    assert idle.idle_enforce(now=later + timedelta(minutes=1))["stopped"] == 0  # once
    assert LedgerEntry.objects.filter(session=session, kind="end").count() == 1
    stop = AuditRecord.objects.get(action="session_stop", object_id=session.public_id)
    assert stop.details["stop_reason"] == "idle"


def test_busy_unknown_and_stale_sessions_are_not_idle(sessions_at, settings):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 300
    busy, connected, unknown, stale, nothing = sessions_at(5)
    reading(busy, kernel_at=NOW - timedelta(minutes=1), at=NOW - timedelta(seconds=10))
    # GPU activity unknown (no reading), connected now and then: connections keep it, as the clock does not run.
    SessionActivity.objects.create(session=connected, last_connected_at=NOW - timedelta(minutes=3))
    SessionActivity.objects.create(session=unknown, state="unknown", reason="no vGPU monitor pod on node gpu-a", sampled_at=NOW)
    reading(stale, kernel_at=NOW - 2 * HOUR, at=NOW - timedelta(minutes=6))
    assert idle.idle_enforce(now=NOW) == {"checked": 5, "warned": 0, "stopped": 0}
    assert Session.objects.filter(phase="Running").count() == 5


def test_a_connection_not_yet_flushed_counts(sessions_at, settings):
    """Noted in Redis during the warning, not flushed yet: it postpones the stop (due a minute ago) all the same."""
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 10**9
    (session,) = sessions_at(1)
    reading(session, kernel_at=NOW - 61 * timedelta(minutes=1), at=NOW)
    activity._redis().delete(activity._hash_key())
    activity.forget_noted()
    activity.connection_note(session.public_id, now=NOW - timedelta(minutes=2))
    assert idle.idle_enforce(now=NOW)["stopped"] == 0
    activity._redis().delete(activity._hash_key())
    assert idle.idle_enforce(now=NOW)["stopped"] == 1


def test_the_users_own_policy_applies_and_zero_means_never(sessions_at, settings):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 10**9
    owner = UserFactory()
    (never,) = sessions_at(1, owner=owner)
    (strict,) = sessions_at(1)
    policy_set(user=owner, idle_timeout_minutes=0, idle_warning_minutes=0, min_balance_hours=Decimal(0))
    policy_set(user=None, idle_timeout_minutes=120, idle_warning_minutes=30, min_balance_hours=Decimal(0))
    for s in (never, strict):
        reading(s, kernel_at=NOW - timedelta(minutes=100), at=NOW)
    assert idle.idle_enforce(now=NOW) == {"checked": 2, "warned": 1, "stopped": 0}
    assert SessionActivity.objects.get(session=strict).stops_at == NOW + timedelta(minutes=20)
    assert SessionActivity.objects.get(session=never).stops_at is None


def test_becoming_busy_again_clears_the_warning(sessions_at, settings):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 10**9
    (session,) = sessions_at(1)
    reading(session, kernel_at=NOW - timedelta(minutes=50), at=NOW)
    idle.idle_enforce(now=NOW)
    assert SessionActivity.objects.get(session=session).idle_since is not None
    reading(session, kernel_at=NOW, at=NOW + timedelta(seconds=30))
    idle.idle_enforce(now=NOW + timedelta(seconds=30))
    row = SessionActivity.objects.get(session=session)
    assert (row.idle_since, row.stops_at) == (None, None)


def test_a_minute_of_the_policy_can_be_shortened(sessions_at, settings):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 10**9
    settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS = 1
    (session,) = sessions_at(1)
    reading(session, kernel_at=NOW - timedelta(seconds=50), at=NOW)
    idle.idle_enforce(now=NOW)
    assert SessionActivity.objects.get(session=session).stops_at == NOW + timedelta(seconds=10)
    assert idle.idle_enforce(now=NOW + timedelta(seconds=11))["stopped"] == 1
    session.refresh_from_db()
    assert "60 policy minutes of 1 s" in session.message


def test_enforcing_costs_a_constant_number_of_queries(sessions_at, settings):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 10**9
    counts = []
    for n in (1, 30):
        made = sessions_at(n)
        for s in made:
            reading(s, kernel_at=NOW - timedelta(minutes=50), at=NOW)
        with CaptureQueriesContext(connection) as queries:
            idle.idle_enforce(now=NOW)
        counts.append(len(queries))
    assert counts[0] == counts[1] <= 4, counts


def test_only_staff_who_manage_sessions_may_exempt_and_it_is_audited(sessions_at, http_for, staff_token, settings, django_user_model):
    settings.GSHARE_ACTIVITY_STALE_SECONDS = 10**9
    from identity.tokens import api_token_create

    (session,) = sessions_at(1)
    owner_http = http_for(api_token_create(username=session.owner.username)[1])
    until = iso(datetime.now(UTC) + timedelta(hours=8))
    refused = owner_http.post(f"/api/v1/sessions/{session.public_id}/idle-exemption", json={"until": until, "reason": "training"})
    assert refused.status_code == 403 and refused.json()["code"] == "idle_exemption_forbidden"
    staff = http_for(staff_token)
    answer = staff.post(f"/api/v1/sessions/{session.public_id}/idle-exemption", json={"until": until, "reason": "overnight training run"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["activity"]["exempt_reason"] == "overnight training run"
    record = AuditRecord.objects.get(action="session_idle_exempt", object_id=session.public_id)
    assert record.changes["exempt_reason"] == ["", "overnight training run"] or record.changes["exempt_reason"]["new"] == "overnight training run"
    reading(session, kernel_at=datetime.now(UTC) - 5 * HOUR, at=datetime.now(UTC))
    assert idle.idle_enforce()["stopped"] == 0
    assert staff.delete(f"/api/v1/sessions/{session.public_id}/idle-exemption").status_code == 200
    assert SessionActivity.objects.get(session=session).exempt_until <= datetime.now(UTC)  # ended now: the clock starts here


@pytest.mark.parametrize("body, code", [
    ({"until": "2020-01-01T00:00:00Z", "reason": "x"}, "invalid_exemption"),
    ({"until": "2999-01-01T00:00:00Z", "reason": "x"}, "invalid_exemption"),
    ({"until": "tomorrow", "reason": "x"}, "invalid_request"),
    ({"until": None, "reason": "x"}, "invalid_request"),
    ({"reason": "x"}, "invalid_request"),
    ({"until": "2026-12-02T00:00:00Z", "reason": ""}, "invalid_request"),
    ({"until": "2026-12-02T00:00:00Z", "reason": "x" * 501}, "invalid_request"),
])
def test_bad_exemptions_are_refused(sessions_at, http_for, staff_token, body, code):
    (session,) = sessions_at(1)
    answer = http_for(staff_token).post(f"/api/v1/sessions/{session.public_id}/idle-exemption", json=body)
    assert answer.status_code == 400 and answer.json()["code"] == code, answer.text
    assert not AuditRecord.objects.filter(action="session_idle_exempt").exists()


def test_an_ended_session_cannot_be_exempted(sessions_at, http_for, staff_token):
    (session,) = sessions_at(1, phase="Terminated")
    answer = http_for(staff_token).post(f"/api/v1/sessions/{session.public_id}/idle-exemption",
                                        json={"until": iso(datetime.now(UTC) + HOUR), "reason": "x"})
    assert answer.status_code == 409 and answer.json()["code"] == "session_not_live"


@pytest.mark.parametrize("timeout, warning", [(-1, 0), (10, 11), (525_601, 0), (True, 0)])
def test_policy_idle_fields_are_checked(timeout, warning):
    with pytest.raises(ApplicationError) as refused:
        policy_set(user=None, idle_timeout_minutes=timeout, idle_warning_minutes=warning)
    assert refused.value.code == "invalid_request"
    assert not Policy.objects.exists()
