"""Public API views for billing: the caller's account and ledger, staff grants. They parse input and call
services/selectors."""

from __future__ import annotations

import codecs
from decimal import Decimal

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, permissions, status, viewsets
from rest_framework.response import Response
from rest_framework.utils import json as drf_json

from billing import selectors, services
from billing.api.serializers import AccountSerializer, AccrualSerializer, GrantCreateSerializer, LedgerEntrySerializer, PriceListSerializer
from core.api.base import SafeJSONParser, query_time

USER_FILTER = OpenApiParameter("user", str, description="Staff only: the username (ignored for other users); without it, the caller's own")


class DecimalJSONParser(SafeJSONParser):
    """JSON with every non-integer number read as a ``Decimal`` (amounts never pass through a float); NaN and
    Infinity refused as DRF's parser does."""

    def parse(self, stream, media_type=None, parser_context=None):  # noqa: D102
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return drf_json.load(codecs.getreader(encoding)(stream), parse_float=Decimal)
        except RecursionError:
            raise exceptions.ParseError("JSON nested too deeply.") from None
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None


class IsStaff(permissions.BasePermission):
    """Only staff users."""

    message = "Only staff users may grant credits: ask an operator of this control plane."

    def has_permission(self, request, view) -> bool:  # noqa: D102
        return bool(request.user and request.user.is_staff)


def _subject(request):
    """The user an account request is about: the caller, or (staff) ``?user=``."""
    username = request.query_params.get("user")
    if username and request.user.is_staff and username != request.user.get_username():
        return services.user_by_username(username)
    return request.user


@extend_schema(parameters=[USER_FILTER])
class AccountViewSet(viewsets.GenericViewSet):
    """``GET /api/v1/billing/account``: balance, accrued usage, holds, available credits and burn rate of the caller."""

    serializer_class = AccountSerializer
    pagination_class = None

    @extend_schema(responses=AccountSerializer)
    def list(self, request):
        """The caller's account (staff: ``?user=<username>``); see docs/billing.md#the-api."""
        return Response(AccountSerializer(selectors.account_summary(_subject(request))).data)


class PriceListViewSet(viewsets.GenericViewSet):
    """``GET /api/v1/prices``: credits per GPU-hour of every GPU model in the fleet (every signed-in user)."""

    serializer_class = PriceListSerializer
    pagination_class = None

    @extend_schema(responses=PriceListSerializer)
    def list(self, request):
        """Credits per GPU-hour of each GPU model the fleet has, with its memory and how many GPUs are free now."""
        return Response(PriceListSerializer(selectors.price_list()).data)


@extend_schema(parameters=[
    OpenApiParameter("session", str, description="Only entries of this session (ses_...)"),
    OpenApiParameter("since", str, description="Only entries written at or after this ISO 8601 time (with a zone)"),
    OpenApiParameter("until", str, description="Only entries written before this ISO 8601 time (with a zone)"),
    USER_FILTER,
])
@extend_schema_view(list=extend_schema(description="List entries (paginated: ``?limit=&offset=``)."))
class LedgerViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/billing/ledger``: the caller's ledger entries, newest first (staff: another user's with ``?user=``)."""

    serializer_class = LedgerEntrySerializer

    def get_queryset(self):  # noqa: D102
        params = self.request.query_params
        return selectors.ledger_list(
            user=self.request.user, session=params.get("session") or None, since=query_time(self.request, "since"),
            until=query_time(self.request, "until"), username=params.get("user") or None,
        )


@extend_schema(parameters=[OpenApiParameter("session", str, description="Only this session's (ses_...)"), USER_FILTER])
@extend_schema_view(list=extend_schema(description="List open accruals (paginated: ``?limit=&offset=``)."))
class AccrualViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """``GET /api/v1/billing/accruals``: the caller's sessions' usage of open billing periods, not charged yet (staff:
    another user's with ``?user=``)."""

    serializer_class = AccrualSerializer

    def get_queryset(self):  # noqa: D102
        params = self.request.query_params
        return selectors.accrual_list(user=self.request.user, session=params.get("session") or None,
                                      username=params.get("user") or None)


class GrantViewSet(viewsets.GenericViewSet):
    """``POST /api/v1/billing/grants`` (staff): give a user credits, once per ``Idempotency-Key``."""

    serializer_class = LedgerEntrySerializer
    permission_classes = [permissions.IsAuthenticated, IsStaff]
    parser_classes = [DecimalJSONParser]

    @extend_schema(
        request=GrantCreateSerializer, responses={201: LedgerEntrySerializer, 200: LedgerEntrySerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, location=OpenApiParameter.HEADER, required=True,
                                     description="Unique per grant (e.g. a UUID): a retry with the same key returns the first entry")],
    )
    def create(self, request):
        """Grant credits: 201 with the new entry, or 200 with the same entry for a retry of the same key."""
        key = request.headers.get("Idempotency-Key", "").strip()
        if not key:
            raise services.IdempotencyKeyMissing(
                "Send an `Idempotency-Key` header (e.g. a UUID) so that a retried grant is applied once."
            )
        data = GrantCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        entry, created = services.credit_grant(
            user=services.user_by_username(data.validated_data["user"]), amount=data.validated_data["amount"],
            reason=data.validated_data["reason"], idempotency_key=key, created_by=f"api:{request.user.get_username()}",
        )
        entry = selectors.ledger_entry(pk=entry.pk)
        return Response(LedgerEntrySerializer(entry).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
