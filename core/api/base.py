"""The DRF exception handler: every error body is ``{"code": "...", "detail": "..."}``."""

from __future__ import annotations

import itertools
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, permissions, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from contract import rfc3339
from core.errors import (
    AUTHENTICATION_FAILED,
    ERROR,
    INVALID_JSON,
    INVALID_REQUEST,
    METHOD_NOT_ALLOWED,
    NOT_AUTHENTICATED,
    NOT_FOUND,
    PERMISSION_DENIED,
    THROTTLED,
    UNSUPPORTED_MEDIA_TYPE,
)
from core.exceptions import ApplicationError

_DRF_CODES = {
    exceptions.NotAuthenticated: (
        NOT_AUTHENTICATED,
        "Send `Authorization: Bearer <api token>`; create a token in the console under My API tokens (`/gshare/apitoken/`, "
        "Create API token); "
        "staff: `manage.py create_api_token <username>`.",
    ),
    exceptions.AuthenticationFailed: (AUTHENTICATION_FAILED, None),
    exceptions.PermissionDenied: (PERMISSION_DENIED, None),
    exceptions.NotFound: (NOT_FOUND, None),
    exceptions.MethodNotAllowed: (METHOD_NOT_ALLOWED, None),
    exceptions.ParseError: (INVALID_JSON, None),
    exceptions.UnsupportedMediaType: (UNSUPPORTED_MEDIA_TYPE, "Send the body as JSON with `Content-Type: application/json`."),
    exceptions.Throttled: (THROTTLED, None),
}


def _flatten(errors, prefix: str = "") -> list[str]:
    if isinstance(errors, dict):
        out = []
        for key, value in errors.items():
            name = key if key != "non_field_errors" else ""
            out.extend(_flatten(value, f"{prefix}{name}" if not prefix else f"{prefix}.{name}"))
        return out
    if isinstance(errors, list):
        out = []
        for value in errors:
            out.extend(_flatten(value, prefix))
        return out
    return [f"{prefix}: {errors}" if prefix else str(errors)]


def exception_handler(exc, context):
    """Render ApplicationError and DRF errors as ``{"code", "detail"}`` with the right status."""
    if isinstance(exc, ApplicationError):
        response = Response(exc.as_body(), status=exc.status)
        if exc.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="gshare"'
        return response
    if isinstance(exc, DjangoValidationError):
        # full_clean() in a service: the same validation for the API and the console.
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, exceptions.ValidationError):
        messages = _flatten(exc.detail)
        return Response(
            {"code": INVALID_REQUEST, "detail": "; ".join(messages), "errors": exc.detail},
            status=status.HTTP_400_BAD_REQUEST,
        )
    # Imported here: rest_framework.views reads DEFAULT_PARSER_CLASSES (this module's SafeJSONParser) when it is
    # imported, so importing it while DRF imports this module for DEFAULT_PAGINATION_CLASS is a circular import.
    from rest_framework.views import exception_handler as drf_exception_handler

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code, detail = ERROR, None
    for cls, (c, d) in _DRF_CODES.items():
        if isinstance(exc, cls):
            code, detail = c, d
            break
    body_detail = detail or (str(exc.detail) if hasattr(exc, "detail") else str(exc))
    response.data = {"code": code, "detail": body_detail}
    return response


def describe_schema_error(error) -> str:
    """A short sentence for a ``jsonschema`` error that never echoes a large payload back.

    Args:
        error: a ``jsonschema.ValidationError``.

    Returns:
        At most about 200 characters, e.g. ``has more than 5000 items``.
    """
    limits = {
        "maxItems": "has more than {} items", "minItems": "has fewer than {} items",
        "maxLength": "is longer than {} characters", "minLength": "is shorter than {} characters",
        "maximum": "is larger than {}", "minimum": "is smaller than {}",
    }
    if error.validator in limits:
        return limits[error.validator].format(error.validator_value)
    if error.validator == "required":
        return error.message[:200]
    if error.validator == "type":
        return f"must be of type {error.validator_value}"
    return error.message if len(error.message) <= 200 else error.message[:197] + "..."


def schema_problems(validator, body, *, limit: int = 10) -> list[str]:
    """Readable problems of ``body`` against a ``jsonschema`` validator (empty when valid), in path order.

    Args:
        validator: e.g. ``Draft202012Validator(contract.STATUS_SCHEMA)``.
        body: the parsed JSON document.
        limit: at most this many problems.

    Returns:
        ``["nodes[3].devices[0].memory_mib: is smaller than 0", ...]`` (``body`` as the path of the document itself).
    """
    oversized = _oversized(validator.schema, body)
    if oversized is not None:  # refused before validating every item of it: a long malformed list costs seconds
        path, most, what = oversized
        return [f"{_shown_path(_json_path(path) or 'body')}: has more than {most} {what}"]
    problems = []
    # The first _MAX_ERRORS errors in validation order, then in path order: a body can hold one error per item.
    first = itertools.islice(validator.iter_errors(body), _MAX_ERRORS)
    for error in sorted(first, key=lambda e: list(e.absolute_path))[:limit]:
        problems.append(f"{_shown_path(_json_path(error.absolute_path) or 'body')}: {describe_schema_error(error)}")
    return problems


