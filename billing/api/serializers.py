"""Serializers of the billing API. Credits are decimal strings with 6 places (``"10.500000"``), never floats."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.models import CREDIT_PLACES, Accrual, LedgerEntry
from billing.periods import period_length


def credits(**kwargs) -> serializers.DecimalField:
    """A credits field, rendered as a decimal string."""
    return serializers.DecimalField(max_digits=18, decimal_places=CREDIT_PLACES, coerce_to_string=True, **kwargs)


class AccountSerializer(serializers.Serializer):
    """Output of ``GET /api/v1/billing/account``."""

    user = serializers.CharField(help_text="Username")
    balance = credits(help_text="Credits: the sum of the ledger")
    accrued = credits(help_text="Credits of usage in open billing periods, not charged yet (held against the balance)")
    holds = credits(help_text="Credits the live sessions hold: their hourly cost × the policy's min_balance_hours")
    available = credits(help_text="balance − accrued − holds: what new sessions can be admitted against")
    burn_rate_per_hour = credits(help_text="Credits per hour the Running sessions cost now")
    credits_last_until = serializers.DateTimeField(
        allow_null=True, help_text="At the burn rate now, when balance − accrued reaches zero (the stop at zero); null while nothing burns")
    below_zero_since = serializers.DateTimeField(allow_null=True, help_text="When the balance went below zero (null while it is not)")


class LedgerEntrySerializer(serializers.ModelSerializer):
    """One ledger entry (output of ``GET /api/v1/billing/ledger`` and ``POST /api/v1/billing/grants``)."""

    user = serializers.CharField(source="account.user.username", read_only=True)
    amount = credits(read_only=True, help_text="Signed credits: grants and refunds positive, charges negative")
    balance_after = credits(read_only=True, help_text="The account's balance after this entry")
    session = serializers.SlugRelatedField(slug_field="public_id", read_only=True, help_text="Charges: the session (ses_...)")
    volume = serializers.CharField(read_only=True, help_text="Storage charges: the volume (vol_...); empty for other entries")
    gpu_seconds = serializers.DecimalField(max_digits=18, decimal_places=6, read_only=True, allow_null=True,
                                           help_text="Charges: GPU-seconds priced (share × seconds, summed); end entries: those of the idle time")
    idle_credits = credits(read_only=True, allow_null=True,
                           help_text="End entries (kind end, amount 0) of sessions the idle policy stopped: credits burned while idle")
    period_start = serializers.DateTimeField(read_only=True, allow_null=True, help_text="Charges: the billing period charged (start)")
    period_end = serializers.DateTimeField(read_only=True, allow_null=True, help_text="Charges: the billing period charged (end)")
    sample_count = serializers.IntegerField(read_only=True, allow_null=True, help_text="Charges of a period: the usage samples covered")

    class Meta:
        model = LedgerEntry
        fields = ["id", "user", "kind", "amount", "balance_after", "session", "volume", "period_start", "period_end", "sample_count",
                  "window_start", "window_end", "gpu_seconds", "idle_credits", "reason", "created_by", "idempotency_key", "created_at"]
        read_only_fields = fields


class AccrualSerializer(serializers.ModelSerializer):
    """One session's usage not charged yet (output of ``GET /api/v1/billing/accruals``)."""

    session = serializers.SlugRelatedField(slug_field="public_id", read_only=True, help_text="The session (ses_...)")
    period_start = serializers.DateTimeField(read_only=True, help_text="The open billing period (start)")
    period_end = serializers.SerializerMethodField(help_text="The open billing period (end)")
    amount = credits(read_only=True, help_text="Credits its samples in this period cost so far (charged when the period closes)")
    gpu_seconds = serializers.DecimalField(max_digits=18, decimal_places=6, read_only=True, help_text="GPU-seconds (share × seconds, summed)")
    sample_count = serializers.IntegerField(source="samples", read_only=True, help_text="Usage samples accrued")
    window_start = serializers.DateTimeField(source="first_start", read_only=True, help_text="The first sample's start")
    window_end = serializers.DateTimeField(source="last_end", read_only=True, help_text="The last sample's end")

    class Meta:
        model = Accrual
        fields = ["session", "period_start", "period_end", "amount", "gpu_seconds", "sample_count", "window_start", "window_end"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.DATETIME)
    def get_period_end(self, obj: Accrual):  # noqa: D102
        return serializers.DateTimeField().to_representation(obj.period_start + period_length())


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


class ModelPriceSerializer(serializers.Serializer):
    """One GPU model of the fleet and its price (an item of ``GET /api/v1/prices``)."""

    model = serializers.CharField(help_text="GPU model as the operators report it (e.g. NVIDIA H100 80GB HBM3)")
    credits_per_gpu_hour = credits(help_text="Credits per hour for one whole GPU; a share pays its fraction (docs/billing.md)")
    priced_as = serializers.ChoiceField(choices=["model", "default"], help_text="model: its own price; default: the default price applies")
    memory_mib = serializers.IntegerField(help_text="Memory per GPU, MiB, as HAMi registers it (the smallest of the model's GPUs)")
    gpus = serializers.IntegerField(help_text="Healthy GPUs of this model in the fleet")
    free_gpus = serializers.IntegerField(help_text="Of those, GPUs nobody holds now")
    clusters = serializers.ListField(child=serializers.CharField(), help_text="Names of the clusters that have it")


class PriceListSerializer(serializers.Serializer):
    """Output of ``GET /api/v1/prices``: what a GPU-hour costs, per model in the fleet."""

    default_credits_per_gpu_hour = credits(help_text="Credits per GPU-hour of a model without its own price")
    models = ModelPriceSerializer(many=True)
