"""Placement attacked: a pinned cluster that stops taking sessions before or while the request waits for its lock, a
cluster deregistered between the unlocked choice and the lock, and one key sent by concurrent retries.

Real PostgreSQL; the races run in threads, each on its own connection.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

from clusters.models import Cluster
from core.exceptions import Conflict
from sessions.create import session_create, session_create_idempotent
from sessions.lifecycle import outbox
from sessions.models import Allocation, Session
from tests.helpers import run_threads
from tests.sessions.test_placement import fleet, recount, stored


@pytest.mark.django_db
@pytest.mark.parametrize("status", [Cluster.Status.DEGRADED, Cluster.Status.UNREACHABLE, Cluster.Status.PENDING])
def test_a_request_pinned_to_a_cluster_that_takes_no_sessions_is_cluster_unavailable(django_user_model, status):
    """Not 409 ``placement_contended`` ("send it again"), which no retry could ever get past."""
    user = django_user_model.objects.create_user("pinner")
    cluster = fleet(nodes=1, gpus=1, name="alpha")
    Cluster.objects.filter(pk=cluster.pk).update(status=status)
    with pytest.raises(Conflict) as info:
        session_create(owner=user, image="img", gpus=1, cluster="alpha")
    assert info.value.code == "cluster_unavailable", info.value.detail
    assert f"is {status}" in info.value.detail
    assert not Session.objects.exists() and not Allocation.objects.exists()


def _hold_cluster_then(cluster: Cluster, change: dict, holding: threading.Event, errors: list) -> None:
    """Lock ``cluster``'s row, wait for a placement to queue behind it, then write ``change`` and commit."""
    try:
        with transaction.atomic():
            Cluster.objects.select_for_update().get(pk=cluster.pk)
            holding.set()
            time.sleep(1.0)  # the placement has chosen (or been pinned) and waits for this lock meanwhile
            Cluster.objects.filter(pk=cluster.pk).update(**change)
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(repr(exc))
    finally:
        holding.set()
        connections.close_all()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", [{"status": Cluster.Status.UNREACHABLE}, {"status": Cluster.Status.DEREGISTERED},
                                    {"session_domain": ""}])
def test_a_pinned_cluster_that_stops_taking_sessions_while_the_request_waits_for_its_lock(django_user_model, monkeypatch, change):
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    alpha = fleet(nodes=1, gpus=2, name="alpha")
    owner = django_user_model.objects.create_user("pinned")
    holding, results, errors = threading.Event(), {}, []

    def place():
        try:
            assert holding.wait(10)
            session_create(owner=owner, image="img", gpus=1, cluster="alpha")
            results["placed"] = True
        except Conflict as exc:
            results["code"] = exc.code
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(lambda f, *a: f(*a), [(_hold_cluster_then, alpha, change, holding, errors), (place,)], timeout=30)
    assert errors == []
    assert results == {"code": "cluster_unavailable"}
    assert not Session.objects.exists() and not Allocation.objects.exists()
    assert stored() == recount()


@pytest.mark.django_db(transaction=True)
def test_a_chosen_cluster_deregistered_before_its_lock_is_left_for_another(django_user_model, monkeypatch):
    """alpha is the choice (binpack: it has a session already), and is deregistered while the request waits for its
    lock: the request chooses again and lands on beta; nothing is left on alpha."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    alpha = fleet(nodes=1, gpus=2, name="alpha")
    beta = fleet(nodes=1, gpus=2, name="beta")
    owner = django_user_model.objects.create_user("chooser")
    holding, results, errors = threading.Event(), {}, []

    def place():
        try:
            assert holding.wait(10)
            results["session"] = session_create(owner=owner, image="img", gpus=1)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    change = {"status": Cluster.Status.DEREGISTERED}
    run_threads(lambda f, *a: f(*a), [(_hold_cluster_then, alpha, change, holding, errors), (place,)], timeout=30)
    assert errors == []
    assert results["session"].cluster_id == beta.pk
    assert Session.objects.get().cluster_id == beta.pk and not Allocation.objects.filter(device__cluster=alpha).exists()
    assert stored() == recount()


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_key_in_process_create_one_session(django_user_model, monkeypatch):
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    fleet(nodes=2, gpus=2, name="alpha")
    owner = django_user_model.objects.create_user("retrier")
    barrier = threading.Barrier(6)
    results, errors = [], []

    def send():
        try:
            barrier.wait()
            results.append(session_create_idempotent(owner=owner, idempotency_key="k-1", image="img", gpus=1))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(send, [()] * 6, timeout=60)
    assert errors == []
    assert len({session.pk for session, _ in results}) == 1
    assert sorted(created for _, created in results) == [False] * 5 + [True]
    assert Session.objects.count() == 1 and Allocation.objects.count() == 1
    assert stored() == recount()