#: Errors read from a validator before the first ``limit`` (in path order) are chosen.
_MAX_ERRORS = 100


def _json_path(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{_shown_key(p)}" for p in path).lstrip(".")


def _oversized(schema: dict, value, path: tuple = ()) -> tuple[tuple, int, str] | None:
    """``(path, maxItems, "items")`` of the first array of ``value`` longer than its schema's ``maxItems``, or
    ``(path, maxProperties, "keys")`` of the first object with more keys than its ``maxProperties``, following only
    ``properties`` and ``items`` (the shape of every payload schema of ``contract``), or None."""
    if isinstance(value, dict):
        most = schema.get("maxProperties")
        if isinstance(most, int) and len(value) > most:
            return path, most, "keys"
    if isinstance(value, list):
        most = schema.get("maxItems")
        if isinstance(most, int) and len(value) > most:
            return path, most, "items"
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                found = _oversized(items, item, (*path, index))
                if found:
                    return found
    elif isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and isinstance(sub, dict):
                found = _oversized(sub, value[key], (*path, key))
                if found:
                    return found
    return None


#: Longest object key, and longest JSON path, quoted in a problem (a key is as long as the body allows).
_MAX_SHOWN_KEY, _MAX_SHOWN_PATH = 64, 200


def _shown_key(key: str) -> str:
    return key if len(key) <= _MAX_SHOWN_KEY else key[: _MAX_SHOWN_KEY - 3] + "..."


def _shown_path(path: str) -> str:
    return path if len(path) <= _MAX_SHOWN_PATH else "..." + path[3 - _MAX_SHOWN_PATH:]


def unstorable_text_path(value, path: str = "") -> str | None:
    """Return the JSON path of the first string (key or value) PostgreSQL cannot store, or None.

    PostgreSQL text refuses NUL characters, and UTF-8 cannot encode unpaired surrogates. Keys in the path are cut to
    64 characters and the path to 200 (its end kept).
    """
    found = _unstorable_text_path(value, path)
    return _shown_path(found) if found else None


def _unstorable_text_path(value, path: str) -> str | None:
    if isinstance(value, str):
        if "\x00" in value:
            return path or "body"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            shown = _shown_key(key) if isinstance(key, str) else key
            found = _unstorable_text_path(key, f"{path}.{shown!r}") or _unstorable_text_path(item, f"{path}.{shown}" if path else str(shown))
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _unstorable_text_path(item, f"{path}[{index}]")
            if found:
                return found
    return None


class SafeJSONParser(JSONParser):
    """DRF's JSON parser, turning absurdly nested documents into a 400 instead of a crash."""

    def parse(self, stream, media_type=None, parser_context=None):  # noqa: D102
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON nested too deeply.") from None


class IsStaffOrReadOnly(permissions.BasePermission):
    """Anyone authenticated may read; only staff may write. Subclasses name what is protected in ``message``."""

    message = "Only staff users may change this: ask an operator of this control plane."

    def has_permission(self, request, view) -> bool:  # noqa: D102
        if request.method in permissions.SAFE_METHODS:
            return True
        return bool(request.user and request.user.is_staff)


class Pagination(LimitOffsetPagination):
    """``?limit=&offset=`` paging with a ceiling: ``limit`` above ``GSHARE_API_MAX_PAGE_SIZE`` is served as that maximum.

    Without the ceiling a ``limit`` past what a PostgreSQL bigint holds reached the database as ``LIMIT`` and
    failed there; an ``offset`` beyond the row count answers an empty page before any row query.
    """

    @property
    def max_limit(self) -> int:  # noqa: D102
        return settings.GSHARE_API_MAX_PAGE_SIZE


def query_time(request, name: str) -> datetime | None:
    """The query parameter ``name`` as an aware UTC ``datetime`` (None when absent or empty).

    Accepts ISO 8601 with a zone (``2026-11-29T16:00:00Z``, ``...+02:00``; an unescaped ``+`` that arrived as a
    space is read as ``+``).

    Raises:
        ApplicationError: ``invalid_request`` (400) for anything else, a time without a zone, or one outside years
            1 to 9999 in UTC.
    """
    value = request.query_params.get(name)
    if not value:
        return None
    converted = rfc3339.parse(value.replace(" ", "+"))  # an unescaped "+" in a query string arrives as " "
    if converted is None:
        raise ApplicationError(f"{name} must be an ISO 8601 time with a zone between years 1 and 9999 in UTC, "
                               f"e.g. 2026-11-29T16:00:00Z; got {value[:64]!r}.", code=INVALID_REQUEST)
    return converted
