"""The one domain exception base: services raise it, the DRF exception handler renders it."""

from __future__ import annotations

from core.errors import APPLICATION_ERROR, CONFLICT, FORBIDDEN, NOT_FOUND


class ApplicationError(Exception):
    """A refusal with a stable machine-readable ``code``, an HTTP ``status`` and a ``detail``
    sentence that names the fix.

    Args:
        detail: the human sentence (names the problem and the fix).
        code: stable snake_case code; defaults to the class attribute.
        status: HTTP status; defaults to the class attribute.
        extra: more JSON-serialisable fields to put in the error body.
        console_detail: the same sentence for the console, where the fix is a page or a button, not an API call
            (``console_detail`` defaults to ``detail``); never in the API's body.
    """

    code = APPLICATION_ERROR
    status = 400

    def __init__(self, detail: str, *, code: str | None = None, status: int | None = None, extra: dict | None = None,
                 console_detail: str | None = None):
        super().__init__(detail)
        self.detail = detail
        self.console_detail = console_detail or detail
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.extra = extra or {}

    def as_body(self) -> dict:
        """Return the error body ``{"code", "detail", **extra}``."""
        return {"code": self.code, "detail": self.detail, **self.extra}


class NotFound(ApplicationError):
    """404: the named object does not exist (or is not visible to the caller)."""

    code = NOT_FOUND
    status = 404


class Conflict(ApplicationError):
    """409: the request conflicts with the current state."""

    code = CONFLICT
    status = 409


class Forbidden(ApplicationError):
    """403: the caller may not do this."""

    code = FORBIDDEN
    status = 403
