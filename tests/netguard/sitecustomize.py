"""Loopback-only network guard for the Python processes the tests start (operators, gunicorn, the demo).

``tests/conftest.py`` puts this folder first on ``PYTHONPATH`` and sets ``GSHARE_NETGUARD=1``, so every
Python subprocess that inherits the environment imports this module at start-up (``site`` imports
``sitecustomize``). The test process itself is guarded by pytest-socket (``--allow-hosts`` in
pyproject.toml); this covers its children. A connection to an address outside 127.0.0.0/8 and ::1 raises
``ConnectionRefusedError`` before any packet is sent.
"""

from __future__ import annotations

import ipaddress
import os
import socket


def allowed(host) -> bool:
    """Whether a connect target may be dialled: loopback addresses, or names that resolve only to them.

    Args:
        host: the host part of a socket address (an IP literal or a name).
    """
    try:
        return ipaddress.ip_address(str(host).split("%", 1)[0]).is_loopback
    except ValueError:
        pass
    try:
        infos = _true_getaddrinfo(host, None)
    except OSError:
        return True  # an unresolvable name cannot be dialled anyway; the real connect reports it
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%", 1)[0]).is_loopback for info in infos)


_true_getaddrinfo = socket.getaddrinfo
_true_connect = socket.socket.connect
_true_connect_ex = socket.socket.connect_ex


def _check(sock, address) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and not allowed(address[0]):
        raise ConnectionRefusedError(f"gShare test network guard: {address[0]!r} is not a loopback address")


def _guarded_connect(self, address):
    _check(self, address)
    return _true_connect(self, address)


def _guarded_connect_ex(self, address):
    _check(self, address)
    return _true_connect_ex(self, address)


if os.environ.get("GSHARE_NETGUARD") == "1":
    socket.socket.connect = _guarded_connect
    socket.socket.connect_ex = _guarded_connect_ex
