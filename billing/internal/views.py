"""Operator-facing view of the billing app: ``POST /internal/v1/usage`` (the operator's usage samples)."""

from __future__ import annotations

from django.utils import timezone
from rest_framework.response import Response

from billing import ingest
from clusters.internal.views import OperatorAPIView
from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError


class UsageView(OperatorAPIView):
    """``POST /internal/v1/usage``: a batch of usage samples of the caller's cluster (docs/billing.md#usage-ingestion)."""

    def post(self, request):
        """Store and charge the batch; answer ``{"server_time", "accepted", "duplicates", "charged"}``."""
        body = request.data
        if not isinstance(body, dict) or "samples" not in body:
            raise ApplicationError('The body must be {"samples": [...]}: a list of usage samples.', code=INVALID_REQUEST)
        result = ingest.usage_ingest(cluster=self.cluster, samples=body["samples"])
        return Response({"server_time": timezone.now().isoformat(), **result})
