"""Placement under concurrency: decisions lock only the cluster they land on, and never over-commit a GPU.

Real PostgreSQL, each thread on its own connection. ``session_create`` chooses without a lock, then locks the chosen
cluster's row and checks the fit again (``sessions.placement.reserve``); a choice that went stale is made again.
"""

import random
import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contract
from clusters.models import Cluster, GpuDevice
from core import instruments
from core.exceptions import Conflict
from sessions import create, lifecycle
from sessions.lifecycle import outbox
from sessions.models import Allocation, Session
from tests.helpers import run_threads
from tests.sessions.test_placement import fleet, recount, stored

#: One creator's or releaser's steps: create (pinned to alpha, beta, or not pinned; GPUs; MiB per GPU or whole) or
#: end one of its live sessions (by index, modulo how many it has).
_STEP = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(["alpha", "beta", None]), st.integers(1, 2), st.sampled_from([None, 3000, 4500])),
    st.tuples(st.just("end"), st.integers(0, 7), st.sampled_from(["fail", "terminate", "status"])),
)


def _fleet() -> None:
    """alpha and beta, 2 nodes x 2 GPUs each, small enough that the workers keep running out (once per database)."""
    for name in ("alpha", "beta"):
        if not Cluster.objects.filter(name=name).exists():
            fleet(nodes=2, gpus=2, split=3, memory=9000, name=name)


def _end(session: Session, how: str) -> None:
    if how == "fail":
        lifecycle.session_fail(session=session, message="test")
    elif how == "terminate":
        lifecycle.session_terminate(session=session, message="test")
    else:
        lifecycle.session_status_apply(cluster=session.cluster, reports=[
            {"session": session.public_id, "phase": contract.PHASE_SUCCEEDED, "observed_at": timezone.now()}])


def _never_over_capacity() -> None:
    for device in GpuDevice.objects.all():
        assert device.used_count <= device.split_count and device.used_memory_mib <= device.memory_mib, device
        assert device.used_cores <= device.cores, device
        assert not device.used_exclusive or device.used_count == 1, device


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.lists(_STEP, min_size=3, max_size=10), min_size=4, max_size=4))
@pytest.mark.django_db(transaction=True)
def test_concurrent_creators_and_releasers_never_over_commit_and_counters_equal_a_recount(django_user_model, monkeypatch, plans):
    """Four workers (own users, own connections) create and end sessions at once on the same cluster and on different
    clusters; whatever the interleaving, no GPU is over its split count, memory or cores, and the counters equal a
    recount from the allocations."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)  # no apply: the workers end their sessions
    _fleet()
    owners = [django_user_model.objects.get_or_create(username=f"racer-{i}")[0] for i in range(len(plans))]
    barrier = threading.Barrier(len(plans))
    errors, placed = [], []

    def worker(owner, plan):
        try:
            barrier.wait()
            mine: list[Session] = []
            for step in plan:
                if step[0] == "end":
                    if mine:
                        _end(mine.pop(step[1] % len(mine)), step[2])
                    continue
                _, cluster, gpus, memory = step
                try:
                    mine.append(create.session_create(owner=owner, image="img", gpus=gpus, gpu_memory_mib=memory,
                                                       gpu_cores=None if memory is None else 20, cluster=cluster))
                    placed.append(mine[-1].cluster_id)
                except Conflict as exc:
                    assert exc.code == "no_capacity", exc.code
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(worker, list(zip(owners, plans, strict=True)), timeout=120)
    assert errors == []
    _never_over_capacity()
    assert stored() == recount()
    for session in Session.objects.exclude(phase__in=Session.TERMINAL_PHASES):  # the next example starts empty
        lifecycle.session_fail(session=session, message="test")
    assert Allocation.objects.count() == 0
    assert stored() == recount()


@pytest.mark.django_db(transaction=True)
def test_a_choice_that_went_stale_before_its_lock_is_made_again(django_user_model, monkeypatch):
    """alpha's last GPU is taken by a transaction that has not committed when a second request chooses (without a
    lock, it sees the GPU free and picks alpha, binpack's tie-break) and waits for alpha's lock: once it has the
    lock it finds the GPU taken, and chooses again: beta."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    fleet(nodes=1, gpus=1, name="alpha")
    beta = fleet(nodes=1, gpus=1, name="beta")
    first, second = (django_user_model.objects.create_user(name) for name in ("first", "second"))
    holding, results, errors = threading.Event(), {}, []

    def hold_alpha():
        try:
            with transaction.atomic():
                results["first"] = create.session_create(owner=first, image="img", gpus=1, cluster="alpha")
                holding.set()
                time.sleep(1.0)  # the second request chooses alpha meanwhile, then waits for its lock
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            holding.set()
            connections.close_all()

    def place():
        try:
            assert holding.wait(10)
            results["second"] = create.session_create(owner=second, image="img", gpus=1)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(lambda f: f(), [(hold_alpha,), (place,)], timeout=30)
    assert errors == []
    assert results["first"].cluster.name == "alpha"
    assert results["second"].cluster_id == beta.pk
    assert Allocation.objects.count() == 2
    _never_over_capacity()
    assert stored() == recount()


