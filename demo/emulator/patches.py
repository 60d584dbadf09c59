"""JSON merge patch (RFC 7386) and what the emulator makes of strategic merge patches."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch (``null`` deletes a key, objects merge, anything else replaces).

    Args:
        target: the current document (not modified).
        patch: the merge patch.

    Returns:
        A new document.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strip_directives(value: Any) -> Any:
    """Drop strategic-merge-patch directives (``$patch``, ``$setElementOrder/...``, ``$retainKeys`` ...)."""
    if isinstance(value, Mapping):
        return {k: strip_directives(v) for k, v in value.items() if not str(k).startswith("$")}
    if isinstance(value, list):
        return [strip_directives(v) for v in value if not (isinstance(v, Mapping) and "$patch" in v)]
    return value


def spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
