"""The control plane under a real gunicorn, as the Helm chart runs it, against this test's database and Redis.

gunicorn is what hands the application the raw request target (``RAW_URI``) that Envoy's ext_authz check is judged
on; pytest-django's ``live_server`` (wsgiref) does not pass it. :func:`control_plane` (a pytest fixture) starts
``python -m gunicorn gshare.wsgi`` on ``127.0.0.1:<free port>`` with ``GSHARE_INTERNAL_HOSTS=127.0.0.1`` and
``DJANGO_ALLOWED_HOSTS`` naming the public host ``gshare.example.com`` and the internal one, waits until
``/internal/ping`` answers, and stops it at teardown. Tests using it commit their rows (``transaction=True``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from django.conf import settings
from django.db import connection

from gshare import embedded

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_HOST = "gshare.example.com"
INTERNAL_HOST = "127.0.0.1"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_url() -> str:
    """The URL of this test's database: the server's URL (DATABASE_URL or the embedded server) with its name."""
    base = os.environ.get("DATABASE_URL") or embedded.embedded_database_url()
    return urlsplit(base)._replace(path="/" + connection.settings_dict["NAME"]).geturl()


test_database_url.__test__ = False  # a helper, not a test


@contextmanager
def run_gunicorn(tmp_path: Path, *, env: dict[str, str], args: list[str]) -> Iterator[tuple[str, Path]]:
    """``python -m gunicorn gshare.wsgi`` on ``127.0.0.1:<free port>`` against this test's database and Redis.

    Args:
        tmp_path: where its home and log go.
        env: settings on top of the database, Redis, home and encryption keys (the parent's ``DJANGO_*``, ``DATABASE_*``,
            ``REDIS_*``, ``GSHARE_*`` and ``PROMETHEUS_*`` variables are dropped first).
        args: gunicorn's options after ``--bind``.

    Yields:
        ``(base URL, log file)`` once ``/internal/ping`` answers 204; the server is stopped on exit.
    """
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_", "GSHARE_", "PROMETHEUS_"))}
    environ.update({
        "DJANGO_SETTINGS_MODULE": "gshare.settings", "DATABASE_URL": test_database_url(), "REDIS_URL": settings.REDIS_URL,
        "GSHARE_HOME": str(tmp_path / "home"), "GSHARE_LOG_LEVEL": "WARNING",
        "GSHARE_ENCRYPTION_KEYS": ",".join(settings.GSHARE_ENCRYPTION_KEYS),  # the signing keys' private halves
        **env,
    })
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "gshare.wsgi", "--bind", f"127.0.0.1:{port}", *args, "--no-control-socket"],
            cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                if requests.get(url + "/internal/ping", timeout=5).status_code == 204:
                    break
            except requests.RequestException:  # not listening yet, or a worker still loading the application
                pass
            assert time.monotonic() < deadline, "gunicorn did not answer in 60 s:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        yield url, log
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture
def control_plane(tmp_path):
    """Start gunicorn (4 threads, 1 worker: every request sees the same process caches); yields its base URL."""
    with run_gunicorn(tmp_path, env={"GSHARE_INTERNAL_HOSTS": INTERNAL_HOST, "DJANGO_ALLOWED_HOSTS": f"{PUBLIC_HOST},{INTERNAL_HOST}"},
                      args=["--workers", "1", "--threads", "4"]) as (url, _log):
        yield url
