"""Status reports from an operator whose clock is wrong: ahead beyond the tolerance refused (409 ``report_from_future``,
nothing applied), ahead within it ordered by the time it arrived, behind applied in its own order; and a session never
freezes after a clock is corrected. The control plane's time is passed to the service (``received_at``): no test here
depends on the wall clock."""

from datetime import UTC, datetime, timedelta

import pytest

from clusters.operator_token.tokens import operator_token_mint
from core.exceptions import ApplicationError
from sessions import lifecycle
from sessions.models import Session
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)  # the control plane's clock in these tests


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


@pytest.fixture
def session(django_user_model):
    owner = django_user_model.objects.create_user("carol")
    return Session.objects.create(owner=owner, cluster=ClusterFactory(), image="img", gpus=1, phase=Session.Phase.STARTING)


def apply(session, phase: str, observed: datetime, *, received: datetime, message: str = "") -> dict:
    report = {"session": session.public_id, "phase": phase, "observed_at": observed, "message": message}
    return lifecycle.session_status_apply(cluster=session.cluster, reports=[report], received_at=received)


def test_a_report_ten_minutes_ahead_is_refused_and_the_next_correct_one_is_applied(session):
    with pytest.raises(ApplicationError) as refused:
        apply(session, "Running", later(600), received=NOW, message="from a clock ten minutes ahead")
    body = refused.value.as_body()
    assert (refused.value.status, body["code"]) == (409, "report_from_future")
    assert body["ahead_seconds"] == 600 and body["server_time"] == NOW.isoformat()
    assert "NTP" in body["detail"] and "600 s" in body["detail"]
    session.refresh_from_db()
    assert (session.phase, session.last_status_at, session.message) == ("Starting", None, "")  # nothing applied
    # The operator's clock is corrected (or it re-stamps with the control plane's time): taken at once.
    assert apply(session, "Running", later(2), received=later(2.5), message="pulled")["applied"] == 1
    assert apply(session, "Succeeded", later(9), received=later(9.1), message="exit 0")["applied"] == 1
    session.refresh_from_db()
    assert session.phase == "Terminated" and session.message == "exit 0" and session.ended_at == later(9)


def test_a_report_ahead_within_the_tolerance_counts_as_received_and_does_not_freeze_the_session(session):
    # 20 s ahead (tolerance 30 s): applied, but dated when it arrived, not 20 s later.
    assert apply(session, "Running", later(20), received=NOW, message="ahead")["applied"] == 1
    session.refresh_from_db()
    assert session.last_status_at == NOW and session.started_at == NOW
    # The clock is fixed: the next honest report (observed 1 s later, 19 s before the skewed stamp) is applied.
    assert apply(session, "Running", later(1), received=later(1.2), message="honest")["applied"] == 1
    session.refresh_from_db()
    assert session.message == "honest" and session.last_status_at == later(1)
    # An older report delivered late is still ignored: ordering holds.
    assert apply(session, "Running", later(0.5), received=later(3), message="stale")["ignored"] == 1
    session.refresh_from_db()
    assert session.message == "honest"


def test_two_reports_of_one_session_ahead_in_one_batch_keep_their_order(session):
    reports = [{"session": session.public_id, "phase": "Succeeded", "observed_at": later(25), "message": "exit 0"},
               {"session": session.public_id, "phase": "Running", "observed_at": later(21), "message": "up"}]
    assert lifecycle.session_status_apply(cluster=session.cluster, reports=reports, received_at=NOW)["applied"] == 2
    session.refresh_from_db()
    assert session.phase == "Terminated" and session.message == "exit 0"
    assert session.started_at == NOW and session.ended_at == NOW + timedelta(microseconds=1)


def test_a_clock_behind_is_applied_in_its_own_order(session):
    """Ten minutes behind: its reports are in the past but ordered among themselves; a late, older one is ignored; when
    the clock is corrected (jumps forward) its reports are newer still. Times are the operator's as reported."""
    assert apply(session, "Running", later(-600), received=NOW)["applied"] == 1
    assert apply(session, "Running", later(-590), received=later(10), message="second")["applied"] == 1
    assert apply(session, "Running", later(-595), received=later(11), message="older")["ignored"] == 1
    session.refresh_from_db()
    assert session.message == "second" and session.started_at == later(-600)
    assert apply(session, "Succeeded", later(20), received=later(20), message="corrected")["applied"] == 1
    session.refresh_from_db()
    assert session.phase == "Terminated" and session.ended_at == later(20)


def test_the_tolerance_is_a_setting(session, settings):
    settings.GSHARE_CLOCK_SKEW_TOLERANCE = 5
    with pytest.raises(ApplicationError) as refused:
        apply(session, "Running", later(6), received=NOW)
    assert refused.value.code == "report_from_future" and "5 s tolerance" in refused.value.detail
    assert apply(session, "Running", later(5), received=NOW)["applied"] == 1


def test_a_refused_batch_applies_none_of_its_reports(session, django_user_model):
    other = Session.objects.create(owner=session.owner, cluster=session.cluster, image="img", gpus=1,
                                   phase=Session.Phase.STARTING)
    reports = [{"session": other.public_id, "phase": "Running", "observed_at": NOW},
               {"session": session.public_id, "phase": "Running", "observed_at": later(31)}]
    with pytest.raises(ApplicationError):
        lifecycle.session_status_apply(cluster=session.cluster, reports=reports, received_at=NOW)
    other.refresh_from_db()
    assert other.phase == "Starting" and other.last_status_at is None


def test_over_http_the_refusal_is_409_json_with_the_control_planes_time(http_for, session):
    operator = http_for(operator_token_mint(cluster_id=session.cluster.public_id))
    far = "9999-12-31T23:59:59.999999Z"  # a valid time; the year 9999 must neither 500 nor freeze the session
    response = operator.post("/internal/v1/status", json={"reports": [
        {"session": session.public_id, "phase": "Running", "observed_at": far}]})
    assert response.status_code == 409, response.text
    body = response.json()
    assert body["code"] == "report_from_future" and body["ahead_seconds"] > 200 * 365 * 86400
    served = datetime.fromisoformat(body["server_time"])
    assert served.tzinfo is not None
    honest = operator.post("/internal/v1/status", json={"reports": [
        {"session": session.public_id, "phase": "Running", "observed_at": served.isoformat()}]})
    assert honest.status_code == 200 and honest.json()["applied"] == 1


def test_a_foreign_session_is_refused_as_foreign_before_its_time_is_judged(http_for, session):
    stranger = http_for(operator_token_mint(cluster_id=ClusterFactory().public_id))
    response = stranger.post("/internal/v1/status", json={"reports": [
        {"session": session.public_id, "phase": "Running", "observed_at": "9999-12-31T23:59:59Z"}]})
    assert response.status_code == 403 and response.json()["code"] == "forbidden_cluster_scope"
