"""The control plane's time as seen from this operator, learnt from every answer, and this node's clock offset.

Every answer of the control plane (and its ``report_from_future`` refusal) carries ``server_time``. It is taken as the
control plane's time at the midpoint of that call's round trip (Cristian's algorithm: the answer was stamped, on
average, halfway through the call, so a slow network does not count as skew), and carried forward on this process's
monotonic clock, which NTP never steps: the control plane's time stays right when this node's wall clock jumps, and the
offset (control plane's time minus this node's wall clock) is the one of now, not of the last answer.

The offset is reported with each inventory (``clock_offset_seconds``, ``ClockOffset.payload``): the control plane shows
it as the ``clock_synced`` check. Status reports are never stamped later than the control plane's time
(``ClockOffset.control_plane_now``): one observed "in the future" by a clock ahead would be refused.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from contract import CLOCK_OFFSET_LIMIT, rfc3339

__all__ = ["ClockOffset", "utc_now"]

logger = logging.getLogger(__name__)


def utc_now() -> datetime.datetime:
    """This node's clock, timezone-aware UTC."""
    return datetime.datetime.now(datetime.UTC)


class ClockOffset:
    """The control plane's time (anchored at the last answer, carried on the monotonic clock), shared by every
    control-plane client of the process.

    Args:
        wall: this node's clock (UTC, timezone-aware); tests pass a controlled one.
        monotonic: a clock that never steps, in seconds; tests pass a controlled one.
    """

    def __init__(self, wall: Callable[[], datetime.datetime] = utc_now, monotonic: Callable[[], float] = time.monotonic):
        self.wall = wall
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._anchor: tuple[datetime.datetime, float] | None = None  # (control plane's time, monotonic then)

    def learn(self, server_time: Any, *, sent: float, received: float) -> bool:
        """Take the control plane's time from an answer's ``server_time``.

        Args:
            server_time: the answer's ``server_time`` (an RFC 3339 string with a zone); anything else is ignored.
            sent: ``monotonic()`` just before the request went out.
            received: ``monotonic()`` when the answer was in.

        Returns:
            Whether it was readable (else the previous estimate stays).
        """
        parsed = rfc3339.parse(server_time) if isinstance(server_time, str) else None
        if parsed is None:
            if server_time is not None:
                logger.debug("control plane answered an unreadable server_time %r; clock offset unchanged", str(server_time)[:64])
            return False
        with self._lock:
            self._anchor = (parsed, (sent + received) / 2)
        return True

    def control_plane_now(self) -> datetime.datetime:
        """The control plane's time now, as far as this process knows (this node's clock before the first answer)."""
        with self._lock:
            anchor = self._anchor
        if anchor is None:
            return self.wall()
        try:
            return anchor[0] + datetime.timedelta(seconds=self.monotonic() - anchor[1])
        except OverflowError:  # a server_time at the end of year 9999: no usable estimate
            return self.wall()

    @property
    def seconds(self) -> float | None:
        """Seconds to add to this node's clock now to get the control plane's (bounded by ``CLOCK_OFFSET_LIMIT``);
        None before the first readable answer."""
        with self._lock:
            known = self._anchor is not None
        if not known:
            return None
        offset = (self.control_plane_now() - self.wall()).total_seconds()
        return max(-CLOCK_OFFSET_LIMIT, min(CLOCK_OFFSET_LIMIT, offset))

    def payload(self) -> dict[str, float]:
        """``{"clock_offset_seconds": s}`` for an inventory report (milliseconds), or ``{}`` before the first answer."""
        offset = self.seconds
        return {} if offset is None else {"clock_offset_seconds": round(offset, 3)}
