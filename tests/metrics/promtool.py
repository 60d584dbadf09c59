"""promtool (Debian package ``prometheus``), which hack/test-deps.sh installs when run as root."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def promtool() -> str:
    """The path of promtool; fails the test as root (test-deps.sh installs it), skips it otherwise."""
    path = shutil.which("promtool", path=os.environ.get("PATH", "") + ":/usr/bin:/usr/sbin")
    if path is None:
        message = "promtool is not installed: bash hack/test-deps.sh promtool (the Debian package prometheus)"
        if os.geteuid() == 0:
            pytest.fail(message)
        pytest.skip(message)
    return path


def check(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """Run ``promtool check ARGS...``; returns the finished process (stdout and stderr as text)."""
    return subprocess.run([promtool(), "check", *args], input=stdin, capture_output=True, timeout=60, check=False)
