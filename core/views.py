"""Project-level views: a health check, a no-op ping and the JSON 404."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core.errors import METHOD_NOT_ALLOWED, NOT_FOUND


def get_only(view):
    """GET and HEAD only, answering any other method 405 ``method_not_allowed`` in JSON (Django's own 405 is empty).

    The views take no cookies or form posts, so they are CSRF-exempt: a POST gets the JSON 405, not Django's HTML
    CSRF page.
    """

    @csrf_exempt
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            response = JsonResponse({"code": METHOD_NOT_ALLOWED, "detail": f"Method {request.method[:20]!r} not allowed: use GET."},
                                    status=405)
            response["Allow"] = "GET, HEAD"
            return response
        return view(request, *args, **kwargs)

    return wrapper


@get_only
def healthz(request):
    """``GET /healthz``: 200 ``{"status": "ok"}`` when the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


@csrf_exempt
def ping(request):
    """``/internal/ping``: 204 with no body, no database and no auth (the baseline of ``bench/connect_verify.py``)."""
    return HttpResponse(status=204)


@csrf_exempt
def json_not_found(request, *args):
    """Any unknown path under ``/api/`` or ``/internal/``: 404 ``not_found`` in JSON (not the console's login page)."""
    return JsonResponse(
        {"code": NOT_FOUND, "detail": f"No such route: {request.path[:200]}. The API is described at /api/v1/schema/."}, status=404
    )


def signed_in_or_login(view):
    """Wrap the API documentation page, a page for browsers: one not logged in to the console goes to the console's
    login and back, rather than a bare 401. Its ``Authorization`` header is not read there (the page is the login
    session's; a token is for the schema and the API): a bad token on an HTML error page would be read again by the
    template's context processors, and raise."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            from django.urls import reverse

            return redirect_to_login(request.get_full_path(), login_url=reverse("admin:login"))
        request.META.pop("HTTP_AUTHORIZATION", None)
        return view(request, *args, **kwargs)

    return wrapped