@pytest.mark.django_db(transaction=True)
def test_a_request_that_loses_its_choice_on_every_attempt_is_refused_as_contended(django_user_model, monkeypatch):
    """With one attempt, the request whose choice went stale (as above) is refused 409 ``placement_contended``, reserves
    nothing, and is counted under the ``contended`` outcome, not ``no_capacity`` (beta still had room)."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    monkeypatch.setattr(create, "PLACEMENT_ATTEMPTS", 1)
    fleet(nodes=1, gpus=1, name="alpha")
    fleet(nodes=1, gpus=1, name="beta")
    first, second = (django_user_model.objects.create_user(name) for name in ("first", "second"))

    def decisions(outcome: str) -> float:
        return instruments.REGISTRY.get_sample_value("gshare_placement_decisions_total", {"outcome": outcome}) or 0.0

    contended, no_capacity = decisions(instruments.CONTENDED), decisions(instruments.NO_CAPACITY)
    holding, results, errors = threading.Event(), {}, []

    def hold_alpha():
        try:
            with transaction.atomic():
                create.session_create(owner=first, image="img", gpus=1, cluster="alpha")
                holding.set()
                time.sleep(1.0)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            holding.set()
            connections.close_all()

    def place():
        try:
            assert holding.wait(10)
            create.session_create(owner=second, image="img", gpus=1)
        except create.PlacementContended as exc:
            results["refused"] = exc
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(lambda f: f(), [(hold_alpha,), (place,)], timeout=30)
    assert errors == []
    assert results["refused"].code == "placement_contended"
    assert not Session.objects.filter(owner=second).exists()
    assert Allocation.objects.count() == 1
    assert decisions(instruments.CONTENDED) == contended + 1
    assert decisions(instruments.NO_CAPACITY) == no_capacity


def _waits_for_a_lock(pid: int | None) -> bool:
    """Whether the backend ``pid`` is waiting for a lock now (``pg_locks``, read live: not a per-transaction snapshot as
    ``pg_stat_activity`` is)."""
    if pid is None:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)", [pid])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_decisions_on_different_clusters_do_not_wait_for_each_other(django_user_model, monkeypatch):
    """While a transaction holds alpha's lock (a placement on alpha not committed yet), a request pinned to beta is
    placed at once, and one not pinned that fits only on beta too: only the chosen cluster is locked."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    fleet(nodes=1, gpus=2, name="alpha")
    beta = fleet(nodes=1, gpus=1, split=4, memory=16000, name="beta")
    holder, other = (django_user_model.objects.create_user(name) for name in ("holder", "other"))
    holding, done, results, errors = threading.Event(), threading.Event(), {}, []

    def hold_alpha():
        try:
            with transaction.atomic():
                create.session_create(owner=holder, image="img", gpus=2, cluster="alpha")
                holding.set()
                # Commits once the other placements are done, or as soon as their backend is seen waiting for a lock
                # (it would be alpha's, the one lock held here: the test then fails), so it neither hangs nor times.
                while not done.wait(0.05):
                    if _waits_for_a_lock(results.get("pid")):
                        results["waited_for_a_lock"] = True
                        break
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            holding.set()
            connections.close_all()

    def place():
        try:
            assert holding.wait(10)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                results["pid"] = cursor.fetchone()[0]
            results["pinned"] = create.session_create(owner=other, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=10, cluster="beta")
            rng = random.Random(3)
            results["any"] = create.session_create(owner=other, image="img", gpus=1, gpu_memory_mib=rng.choice([2000, 3000]),
                                                   gpu_cores=10)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            done.set()
            connections.close_all()

    run_threads(lambda f: f(), [(hold_alpha,), (place,)], timeout=30)
    assert errors == []
    assert "waited_for_a_lock" not in results  # beta's placements never waited for alpha's lock
    assert results["pinned"].cluster_id == results["any"].cluster_id == beta.pk
    assert stored() == recount()
