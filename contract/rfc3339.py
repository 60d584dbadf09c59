"""RFC 3339 times, read and written the same way by the operator and the control plane.

Standard library only (``operator_agent`` imports no Django), so both sides import it. Times on the wire are
``2026-11-29T16:00:00Z`` or ``2026-11-29T16:00:00.123456+05:30``; what ``datetime.fromisoformat`` (Python 3.11)
reads is accepted, as long as the zone is ``Z`` or an offset in whole minutes (RFC 3339 ``time-offset``).
"""

from __future__ import annotations

import datetime

#: Longest time text read; a longer value is refused before it is parsed (the wire fields allow 64 characters).
MAX_LENGTH = 64

_UTC = datetime.UTC
_fromisoformat = datetime.datetime.fromisoformat


def offset_in_whole_minutes(raw: str) -> bool:
    """Whether the zone of ``raw`` (a time ``fromisoformat`` read as aware) is ``Z`` or written in hours and minutes.

    An offset with seconds (``+00:00:00.9``) is not RFC 3339, and Python 3.11 reads a sub-second one as UTC
    (``-00:00:00.9`` too), so its instant cannot be trusted; PostgreSQL could not store it either.
    """
    last = raw[-1]
    if last == "Z" or last == "z":
        return True
    # The offset's sign is the last + or - (a date's hyphens all come before index 9); with it, ±HH:MM is 6 characters.
    sign = max(raw.rfind("+"), raw.rfind("-"))
    return sign <= 8 or len(raw) - sign <= 6


def parse(value: object, *, naive_as_utc: bool = False) -> datetime.datetime | None:
    """``value`` as an aware ``datetime`` in UTC, or None when it is not an RFC 3339 time.

    Args:
        value: anything; only a printable ``str`` of at most ``MAX_LENGTH`` characters can be a time (Python 3.11's
            ``fromisoformat`` reads ``2026-11-29T16:00:00\\x00Z`` as a time, RFC 3339 has no control characters).
        naive_as_utc: read a time without a zone as UTC (what Kubernetes objects mean by one) instead of refusing it.

    Returns:
        The instant converted to UTC; None for a non-string, an unreadable text, a time without a zone (unless
        ``naive_as_utc``), an offset with seconds, or an instant outside years 1 to 9999 in UTC.
    """
    if type(value) is not str or not value or len(value) > MAX_LENGTH or not value.isprintable():
        return None
    try:
        parsed = _fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        if not naive_as_utc:
            return None
        return parsed.replace(tzinfo=_UTC)
    if not offset_in_whole_minutes(value):
        return None
    try:
        return parsed.astimezone(_UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+14:00 is before year 1 in UTC
        return None


def format_utc(moment: datetime.datetime, *, timespec: str = "seconds") -> str:
    """``moment`` (aware) in UTC with a ``Z``: ``2026-11-29T16:00:00Z`` (``timespec`` as ``datetime.isoformat``)."""
    return moment.astimezone(_UTC).isoformat(timespec=timespec).replace("+00:00", "Z")
