"""The tests' clock: the instant billing and period tests run at, and the sample times derived from it.

``GSHARE_TEST_NOW`` (RFC 3339, e.g. ``2026-11-30T23:59:30Z``) pins that instant: the ``controlled_clock`` fixture
(tests/conftest.py) moves the test process's clock there with time-machine, and :data:`T0` is derived from it, so a
test that builds an expectation from ``T0`` sees the same hour, day and month as the product does. Without it the
instant is the real time when the tests started. ``make test-clock`` runs tests/billing at the awkward instants
(a minute before midnight, across a month end).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

ENV = "GSHARE_TEST_NOW"


def test_now_from(value: str | None) -> datetime:
    """The instant named by ``value`` (RFC 3339 with an offset or ``Z``), or the real time now; aware, UTC.

    Raises:
        ValueError: ``value`` is not an RFC 3339 timestamp with an offset.
    """
    if not value:
        return datetime.now(UTC).replace(microsecond=0)
    instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if instant.tzinfo is None:
        raise ValueError(f"{ENV}={value!r} has no UTC offset: write it as 2026-11-30T23:59:30Z")
    return instant.astimezone(UTC)


#: The instant the controlled clock starts at (``GSHARE_TEST_NOW``, else the real time at import).
TEST_NOW = test_now_from(os.environ.get(ENV))

#: The moment the test samples start at (UTC): ten days before :data:`TEST_NOW`, on the hour, so every test window lies
#: inside the accepted range (GSHARE_USAGE_MAX_AGE_SECONDS before now .. a few minutes after now).
T0 = (TEST_NOW - timedelta(days=10)).replace(minute=0, second=0, microsecond=0)


def period_text(start: datetime, end: datetime) -> str:
    """``2026-11-20 15:00–16:00``, or ``2026-11-20 23:00–2026-11-21 00:00`` when the end falls on another day (UTC)."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    until = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
    return f"{start:%Y-%m-%d %H:%M}–{until}"
