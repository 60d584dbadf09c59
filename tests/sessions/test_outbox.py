"""A broker that is down or silent does not hold the API; the session rows are the outbox and ``sessions.reconcile`` relays them.

Through HTTP on the live server, with Celery pointed at a loopback listener that accepts and never answers
(``silent``) or at a closed port, and NOT eager: the API answers after a bounded number of waits on the broker (the
connections the silent listener took, each waiting at most ``GSHARE_REDIS_TIMEOUT`` for a reply: counted, not timed)
and the session waits in its phase; then, with the broker working again (eager), the reconciler applies or deletes
it on the emulated cluster.
"""

import socket
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from gshare.celery import app
from sessions import lifecycle, tasks
from sessions.models import Session
from tests.helpers import run_threads

pytestmark = pytest.mark.django_db

GSS = ("gsharesessions", "gshare.io", "v1alpha1")
#: Connections one publish may open to a silent broker: the first, and the one retry of
#: ``CELERY_TASK_PUBLISH_RETRY_POLICY``; each waits at most ``GSHARE_REDIS_TIMEOUT`` for a reply.
PUBLISH_WAITS = 2


class SilentRedis:
    """A loopback listener that never accepts nor answers: the kernel completes each client's connection into the
    backlog, and the client waits for a reply until its socket timeout. ``waits()`` takes the connections made since
    the last call out of the backlog and counts them (each is one bounded wait)."""

    def __init__(self):
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(128)
        self._server.setblocking(False)
        self._taken: list[socket.socket] = []
        self.host_port = f"127.0.0.1:{self._server.getsockname()[1]}"

    def waits(self) -> int:
        """The connections made since the last call."""
        count = 0
        while True:
            try:
                connection, _ = self._server.accept()
            except BlockingIOError:
                return count
            self._taken.append(connection)
            count += 1

    def close(self) -> None:
        for connection in self._taken:
            connection.close()
        self._server.close()


@pytest.fixture
def silent(settings):
    """A ``SilentRedis`` (allowed as a loopback host)."""
    listener = SilentRedis()
    settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, listener.host_port]
    yield listener
    listener.close()


def test_every_wait_on_the_broker_is_bounded(settings):
    """What makes each counted wait bounded: redis-py's socket timeouts and one connection attempt per publish."""
    options = app.conf.broker_transport_options
    assert options["socket_timeout"] == options["socket_connect_timeout"] == settings.GSHARE_REDIS_TIMEOUT > 0
    assert options["max_retries"] == 0 and app.conf.task_publish_retry_policy["max_retries"] == PUBLISH_WAITS - 1


@pytest.fixture(autouse=True)
def patient_probe(settings):
    """The emulated apiservers get more than the test settings' 3 s: these tests time the API, not the probe."""
    settings.GSHARE_PROBE_TIMEOUT = 10.0


@pytest.fixture
def broker():
    """``point(url)``: send Celery's publishes to ``url``, not eagerly; the app's broker and eagerness come back after."""
    saved = {"broker_url": app.conf.broker_url, "task_always_eager": app.conf.task_always_eager}

    def drop_pools(close: bool) -> None:
        if close and app._pool is not None:
            app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None

    def point(url: str) -> None:
        app.conf.update(broker_url=url, task_always_eager=False)
        drop_pools(close=False)  # the working broker's pool stays registered in kombu for the restore

    yield point
    drop_pools(close=app.conf.broker_url != saved["broker_url"])
    app.conf.update(saved)


