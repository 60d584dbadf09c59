"""Middleware: JSON ``{"code", "detail"}`` answers under ``/api/`` and ``/internal/``, and the internal plane
answering only on the internal hosts (``GSHARE_INTERNAL_HOSTS``)."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.http import JsonResponse
from django.http.request import split_domain_port, validate_host

_JSON_PREFIXES = ("/api/", "/internal/")

#: Path prefixes of the internal plane: the operators' routes and ingress-nginx's connect verify (``/internal``),
#: the JWKS (``/.well-known``) and metrics (``/metrics``, should the control plane ever serve them).
INTERNAL_PATH_PREFIXES = ("/internal", "/.well-known", "/metrics")


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


def is_internal_path(path: str) -> bool:
    """True when ``path`` (``request.path_info``, decoded) is ``/internal``, ``/.well-known`` or ``/metrics`` or below."""
    return any(path == prefix or path.startswith(prefix + "/") for prefix in INTERNAL_PATH_PREFIXES)


@lru_cache(maxsize=8)
def _normalised(hosts: tuple[str, ...]) -> tuple[str, ...]:
    normalised = []
    for entry in hosts:
        host = entry.strip().lower()
        if host == "*":
            normalised.append(host)
            continue
        if host.count(":") > 1 and not host.startswith("["):
            host = f"[{host}]"  # a bare IPv6 address (a pod IP): Django's host form is bracketed
        domain, _port = split_domain_port(host)
        if not domain:
            raise ImproperlyConfigured(
                f"GSHARE_INTERNAL_HOSTS has {entry!r}, which is not a host name, an IP address or a .domain pattern: "
                "fix or remove it (comma-separated, e.g. gshare-api.gshare.svc,10.0.0.7)."
            )
        normalised.append(domain)
    return tuple(normalised)


def internal_hosts() -> tuple[str, ...]:
    """``GSHARE_INTERNAL_HOSTS`` in Django's host form: lowercase, no port, IPv6 in brackets.

    Raises:
        ImproperlyConfigured: an entry is not a host, an IP address, a ``.domain`` pattern or ``*``.
    """
    return _normalised(tuple(settings.GSHARE_INTERNAL_HOSTS))


def on_internal_host(request) -> bool:
    """True when the request's host is one of ``GSHARE_INTERNAL_HOSTS``.

    The host is the one Django acts on: ``request.get_host()`` (``X-Forwarded-Host`` only with
    ``USE_X_FORWARDED_HOST``), port stripped, matched like ``ALLOWED_HOSTS`` (``.example.com`` covers its
    subdomains).

    Raises:
        DisallowedHost: the host is not in ``ALLOWED_HOSTS`` (Django answers 400).
    """
    domain, _port = split_domain_port(request.get_host())
    return bool(domain) and validate_host(domain, internal_hosts())


class InternalHostsMiddleware:
    """The internal plane (``/internal``, ``/.well-known``, ``/metrics``) answers only on ``GSHARE_INTERNAL_HOSTS``.

    On any other host, a public one above all, those paths answer 404 ``not_found`` exactly like an unknown
    route, before authentication, so the public host does not even reveal that they exist. The path judged is
    ``request.path_info`` (decoded), the one the URL resolver routes.
    """

    def __init__(self, get_response):
        self.get_response = get_response
        internal_hosts()  # a malformed setting stops the web server at boot, not at the first operator call

    def __call__(self, request):  # noqa: D102
        if is_internal_path(request.path_info) and not on_internal_host(request):
            return _not_found(request)
        return self.get_response(request)


def _not_found(request):
    from gshare.views import json_not_found  # the same body as any unknown route

    return json_not_found(request)


class AuditActorMiddleware:
    """Run each request as its audit actor (``audit.context``): ``api:<user>`` under ``/api/``, ``operator:<cluster
    id>`` under ``/internal/``, ``console:<user>`` elsewhere, with ``REMOTE_ADDR`` as the source address.

    The user is read when an audit row is written (DRF authenticates inside the view), not here.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):  # noqa: D102
        from audit.context import request_scope

        with request_scope(request):
            return self.get_response(request)
