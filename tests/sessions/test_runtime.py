"""The session time limit (``sessions.runtime``): ``runtime_hours`` and ``ends_at`` at creation, the warning before the
end, the stop at ``ends_at`` with ``stop_reason`` ``time_limit``, extensions by the owner and by staff, and hostile
input (always 400 with a code, never a 500, never a half-created session). On a frozen clock."""

import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.contrib.auth.models import Permission
from django.db import connection, connections, transaction

from audit.models import AuditRecord
from billing import admission
from billing.services import policy_set
from core.exceptions import ApplicationError
from identity.tokens import api_token_create
from sessions import create, placement, runtime
from sessions.lifecycle import outbox
from sessions.models import Session
from sessions.tasks import runtime_enforce_task
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, UserFactory
from tests.helpers import lock_waiters

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
IMAGE = "quay.io/jupyter/base-notebook"


@pytest.fixture(autouse=True)
def frozen():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


@pytest.fixture(autouse=True)
def no_cluster_calls(monkeypatch):
    """The factory cluster's apiserver is never dialled: applies and deletes are not published (sessions stay Scheduled,
    or Stopping once stopped)."""
    monkeypatch.setattr(outbox, "publish_after_commit", lambda *args, **kwargs: None)


@pytest.fixture(autouse=True)
def fleet():
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster)
    for i in range(4):
        GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=16000, cores=100)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster


@pytest.fixture
def alice(plain_user):
    policy_set(user=plain_user, min_balance_hours=Decimal(0), max_runtime_hours=Decimal(24), runtime_warning_minutes=15)
    return plain_user


@pytest.fixture
def alice_http(http_for, alice):
    return http_for(api_token_create(username=alice.username)[1])


def start(http, **body):
    return http.post("/api/v1/sessions", json={"image": IMAGE, "gpus": 1, **body})


# --------------------------------------------------------------------------- the policy's fields


def test_policy_defaults_and_settings_fallback(settings):
    user = UserFactory()
    assert admission.policy_for(user).max_runtime_hours == Decimal(24) and admission.policy_for(user).runtime_warning_minutes == 15
    settings.GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS = "0.5"
    assert admission.policy_for(user).max_runtime_hours == Decimal("0.5")
    policy = policy_set(user=None)
    assert (policy.max_runtime_hours, policy.runtime_warning_minutes) == (Decimal(24), 15)
    policy_set(user=user, max_runtime_hours=Decimal("1.25"), runtime_warning_minutes=5)
    assert (admission.policy_for(user).max_runtime_hours, admission.policy_for(user).runtime_warning_minutes) == (Decimal("1.25"), 5)
    policy_set(user=user, max_runtime_hours=0)
    assert admission.policy_for(user).max_runtime_hours == 0


@pytest.mark.parametrize("hours", [Decimal(-1), Decimal("NaN"), Decimal("Infinity"), Decimal("1.234"), Decimal(8761), 10**9, True,
                                   1.5, "2", None])
def test_policy_refuses_hostile_max_runtime_hours(hours):
    with pytest.raises(ApplicationError) as refused:
        policy_set(user=UserFactory(), max_runtime_hours=hours)
    assert refused.value.code == "invalid_request" and "max_runtime_hours" in refused.value.detail


@pytest.mark.parametrize("minutes", [-1, 525_601, True, 1.5, "15", None])
def test_policy_refuses_hostile_runtime_warning_minutes(minutes):
    with pytest.raises(ApplicationError) as refused:
        policy_set(user=UserFactory(), runtime_warning_minutes=minutes)
    assert refused.value.code == "invalid_request" and "runtime_warning_minutes" in refused.value.detail


def test_policy_change_is_audited_with_the_new_fields():
    user = UserFactory()
    policy_set(user=user)
    policy_set(user=user, max_runtime_hours=Decimal(8))
    record = AuditRecord.objects.filter(action="policy_update").latest("pk")
    assert "max_runtime_hours" in record.changes


# --------------------------------------------------------------------------- creation


def test_omitted_runtime_hours_is_the_policys_maximum_from_the_reservation(alice_http):
    response = start(alice_http)
    assert response.status_code == 201, response.text
    body = response.json()
    assert datetime.fromisoformat(body["ends_at"]) == NOW + 24 * HOUR and body["ends_soon"] is False
    session = Session.objects.get(public_id=body["id"])
    assert session.ends_at - session.created_at == 24 * HOUR


