"""Errors answered as Kubernetes ``Status`` objects, with the apiserver's reasons and messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import kmock

from demo.emulator.resources import ResourceSpec


@attrs.frozen
class ApiError(kmock.KubernetesError):
    """An error answered as a Kubernetes ``Status`` object.

    Attributes:
        status: HTTP status code (also the Status ``code``).
        reason: the Status ``reason`` (``NotFound``, ``AlreadyExists``, ``Conflict`` ...).
        message: the Status ``message``.
        details: the Status ``details`` (``name``, ``group``, ``kind``, ``causes``), or None.
    """


def not_found(spec: ResourceSpec, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{qualified(spec)} "{name}" not found', status_details(spec, name))


def qualified(spec: ResourceSpec) -> str:
    return f"{spec.plural}.{spec.group}" if spec.group else spec.plural


def status_details(spec: ResourceSpec, name: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": spec.plural}
    if spec.group:
        details["group"] = spec.group
    details.update(extra)
    return details


def no_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", None)


def status_document(code: int, reason: str, message: str, details: Mapping[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = dict(details)
    return status


def watch_error(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"type": "ERROR", "object": status_document(code, reason, message, None)}
