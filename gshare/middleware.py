"""Middleware that keeps every answer under ``/api/`` and ``/internal/`` a JSON ``{"code", "detail"}``."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse

_JSON_PREFIXES = ("/api/", "/internal/")


class ApiErrorsMiddleware:
    """Refuse NUL characters in the path or query (400) and oversized bodies (413) with JSON bodies.

    PostgreSQL cannot store or compare text with NUL characters, so such requests are refused before
    any view runs; Django's own "request data too big" page is HTML, hence the 413 here.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):  # noqa: D102
        if "\x00" in request.path or "\x00" in request.META.get("QUERY_STRING", "") or "%00" in request.META.get("QUERY_STRING", ""):
            return JsonResponse({"code": "invalid_request", "detail": "The URL contains a NUL character: remove it."}, status=400)
        try:
            return self.get_response(request)
        except RequestDataTooBig:
            return JsonResponse(
                {"code": "request_too_large", "detail": "The request body is larger than GSHARE_MAX_BODY_BYTES allows: send less."},
                status=413,
            )

    def process_exception(self, request, exception):  # noqa: D102
        if isinstance(exception, RequestDataTooBig) and request.path.startswith(_JSON_PREFIXES):
            return JsonResponse(
                {"code": "request_too_large", "detail": "The request body is larger than GSHARE_MAX_BODY_BYTES allows: send less."},
                status=413,
            )
        return None