@pytest.mark.parametrize(("asked", "expected"), [(2, 2 * HOUR), ("1.5", 90 * timedelta(minutes=1)), (0.25, 15 * timedelta(minutes=1)),
                                                  ("24", 24 * HOUR), ("0.01", timedelta(seconds=36)), (" 3 ", 3 * HOUR)])
def test_runtime_hours_sets_ends_at(alice_http, asked, expected):
    response = start(alice_http, runtime_hours=asked)
    assert response.status_code == 201, response.text
    assert datetime.fromisoformat(response.json()["ends_at"]) == NOW + expected


@pytest.mark.parametrize("asked", [24.01, "25", 8760, "8760.00"])
def test_over_the_policys_maximum_is_refused_naming_the_limit(alice_http, asked):
    response = start(alice_http, runtime_hours=asked)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "runtime_over_limit" and body["max_runtime_hours"] == "24.00" and "max_runtime_hours" in body["detail"]
    assert Session.objects.count() == 0


@pytest.mark.parametrize("asked", [0, -1, "-0.5", "NaN", "nan", "Infinity", "-Infinity", "inf", "1e400", 1e308, "1.234", 1.005, "abc", "",
                                   True, False, [1], {"hours": 1}, "0x10", "1_0", "٣", "1" * 40, "0.001"])
def test_hostile_runtime_hours_are_400_and_create_nothing(alice_http, asked):
    response = start(alice_http, runtime_hours=asked)
    assert response.status_code == 400, (asked, response.text)
    assert response.json()["code"] == "invalid_request" and "runtime_hours" in response.json()["detail"]
    assert Session.objects.count() == 0


def test_nan_as_a_json_literal_is_refused(alice_http):
    response = alice_http.post("/api/v1/sessions", data=f'{{"image": "{IMAGE}", "runtime_hours": NaN}}',
                               headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and Session.objects.count() == 0


def test_an_unlimited_policy_leaves_ends_at_empty_unless_asked(alice_http, alice):
    policy_set(user=alice, min_balance_hours=Decimal(0), max_runtime_hours=0)
    unlimited = start(alice_http).json()
    assert unlimited["ends_at"] is None and unlimited["ends_soon"] is False
    asked = start(alice_http, runtime_hours=1000)
    assert asked.status_code == 201 and datetime.fromisoformat(asked.json()["ends_at"]) == NOW + 1000 * HOUR


def test_the_service_applies_the_same_rules(alice):
    session = create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=Decimal("0.5"))
    assert session.ends_at == NOW + HOUR / 2
    with pytest.raises(runtime.RuntimeOverLimit):
        create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=30)
    assert Session.objects.count() == 1


