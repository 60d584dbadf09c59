"""Kubernetes resource quantities (``1Gi``, ``500m``, ``12e6`` ...), read with ``kubernetes.utils.parse_quantity``.

The client's parser is lenient where the apiserver is not: it hands the number to ``decimal.Decimal``, which also
takes ``NaN``, ``Infinity``, ``1_000`` and non-ASCII digits, and builds ``1e99999999999`` digit by digit until memory
runs out. So a text is first checked against the quantity grammar of ``k8s.io/apimachinery``
(``pkg/api/resource/quantity.go``)::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <sign>            ::= "+" | "-"
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

(ASCII digits only, an integer exponent), with its length and exponent bounded, and only then parsed.

Standard library and the ``kubernetes`` client only: the operator and the emulator both use it, neither imports Django.
"""

from __future__ import annotations

import decimal
import math
import re
from typing import Any

_GRAMMAR = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")

_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)\Z")

MAX_LENGTH = 64
"""Longest quantity text accepted (the apiserver's canonical forms are far shorter)."""

MAX_EXPONENT = 100
"""Largest decimal exponent accepted in either direction (``1e100``; ``E``, exa, is 18)."""


def quantity_decimal(value: Any) -> decimal.Decimal:
    """The exact value of a quantity.

    Args:
        value: a quantity string (surrounding ASCII whitespace ignored) or a JSON number (int or finite float).

    Returns:
        The value as a ``Decimal`` (``"1Ki"`` -> 1024, ``"500m"`` -> 0.5).

    Raises:
        ValueError: not a quantity: another type (bool included), a text outside the grammar, longer than
            ``MAX_LENGTH``, with an exponent beyond ``MAX_EXPONENT``, or a non-finite float.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return decimal.Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a quantity: {value!r}")
        return decimal.Decimal(value)
    text = value.strip(" \t\r\n")
    if len(text) > MAX_LENGTH:
        raise ValueError(f"not a quantity: {value[:MAX_LENGTH]!r}... is longer than {MAX_LENGTH} characters")
    if _GRAMMAR.fullmatch(text) is None:
        raise ValueError(f"not a quantity: {value!r}")
    exponent = _EXPONENT.search(text)
    if exponent is not None and abs(int(exponent[1])) > MAX_EXPONENT:
        raise ValueError(f"not a quantity: {value!r} (exponent beyond 1e{MAX_EXPONENT})")
    # Imported on first use: ``kubernetes`` imports its whole client package first (about 0.5 s), and the demo's
    # emulator processes, which read quantities only once Pods or claims arrive, should start without it.
    from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

    try:
        return client_parse_quantity(text)
    except (ArithmeticError, MemoryError, ValueError) as exc:
        raise ValueError(f"not a quantity: {value!r} ({exc})") from None


def parse_quantity(value: Any) -> int:
    """The integer value of a quantity, rounded up as apimachinery's ``Quantity.Value()`` does.

    ``"1643124Mi"`` -> 1722936950784, ``"20k"`` -> 20000, ``"1500m"`` -> 2, ``"12e6"`` -> 12000000, ``4096`` -> 4096.

    Raises:
        ValueError: not a quantity (see ``quantity_decimal``).
    """
    amount = quantity_decimal(value)
    try:
        return int(amount.to_integral_value(rounding=decimal.ROUND_CEILING))
    except (ArithmeticError, ValueError) as exc:
        raise ValueError(f"not a quantity: {value!r} ({exc})") from None


def same_quantity(a: Any, b: Any) -> bool:
    """Whether two quantities are equal (``"1Gi"`` and ``"1073741824"``); False when either is not a quantity."""
    try:
        return quantity_decimal(a) == quantity_decimal(b)
    except ValueError:
        return False
