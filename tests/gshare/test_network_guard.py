"""The suite dials loopback only: pytest-socket guards this process, tests/netguard/sitecustomize.py its children.

No test here opens a connection to a non-loopback address; the guards' decisions are checked instead.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.netguard import sitecustomize as guard


@pytest.mark.parametrize("host", ["127.0.0.1", "127.5.6.7", "::1", "localhost"])
def test_loopback_targets_are_allowed(host):
    assert guard.allowed(host)


@pytest.mark.parametrize("host", ["10.0.0.1", "192.168.1.1", "172.16.0.1", "8.8.8.8", "2001:db8::1", "169.254.169.254", "0.0.0.0"])
def test_other_targets_are_refused(host):
    assert not guard.allowed(host)


def test_this_process_is_guarded_by_pytest_socket():
    assert socket.socket.connect.__name__ == "guarded_connect"
    assert socket.socket.connect.__module__ == "pytest_socket"


def test_python_subprocesses_load_the_guard():
    code = ("import json, socket, sitecustomize; "
            "print(json.dumps([socket.socket.connect is sitecustomize._guarded_connect, sitecustomize.allowed('192.0.2.1')]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == [True, False]