def test_an_idempotent_retry_must_ask_the_same_hours(alice_http):
    first = alice_http.post("/api/v1/sessions", json={"image": IMAGE, "runtime_hours": 2}, headers={"Idempotency-Key": "k1"})
    again = alice_http.post("/api/v1/sessions", json={"image": IMAGE, "runtime_hours": 2}, headers={"Idempotency-Key": "k1"})
    other = alice_http.post("/api/v1/sessions", json={"image": IMAGE, "runtime_hours": 3}, headers={"Idempotency-Key": "k1"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert again.json()["id"] == first.json()["id"] and other.json()["code"] == "idempotency_key_reused"
    written_otherwise = alice_http.post("/api/v1/sessions", json={"image": IMAGE, "runtime_hours": "2.00"}, headers={"Idempotency-Key": "k1"})
    assert written_otherwise.status_code == 200 and written_otherwise.json()["id"] == first.json()["id"]


# --------------------------------------------------------------------------- the warning and the stop


def test_warned_then_stopped_at_ends_at(alice_http, frozen):
    body = start(alice_http, runtime_hours=1).json()
    session_id, ends_at = body["id"], NOW + HOUR
    Session.objects.filter(public_id=session_id).update(phase="Running", started_at=NOW + timedelta(minutes=5))

    frozen.move_to(ends_at - timedelta(minutes=15, seconds=1))
    assert alice_http.get(f"/api/v1/sessions/{session_id}").json()["ends_soon"] is False
    frozen.move_to(ends_at - timedelta(minutes=15))
    assert alice_http.get(f"/api/v1/sessions/{session_id}").json()["ends_soon"] is True
    assert alice_http.get("/api/v1/sessions").json()["results"][0]["ends_soon"] is True

    frozen.move_to(ends_at - timedelta(seconds=1))
    assert runtime_enforce_task() == {"due": 0, "stopped": 0}
    frozen.move_to(ends_at)
    assert runtime_enforce_task() == {"due": 1, "stopped": 1}
    session = Session.objects.get(public_id=session_id)
    assert session.phase == "Stopping" and session.stop_reason == "time_limit"
    assert "time limit" in session.message and "1.00 hours" in session.message
    stop = AuditRecord.objects.get(action="session_stop", object_id=session_id)
    assert stop.details["stop_reason"] == "time_limit"
    shown = alice_http.get(f"/api/v1/sessions/{session_id}").json()
    assert shown["stop_reason"] == "time_limit" and shown["ends_soon"] is False
    assert runtime_enforce_task() == {"due": 0, "stopped": 0}  # once


def test_sessions_not_yet_running_are_stopped_too_and_unlimited_ones_never(alice, frozen):
    pending = create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=1)  # Scheduled: it holds its GPUs
    policy_set(user=alice, min_balance_hours=Decimal(0), max_runtime_hours=0)
    forever = create.session_create(owner=alice, image=IMAGE, gpus=1)
    frozen.move_to(NOW + 10_000 * HOUR)
    assert runtime.runtime_enforce() == {"due": 1, "stopped": 1}
    pending.refresh_from_db()
    forever.refresh_from_db()
    assert pending.stop_reason == "time_limit" and forever.phase == "Scheduled" and forever.ends_at is None


def test_the_warning_follows_the_owners_policy(alice, frozen):
    session = create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=2)
    policy = admission.policy_for(alice)
    frozen.move_to(NOW + HOUR + timedelta(minutes=44))
    assert not runtime.runtime_warning(session=session, policy=policy, now=NOW + HOUR + timedelta(minutes=44))
    assert runtime.runtime_warning(session=session, policy=policy, now=NOW + HOUR + timedelta(minutes=45))
    policy_set(user=alice, min_balance_hours=Decimal(0), runtime_warning_minutes=0)
    assert not runtime.runtime_warning(session=session, policy=admission.policy_for(alice), now=NOW + HOUR + timedelta(minutes=59))
    assert runtime.runtime_warning(session=session, policy=admission.policy_for(alice), now=NOW + 2 * HOUR)


# --------------------------------------------------------------------------- extending


def test_the_owner_extends_within_the_policys_maximum(alice_http, frozen):
    session_id = start(alice_http, runtime_hours=10).json()["id"]
    frozen.move_to(NOW + 9 * HOUR)
    response = alice_http.post(f"/api/v1/sessions/{session_id}/extend", json={"hours": "13.5"})
    assert response.status_code == 200, response.text
    assert datetime.fromisoformat(response.json()["ends_at"]) == NOW + 23.5 * HOUR
    over = alice_http.post(f"/api/v1/sessions/{session_id}/extend", json={"hours": 0.51})
    assert over.status_code == 400 and over.json()["code"] == "runtime_over_limit"
    assert "at most 0.50 hours" in over.json()["detail"]
    assert alice_http.post(f"/api/v1/sessions/{session_id}/extend", json={"hours": 0.5}).status_code == 200
    assert Session.objects.get(public_id=session_id).ends_at == NOW + 24 * HOUR
    records = AuditRecord.objects.filter(action="session_extend", object_id=session_id).order_by("pk")
    assert [r.details["hours"] for r in records] == ["13.5", "0.5"] and records[0].details["by_staff"] is False


def test_an_extension_keeps_the_session_past_its_old_end(alice_http, frozen):
    session_id = start(alice_http, runtime_hours=1).json()["id"]
    alice_http.post(f"/api/v1/sessions/{session_id}/extend", json={"hours": 1})
    frozen.move_to(NOW + HOUR)
    assert runtime.runtime_enforce()["stopped"] == 0
    frozen.move_to(NOW + 2 * HOUR)
    assert runtime.runtime_enforce()["stopped"] == 1


