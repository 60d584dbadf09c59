"""The error codes of the base layer: what any route can answer (the exception handler, the middleware, the JSON
404/405 views) and the defaults of the ``core.exceptions`` classes.

Every error body is ``{"code": "<one of the codes of an app's errors module or of contract>", "detail": "..."}``;
docs/errors.md lists each code answered, and ``tests/test_error_codes.py`` holds the two equal. Each app's
``errors`` module holds its own codes; a code two apps answer lives in the lower one's (``contract`` for those the
operator reads too).
"""

from __future__ import annotations

INVALID_REQUEST = "invalid_request"
"""400: a field is missing or malformed (the body adds ``errors``, per field), or the URL holds a NUL character."""

INVALID_JSON = "invalid_json"
"""400: the body is not JSON (or nests too deep)."""

NOT_AUTHENTICATED = "not_authenticated"
"""401: no ``Authorization`` header (nor a console login session) on a public API route."""

PERMISSION_DENIED = "permission_denied"
"""403: the action needs a staff user (DRF's ``PermissionDenied``)."""

FORBIDDEN = "forbidden"
"""403: the caller may not do this (``core.exceptions.Forbidden``)."""

NOT_FOUND = "not_found"
"""404: no such route or object (``core.exceptions.NotFound``)."""

METHOD_NOT_ALLOWED = "method_not_allowed"
"""405: the route does not take this HTTP method."""

ERROR = "error"
"""Any DRF exception the exception handler maps to no code of its own; the one a request can get is DRF's
``NotAcceptable`` (406: the ``Accept`` header names no type the API answers, which is only ``application/json``)."""

REQUEST_TOO_LARGE = "request_too_large"
"""413: the body is larger than ``GSHARE_MAX_BODY_BYTES``."""

UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
"""415: the body is not ``application/json``."""

APPLICATION_ERROR = "application_error"
"""Default of ``ApplicationError``: every raise of the class itself names a code, so nothing answers this one."""

CONFLICT = "conflict"
"""Default of ``core.exceptions.Conflict``: every raise of the class itself names a code, so nothing answers this one."""

AUTHENTICATION_FAILED = "authentication_failed"
"""DRF's ``AuthenticationFailed``: the API's authentication classes raise their own codes instead, so nothing answers it."""

THROTTLED = "throttled"
"""DRF's ``Throttled``: no throttle class is configured, so nothing answers it."""

UNANSWERED = frozenset({APPLICATION_ERROR, CONFLICT, AUTHENTICATION_FAILED, THROTTLED})
"""Codes above that no request can get (defaults and mappings kept so that a future raise has a code); docs/errors.md
does not list them."""
