"""Operator-facing views under ``/internal/v1/`` (authenticated by operator JWTs)."""

from __future__ import annotations

from django.utils import timezone
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters import services
from clusters.diagnosis import connect_ext_authz_url, connect_verify_url
from clusters.errors import INVALID_INVENTORY
from clusters.internal.authentication import OperatorTokenAuthentication
from clusters.internal.schemas import inventory_errors, inventory_read
from clusters.operator_token.tokens import TokenRefreshThrottled, operator_token_exchange
from core.api.base import SafeJSONParser
from core.exceptions import ApplicationError


class OperatorAPIView(APIView):
    """Base of every ``/internal/v1`` view: operator token only, JSON in and out."""

    authentication_classes = [OperatorTokenAuthentication]
    permission_classes = [IsAuthenticated]
    parser_classes = [SafeJSONParser]

    @property
    def cluster(self):
        """The cluster named in the caller's token."""
        return self.request.user.cluster


class InventoryView(OperatorAPIView):
    """``PUT /internal/v1/inventory``: a full snapshot of the cluster's GPU nodes and devices, or a digest-only report
    that the last one applied still holds."""

    def put(self, request):
        """Apply the snapshot, or confirm the one recorded (``digest`` without ``nodes``; 409
        ``inventory_snapshot_required`` when it is not the recorded one). The optional ``checks`` are recorded as
        ``Cluster.operator_checks`` either way, and the optional ``clock_offset_seconds`` as
        ``Cluster.clock_offset_seconds``. Answer ``digest`` (the one recorded: "" asks for a full snapshot next time),
        ``unchanged`` (a digest-only report), counts for a full snapshot (``*_missing``: left out but kept, live
        sessions hold them), what the operator is to check next (``session_domain``, ``ingress_node``,
        ``connect_verify_url``; ``routing`` and ``connect_ext_authz_url``, which a ``gateway-api`` cluster's operator
        probes instead: ``contract.INVENTORY_RESPONSE_ROUTING_KEYS``) and server time."""
        body = inventory_read(request.body)
        if body is None:  # the contract's own reader decides, and names what is wrong
            body = request.data
            problems = inventory_errors(body)
            if problems:
                raise ApplicationError(
                    "The inventory snapshot is malformed: " + "; ".join(problems) + ". Upgrade the operator to match this control plane.",
                    code=INVALID_INVENTORY,
                )
        if "nodes" in body:
            result = services.inventory_apply(cluster=self.cluster, nodes=body["nodes"], checks=body.get("checks"),
                                              digest=body.get("digest") or "", clock_offset=body.get("clock_offset_seconds"))
            counts = {"nodes": result.nodes, "gpus": result.gpus, "nodes_removed": result.nodes_removed,
                      "gpus_removed": result.gpus_removed, "nodes_missing": result.nodes_missing, "gpus_missing": result.gpus_missing}
        else:
            result = services.inventory_confirm(cluster=self.cluster, digest=body["digest"], checks=body.get("checks"),
                                                clock_offset=body.get("clock_offset_seconds"))
            counts = {}
        cluster = self.cluster
        return Response({
            "cluster": cluster.public_id,
            "digest": result.digest,
            "unchanged": result.unchanged,
            **counts,
            # What the operator checks from inside the cluster before its next report (operator_agent.session_path).
            "session_domain": cluster.session_domain,
            "ingress_node": cluster.ingress_node,
            "connect_verify_url": connect_verify_url(),
            "routing": cluster.routing,
            "connect_ext_authz_url": connect_ext_authz_url(),
            "server_time": timezone.now().isoformat(),
        })


class TokenView(OperatorAPIView):
    """``POST /internal/v1/token``: exchange the caller's valid operator token for a fresh one (self-refresh)."""

    def post(self, request):
        """Answer ``{"token", "expires_at", "generation", "server_time"}``: a token of the cluster's current
        generation with ``GSHARE_OPERATOR_TOKEN_TTL`` seconds of life, for the calling operator only (``no-store``).

        Only inside the presented token's refresh window (409 ``token_refresh_too_early`` with ``refresh_after``
        before it), at most ``GSHARE_OPERATOR_TOKEN_EXCHANGE_LIMIT`` a minute per cluster (429
        ``token_refresh_throttled`` with ``Retry-After``); see ``clusters.operator_token.tokens.operator_token_exchange``."""
        try:
            issued = operator_token_exchange(cluster=self.cluster, claims=request.auth)
        except TokenRefreshThrottled as exc:
            response = Response(exc.as_body(), status=exc.status)
            response["Retry-After"] = str(exc.retry_after)
            return response
        response = Response({
            "token": issued.token,
            "expires_at": issued.expires_at.isoformat(),
            "generation": issued.generation,
            "server_time": timezone.now().isoformat(),
        })
        response["Cache-Control"] = "no-store"
        return response
