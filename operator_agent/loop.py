"""The operator's periodic loops: each of its threads repeats one step until the process's stop flag is set.

``every`` runs a tick on a fixed period, start to start, the first at once (inventory, volume sync, usage, GPU
activity); ``repeat`` runs a step that says how long to pause before the next one (the session reconciler's Kopf
restarts, the status reporter's flushes). A pause ends at once when the stop flag is set (or, with ``wait``, when
whatever that waits on is set).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["every", "repeat"]


def repeat(step: Callable[[], float], stop: threading.Event, *,
           wait: Callable[[float], object] | None = None) -> None:
    """Call ``step`` until ``stop`` is set, pausing after each call for the seconds it returns.

    Args:
        step: one round of work; returns the pause before the next round (0 or less: none).
        stop: checked before each round.
        wait: how to pause (default ``stop.wait``: the pause ends when ``stop`` is set). Another event's ``wait`` lets
            that event cut a pause short too; whoever sets ``stop`` must then set it as well.
    """
    wait = wait or stop.wait
    while not stop.is_set():
        wait(step())


def every(interval: float, tick: Callable[[], object], stop: threading.Event, *, logger: logging.Logger,
          what: str, clock: Callable[[], float] = time.monotonic) -> None:
    """Call ``tick`` every ``interval`` seconds (start to start, the first at once) until ``stop`` is set.

    A tick that takes longer than ``interval`` is followed by the next at once. An exception escaping ``tick`` is
    logged on ``logger`` with its traceback (``"<what> failed unexpectedly"``) and the loop goes on: one bug must not
    stop the operator's reports.

    Args:
        interval: seconds between the starts of two ticks.
        tick: one round of work; it handles the failures it expects itself.
        stop: set to end the loop; the pause between ticks ends at once.
        logger, what: where and as what an unexpected failure is logged (e.g. ``"inventory tick"``).
        clock: monotonic seconds.
    """

    def step() -> float:
        started = clock()
        try:
            tick()
        except Exception:  # keep the operator alive across unexpected bugs; the traceback is logged
            logger.exception("%s failed unexpectedly", what)
        return interval - (clock() - started)

    repeat(step, stop)
