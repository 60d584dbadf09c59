"""Middleware: JSON ``{"code", "detail"}`` answers under ``/api/`` and ``/internal/``, and the internal plane
answering only on the internal hosts (``GSHARE_INTERNAL_HOSTS``)."""

from __future__ import annotations

import time
from functools import lru_cache
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.http import JsonResponse
from django.http.request import split_domain_port, validate_host

from operator_agent import contract

_JSON_PREFIXES = ("/api/", "/internal/")

#: Path prefixes of the internal plane: the operators' routes and ingress-nginx's connect verify (``/internal``),
#: the JWKS (``/.well-known``) and metrics (``/metrics``, should the control plane ever serve them).
INTERNAL_PATH_PREFIXES = ("/internal", "/.well-known", "/metrics")
_EXT_AUTHZ_PREFIX = contract.CONNECT_EXT_AUTHZ_PATH + "/"
#: The session path prefix (``https://<session_domain>/s/<id>/``) each cluster's fallback route sends here.
SESSION_PATH_PREFIX = "/s/"


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
        if not _is_ext_authz_check(request.path_info) and ("\x00" in request.path or "\x00" in query or "%00" in query):
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


def _is_ext_authz_check(path: str) -> bool:
    """True when ``path`` (``request.path_info``) is under ``operator_agent.contract.CONNECT_EXT_AUTHZ_PATH`` + ``/``."""
    return path.startswith(_EXT_AUTHZ_PREFIX)


def _control_plane_host() -> str:
    """The host of ``GSHARE_CONTROL_PLANE_URL`` (lowercase, no trailing dot): a public host even when
    ``DJANGO_ALLOWED_HOSTS`` is ``*``, as ``clusters.routing.is_control_plane_host`` counts it."""
    return (urlsplit(settings.GSHARE_CONTROL_PLANE_URL).hostname or "").lower().rstrip(".")


def ext_authz_host_allowed(request) -> bool:
    """True when Envoy's ext_authz check may be answered on the request's host.

    On an internal host (``GSHARE_INTERNAL_HOSTS``), as every internal route: :func:`on_internal_host`. Otherwise on
    the ``session_domain`` of a registered cluster (``sessions.ext_authz.session_domain_registered``, a cached set),
    Envoy's ``Host`` for the check being the original ``:authority``; but never on a host an explicit
    ``DJANGO_ALLOWED_HOSTS`` entry (not ``*``) matches, nor on the host of ``GSHARE_CONTROL_PLANE_URL``: those are
    public hosts of the control plane (``clusters.routing.is_control_plane_host`` refuses them as session domains).
    The host is the raw one ``request.get_host()`` would check (port stripped), read without ``ALLOWED_HOSTS``, which
    does not list session domains.

    Raises:
        DisallowedHost: an internal host that ``ALLOWED_HOSTS`` does not list (Django answers 400), as for every
            internal route.
        VerifyUnavailable: the registered domains cannot be read from the database in time (503).
    """
    domain, _port = split_domain_port(request._get_raw_host())
    if not domain:
        return False
    if validate_host(domain, internal_hosts()):
        return on_internal_host(request)
    if validate_host(domain, [host for host in settings.ALLOWED_HOSTS if host != "*"]) or domain == _control_plane_host():
        return False
    from sessions.ext_authz import session_domain_registered

    return session_domain_registered(domain)


class InternalHostsMiddleware:
    """The internal plane (``/internal``, ``/.well-known``, ``/metrics``) answers only on ``GSHARE_INTERNAL_HOSTS``.

    On any other host, a public one above all, those paths answer 404 ``not_found`` exactly like an unknown
    route, before authentication, so the public host does not even reveal that they exist. The path judged is
    ``request.path_info`` (decoded), the one the URL resolver routes.

    One exception, Envoy's ext_authz check (``/internal/connect/ext-authz/...``): it also answers on a registered
    cluster's ``session_domain`` (:func:`ext_authz_host_allowed`), and this middleware hands it straight to its view
    (``sessions.internal.views.connect_ext_authz``) rather than to the rest of the stack, which would refuse a
    ``Host`` that ``DJANGO_ALLOWED_HOSTS`` does not list and has nothing to add to a check (no session, CSRF or
    console); it is the hot path of every session request.

    The session path prefix ``/s/`` is handed the same way, on the same hosts, to ``sessions.ended`` (the page a
    cluster's fallback route for ``/s/`` shows for a stopped session's URL or an unknown id); on the public host it
    stays the console's.
    """

    def __init__(self, get_response):
        self.get_response = get_response
        internal_hosts()  # a malformed setting stops the web server at boot, not at the first operator call

    def __call__(self, request):  # noqa: D102
        path = request.path_info
        if is_internal_path(path):
            if _is_ext_authz_check(path):
                return _ext_authz(request)
            if not on_internal_host(request):
                return _not_found(request)
        elif path.startswith(SESSION_PATH_PREFIX):
            ended = _session_ended(request)
            if ended is not None:
                return ended
        return self.get_response(request)


def _ext_authz(request):
    from gshare.metrics import instruments
    from sessions import connect
    from sessions.internal.views import connect_ext_authz, verify_unavailable

    started = time.perf_counter()
    try:
        allowed = ext_authz_host_allowed(request)
    except connect.VerifyUnavailable as exc:
        instruments.connect_verify_observe(503, time.perf_counter() - started)
        return verify_unavailable(exc)
    return connect_ext_authz(request) if allowed else _not_found(request)


def _session_ended(request):
    """A cluster's fallback route for the session path prefix sent this request here (``sessions.ended``): the
    "session ended" page on a registered cluster's ``session_domain`` or an internal host, as Envoy's check is
    (:func:`ext_authz_host_allowed`); None elsewhere (the public host: the console's routes)."""
    from sessions import connect
    from sessions.ended import session_ended_view
    from sessions.internal.views import verify_unavailable

    try:
        allowed = ext_authz_host_allowed(request)
    except connect.VerifyUnavailable as exc:
        return verify_unavailable(exc)
    return session_ended_view(request) if allowed else None


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