def test_staff_extend_any_session_past_the_policy_and_it_is_audited(alice_http, http_for, staff_token):
    session_id = start(alice_http, runtime_hours=24).json()["id"]
    response = http_for(staff_token).post(f"/api/v1/sessions/{session_id}/extend", json={"hours": 100})
    assert response.status_code == 200, response.text
    assert datetime.fromisoformat(response.json()["ends_at"]) == NOW + 124 * HOUR
    record = AuditRecord.objects.get(action="session_extend", object_id=session_id)
    assert record.actor.endswith("admin") and record.details["by_staff"] is True and record.details["owner"] == "alice"


def test_staff_without_the_sessions_permission_extend_only_their_own(alice_http, http_for, django_user_model):
    session_id = start(alice_http).json()["id"]
    helpdesk = django_user_model.objects.create_user("helpdesk", is_staff=True)
    helpdesk_http = http_for(api_token_create(username="helpdesk")[1])
    refused = helpdesk_http.post(f"/api/v1/sessions/{session_id}/extend", json={"hours": 1})
    assert refused.status_code == 403 and refused.json()["code"] == "extend_forbidden"
    helpdesk.user_permissions.add(Permission.objects.get(codename="change_session", content_type__app_label="gpu_sessions"))
    assert http_for(api_token_create(username="helpdesk")[1]).post(
        f"/api/v1/sessions/{session_id}/extend", json={"hours": 1}).status_code == 200


def test_another_user_cannot_see_nor_extend(alice_http, http_for):
    session_id = start(alice_http).json()["id"]
    UserFactory(username="mallory")
    mallory = http_for(api_token_create(username="mallory")[1])
    response = mallory.post(f"/api/v1/sessions/{session_id}/extend", json={"hours": 1})
    assert response.status_code == 404 and response.json()["code"] == "session_not_found"
    assert not AuditRecord.objects.filter(action="session_extend").exists()


def test_an_ended_or_unlimited_session_has_nothing_to_extend(alice_http, alice):
    ended = start(alice_http).json()["id"]
    alice_http.delete(f"/api/v1/sessions/{ended}")
    response = alice_http.post(f"/api/v1/sessions/{ended}/extend", json={"hours": 1})
    assert response.status_code == 409 and response.json()["code"] == "session_not_live"
    policy_set(user=alice, min_balance_hours=Decimal(0), max_runtime_hours=0)
    unlimited = start(alice_http).json()["id"]
    response = alice_http.post(f"/api/v1/sessions/{unlimited}/extend", json={"hours": 1})
    assert response.status_code == 409 and response.json()["code"] == "no_time_limit"


@pytest.mark.parametrize("body", [{}, {"hours": None}, {"hours": 0}, {"hours": -3}, {"hours": "NaN"}, {"hours": "Infinity"},
                                  {"hours": "1e400"}, {"hours": 1e308}, {"hours": 8761}, {"hours": "1.001"}, {"hours": True},
                                  {"hours": [1]}, {"hours": {"a": 1}}, {"hours": "one"}, {"hours": "9" * 100}])
def test_hostile_extensions_are_400(alice_http, http_for, staff_token, body):
    session_id = start(alice_http).json()["id"]
    for http in (alice_http, http_for(staff_token)):
        response = http.post(f"/api/v1/sessions/{session_id}/extend", json=body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["code"] == "invalid_request"
    assert Session.objects.get(public_id=session_id).ends_at == NOW + 24 * HOUR
    assert not AuditRecord.objects.filter(action="session_extend").exists()


@pytest.mark.django_db(transaction=True)
def test_an_extension_that_lands_while_the_stop_waits_for_the_row_wins(alice, frozen):
    """The stop found the session due, then waited for its row lock held by an extension: judged again under the lock,
    the session is kept."""
    session = create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=1)
    frozen.move_to(NOW + HOUR)
    results = []

    def enforce():
        try:
            results.append(runtime.runtime_enforce())
        finally:
            connections.close_all()

    with transaction.atomic():
        Session.objects.select_for_update().get(pk=session.pk)
        stopper = threading.Thread(target=enforce, daemon=True)
        stopper.start()
        with connection.cursor() as cursor:
            for _ in range(200):
                if lock_waiters(cursor):
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the stop never waited for the session's row")
        runtime.session_extend(session=session, user=alice, hours=1)
    stopper.join(30)
    assert results == [{"due": 1, "stopped": 0}]
    session.refresh_from_db()
    assert session.phase == "Scheduled" and session.stop_reason == "" and session.ends_at == NOW + 2 * HOUR
