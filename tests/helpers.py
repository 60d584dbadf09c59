"""Plain helpers shared by the test folders (fixtures stay in the conftests).

* :class:`Http`: a ``requests`` session on a base URL; :class:`InProcessHttp`, the same served in this thread by
  Django's test handler (no server, no commit: the test's transaction is rolled back);
* :func:`wait_for`: poll a check until it answers something truthy;
* kubeconfig texts of emulated clusters and of fixtures, a Kubernetes ``Status`` body (:func:`status_body`), and
  :func:`registered` for the operator process tests;
* :func:`serve_seed`: the emulator's command line on a seed file;
* usage sample bodies (:func:`sample`, from :data:`T0`) and the metered sessions they are charged to.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import io
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests
import urllib3
import yaml
from requests.adapters import BaseAdapter, HTTPAdapter

from tests.clock import T0  # noqa: F401  (re-exported: the sample start the billing tests share)

#: The repository root.
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"

T = TypeVar("T")

_counter = itertools.count()


def iso(value: datetime) -> str:
    """``2026-11-29T16:00:00Z``."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


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


class _Original:
    """What ``requests`` and ``urllib3`` read of an ``http.client.HTTPResponse``: the headers (for cookies), the method."""

    def __init__(self, headers: list[tuple[str, str]], method: str):
        self.msg = http.client.HTTPMessage()
        for name, value in headers:
            self.msg[name] = value
        self._method = method

    def isclosed(self) -> bool:  # noqa: D102
        return True

    def close(self) -> None:  # noqa: D102
        pass


class DjangoTestAdapter(BaseAdapter):
    """A ``requests`` transport adapter that hands each prepared request to Django's test handler in this thread.

    The request is the one ``requests`` would send (URL quoting, body, headers, the session's cookies, a ``Host`` from
    the URL); the WSGI environ is built as ``runserver`` builds it (headers as ``HTTP_*``, ``CONTENT_TYPE`` text/plain
    when absent), CSRF checks are enforced and a view's exception is a 500 answer, as on the live server. The
    response keeps its ``Set-Cookie`` headers, so ``requests`` keeps cookies as it would (a ``Secure`` one is not
    sent back over http). ``transaction.on_commit`` callbacks registered while serving (Celery tasks queued on
    commit) run when the response is ready, as they would after a real commit.
    """

    def __init__(self):
        super().__init__()
        from rest_framework.test import APIClient

        self.client = APIClient(enforce_csrf_checks=True, raise_request_exception=False)

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):  # noqa: D102
        from django.test import TestCase

        url = urlsplit(request.url)
        headers = dict(request.headers)
        headers.pop("Content-Length", None)
        headers.setdefault("Host", url.netloc)
        content_type = headers.pop("Content-Type", None) or "text/plain"
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode("iso-8859-1")  # as http.client encodes a str body
        self.client.cookies.clear()  # the cookies are the session's, in the Cookie header
        with TestCase.captureOnCommitCallbacks(execute=True):
            served = self.client.generic(request.method, url.path + (f"?{url.query}" if url.query else ""), data=body,
                                         content_type=content_type, headers=headers)
        content = b"".join(served.streaming_content) if served.streaming else served.content
        answered = [*served.items(), *(("Set-Cookie", c.output(header="").strip()) for c in served.cookies.values())]
        raw = urllib3.HTTPResponse(body=io.BytesIO(content), headers=urllib3.HTTPHeaderDict(answered), status=served.status_code,
                                   reason=served.reason_phrase, preload_content=False, decode_content=True,
                                   original_response=_Original(answered, request.method), request_method=request.method)
        return HTTPAdapter.build_response(self, request, raw)

    def close(self) -> None:  # noqa: D102
        pass


class InProcessHttp(Http):
    """:class:`Http` on ``http://localhost`` served in-process by :class:`DjangoTestAdapter`: the same requests and
    answers as on ``live_server`` (whose host is ``localhost``), inside the test's transaction."""

    def __init__(self, token: str | None = None, host: str = "localhost"):
        super().__init__(f"http://{host}", token)
        self.session.mount("http://", DjangoTestAdapter())


