"""gunicorn's configuration for gShare: ``gunicorn --config python:gshare.gunicorn_hooks``.

``logger_class`` is :class:`gshare.access_log.RedactingLogger`: no connect-link token, header credential or
token-shaped string reaches the access or error log (docs/connect.md, "Tokens and logs").

The server hooks serve prometheus-client's multiprocess mode.

With ``PROMETHEUS_MULTIPROC_DIR`` set (the Helm chart sets it for the api), every worker keeps its counters and
histograms in memory-mapped files in that directory and ``GET /metrics`` sums them over all workers
(prometheus-client's multiprocess mode, https://prometheus.github.io/client_python/multiprocess/). The directory
must start empty, or the counts of a previous run would be added in: the master empties it before forking.
Without the variable both hooks do nothing. The module imports neither Django nor the project: gunicorn reads it
in the master process, before the application is loaded.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

logger_class = "gshare.access_log.RedactingLogger"


def on_starting(server) -> None:
    """Empty (create if missing) ``PROMETHEUS_MULTIPROC_DIR`` before the first worker is forked."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def child_exit(server, worker) -> None:
    """Tell prometheus-client a worker is gone (its live gauges' files are dropped; its counters stay summed)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