@pytest.fixture
def closed_port() -> str:
    """``host:port`` of a loopback port nothing listens on (a stopped Redis: connections are refused)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    host_port = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()
    return host_port


@pytest.fixture(params=["silent", "stopped"])
def broker_down(request, broker):
    """The broker as a listener that never answers, or as a closed port; yields ``restore()`` (eager again), with
    ``restore.silent``: the ``SilentRedis`` (None for the closed port, where each attempt is refused at once)."""
    silent = request.getfixturevalue("silent") if request.param == "silent" else None
    host_port = silent.host_port if silent else request.getfixturevalue("closed_port")
    saved = app.conf.broker_url
    broker(f"redis://{host_port}/0")

    def restore() -> None:
        app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None
        app.conf.update(broker_url=saved, task_always_eager=True)

    restore.silent = silent
    return restore


def start(http, **body):
    return http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, **body}, timeout=15)


def backdate(**fields) -> None:
    past = timezone.now() - timedelta(seconds=600)
    Session.objects.update(**{field: past for field in fields})


def test_create_answers_at_once_and_the_reconciler_applies_it_later(http, live_cluster, broker_down):
    _, emulated = live_cluster("lab-c1")
    response = start(http, name="nb")
    assert response.status_code == 201, response.text
    silent = broker_down.silent
    if silent is not None:
        assert 1 <= silent.waits() <= PUBLISH_WAITS  # one publish, bounded; a closed port refuses each attempt at once
    body = response.json()
    assert body["phase"] == "Scheduled" and body["url"]
    listed = http.get("/api/v1/clusters", timeout=15)
    assert listed.status_code == 200
    assert silent is None or silent.waits() == 0  # a read publishes nothing: it never waits on the broker
    assert emulated.objects_of(*GSS) == []  # nothing reached the cluster yet

    broker_down()
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 0, "delete": 0, "reapply": 0, "unpublished": 0}  # not due yet
    backdate(created_at=True)
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 1, "delete": 0, "reapply": 0, "unpublished": 0}
    shown = http.get(f"/api/v1/sessions/{body['id']}").json()
    assert shown["phase"] == "Starting"
    (gss,) = emulated.objects_of(*GSS)
    assert gss["metadata"]["name"] == body["id"].replace("_", "-")
    # Idempotent: nothing is due any more.
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 0, "delete": 0, "reapply": 0, "unpublished": 0}
    assert len(emulated.objects_of(*GSS)) == 1


def test_a_retry_during_an_outage_with_an_idempotency_key_gets_the_same_session(http, live_cluster, broker, silent):
    live_cluster("lab-c1")
    broker(f"redis://{silent.host_port}/0")
    body = {"image": "quay.io/jupyter/base-notebook", "gpus": 1}
    first = http.post("/api/v1/sessions", json=body, headers={"Idempotency-Key": "retry-me"}, timeout=15)
    again = http.post("/api/v1/sessions", json=body, headers={"Idempotency-Key": "retry-me"}, timeout=15)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and again.json()["phase"] == "Scheduled"
    assert Session.objects.count() == 1
    assert silent.waits() <= PUBLISH_WAITS  # the replayed answer publishes nothing


@pytest.mark.parametrize("cache_too", [False, True], ids=["broker", "broker-and-cache"])
def test_stop_answers_at_once_and_the_reconciler_deletes_it_later(http, live_cluster, broker, silent, settings, cache_too):
    _, emulated = live_cluster("lab-c1")
    session_id = start(http).json()["id"]  # eager: applied now
    assert len(emulated.objects_of(*GSS)) == 1
    broker(f"redis://{silent.host_port}/0")
    if cache_too:  # the same Redis holds the cache: dropping the connect facts after the commit must not wait either
        settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://{silent.host_port}/0"}}
    response = http.delete(f"/api/v1/sessions/{session_id}", timeout=15)
    assert response.status_code == 202, response.text
    # The publish's waits, and the cache's (one connection per cache call, each with the same socket timeout).
    assert 1 <= silent.waits() <= PUBLISH_WAITS + (2 if cache_too else 0)
    assert response.json()["phase"] == "Stopping"
    assert len(emulated.objects_of(*GSS)) == 1
    assert Session.objects.get().stop_requested_at is not None

    app.conf.update(task_always_eager=True)  # a working broker again (eager: the task runs here)
    assert tasks.sessions_reconcile_task.delay().get()["delete"] == 0  # asked to stop just now: not due yet
    backdate(stop_requested_at=True)
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 0, "delete": 1, "reapply": 0, "unpublished": 0}
    assert http.get(f"/api/v1/sessions/{session_id}").json()["phase"] == "Terminated"
    assert emulated.objects_of(*GSS) == []
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 0, "delete": 0, "reapply": 0, "unpublished": 0}


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_a_silent_broker_all_answer(live_server, staff_token, live_cluster, broker, silent):
    """Each request waits at most one publish's bound, so a stall does not pile requests up behind each other: the
    four creates together made at most four publishes' connections, the read none."""
    from tests.helpers import Http

    live_cluster("lab-c1")
    broker(f"redis://{silent.host_port}/0")
    results, errors = [], []
    barrier = threading.Barrier(5)

    def send(n: int) -> None:
        client = Http(live_server.url, staff_token)
        try:
            barrier.wait()
            call = (lambda: client.get("/api/v1/clusters", timeout=15)) if n == 0 else (lambda: start(client, name=f"nb{n}"))
            results.append(call())
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(send, [(n,) for n in range(5)], timeout=60)
    assert not errors
    assert sorted(r.status_code for r in results) == [200, 201, 201, 201, 201], [r.text for r in results]
    assert 4 <= silent.waits() <= 4 * PUBLISH_WAITS
    assert Session.objects.filter(phase=Session.Phase.SCHEDULED).count() == 4


