"""Helpers for the demo tests: running the emulator's command line on a seed file."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def serve_seed(tmp_path: Path, seed: Path, *extra: str) -> tuple[subprocess.Popen, dict]:
    """Start ``python -m demo.emulator --seed SEED --port 0`` and wait (20 s at most) for its ready file.

    Returns:
        ``(process, ready info {"url", "pid"})``; the caller stops the process.
    """
    ready = tmp_path / "ready.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "demo.emulator", "--seed", str(seed), "--port", "0", "--ready-file", str(ready),
         "--log-level", "WARNING", *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), process.stdout.read().decode() if process.poll() is not None and process.stdout else ""
    return process, json.loads(ready.read_text())
