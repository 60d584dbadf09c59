"""``GET /api/v1/audit``: the audit trail, staff only. Parses the filters and calls the selector."""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, permissions, viewsets

from audit import selectors
from audit.api.filters import AuditFilter
from audit.api.serializers import AuditRecordSerializer
from core.api.base import Pagination, query_time


class IsStaff(permissions.BasePermission):
    """Only staff users."""

    message = "Only staff users may read the audit trail: ask an operator of this control plane."

    def has_permission(self, request, view) -> bool:  # noqa: D102
        return bool(request.user and request.user.is_staff)


@extend_schema(parameters=[
    OpenApiParameter("actor", str, description="Only rows of this actor (api:alice); ending with ':' every actor of that kind (beat:)"),
    OpenApiParameter("action", str, description="Only rows of this action (cluster_update, session_stop, ...)"),
    OpenApiParameter("cluster", str, description=AuditFilter.base_filters["cluster"].extra["help_text"]),
    OpenApiParameter("object", str, description="Only rows about this object: its id (ses_..., vol_..., a signing key's kid)"),
    OpenApiParameter("since", str, description="Only rows written at or after this ISO 8601 time (with a zone)"),
    OpenApiParameter("until", str, description="Only rows written before this ISO 8601 time (with a zone)"),
])
@extend_schema_view(list=extend_schema(description="List rows (two queries: the count and the page)."))
class AuditViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/audit``: who did what, newest first (staff only), paginated ``?limit=&offset=``."""

    serializer_class = AuditRecordSerializer
    permission_classes = [permissions.IsAuthenticated, IsStaff]
    pagination_class = Pagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = AuditFilter

    def get_queryset(self):  # noqa: D102
        params = self.request.query_params
        return selectors.audit_list(
            actor=params.get("actor") or None, action=params.get("action") or None, object_id=params.get("object") or None,
            since=query_time(self.request, "since"), until=query_time(self.request, "until"),
        )
