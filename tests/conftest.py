"""Shared fixtures: users and API tokens, an HTTP client on the live server, emulated clusters.

Every network peer a test talks to listens on loopback: pytest-django's ``live_server`` (a real
threaded WSGI server), ``demo.emulator.EmulatedCluster`` (kmock's Kubernetes emulator over HTTP)
and :func:`silent_listener` (accepts TCP connections and never answers).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
import requests
import yaml

FIXTURES = Path(__file__).parent / "fixtures"

# Loopback only, for the Python processes the tests start too: their site imports tests/netguard/sitecustomize.py
# (pytest-socket's --allow-hosts in pyproject.toml guards this process).
NETGUARD = Path(__file__).parent / "netguard"
os.environ["GSHARE_NETGUARD"] = "1"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NETGUARD), os.environ.get("PYTHONPATH")]))


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


class Http:
    """A ``requests`` session bound to a base URL and (optionally) a bearer token."""

    def __init__(self, base_url: str, token: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        """Send ``method`` to ``base_url + path`` (30 s timeout unless given)."""
        kwargs.setdefault("timeout", 30)
        return self.session.request(method, self.base_url + path, **kwargs)

    def get(self, path, **kw):  # noqa: D102
        return self.request("GET", path, **kw)

    def post(self, path, **kw):  # noqa: D102
        return self.request("POST", path, **kw)

    def put(self, path, **kw):  # noqa: D102
        return self.request("PUT", path, **kw)

    def patch(self, path, **kw):  # noqa: D102
        return self.request("PATCH", path, **kw)

    def delete(self, path, **kw):  # noqa: D102
        return self.request("DELETE", path, **kw)


@pytest.fixture
def staff_user(django_user_model):
    """A staff superuser ``admin``."""
    return django_user_model.objects.create_superuser("admin", "admin@example.com", "admin-password")


@pytest.fixture
def plain_user(django_user_model):
    """A researcher without staff rights."""
    return django_user_model.objects.create_user("alice", "alice@example.com", "alice-password")


def _token_for(user) -> str:
    from gshare.auth.tokens import api_token_create

    return api_token_create(username=user.username)[1]


@pytest.fixture
def staff_token(staff_user) -> str:
    """An API token of ``staff_user``."""
    return _token_for(staff_user)


@pytest.fixture
def http(live_server, staff_token) -> Http:
    """HTTP client on the live server, authenticated as staff."""
    return Http(live_server.url, staff_token)


@pytest.fixture
def http_user(live_server, plain_user) -> Http:
    """HTTP client on the live server, authenticated as a non-staff user."""
    return Http(live_server.url, _token_for(plain_user))


@pytest.fixture
def anon(live_server) -> Http:
    """HTTP client on the live server without credentials."""
    return Http(live_server.url)


def load_kubeconfig_fixture(name: str) -> str:
    """Return the text of ``tests/fixtures/kubeconfig/<name>``."""
    return (FIXTURES / "kubeconfig" / name).read_text()


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


def kubeconfig_text(cluster, name: str = "lab") -> str:
    """The YAML kubeconfig of an ``EmulatedCluster``."""
    return yaml.safe_dump(cluster.kubeconfig(name))


def silent_kubeconfig(host_port: str) -> dict:
    """A token kubeconfig whose server accepts connections and never answers."""
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://{host_port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


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
