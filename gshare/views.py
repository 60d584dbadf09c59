"""Project-level views: the public JWKS, a health check and a no-op ping."""

from __future__ import annotations

from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from gshare.auth.internal_jwt import public_jwks


@require_GET
def jwks(request):
    """``GET /.well-known/gshare-internal-jwks.json``: public keys of every published signing key."""
    response = JsonResponse(public_jwks())
    response["Cache-Control"] = "public, max-age=300"
    return response


@require_GET
def healthz(request):
    """``GET /healthz``: 200 ``{"status": "ok"}`` when the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def ping(request):
    """``/internal/ping``: 204 with no body, no database and no auth (the baseline of ``bench/connect_verify.py``)."""
    return HttpResponse(status=204)


def json_not_found(request, *args):
    """Any unknown path under ``/api/`` or ``/internal/``: 404 ``not_found`` in JSON (not the console's login page)."""
    return JsonResponse(
        {"code": "not_found", "detail": f"No such route: {request.path[:200]}. The API is described at /api/v1/schema/."}, status=404
    )
