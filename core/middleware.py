"""Middleware of the base layer: JSON ``{"code", "detail"}`` answers for what Django refuses before any view
(a NUL in the URL, an oversized body) under ``/api/`` and ``/internal/``."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse

from core.errors import INVALID_REQUEST, REQUEST_TOO_LARGE
from core.internal_hosts import is_ext_authz_check

_JSON_PREFIXES = ("/api/", "/internal/")


class ApiErrorsMiddleware:
    """Refuse NUL characters in the path or query (400) and oversized bodies (413) with JSON bodies.

    PostgreSQL cannot store or compare text with NUL characters, so such requests are refused before
    any view runs; Django's own "request data too big" page is HTML, hence the 413 here.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):  # noqa: D102
        # Envoy's ext_authz check judges a NUL in the original path itself: 401 connect_refused, as the verify does.
        query = request.META.get("QUERY_STRING", "")
        if not is_ext_authz_check(request.path_info) and ("\x00" in request.path or "\x00" in query or "%00" in query):
            return JsonResponse({"code": INVALID_REQUEST, "detail": "The URL contains a NUL character: remove it."}, status=400)
        try:
            return self.get_response(request)
        except RequestDataTooBig:
            return JsonResponse(
                {"code": REQUEST_TOO_LARGE, "detail": "The request body is larger than GSHARE_MAX_BODY_BYTES allows: send less."},
                status=413,
            )

    def process_exception(self, request, exception):  # noqa: D102
        if isinstance(exception, RequestDataTooBig) and request.path.startswith(_JSON_PREFIXES):
            return JsonResponse(
                {"code": REQUEST_TOO_LARGE, "detail": "The request body is larger than GSHARE_MAX_BODY_BYTES allows: send less."},
                status=413,
            )
        return None