def wait_for(check: Callable[[], T], timeout: float = 60.0, *, what: str = "condition", interval: float = 0.05) -> T:
    """Call ``check`` every ``interval`` s until it returns something truthy, and return that.

    It is called at least once, and once more after ``timeout`` s have passed; then AssertionError "timed out waiting
    for <what>".
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def run_threads(target: Callable[..., Any], args: list[tuple], *, timeout: float = 60.0) -> None:
    """Run ``target(*a)`` for each ``a`` of ``args``, each in its own thread, all started before any is joined.

    Args:
        target: what each thread runs; it records its own results and closes its database connections.
        args: one tuple of arguments per thread.
        timeout: seconds each thread may still take once the previous ones are joined.

    Raises:
        AssertionError: a thread still running after its ``timeout`` (a hang, not an answer to assert on).
    """
    threads = [threading.Thread(target=target, args=a, daemon=True) for a in args]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    hung = sum(thread.is_alive() for thread in threads)
    assert not hung, f"{hung} of {len(threads)} threads still running after {timeout:g} s"


def load_kubeconfig_fixture(name: str) -> str:
    """Return the text of ``tests/fixtures/kubeconfig/<name>``."""
    return (FIXTURES / "kubeconfig" / name).read_text()


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


def send_json(handler: http.server.BaseHTTPRequestHandler, status: int, body: Any) -> None:
    """Answer ``body`` as JSON with ``status`` from a ``serving`` handler (Content-Type and Content-Length set)."""
    payload = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


def status_body(message: str, code: int = 403) -> bytes:
    """A Kubernetes ``Status`` body (JSON) carrying ``message``."""
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}).encode()


def registered(fleet_cluster, tmp_path: Path, name: str, token: bool = True, **emulator_options) -> tuple[Any, Any, Path, Path]:
    """Register the emulated fleet cluster ``name`` (``fleet_cluster``: the fixture's factory).

    Returns ``(Cluster, EmulatedCluster, kubeconfig_path, token_path)``: the files an operator process reads, the token
    a valid operator token (or ``not-a-valid-token`` when ``token`` is false).
    """
    from clusters import services
    from clusters.operator_token.tokens import operator_token_mint

    emulated = fleet_cluster(name, **emulator_options)
    cluster = services.cluster_register(name=name, kubeconfig=kubeconfig_text(emulated), session_domain=f"{name}.example.com")
    kubeconfig_path = tmp_path / "kubeconfig.yaml"
    kubeconfig_path.write_text(kubeconfig_text(emulated))
    token_path = tmp_path / "internal-jwt"
    token_path.write_text(operator_token_mint(cluster_id=cluster.public_id) if token else "not-a-valid-token")
    return cluster, emulated, kubeconfig_path, token_path


def serve_seed(tmp_path: Path, seed: Path, *extra: str) -> tuple[subprocess.Popen, dict]:
    """Start ``python -m demo.emulator --seed SEED --port 0`` and wait (20 s at most) for its ready file.

    Returns:
        ``(process, ready info {"url", "pid"})``; the caller stops the process.
    """
    ready = tmp_path / "ready.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "demo.emulator", "--seed", str(seed), "--port", "0", "--ready-file", str(ready),
         "--log-level", "WARNING", *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), process.stdout.read().decode() if process.poll() is not None and process.stdout else ""
    return process, json.loads(ready.read_text())


def device(cluster, model_prefix: str):
    """The first ``GpuDevice`` of ``cluster`` whose model starts with ``model_prefix``."""
    from clusters.models import GpuDevice

    return GpuDevice.objects.filter(cluster=cluster, model__startswith=model_prefix).order_by("index", "pk").first()


def metered_session(cluster, *, owner=None, gpus=None, **fields):
    """A Running session on ``cluster`` (``SessionFactory`` with ``fields``) that usage can be charged to: created a
    day before ``T0`` (a window may not begin before its session) and holding ``gpus`` (``GpuDevice`` rows; all of the
    cluster's by default) as the operator reports them (``Session.devices``)."""
    from clusters.models import GpuDevice
    from sessions.models import Session
    from tests.factories import SessionFactory, UserFactory

    session = SessionFactory(cluster=cluster, owner=owner or UserFactory(), **fields)
    held = list(GpuDevice.objects.filter(cluster=cluster).order_by("pk")) if gpus is None else gpus
    Session.objects.filter(pk=session.pk).update(created_at=T0 - timedelta(days=1), started_at=T0 - timedelta(days=1),
                                                 devices=[g.uuid for g in held])
    session.refresh_from_db()
    return session


def sample(session, gpu, *, start: datetime = T0, seconds: float = 60, sample_id: str | None = None, **extra) -> dict:
    """One usage sample body of ``session`` on ``gpu`` (a ``GpuDevice`` or a UUID)."""
    uuid = gpu if isinstance(gpu, str) else gpu.uuid
    body = {
        "sample_id": sample_id or f"{session.public_id}:{uuid}:{next(_counter)}",
        "session_id": session.public_id,
        "device_uuid": uuid,
        "start": iso(start),
        "end": iso(start + timedelta(seconds=seconds)),
        "gpu_util_percent": 42.5,
        "memory_used_mib": 1024,
    }
    body.update(extra)
    return body


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler], *, tls=None) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (a free port) in a thread; yields the base URL (``http://127.0.0.1:<port>``,
    ``https://`` when ``tls`` is given: an object with ``ssl_context()``, e.g. ``demo.emulator.tls``'s CA)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.ssl_context().wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls is not None else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def lock_waiters(cursor) -> int:
    """How many sessions of this test's database wait on a lock (``pg_blocking_pids``), e.g. on a row this test holds.

    Counted per database, not server-wide: pytest-xdist's other workers run in their own test databases on the same
    server, and their waits must not be taken for this test's. Inside a transaction PostgreSQL keeps the first
    snapshot of ``pg_stat_activity`` it read, so each call clears it first.
    """
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0")
    return cursor.fetchone()[0]


@contextlib.contextmanager
def table_locked(model) -> Iterator[None]:
    """Hold an ACCESS EXCLUSIVE lock on ``model``'s table from another connection (a stuck migration, a slow database)."""
    from django.db import connections

    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute(f'LOCK TABLE "{model._meta.db_table}" IN ACCESS EXCLUSIVE MODE')
        yield
    finally:
        other.rollback()
        other.close()
