"""The errors of a call to the control plane (``operator_agent.control_plane_client``), kept apart from the client so
the token source, which the client uses, can name them too."""

from __future__ import annotations


class ControlPlaneError(Exception):
    """A call to the control plane failed. ``status`` is the HTTP status (``None`` if none was received).

    ``body`` is the decoded JSON error body (``{"code", "detail", ...}``, e.g. the ``index`` of a refused usage
    sample), ``{}`` when there was none or it was not a JSON object.
    """

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None, detail: str = "",
                 body: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body or {}


class ControlPlaneUnavailable(ControlPlaneError):
    """Connection errors, timeouts or 5xx/429 on every attempt (or the caller asked to stop)."""


class ControlPlaneAuthError(ControlPlaneError):
    """401: the operator token is expired, revoked or of a deregistered cluster; rotate it."""


class ControlPlaneRejected(ControlPlaneError):
    """403 or another 4xx: the control plane refused the request; retrying the same body will not help."""
