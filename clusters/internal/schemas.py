"""Validation of the operator's inventory report (``PUT /internal/v1/inventory``) against
``contract.INVENTORY_SCHEMA``.

Two readers, one verdict. ``inventory_read`` decodes and checks the raw body in one pass with ``msgspec`` (types
mirroring the schema, below): a 1,000-node snapshot in a few milliseconds, where ``json.loads`` alone takes twice
that and ``jsonschema`` half a second. It answers only "valid" (the body) or "not sure" (None); then
``inventory_errors`` judges the parsed body with ``jsonschema`` (compiled once), the contract's own reader, whose
readable problems are what a refusal names. A body the schema accepts is accepted either way (``tests`` check the
two agree on the cases that matter).
"""

from __future__ import annotations

import re
from typing import Annotated, NotRequired, TypedDict

import msgspec
from jsonschema import Draft202012Validator
from msgspec import Meta

from contract import (
    CLOCK_OFFSET_LIMIT,
    INVENTORY_DIGEST_LENGTH,
    INVENTORY_DIGEST_PATTERN,
    INVENTORY_RESOURCE_MAX,
    INVENTORY_SCHEMA,
    rfc3339,
)
from core.api.base import schema_problems, unstorable_text_path

inventory_validator = Draft202012Validator(INVENTORY_SCHEMA)

_INT32 = 2**31 - 1
_Count = Annotated[int, Meta(ge=0, le=_INT32)]
_Resource = Annotated[int, Meta(ge=0, le=INVENTORY_RESOURCE_MAX)]


class _Device(TypedDict):
    uuid: Annotated[str, Meta(min_length=1, max_length=128)]
    index: _Count
    model: Annotated[str, Meta(min_length=1, max_length=128)]
    memory_mib: _Count
    split_count: Annotated[int, Meta(ge=1, le=_INT32)]
    cores: _Count
    health: bool
    mode: NotRequired[Annotated[str, Meta(max_length=32)] | None]


class _Node(TypedDict):
    name: Annotated[str, Meta(min_length=1, max_length=253)]
    ready: bool
    devices: Annotated[list[_Device], Meta(max_length=64)]
    labels: NotRequired[dict[str, str]]
    hami_error: NotRequired[str]
    cpu_allocatable_millicores: NotRequired[_Resource]
    memory_allocatable_mib: NotRequired[_Resource]
    cpu_requested_millicores: NotRequired[_Resource]
    memory_requested_mib: NotRequired[_Resource]


class _Check(TypedDict):
    ok: bool
    detail: Annotated[str, Meta(max_length=1000)]
    checked_at: Annotated[str, Meta(max_length=64)]


class _Body(TypedDict):
    nodes: NotRequired[Annotated[list[_Node], Meta(max_length=5000)]]
    digest: NotRequired[Annotated[str, Meta(pattern=INVENTORY_DIGEST_PATTERN, max_length=INVENTORY_DIGEST_LENGTH)]]
    checks: NotRequired[Annotated[dict[Annotated[str, Meta(max_length=64)], _Check], Meta(max_length=16)]]
    clock_offset_seconds: NotRequired[Annotated[float, Meta(ge=-CLOCK_OFFSET_LIMIT, le=CLOCK_OFFSET_LIMIT)]]


_decoder = msgspec.json.Decoder(_Body)
#: What may decode to text PostgreSQL cannot store: an escaped NUL or surrogate, or a UTF-8-encoded surrogate. Found
#: (rarely, and also inside an escaped backslash), the body is left to the schema's reader, which searches all of it
#: exactly (``unstorable_text_path``), keys this reader drops included.
_MAYBE_UNSTORABLE = re.compile(rb"\\u0000|\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def inventory_read(raw: bytes) -> dict | None:
    """The inventory body in ``raw`` (JSON bytes) when it is certainly valid, else None (judge it with
    ``inventory_errors``).

    Valid: the schema's types and bounds, ``nodes`` or ``digest``, storable text, readable ``checked_at``, node names
    and GPU UUIDs unique in the snapshot. Keys the schema does not name are dropped.
    """
    try:
        body = _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if "nodes" not in body and "digest" not in body:
        return None
    if _MAYBE_UNSTORABLE.search(raw):  # also in a key this reader drops, which the schema's reader refuses too
        return None
    if any(rfc3339.parse(result["checked_at"]) is None for result in (body.get("checks") or {}).values()):
        return None
    nodes = body.get("nodes") or []
    uuids = [device["uuid"] for node in nodes for device in node["devices"]]
    if len(set(uuids)) != len(uuids) or len({node["name"] for node in nodes}) != len(nodes):
        return None
    return body


def inventory_errors(body) -> list[str]:
    """Return readable problems with an inventory body (empty when valid).

    Each problem names the JSON path (``nodes[3].devices[0].memory_mib``) and what is wrong; also
    reports a check's ``checked_at`` that ``contract.rfc3339.parse`` cannot read and duplicate node names and
    GPU UUIDs, which the schema cannot express.
    """
    problems = schema_problems(inventory_validator, body)
    if problems:
        return problems
    if "nodes" not in body and "digest" not in body:
        return ["nodes: is required (a full snapshot), or digest alone (a digest-only report)"]
    bad_text = unstorable_text_path(body)
    if bad_text:
        return [f"{bad_text}: contains a NUL character or an unpaired surrogate, which cannot be stored"]
    for name, result in (body.get("checks") or {}).items():
        if rfc3339.parse(result["checked_at"]) is None:
            problems.append(f"checks.{name}.checked_at: must be an RFC 3339 time with a zone, e.g. "
                            f"2026-11-29T16:00:00Z; got {result['checked_at'][:64]!r}")
    names, uuids = set(), set()
    for i, node in enumerate(body.get("nodes") or []):
        if node["name"] in names:
            problems.append(f"nodes[{i}].name: node {node['name']!r} appears twice")
        names.add(node["name"])
        for j, device in enumerate(node["devices"]):
            if device["uuid"] in uuids:
                problems.append(f"nodes[{i}].devices[{j}].uuid: GPU {device['uuid']!r} appears twice")
            uuids.add(device["uuid"])
    return problems[:10]
