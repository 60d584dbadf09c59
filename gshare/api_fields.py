"""Serializer fields shared by the public API.

DRF's own ``IntegerField`` reads ``"1"``, ``"1.0"`` and (through ``int(True)``) ``true`` as numbers. The public API
documents JSON numbers where it takes numbers, so a client that sends a string or a boolean is told so (400
``invalid_request``) instead of having it guessed. Money is the exception: credits are decimal strings or JSON
numbers by design (``billing.api.serializers.AmountField``, docs/billing.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from rest_framework import serializers

from gshare.exceptions import ApplicationError


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


class RefuseUnknownFieldsMixin:
    """Serializer mixin for ``PATCH`` bodies: a body naming a field the serializer does not have is refused, before
    any field is validated, with 400 ``invalid_request`` (``gshare.exceptions.ApplicationError``) and the sentence of
    ``unknown_fields_message`` (DRF's default ignores unknown keys, which would let a typo pass as "nothing changed")."""

    def unknown_fields_message(self, unknown: list[str]) -> str:
        """The ``detail`` for ``unknown`` (sorted field names); override to point at another way to change them."""
        return f"Only {', '.join(self.fields)} can be changed; not {', '.join(unknown)}."

    def to_internal_value(self, data):  # noqa: D102
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise ApplicationError(self.unknown_fields_message(unknown), code="invalid_request")
        return super().to_internal_value(data)
