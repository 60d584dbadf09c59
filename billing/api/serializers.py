"""Serializers of the billing API. Credits are decimal strings with 6 places (``"10.500000"``), never floats."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.models import CREDIT_PLACES, LedgerEntry


def credits(**kwargs) -> serializers.DecimalField:
    """A credits field, rendered as a decimal string."""
    return serializers.DecimalField(max_digits=18, decimal_places=CREDIT_PLACES, coerce_to_string=True, **kwargs)


class AccountSerializer(serializers.Serializer):
    """Output of ``GET /api/v1/billing/account``."""

    user = serializers.CharField(help_text="Username")
    balance = credits(help_text="Credits: the sum of the ledger")
    holds = credits(help_text="Credits the live sessions hold: their hourly cost × the policy's min_balance_hours")
    available = credits(help_text="balance − holds: what new sessions can be admitted against")
    burn_rate_per_hour = credits(help_text="Credits per hour the Running sessions cost now")
    below_zero_since = serializers.DateTimeField(allow_null=True, help_text="When the balance went below zero (null while it is not)")


class LedgerEntrySerializer(serializers.ModelSerializer):
    """One ledger entry (output of ``GET /api/v1/billing/ledger`` and ``POST /api/v1/billing/grants``)."""

    user = serializers.CharField(source="account.user.username", read_only=True)
    amount = credits(read_only=True, help_text="Signed credits: grants and refunds positive, charges negative")
    balance_after = credits(read_only=True, help_text="The account's balance after this entry")
    session = serializers.SlugRelatedField(slug_field="public_id", read_only=True, help_text="Charges: the session (ses_...)")
    gpu_seconds = serializers.DecimalField(max_digits=18, decimal_places=6, read_only=True, allow_null=True,
                                           help_text="Charges: GPU-seconds priced (share × seconds, summed); end entries: those of the idle time")
    idle_credits = credits(read_only=True, allow_null=True,
                           help_text="End entries (kind end, amount 0) of sessions the idle policy stopped: credits burned while idle")

    class Meta:
        model = LedgerEntry
        fields = ["id", "user", "kind", "amount", "balance_after", "session", "window_start", "window_end", "gpu_seconds",
                  "idle_credits", "reason", "created_by", "idempotency_key", "created_at"]
        read_only_fields = fields


@extend_schema_field(OpenApiTypes.STR)
class AmountField(serializers.Field):
    """Credits as a decimal string (``"10.5"``) or a JSON number (read as a decimal, never through a float); checked by
    ``billing.services.parse_amount``."""

    def to_internal_value(self, data):  # noqa: D102
        return data

    def to_representation(self, value):  # noqa: D102
        return str(value)


class GrantCreateSerializer(serializers.Serializer):
    """Input of ``POST /api/v1/billing/grants`` (with an ``Idempotency-Key`` header)."""

    user = serializers.CharField(max_length=150, help_text="Username of the receiving user")
    amount = AmountField(help_text='Credits > 0, at most 6 decimal places, e.g. "10.5"')
    reason = serializers.CharField(max_length=500, help_text="Why (shown in the ledger)")
