"""Validation of the operator's inventory snapshot (``PUT /internal/v1/inventory``) against
``operator_agent.contract.INVENTORY_SCHEMA``.

Validated with ``jsonschema`` (compiled once): declarative, well kept, and fast enough for a
500-node snapshot, where nested DRF serializers would cost a Python object per device.
"""

from __future__ import annotations

from jsonschema import Draft202012Validator

from gshare.api import schema_problems, unstorable_text_path
from operator_agent import rfc3339
from operator_agent.contract import INVENTORY_SCHEMA

inventory_validator = Draft202012Validator(INVENTORY_SCHEMA)


def inventory_errors(body) -> list[str]:
    """Return readable problems with an inventory body (empty when valid).

    Each problem names the JSON path (``nodes[3].devices[0].memory_mib``) and what is wrong; also
    reports a check's ``checked_at`` that ``operator_agent.rfc3339.parse`` cannot read and duplicate node names and
    GPU UUIDs, which the schema cannot express.
    """
    problems = schema_problems(inventory_validator, body)
    if problems:
        return problems
    bad_text = unstorable_text_path(body)
    if bad_text:
        return [f"{bad_text}: contains a NUL character or an unpaired surrogate, which cannot be stored"]
    for name, result in (body.get("checks") or {}).items():
        if rfc3339.parse(result["checked_at"]) is None:
            problems.append(f"checks.{name}.checked_at: must be an RFC 3339 time with a zone, e.g. "
                            f"2026-11-29T16:00:00Z; got {result['checked_at'][:64]!r}")
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