def test_a_routing_change_answers_at_once_and_the_reconciler_reapplies_later(http, live_cluster, broker, silent):
    """The re-applies a routing change owes its live sessions are marked in its transaction: a lost publish is relayed."""
    cluster, emulated = live_cluster("lab-c1")
    session_id = start(http).json()["id"]  # eager: applied now
    (gss,) = emulated.objects_of(*GSS)
    assert gss["spec"]["routing"] == "ingress-nginx"
    broker(f"redis://{silent.host_port}/0")
    response = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"routing": "gateway-api"}, timeout=15)
    assert response.status_code == 200, response.text
    assert 1 <= silent.waits() <= PUBLISH_WAITS
    assert response.json()["sessions_reapplied"] == 1
    assert Session.objects.get().reapply_due_at is not None
    assert emulated.objects_of(*GSS)[0]["spec"]["routing"] == "ingress-nginx"  # the publish was lost

    app.conf.update(task_always_eager=True)  # a working broker again (eager: the task runs here)
    assert tasks.sessions_reconcile_task.delay().get()["reapply"] == 0  # marked just now: not due yet
    backdate(reapply_due_at=True)
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 0, "delete": 0, "reapply": 1, "unpublished": 0}
    (gss,) = emulated.objects_of(*GSS)
    assert gss["spec"]["routing"] == "gateway-api" and gss["spec"]["gateway"] == {"name": "gshare-sessions", "namespace": "gshare-system"}
    assert http.get(f"/api/v1/sessions/{session_id}").json()["phase"] == "Starting"
    assert Session.objects.get().reapply_due_at is None
    assert tasks.sessions_reconcile_task.delay().get() == {"apply": 0, "delete": 0, "reapply": 0, "unpublished": 0}


def test_a_publish_that_fails_stops_the_run_and_leaves_the_rest_due(live_cluster, broker, silent):
    from sessions import create
    from tests.factories import UserFactory

    cluster, _ = live_cluster("lab-c1")
    owner = UserFactory()
    for n in range(3):
        create.session_create(owner=owner, image="img", gpus=1, name=f"s{n}")  # eager: applied, then put back
    Session.objects.update(phase=Session.Phase.SCHEDULED)
    backdate(created_at=True)
    broker(f"redis://{silent.host_port}/0")
    assert lifecycle.sessions_reconcile(older_than=90) == {"apply": 0, "delete": 0, "reapply": 0, "unpublished": 3}
    assert 1 <= silent.waits() <= PUBLISH_WAITS  # one bounded publish, not one per due session


@pytest.mark.django_db(transaction=False)  # the migration's rows; pytest-django runs these before the flushing tests
def test_reconcile_schedule_is_created_by_migration():
    task = PeriodicTask.objects.get(task="sessions.reconcile")
    assert task.enabled and task.interval.every == 30 and task.interval.period == "seconds"
    assert 0 < task.expire_seconds <= 30  # expires no later than its interval
