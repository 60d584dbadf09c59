"""The control plane's time as seen from this operator: the offset of this node's clock, learnt from every answer.

Every answer of the control plane (and its ``report_from_future`` refusal) carries ``server_time``. The offset is
``server_time`` minus the midpoint of that call's round trip on this node's clock (Cristian's algorithm: the answer was
stamped, on average, halfway through the call), so a slow network does not count as skew. The newest estimate wins: a
clock stepped by NTP is followed at the next answer.

The offset is reported with each inventory (``clock_offset_seconds``, ``ClockOffset.payload``): the control plane shows
it as the ``clock_synced`` check. Status reports are never stamped later than the control plane's time
(``ClockOffset.control_plane_now``): one observed "in the future" by a clock ahead would be refused.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

from operator_agent import rfc3339
from operator_agent.contract import CLOCK_OFFSET_LIMIT

__all__ = ["ClockOffset", "utc_now"]

logger = logging.getLogger(__name__)


def utc_now() -> datetime.datetime:
    """This node's clock, timezone-aware UTC."""
    return datetime.datetime.now(datetime.UTC)


class ClockOffset:
    """The latest estimate of (control plane's clock - this node's clock), shared by every control-plane client.

    Args:
        wall: this node's clock (UTC, timezone-aware); tests pass a controlled one.
    """

    def __init__(self, wall: Callable[[], datetime.datetime] = utc_now):
        self.wall = wall
        self._lock = threading.Lock()
        self._seconds: float | None = None

    @property
    def seconds(self) -> float | None:
        """Seconds to add to this node's clock to get the control plane's; None before the first readable answer."""
        with self._lock:
            return self._seconds

    def learn(self, server_time: Any, *, sent: datetime.datetime, received: datetime.datetime) -> float | None:
        """Take a new estimate from an answer's ``server_time``.

        Args:
            server_time: the answer's ``server_time`` (an RFC 3339 string with a zone); anything else is ignored.
            sent: this node's clock just before the request went out.
            received: this node's clock when the answer was in.

        Returns:
            The new offset in seconds (bounded by ``CLOCK_OFFSET_LIMIT``), or None when ``server_time`` was not readable
            (the previous estimate stays).
        """
        parsed = rfc3339.parse(server_time) if isinstance(server_time, str) else None
        if parsed is None:
            if server_time is not None:
                logger.debug("control plane answered an unreadable server_time %r; clock offset unchanged", str(server_time)[:64])
            return None
        midpoint = sent + (received - sent) / 2
        offset = max(-CLOCK_OFFSET_LIMIT, min(CLOCK_OFFSET_LIMIT, (parsed - midpoint).total_seconds()))
        with self._lock:
            self._seconds = offset
        return offset

    def control_plane_now(self) -> datetime.datetime:
        """The control plane's time now, as far as this node knows (its own clock before the first answer)."""
        now, offset = self.wall(), self.seconds
        if offset is None:
            return now
        try:
            return now + datetime.timedelta(seconds=offset)
        except OverflowError:  # an offset past year 9999: no usable estimate
            return now

    def payload(self) -> dict[str, float]:
        """``{"clock_offset_seconds": s}`` for an inventory report (milliseconds), or ``{}`` before the first answer."""
        offset = self.seconds
        return {} if offset is None else {"clock_offset_seconds": round(offset, 3)}
