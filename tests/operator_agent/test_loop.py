"""The operator's periodic loops (operator_agent.loop), on a fake clock and a stop flag the test controls."""

from __future__ import annotations

import logging
import threading

from operator_agent.loop import every, repeat


class FakeStop:
    """A stop flag whose ``wait`` records the pause and advances the fake clock instead of sleeping."""

    def __init__(self, clock: list[float], *, after_waits: int):
        self.clock = clock
        self.waits: list[float] = []
        self.after_waits = after_waits
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if seconds > 0:
            self.clock[0] += seconds
        if len(self.waits) >= self.after_waits:
            self._set = True
        return self._set


def test_every_runs_start_to_start_and_the_first_tick_at_once():
    clock = [100.0]
    stop = FakeStop(clock, after_waits=3)
    starts: list[float] = []
    durations = iter([2.0, 0.5, 12.0])

    def tick() -> None:
        starts.append(clock[0])
        clock[0] += next(durations)

    every(10.0, tick, stop, logger=logging.getLogger("test"), what="test tick", clock=lambda: clock[0])

    assert starts == [100.0, 110.0, 120.0]
    # a tick longer than the interval is followed by the next at once (a pause of 0 or less is no pause)
    assert stop.waits == [8.0, 9.5, -2.0]


def test_every_logs_an_unexpected_failure_and_goes_on(caplog):
    clock = [0.0]
    stop = FakeStop(clock, after_waits=2)
    calls = []

    def tick() -> None:
        calls.append(clock[0])
        if len(calls) == 1:
            raise RuntimeError("a bug")

    with caplog.at_level(logging.ERROR, logger="test"):
        every(5.0, tick, stop, logger=logging.getLogger("test"), what="test tick", clock=lambda: clock[0])

    assert calls == [0.0, 5.0]
    assert [r.getMessage() for r in caplog.records] == ["test tick failed unexpectedly"]
    assert caplog.records[0].exc_info is not None


def test_every_does_nothing_once_stopped():
    stop = threading.Event()
    stop.set()
    every(1.0, lambda: (_ for _ in ()).throw(AssertionError("ticked")), stop, logger=logging.getLogger("test"),
          what="test tick")


def test_repeat_pauses_as_each_step_says_with_the_given_wait():
    stop = threading.Event()
    pauses = iter([3.0, 0.0, 7.5])
    waited: list[float] = []

    def wait(seconds: float) -> None:
        waited.append(seconds)
        if len(waited) == 3:
            stop.set()

    repeat(lambda: next(pauses), stop, wait=wait)

    assert waited == [3.0, 0.0, 7.5]
