"""Runs each request as its audit actor (``audit.context``)."""

from __future__ import annotations

from audit.context import request_scope


class AuditActorMiddleware:
    """Run each request as its audit actor (``audit.context``): ``api:<user>`` under ``/api/``, ``operator:<cluster
    id>`` under ``/internal/``, ``console:<user>`` elsewhere, with ``REMOTE_ADDR`` as the source address.

    The user is read when an audit row is written (DRF authenticates inside the view), not here.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):  # noqa: D102
        with request_scope(request):
            return self.get_response(request)
