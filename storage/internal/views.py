"""Operator-facing view of the storage app: ``POST /internal/v1/storage`` (the operator's volume-sync tick)."""

from __future__ import annotations

from django.utils import timezone
from jsonschema import Draft202012Validator
from rest_framework.response import Response

from clusters.internal.views import OperatorAPIView
from gshare.api import describe_schema_error, unstorable_text_path
from gshare.exceptions import ApplicationError
from operator_agent import rfc3339
from storage import services

_BIG = 2**63 - 1

#: The body of ``POST /internal/v1/storage`` (docs/storage.md#operator-report).
STORAGE_REPORT_SCHEMA = {
    "type": "object",
    "required": ["read_at"],
    "properties": {
        "read_at": {"type": "string", "maxLength": 64},
        "storage_classes": {
            "type": "array",
            "maxItems": 1000,
            "items": {
                "type": "object",
                "required": ["storage_class"],
                "properties": {
                    "storage_class": {"type": "string", "minLength": 1, "maxLength": 253},
                    "capacity_bytes": {"type": ["integer", "null"], "minimum": 0, "maximum": _BIG},
                    "objects": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                },
            },
        },
        # Optional: an operator older than the field does not send it, and nothing is then known of its StorageClasses.
        "existing_storage_classes": {
            "type": "array",
            "maxItems": 1000,
            "items": {"type": "string", "minLength": 1, "maxLength": 253},
        },
        "volumes": {
            "type": "array",
            "maxItems": 5000,
            "items": {
                "type": "object",
                "required": ["volume_id", "phase"],
                "properties": {
                    "volume_id": {"type": "string", "pattern": "^vol_[a-z0-9]{1,32}$"},
                    "claim_name": {"type": "string", "maxLength": 253},
                    "phase": {"enum": ["Bound", "Pending", "Lost"]},
                    "volume_name": {"type": ["string", "null"], "maxLength": 253},
                    "message": {"type": ["string", "null"], "maxLength": 4000},
                },
            },
        },
        "nodes": {
            "type": "array",
            "maxItems": 5000,
            "items": {
                "type": "object",
                "required": ["name", "disk_bytes"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 253},
                    "disk_bytes": {"type": "integer", "minimum": 0, "maximum": _BIG},
                },
            },
        },
    },
}
_validator = Draft202012Validator(STORAGE_REPORT_SCHEMA)


def storage_report_errors(body) -> list[str]:
    """Readable problems with a storage report (empty when valid): schema errors with their JSON path, text
    PostgreSQL cannot store, a ``read_at`` that is not a zoned ISO 8601 time, and duplicates (a StorageClass, a
    volume or a node listed twice, a name twice in ``existing_storage_classes``)."""
    problems = []
    for error in sorted(_validator.iter_errors(body), key=lambda e: list(e.absolute_path))[:10]:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".") or "body"
        problems.append(f"{path}: {describe_schema_error(error)}")
    if problems:
        return problems
    bad_text = unstorable_text_path(body)
    if bad_text:
        return [f"{bad_text}: contains a NUL character or an unpaired surrogate, which cannot be stored"]
    if rfc3339.parse(body["read_at"]) is None:
        problems.append(f"read_at: must be an ISO 8601 time with a zone, e.g. 2026-11-29T16:00:00Z; got {body['read_at']!r}")
    for key, field in (("storage_classes", "storage_class"), ("volumes", "volume_id"), ("nodes", "name")):
        seen = set()
        for index, item in enumerate(body.get(key) or []):
            if item[field] in seen:
                problems.append(f"{key}[{index}].{field}: {item[field]!r} appears twice")
            seen.add(item[field])
    seen = set()
    for index, name in enumerate(body.get("existing_storage_classes") or []):
        if name in seen:
            problems.append(f"existing_storage_classes[{index}]: {name!r} appears twice")
        seen.add(name)
    return problems[:10]


class StorageReportView(OperatorAPIView):
    """``POST /internal/v1/storage``: CSIStorageCapacity readings, node disks and PVC statuses of the caller's cluster."""

    def post(self, request):
        """Apply the report; answer counts and server time."""
        problems = storage_report_errors(request.data)
        if problems:
            raise ApplicationError(
                "The storage report is malformed: " + "; ".join(problems) + ". Upgrade the operator to match this control plane.",
                code="invalid_storage_report",
            )
        report = {**request.data, "read_at": rfc3339.parse(request.data["read_at"])}
        result = services.storage_report_apply(cluster=self.cluster, report=report)
        return Response({"server_time": timezone.now().isoformat(), **result})
