"""The project's middleware wiring: the internal plane answering only on the internal hosts
(``core.internal_hosts``), and the two requests of a session's own host handed straight to the sessions app (Envoy's
ext_authz check and the "session ended" page)."""

from __future__ import annotations

import time

from core import instruments
from core.internal_hosts import SESSION_PATH_PREFIX, internal_hosts, is_ext_authz_check, is_internal_path, on_internal_host
from core.views import json_not_found
from sessions import connect
from sessions.ended import session_ended_view
from sessions.ext_authz import ext_authz_host_allowed
from sessions.internal.views import connect_ext_authz, verify_unavailable


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
            if is_ext_authz_check(path):
                return _ext_authz(request)
            if not on_internal_host(request):
                return _not_found(request)
        elif path.startswith(SESSION_PATH_PREFIX):
            ended = _session_ended(request)
            if ended is not None:
                return ended
        return self.get_response(request)


def _ext_authz(request):
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
    try:
        allowed = ext_authz_host_allowed(request)
    except connect.VerifyUnavailable as exc:
        return verify_unavailable(exc)
    return session_ended_view(request) if allowed else None


def _not_found(request):
    return json_not_found(request)
