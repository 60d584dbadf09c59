"""Figures as the console shows them to a person: no more precision than one needs to read them.

The API and the ledger keep every credit to 0.000001 (``billing.models.CREDITS``); a page that shows
``1000.000000`` or ``3.113052 per hour`` makes a person read digits that change nothing. The console shows credits
with two decimals and thousands separators, and an amount below 0.01 with two significant digits (so a 5-second charge
of 0.0035 credits is not shown as ``0.00``). The exact value stays in the element's ``title``.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

_CENT = Decimal("0.01")
_MICRO = Decimal("0.000001")


def credits_display(value) -> str:
    """``value`` (credits: ``Decimal``, int or a decimal string) as a person reads it.

    ``1234.5`` -> ``1,234.50``; ``-3`` -> ``-3.00``; ``0.613052`` -> ``0.61``; ``0.0035`` -> ``0.0035``;
    ``0.000001`` -> ``0.000001``; ``0`` -> ``0.00``. Rounding is ``ROUND_HALF_EVEN``, as the ledger's. None or text
    that is not a number is returned as ``""``/unchanged.
    """
    if value is None or value == "":
        return ""
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return str(value)
    if not amount.is_finite():
        return str(value)
    magnitude = abs(amount)
    if magnitude == 0 or magnitude >= _CENT:
        return f"{amount.quantize(_CENT, rounding=ROUND_HALF_EVEN):,}"
    # Below a cent: two significant digits, at most the ledger's six places.
    places = max(_MICRO, Decimal(1).scaleb(magnitude.adjusted() - 1))
    return format(amount.quantize(places, rounding=ROUND_HALF_EVEN).normalize(), "f")
