"""The queue under concurrency: passes (admitters), releases and new requests at once never start two sessions on one
slot, never admit one queued session twice, and leave the counters equal to a recount. Real PostgreSQL, each thread on
its own connection."""

import threading
from decimal import Decimal

import pytest
from celery import current_app
from django.db import connections

from billing.services import policy_set
from clusters.models import GpuDevice
from core.exceptions import ApplicationError
from sessions import create, lifecycle
from sessions.lifecycle import outbox
from sessions.models import Allocation, Session
from sessions.queue import leave
from sessions.queue.admit import queue_pass
from tests.helpers import run_threads
from tests.sessions.test_placement import fleet, recount, stored

IMAGE = "quay.io/jupyter/base-notebook"


@pytest.mark.django_db(transaction=True)
def test_admitters_releasers_and_new_requests_at_once_never_share_a_slot(django_user_model, monkeypatch):
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    monkeypatch.setattr(leave, "publish_after_commit", lambda: None)  # the threads run the passes themselves
    fleet(nodes=2, gpus=2, split=2, memory=9000, name="alpha")
    users = []
    for i in range(6):
        user = django_user_model.objects.create(username=f"queue-racer-{i}")
        policy_set(user=user, min_balance_hours=Decimal(0), max_queued_sessions=10)
        users.append(user)
    running = [create.session_create(owner=users[i], image=IMAGE, gpus=1) for i in range(4)]  # the fleet is full
    for i in range(8):
        create.session_create(owner=users[4 + i % 2], image=IMAGE, gpus=1 + i % 2, queue=True)
    barrier = threading.Barrier(6)
    errors = []

    def releaser(session):
        try:
            barrier.wait()
            lifecycle.session_terminate(session=Session.objects.get(pk=session.pk), message="released")
        except Exception as exc:  # noqa: BLE001 - recorded, asserted below
            errors.append(exc)
        finally:
            connections.close_all()

    def admitter():
        try:
            barrier.wait()
            for _ in range(3):
                queue_pass()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    def requester(user):
        try:
            barrier.wait()
            for _ in range(2):
                try:
                    create.session_create(owner=user, image=IMAGE, gpus=1, queue=True)
                except ApplicationError as refused:  # a contended placement or the queue's limit: refusals, not faults
                    assert refused.code in ("placement_contended", "queue_limit_reached"), refused.code
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [(releaser, running[0]), (releaser, running[1]), (admitter,), (admitter,), (requester, users[0]), (requester, users[1])]
    run_threads(lambda fn, *a: fn(*a), threads)
    assert not errors, errors
    queue_pass()
    for device in GpuDevice.objects.all():
        assert device.used_count <= 1, device  # whole GPUs only: one session per GPU
    assert recount() == stored()
    admitted = Session.objects.exclude(phase__in=[Session.Phase.QUEUED, *Session.TERMINAL_PHASES])
    assert sum(s.gpus for s in admitted) == Allocation.objects.count() <= 4
    for session in admitted:
        assert session.allocations.count() == session.gpus


@pytest.mark.django_db
def test_a_burst_of_changes_publishes_one_pass_until_it_starts(monkeypatch):
    """Releases and inventories come in bursts: while a published pass has not started, further changes publish
    nothing (that pass reads the state when it starts); once it starts, the next change publishes again."""
    published = []
    monkeypatch.setattr(current_app.tasks[leave.TICK_TASK], "delay", lambda: published.append(1))
    leave.pass_started()
    for _ in range(5):
        leave.publish_now()
    assert len(published) == 1
    leave.pass_started()
    leave.publish_now()
    assert len(published) == 2
    leave.pass_started()
