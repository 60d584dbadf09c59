"""The queue's order: the one rule that says who is ahead of whom (``QUEUE_ORDER``, ``order_key``).

Higher ``priority`` first (the owner's policy ``priority`` when queued; staff may change a session's), then arrival
(``queued_at``), then the session's pk (two arrivals in one microsecond). Backfill (``sessions.queue.plan``) lets a later
session start first only where it delays nobody ahead. Projects and fair share extend this function, not its callers.
"""

from __future__ import annotations

from datetime import datetime

#: ``order_key`` as an ORM ``order_by`` (served by the partial index ``session_queue_order_idx``).
QUEUE_ORDER = ("-priority", "queued_at", "id")


def order_key(*, priority: int, queued_at: datetime, pk: int) -> tuple:
    """The sort key of a queued session: smaller is further ahead.

    Args:
        priority: the session's priority (higher first).
        queued_at: when it joined the queue (aware).
        pk: its primary key (0 for a request not saved yet: it sorts after every saved one of its instant).
    """
    return (-priority, queued_at, pk or float("inf"))
