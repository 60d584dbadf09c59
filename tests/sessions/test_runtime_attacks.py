"""Attacks on the session time limit (``sessions.runtime``) that hold: repeated extensions never take the owner past
the policy, a policy lowered after creation leaves nothing to extend, hostile ``hours``/``runtime_hours`` spellings
are 400 (never a 500, never half applied), every live phase but Stopping is stopped at ``ends_at``, and the GPUs of a
time-limit stop are billed as held until their release. On a frozen clock."""

import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.db import connection, connections, transaction

from audit.models import AuditRecord
from billing.models import HeldGpu
from billing.services import policy_set
from identity.tokens import api_token_create
from sessions import create, placement, runtime
from sessions.lifecycle import end, outbox
from sessions.models import Session
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory
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


def extend(http, session_id, hours):
    return http.post(f"/api/v1/sessions/{session_id}/extend", json={"hours": hours})


def test_many_small_extensions_never_pass_the_policy(alice_http, frozen):
    session_id = start(alice_http, runtime_hours=1).json()["id"]
    for _ in range(23):
        frozen.shift(HOUR - timedelta(seconds=1))
        assert extend(alice_http, session_id, 1).status_code == 200
    refused = extend(alice_http, session_id, "0.01")
    assert refused.status_code == 400 and refused.json()["code"] == "runtime_over_limit" and "at most 0.00 hours" in refused.json()["detail"]
    assert Session.objects.get(public_id=session_id).ends_at == NOW + 24 * HOUR
    assert AuditRecord.objects.filter(action="session_extend", object_id=session_id).count() == 23


def test_a_policy_lowered_after_creation_leaves_nothing_to_extend(alice_http, alice):
    session_id = start(alice_http, runtime_hours=10).json()["id"]
    policy_set(user=alice, min_balance_hours=Decimal(0), max_runtime_hours=Decimal(4))
    refused = extend(alice_http, session_id, "0.01")
    assert refused.status_code == 400 and refused.json()["code"] == "runtime_over_limit" and "at most 0.00 hours" in refused.json()["detail"]
    assert Session.objects.get(public_id=session_id).ends_at == NOW + 10 * HOUR
    assert not AuditRecord.objects.filter(action="session_extend").exists()


def test_an_extension_after_ends_at_before_the_stop_stays_within_the_policy(alice_http, frozen):
    """The beat task has not run yet: the owner may still extend, but only up to the policy's maximum from the
    reservation, so the GPUs are never held longer than the policy allows."""
    session_id = start(alice_http, runtime_hours=2).json()["id"]
    frozen.move_to(NOW + 3 * HOUR)
    assert extend(alice_http, session_id, 22.01).json()["code"] == "runtime_over_limit"
    assert extend(alice_http, session_id, 22).status_code == 200
    frozen.move_to(NOW + 24 * HOUR)
    assert runtime.runtime_enforce() == {"due": 1, "stopped": 1}


@pytest.mark.parametrize(("asked", "expected"), [("1E1", 10 * HOUR), ("+1", HOUR), ("1e-2", timedelta(seconds=36)),
                                                  ("100e-2", HOUR), ("\t2\n", 2 * HOUR)])
def test_odd_but_valid_spellings(alice_http, asked, expected):
    response = start(alice_http, runtime_hours=asked)
    assert response.status_code == 201, response.text
    assert Session.objects.get().ends_at == NOW + expected


@pytest.mark.parametrize("asked", ["-0", "0e5", "0.00", "-0.0", "1e999999999", "1e-999999999", "１", "1 2", "1e", ".5", "5.",
                                   "1,5", "2h", 1e-7, -0.0, "\u00a0"])
def test_more_hostile_spellings_are_400_for_create_and_extend(alice_http, http_for, staff_token, asked):
    response = start(alice_http, runtime_hours=asked)
    assert response.status_code == 400 and response.json()["code"] == "invalid_request", (asked, response.text)
    assert Session.objects.count() == 0
    session_id = start(alice_http).json()["id"]
    for http in (alice_http, http_for(staff_token)):
        response = extend(http, session_id, asked)
        assert response.status_code == 400 and response.json()["code"] == "invalid_request", (asked, response.text)
    assert Session.objects.get().ends_at == NOW + 24 * HOUR
    assert not AuditRecord.objects.filter(action="session_extend").exists()


