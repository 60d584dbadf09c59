"""Validators of the operator payload schemas (``contract``) for tests on either side.

``date-time`` is checked with ``contract.rfc3339.parse``, the function both sides read times with, so a
payload valid here is one the control plane reads.
"""

from __future__ import annotations

from jsonschema import Draft202012Validator, FormatChecker

import contract
from contract import rfc3339

FORMATS = FormatChecker(formats=())
FORMATS.checks("date-time")(lambda value: not isinstance(value, str) or rfc3339.parse(value) is not None)


def validator(schema: dict) -> Draft202012Validator:
    """A validator of ``schema`` that also checks ``format: date-time``."""
    return Draft202012Validator(schema, format_checker=FORMATS)


INVENTORY = validator(contract.INVENTORY_SCHEMA)
STATUS = validator(contract.STATUS_SCHEMA)
STORAGE_REPORT = validator(contract.STORAGE_REPORT_SCHEMA)
USAGE = validator(contract.USAGE_SCHEMA)
USAGE_SAMPLE = validator(contract.USAGE_SAMPLE_SCHEMA)
ACTIVITY = validator(contract.ACTIVITY_SCHEMA)


def problems(checker: Draft202012Validator, body) -> list[str]:
    """The schema errors of ``body`` as ``"path: message"`` strings (empty when valid)."""
    return [f"{'/'.join(map(str, e.absolute_path)) or 'body'}: {e.message}" for e in checker.iter_errors(body)]
