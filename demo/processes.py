"""Starting and stopping the demo's child processes (no Django here).

Each child runs in its own process group with its output in a log file, so that stopping the demo
(Ctrl-C, SIGTERM, an error, or the end of ``--smoke``) stops every process it started, children of
children included.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    """A started child process.

    Attributes:
        name: short label (``web``, ``operator-lab-c1``...).
        process: the ``subprocess.Popen``.
        log_path: where its stdout and stderr go.
    """

    name: str
    process: subprocess.Popen
    log_path: Path

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

    def start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> Child:
        """Start ``argv`` in a new session (process group) with ``env``; output to ``<log_dir>/<name>.log``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - the child owns it until it exits
        process = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        child = Child(name=name, process=process, log_path=log_path)
        self.children.append(child)
        return child

    def dead(self) -> list[Child]:
        """Children that have exited."""
        return [child for child in self.children if child.process.poll() is not None]

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


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def python_argv(*args: str) -> list[str]:
    """``[sys.executable, *args]``: run a module or script with the demo's own interpreter."""
    return [sys.executable, *args]
