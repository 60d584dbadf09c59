"""What the benchmarks share: a throwaway database and Redis database, and Django set up against them.

``bench_environment()`` creates the database ``gshare_bench`` on the PostgreSQL server behind
``DATABASE_URL`` (or the embedded one when it is unset), migrates it, points Django (and the
environment, for child processes) at it and at Redis database 15 of the server behind ``REDIS_URL``
(or the embedded Redis), and drops the database on the way out, even after an error or Ctrl-C.
The demo's and the tests' data are never read or written.

Not a benchmark itself: the scripts next to it import it.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATABASE = "gshare_bench"
#: Redis database index the benchmarks use (``BENCH_REDIS_DB`` overrides it).
BENCH_REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "15"))

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        query["db"] = str(db)
        return f"unix://{parts.path}?{urlencode(query)}"
    return urlunsplit(parts._replace(path=f"/{db}"))


def _admin_connect(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _drop(url: str) -> None:
    with _admin_connect(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DATABASE}" WITH (FORCE)')


@contextlib.contextmanager
def bench_environment(*, quiet: bool = True) -> Iterator[dict[str, str]]:
    """Create, migrate and (on exit) drop the bench database; Django is set up inside.

    Yields:
        ``{"DATABASE_URL": ..., "REDIS_URL": ...}`` of the bench database and Redis database, for
        child processes (the same values are also in ``os.environ``).
    """
    from gshare import embedded

    # Keep the embedded servers' handles in this process: they run as long as it does.
    base_db = os.environ.get("DATABASE_URL") or embedded.embedded_database_url()
    base_redis = os.environ.get("REDIS_URL") or embedded.embedded_redis_url()
    if urlsplit(base_db).path.strip("/") == BENCH_DATABASE:
        raise SystemExit(f"DATABASE_URL already names {BENCH_DATABASE}: point it at the server's maintenance database (e.g. postgres).")
    bench_db = _with_database(base_db, BENCH_DATABASE)
    bench_redis = _with_redis_db(base_redis, BENCH_REDIS_DB)

    _drop(base_db)  # a run killed with SIGKILL may have left one behind
    with _admin_connect(base_db) as conn:
        conn.execute(f'CREATE DATABASE "{BENCH_DATABASE}"')
    try:
        os.environ["DATABASE_URL"] = bench_db
        os.environ["REDIS_URL"] = bench_redis
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gshare.settings")
        if quiet:
            os.environ.setdefault("GSHARE_LOG_LEVEL", "WARNING")
        import django

        django.setup()
        from django.core.management import call_command

        started = time.perf_counter()
        call_command("migrate", verbosity=0, interactive=False)
        log(f"database {BENCH_DATABASE} created and migrated in {time.perf_counter() - started:.1f} s")
        yield {"DATABASE_URL": bench_db, "REDIS_URL": bench_redis}
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        _drop(base_db)
        log(f"database {BENCH_DATABASE} dropped")


def log(message: str) -> None:
    """Progress line on stderr (results go to stdout)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, env: dict[str, str], workers: int, logfile: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``gunicorn gshare.wsgi`` on 127.0.0.1:``port`` and wait (at most 60 s) until ``/internal/ping`` answers 204.

    Args:
        port: TCP port on loopback. env: the bench environment (``bench_environment()``). workers: sync workers.
        logfile: where gunicorn's output goes. extra_env: more variables for the server (e.g. ``DATABASE_CONN_MAX_AGE``).

    Raises:
        RuntimeError: gunicorn exited or did not answer in time (with the end of its log).
    """
    command = [sys.executable, "-m", "gunicorn", "gshare.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
               "--no-control-socket"]  # gunicorn >= 27 would otherwise take a control socket another server may be using
    child_env = {**os.environ, **env, "DJANGO_SETTINGS_MODULE": "gshare.settings", "GSHARE_LOG_LEVEL": "WARNING", **(extra_env or {})}
    with open(logfile, "wb") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=child_env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.returncode}:\n{logfile.read_text()[-3000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                conn.request("GET", "/internal/ping")
                if conn.getresponse().status == 204:
                    return server
            finally:
                conn.close()
        except OSError:
            pass
        time.sleep(0.2)
    stop_server(server)
    raise RuntimeError(f"gunicorn did not answer within 60 s:\n{logfile.read_text()[-3000:]}")


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM gunicorn's master (it stops its workers), then SIGKILL after 15 s."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
