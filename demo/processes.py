"""Starting, supervising and stopping the demo's child processes (no Django here).

Each child runs in its own process group with its output in a log file, so that stopping the demo
(Ctrl-C, SIGTERM, an error, or the end of ``--smoke``) stops every process it started, children of
children included. A child that exits on its own is started again (:meth:`ProcessGroup.supervise`)
after a backoff of 1, 2, 4, 8, 16 s while it keeps failing within a minute of its start; the sixth such
failure in a row gives up (:class:`ChildFailed`), so a broken configuration still stops the demo.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: A child that ran at least this long before exiting starts its backoff again from the first step, seconds.
STABLE_SECONDS = 60.0
#: First restart delay, doubled for each further quick failure up to BACKOFF_MAX, seconds.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
#: Quick failures in a row (each within STABLE_SECONDS of its start) after which the child is given up.
MAX_QUICK_FAILURES = 5


class ChildFailed(RuntimeError):
    """A child kept exiting right after each restart; ``child`` is the one given up."""

    def __init__(self, child: Child):
        super().__init__(f"{child.name} exited with code {child.process.returncode} {child.failures} times in a row, "
                         f"each within {STABLE_SECONDS:g} s of its start; last lines of {child.log_path}:\n{child.log_tail()}")
        self.child = child


def _say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


@dataclass
class Child:
    """A started child process.

    Attributes:
        name: short label (``web``, ``operator-lab-c1``...).
        process: the ``subprocess.Popen`` of its current run.
        log_path: where its stdout and stderr go (appended to on each restart).
        argv, env, cwd: how to start it again (``argv`` may be changed, e.g. to pin a port chosen at the first start).
        restarts: how many times it has been started again.
        failures: exits in a row each within ``STABLE_SECONDS`` of its start (an exit after a longer run counts as the first).
        started_at: ``time.monotonic()`` of its current run.
        restart_at: ``time.monotonic()`` at which it is due to start again, while it is down.
    """

    name: str
    process: subprocess.Popen
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    restarts: int = 0
    failures: int = 0
    started_at: float = field(default_factory=time.monotonic)
    restart_at: float | None = None

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of its log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class ProcessGroup:
    """The set of processes one demo run started.

    Args:
        log_dir: folder for the children's log files (created).
    """

    log_dir: Path
    children: list[Child] = field(default_factory=list)
    say: Callable[[str], None] = _say

    def start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> Child:
        """Start ``argv`` in a new session (process group) with ``env``; output to ``<log_dir>/<name>.log``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        child = Child(name=name, process=_spawn(argv, env, cwd, log_path, "wb"), log_path=log_path, argv=list(argv), env=env, cwd=cwd)
        self.children.append(child)
        return child

    def dead(self) -> list[Child]:
        """Children that have exited (and are not running again yet)."""
        return [child for child in self.children if child.process.poll() is not None]

    def supervise(self) -> list[Child]:
        """Start again every child that has exited, once its backoff has passed; call it often (every second or so).

        An exit is announced at once (through ``say`` and in the child's log) with the delay; the restart when it
        happens. Returns the children started again by this call.

        Raises:
            ChildFailed: a child exited within ``STABLE_SECONDS`` of its start ``MAX_QUICK_FAILURES + 1`` times in a row.
        """
        now = time.monotonic()
        restarted = []
        for child in self.children:
            code = child.process.poll()
            if code is None:
                continue
            if child.restart_at is None:  # just noticed
                _signal_group(child.process, signal.SIGKILL)  # what it leaves behind (gunicorn, celery workers) would hold its port
                child.failures = child.failures + 1 if now - child.started_at < STABLE_SECONDS else 1
                if child.failures > MAX_QUICK_FAILURES:
                    raise ChildFailed(child)
                delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (child.failures - 1))
                child.restart_at = now + delay
                message = f"{child.name} exited with code {code}; restarting it in {delay:g} s (restart {child.restarts + 1}; log {child.log_path})"
                self.say(message)
                _append(child.log_path, f"[demo] {message}\n")
            if now >= child.restart_at:
                _append(child.log_path, f"[demo] restarting {child.name}\n")
                child.process = _spawn(child.argv, child.env, child.cwd, child.log_path, "ab")
                child.restarts += 1
                child.started_at, child.restart_at = time.monotonic(), None
                self.say(f"restarted {child.name} (pid {child.process.pid}, restart {child.restarts})")
                restarted.append(child)
        return restarted

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every child's process group (newest first), then SIGKILL what is left after ``timeout`` s."""
        for child in reversed(self.children):
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in reversed(self.children):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.process.wait(remaining)
            except subprocess.TimeoutExpired:
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait(5)
        # Grandchildren (gunicorn or celery workers) may outlive their parent by a moment.
        for child in self.children:
            _signal_group(child.process, signal.SIGKILL)
        self.children.clear()


def _spawn(argv: list[str], env: dict[str, str], cwd: Path | None, log_path: Path, mode: str) -> subprocess.Popen:
    with open(log_path, mode) as log:  # the child holds its own descriptor
        return subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def _append(path: Path, text: str) -> None:
    with open(path, "a") as log:
        log.write(text)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def python_argv(*args: str) -> list[str]:
    """``[sys.executable, *args]``: run a module or script with the demo's own interpreter."""
    return [sys.executable, *args]
