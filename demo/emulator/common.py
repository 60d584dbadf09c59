"""Small helpers shared by the emulator's modules: time stamps, headers, query flags, loopback check, and the
hand-over of a mutation's outcome to the fallback serving the request."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def header_value(headers: Mapping[str, str], name: str) -> str:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return ""


def truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1", "yes")


@dataclass
class Outcome:
    """What a mutation produced; the fallback serving the request renders it."""

    status: int
    body: Any


class WatchClosed(Exception):
    """Put on the buses when the emulator shuts down: every open watch ends its stream."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
