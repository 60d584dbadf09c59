"""JSON Schema of the operator's inventory snapshot (``PUT /internal/v1/inventory``).

Validated with ``jsonschema`` (compiled once): declarative, well kept, and fast enough for a
500-node snapshot, where nested DRF serializers would cost a Python object per device.
"""

from __future__ import annotations

from jsonschema import Draft202012Validator

from gshare.api import describe_schema_error, unstorable_text_path

_DEVICE = {
    "type": "object",
    "required": ["uuid", "index", "model", "memory_mib", "split_count", "cores", "health"],
    "properties": {
        "uuid": {"type": "string", "minLength": 1, "maxLength": 128},
        "index": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "model": {"type": "string", "minLength": 1, "maxLength": 128},
        "memory_mib": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "split_count": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        "cores": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "health": {"type": "boolean"},
        "mode": {"type": ["string", "null"], "maxLength": 32},
    },
}

INVENTORY_SCHEMA = {
    "type": "object",
    "required": ["nodes"],
    "properties": {
        "nodes": {
            "type": "array",
            "maxItems": 5000,
            "items": {
                "type": "object",
                "required": ["name", "ready", "devices"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 253},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "ready": {"type": "boolean"},
                    "hami_error": {"type": "string"},
                    "devices": {"type": "array", "maxItems": 64, "items": _DEVICE},
                },
            },
        }
    },
}

inventory_validator = Draft202012Validator(INVENTORY_SCHEMA)


def inventory_errors(body) -> list[str]:
    """Return readable problems with an inventory body (empty when valid).

    Each problem names the JSON path (``nodes[3].devices[0].memory_mib``) and what is wrong; also
    reports duplicate node names and GPU UUIDs, which the schema cannot express.
    """
    problems = []
    for error in sorted(inventory_validator.iter_errors(body), key=lambda e: list(e.absolute_path))[:10]:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".") or "body"
        problems.append(f"{path}: {describe_schema_error(error)}")
    if problems:
        return problems
    bad_text = unstorable_text_path(body)
    if bad_text:
        return [f"{bad_text}: contains a NUL character or an unpaired surrogate, which cannot be stored"]
    names, uuids = set(), set()
    for i, node in enumerate(body["nodes"]):
        if node["name"] in names:
            problems.append(f"nodes[{i}].name: node {node['name']!r} appears twice")
        names.add(node["name"])
        for j, device in enumerate(node["devices"]):
            if device["uuid"] in uuids:
                problems.append(f"nodes[{i}].devices[{j}].uuid: GPU {device['uuid']!r} appears twice")
            uuids.add(device["uuid"])
    return problems[:10]
