"""Serializer fields shared by the public API.

DRF's own ``IntegerField`` reads ``"1"``, ``"1.0"`` and (through ``int(True)``) ``true`` as numbers. The public API
documents JSON numbers where it takes numbers, so a client that sends a string or a boolean is told so (400
``invalid_request``) instead of having it guessed. Money is the exception: credits are decimal strings or JSON
numbers by design (``billing.api.serializers.AmountField``, docs/billing.md).
"""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers


class StrictIntegerField(serializers.IntegerField):
    """A whole JSON number: strings, booleans and numbers with a fractional part are refused.

    ``1`` and ``1.0`` (JSON does not tell them apart) are read as ``1``; ``"1"``, ``true`` and ``1.5`` fail with
    ``invalid_request``. ``min_value``/``max_value`` and the other ``IntegerField`` options apply as usual.
    """

    default_error_messages = {
        "not_a_number": "must be a JSON number (a whole number such as 1, not a string or a boolean)",
        "invalid": "must be a whole number",
    }

    def to_internal_value(self, data):  # noqa: D102
        if isinstance(data, bool) or not isinstance(data, int | float | Decimal):
            self.fail("not_a_number")
        if isinstance(data, float | Decimal):
            exact = Decimal(data)  # exact (no rounding through str), so 1.0000000001 is not taken for 1
            if not exact.is_finite() or exact != exact.to_integral_value():
                self.fail("invalid")
            data = int(exact)
        return super().to_internal_value(data)
