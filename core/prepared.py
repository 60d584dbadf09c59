"""Server-side prepared statements for the few big statements run on every session start (``GSHARE_DB_PREPARED_STATEMENTS``).

Django's cursors bind parameters on the client, so PostgreSQL parses and plans every statement each time it runs.
``statement_cursor()`` gives, when the setting is on, a cursor that binds on the server and prepares each statement
on its first run on a connection (psycopg 3 keeps the prepared statements per connection, the 100 most recently used);
later runs skip parsing and, once PostgreSQL settles on a generic plan, planning. psycopg deallocates them all at
any rollback on the connection (a refused request's, too): the next runs prepare them again. Off, it is
``connection.cursor()``.

Off by default: a prepared statement lives in one server session, and a pooler in transaction mode that gives each
transaction another server session (PgBouncer before 1.21, or 1.21+ without ``max_prepared_statements``) breaks it
("prepared statement ... does not exist"). Turn it on with a direct connection or a pooler that tracks protocol-level
prepared statements.
"""

from __future__ import annotations

import sys

import psycopg
from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper


class _PreparingCursor(psycopg.Cursor):
    """Server-side binding, every statement prepared (``execute(..., prepare=True)``)."""

    def execute(self, query, params=None, *, prepare=None, binary=None):  # noqa: ARG002 - Django passes neither
        return super().execute(query, params, prepare=True, binary=binary)


class _DebugWrapper(CursorDebugWrapper):
    """Logs (``connection.queries``, ``CaptureQueriesContext``) the statement as written, with its placeholders:
    Django reads the executed text from client-side binding's state, which a server-binding cursor leaves empty."""

    def debug_sql(self, sql=None, params=None, use_last_executed_query=False, many=False):  # noqa: ARG002 - always the text
        return super().debug_sql(sql, params, use_last_executed_query=False, many=many)


def statement_cursor():
    """A cursor of the default connection (a Django ``CursorWrapper``: query logging and counting as usual) for one
    of the per-decision statements written for it: ``%(name)s`` or ``%s`` placeholders whose values need no
    client-side interpolation (casts written in the SQL where a type is not implied). Use it as a context manager.
    """
    if not settings.GSHARE_DB_PREPARED_STATEMENTS:
        return connection.cursor()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:
        # Django turns psycopg's automatic preparation off (prepare_threshold None), which also refuses an explicit
        # prepare=True: only the statements this module runs get prepared, as no other cursor asks.
        raw.prepare_threshold = sys.maxsize
    cursor = _PreparingCursor(raw)
    connection.validate_thread_sharing()
    return _DebugWrapper(cursor, connection) if connection.queries_logged else connection.make_cursor(cursor)
