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

from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer token: strings, booleans and every number written with a decimal point or an exponent are refused.

    ``1`` is read as ``1``; ``"1"``, ``true``, ``1.5``, and also ``1.0``, ``1e0`` and ``1e3`` fail with
    ``invalid_request`` (the JSON parser reads those tokens as floats: a client that writes them is computing the
    number in floating point, where a large value is silently rounded, so it is told to send the integer itself).
    ``min_value``/``max_value`` and the other ``IntegerField`` options apply as usual. The operator's inventory
    contract (``contract``) is separate and accepts integral floats on purpose.
    """

    default_error_messages = {
        "not_a_number": "must be a JSON number (a whole number such as 1, not a string or a boolean)",
        "not_an_integer": "must be a whole number written without a decimal point or an exponent (e.g. 1000, not 1000.0 or 1e3)",
    }

    def to_internal_value(self, data):  # noqa: D102
        if isinstance(data, bool) or not isinstance(data, int | float | Decimal):
            self.fail("not_a_number")
        if not isinstance(data, int):
            self.fail("not_an_integer")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A JSON string token: numbers and booleans are refused (``invalid_request``) instead of being turned into text
    (DRF's ``CharField`` reads ``1`` as ``"1"``). The other ``CharField`` options apply as usual."""

    default_error_messages = {"not_a_string": "must be a JSON string"}

    def to_internal_value(self, data):  # noqa: D102
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class RefuseUnknownFieldsMixin:
    """Serializer mixin for ``PATCH`` bodies: a body naming a field the serializer does not have is refused, before
    any field is validated, with 400 ``invalid_request`` (``core.exceptions.ApplicationError``) and the sentence of
    ``unknown_fields_message`` (DRF's default ignores unknown keys, which would let a typo pass as "nothing changed")."""

    def unknown_fields_message(self, unknown: list[str]) -> str:
        """The ``detail`` for ``unknown`` (sorted field names); override to point at another way to change them."""
        return f"Only {', '.join(self.fields)} can be changed; not {', '.join(unknown)}."

    def to_internal_value(self, data):  # noqa: D102
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise ApplicationError(self.unknown_fields_message(unknown), code=INVALID_REQUEST)
        return super().to_internal_value(data)
