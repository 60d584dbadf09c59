"""Stopping the sessions of accounts below zero once their policy's grace has passed (``sessions.overdrawn``, the beat
task billing.stop_overdrawn_sessions), through the session service, against an emulated cluster of the demo fleet."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import PeriodicTask

from billing.models import CreditAccount, LedgerEntry, Policy
from billing.services import account_for, credit_grant, ledger_append
from sessions import create, lifecycle, overdrawn, tasks
from sessions.lifecycle import outbox
from sessions.models import Allocation, Session

pytestmark = pytest.mark.django_db

GSS = ("gsharesessions", "gshare.io", "v1alpha1")


@pytest.fixture(autouse=True)
def defaults(settings):
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = 0
    settings.GSHARE_BILLING_DEFAULT_GRACE_SECONDS = 900


@pytest.fixture
def lab(live_cluster):
    """lab-c1 (emulated) and its emulator."""
    return live_cluster("lab-c1")


def start(owner, **kwargs) -> Session:
    return create.session_create(owner=owner, image="quay.io/jupyter/base-notebook", gpus=1, **kwargs)


def overdraw(user, amount="-1.23", key="debt") -> CreditAccount:
    """Take the balance below zero (an adjustment through the ledger); ``below_zero_since`` is now."""
    ledger_append(account=account_for(user), kind=LedgerEntry.Kind.ADJUSTMENT, amount=Decimal(amount), idempotency_key=f"{user.pk}:{key}")
    return CreditAccount.objects.get(user=user)


def live(user):
    return Session.objects.filter(owner=user).exclude(phase__in=Session.TERMINAL_PHASES)


@pytest.mark.django_db(transaction=True)
def test_within_grace_nothing_after_grace_stopped_through_the_service(lab, django_user_model):
    _, emulated = lab
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    mine = [start(alice), start(alice, gpu_memory_mib=1000)]
    theirs = start(bob)
    assert len(emulated.objects_of(*GSS)) == 3
    account = overdraw(alice)
    since = account.below_zero_since
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=899)) == 0
    assert live(alice).count() == 2 and len(emulated.objects_of(*GSS)) == 3

    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=900)) == 2
    names = {gss["metadata"]["name"] for gss in emulated.objects_of(*GSS)}
    assert names == {theirs.public_id.replace("_", "-")}  # the GShareSessions were deleted (the delete task ran)
    for session in mine:
        session.refresh_from_db()
        assert session.phase == Session.Phase.TERMINATED and session.ended_at is not None
        assert session.message.startswith("Stopped: credits ran out (balance -1.23 since ")
        assert "grace 900 s" in session.message and "grant" in session.message
        assert not Allocation.objects.filter(session=session).exists()
    assert live(bob).count() == 1  # another account's sessions are left alone

    before = list(Session.objects.order_by("pk").values_list("pk", "phase", "message", "ended_at"))
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=5000)) == 0  # idempotent
    assert list(Session.objects.order_by("pk").values_list("pk", "phase", "message", "ended_at")) == before


def test_a_balance_back_at_zero_or_above_stops_nothing(lab, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    start(alice)
    since = overdraw(alice).below_zero_since
    credit_grant(user=alice, amount=Decimal("1.23"), reason="top-up", idempotency_key="top-up", created_by="test")
    account = CreditAccount.objects.get(user=alice)
    assert account.balance == 0 and account.below_zero_since is None
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(days=1)) == 0
    assert live(alice).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_users_policy_grace_applies(lab, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    bob = django_user_model.objects.create_user("bob")
    Policy.objects.create(min_balance_hours=0, grace_seconds=60)  # default row
    Policy.objects.create(user=bob, min_balance_hours=0, grace_seconds=3600)
    start(alice), start(bob)
    since = max(overdraw(alice).below_zero_since, overdraw(bob).below_zero_since)
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=61)) == 1
    assert live(alice).count() == 0 and live(bob).count() == 1
    assert "grace 60 s" in Session.objects.get(owner=alice).message
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=3601)) == 1
    assert live(bob).count() == 0 and "grace 3600 s" in Session.objects.get(owner=bob).message


def test_a_session_already_stopping_keeps_its_own_reason(lab, django_user_model, monkeypatch):
    alice = django_user_model.objects.create_user("alice")
    session = start(alice)
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)  # the delete task does not run
    lifecycle.session_stop(session=session)
    since = overdraw(alice).below_zero_since
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(hours=1)) == 0
    session.refresh_from_db()
    assert session.phase == Session.Phase.STOPPING and session.message == "Stopped on request."


def test_the_reason_survives_the_operators_reports_while_stopping(lab, django_user_model, monkeypatch):
    cluster, _ = lab
    alice = django_user_model.objects.create_user("alice")
    session = start(alice)
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)  # the operator reports the end
    since = overdraw(alice).below_zero_since
    assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=900)) == 1
    reports = [{"session": session.public_id, "phase": phase, "message": "", "observed_at": since + timedelta(seconds=s)}
               for phase, s in (("Running", 1), ("Terminated", 2))]
    lifecycle.session_status_apply(cluster=cluster, reports=reports)
    session.refresh_from_db()
    assert session.phase == Session.Phase.TERMINATED and session.message.startswith("Stopped: credits ran out")


def test_the_query_count_does_not_grow_with_the_number_of_accounts(lab, django_user_model, monkeypatch):
    """Three sessions of one account, then three sessions of three accounts: the same queries (per session: the
    service's; per run: four)."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)  # count the stop, not the deletion
    counts = []
    for round_, owners in enumerate((["a"] * 3, ["b", "c", "d"])):
        users = {name: django_user_model.objects.get_or_create(username=name)[0] for name in set(owners)}
        for name in owners:
            start(users[name])
        since = max(overdraw(user, key=f"r{round_}").below_zero_since for user in users.values())
        with CaptureQueriesContext(connection) as queries:
            assert overdrawn.overdrawn_sessions_stop(now=since + timedelta(seconds=901)) == 3
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


@pytest.mark.django_db(transaction=True)
def test_the_task_calls_the_service(lab, django_user_model):
    alice = django_user_model.objects.create_user("alice")
    start(alice)
    account = overdraw(alice)
    CreditAccount.objects.filter(pk=account.pk).update(below_zero_since=account.below_zero_since - timedelta(seconds=901))
    tasks.stop_overdrawn_sessions.delay()
    assert live(alice).count() == 0
    assert Session.objects.get(owner=alice).message.startswith("Stopped: credits ran out")


@pytest.mark.django_db  # not transactional: a transactional test's flush removes what migrations created
def test_the_beat_schedule_is_created_by_migration():
    task = PeriodicTask.objects.get(task="billing.stop_overdrawn_sessions")
    assert task.enabled
    assert task.interval.every == 60 and task.interval.period == "seconds"
    assert 0 < task.expire_seconds <= 60
