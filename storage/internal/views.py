"""Operator-facing view of the storage app: ``POST /internal/v1/storage`` (the operator's volume-sync tick)."""

from __future__ import annotations

from django.utils import timezone
from jsonschema import Draft202012Validator
from rest_framework.response import Response

import contract
from clusters.internal.views import OperatorAPIView
from contract import rfc3339
from core.api.base import schema_problems, unstorable_text_path
from core.exceptions import ApplicationError
from storage import services
from storage.errors import INVALID_STORAGE_REPORT

_validator = Draft202012Validator(contract.STORAGE_REPORT_SCHEMA)


def storage_report_errors(body) -> list[str]:
    """Readable problems with a storage report (empty when valid): schema errors with their JSON path, text
    PostgreSQL cannot store, a ``read_at`` that is not a zoned ISO 8601 time, and duplicates (a StorageClass, a
    volume or a node listed twice, a name twice in ``existing_storage_classes``)."""
    problems = schema_problems(_validator, body)
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
                code=INVALID_STORAGE_REPORT,
            )
        report = {**request.data, "read_at": rfc3339.parse(request.data["read_at"])}
        result = services.storage_report_apply(cluster=self.cluster, report=report)
        return Response({"server_time": timezone.now().isoformat(), **result})