def test_a_huge_json_integer_is_400(alice_http):
    huge = "9" * 5000
    response = alice_http.post("/api/v1/sessions", data=f'{{"image": "{IMAGE}", "runtime_hours": {huge}}}',
                               headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and Session.objects.count() == 0
    session_id = start(alice_http).json()["id"]
    response = alice_http.post(f"/api/v1/sessions/{session_id}/extend", data=f'{{"hours": {huge}}}',
                               headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and Session.objects.get().ends_at == NOW + 24 * HOUR


@pytest.mark.parametrize("phase", ["Pending", "Scheduled", "Starting", "Running"])
def test_every_live_phase_is_stopped_at_ends_at_and_a_stopping_one_is_left_alone(alice, frozen, phase):
    session = create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=1)
    stopping = create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=1)
    Session.objects.filter(pk=session.pk).update(phase=phase)
    Session.objects.filter(pk=stopping.pk).update(phase="Stopping", stop_reason="requested")
    frozen.move_to(NOW + HOUR)
    assert runtime.runtime_enforce() == {"due": 1, "stopped": 1}
    session.refresh_from_db()
    stopping.refresh_from_db()
    assert session.phase == "Stopping" and session.stop_reason == "time_limit"
    assert stopping.stop_reason == "requested"


def test_a_time_limit_stop_is_held_until_the_gpus_are_released(alice, frozen):
    session = create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=1)
    frozen.move_to(NOW + HOUR + timedelta(seconds=20))
    assert runtime.runtime_enforce()["stopped"] == 1
    frozen.move_to(NOW + HOUR + timedelta(seconds=50))
    end.session_terminate(session=Session.objects.get(pk=session.pk), message="gone")
    held = list(HeldGpu.objects.filter(session=session).values_list("held_from", "held_until"))
    assert held == [(NOW, NOW + HOUR + timedelta(seconds=50))]
    assert runtime.runtime_enforce() == {"due": 0, "stopped": 0}


@pytest.mark.parametrize("again", [2, "2.0", " 2.00 ", "2e0", "0.2e1"])
def test_an_idempotent_retry_matches_the_same_hours_however_written(alice_http, again):
    first = alice_http.post("/api/v1/sessions", json={"image": IMAGE, "runtime_hours": "2"}, headers={"Idempotency-Key": "k"})
    retry = alice_http.post("/api/v1/sessions", json={"image": IMAGE, "runtime_hours": again}, headers={"Idempotency-Key": "k"})
    assert (first.status_code, retry.status_code) == (201, 200) and retry.json()["id"] == first.json()["id"]


def test_an_idempotent_retry_cannot_turn_the_policys_default_into_other_hours(alice_http, alice):
    """A retry that asks hours the first request did not is another request (409), even when they equal the policy's
    maximum of the time; one that omits them again gets the first session and its first ``ends_at`` back, whatever
    the policy says now."""
    first = alice_http.post("/api/v1/sessions", json={"image": IMAGE}, headers={"Idempotency-Key": "k"})
    assert first.status_code == 201
    for hours in (24, 1):
        other = alice_http.post("/api/v1/sessions", json={"image": IMAGE, "runtime_hours": hours}, headers={"Idempotency-Key": "k"})
        assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    policy_set(user=alice, min_balance_hours=Decimal(0), max_runtime_hours=0)
    retry = alice_http.post("/api/v1/sessions", json={"image": IMAGE}, headers={"Idempotency-Key": "k"})
    assert retry.status_code == 200 and datetime.fromisoformat(retry.json()["ends_at"]) == NOW + 24 * HOUR
    assert Session.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_extensions_at_once_cannot_both_pass_the_policy(alice):
    """Each judges the limit on the row it locked: the one that waited sees the other's new ``ends_at`` and is refused."""
    session = create.session_create(owner=alice, image=IMAGE, gpus=1, runtime_hours=10)
    outcomes = []

    def other():
        try:
            runtime.session_extend(session=session, user=alice, hours=14)
            outcomes.append("extended")
        except runtime.RuntimeOverLimit:
            outcomes.append("refused")
        finally:
            connections.close_all()

    with transaction.atomic():
        runtime.session_extend(session=session, user=alice, hours=14)
        waiter = threading.Thread(target=other, daemon=True)
        waiter.start()
        with connection.cursor() as cursor:
            for _ in range(200):
                if lock_waiters(cursor):
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the second extension never waited for the session's row")
    waiter.join(30)
    assert outcomes == ["refused"]
    session.refresh_from_db()
    assert session.ends_at == NOW + 24 * HOUR
    assert AuditRecord.objects.filter(action="session_extend").count() == 1
