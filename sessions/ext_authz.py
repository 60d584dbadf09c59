"""Connect verification in Envoy's shape: the HTTP ext_authz check of an Envoy Gateway ``SecurityPolicy``.

Envoy Gateway v1.9.0 turns the session's ``SecurityPolicy`` (``extAuth.http`` with ``path:
/internal/connect/ext-authz``, ``headersToExtAuth: [cookie, authorization, x-forwarded-proto]``,
``headersToBackend: [x-auth-request-user]``, ``failOpen: false``) into Envoy's ``ext_authz`` HTTP filter
(``internal/xds/translator/extauth.go``: ``http_service.path_prefix``, ``allowed_headers``,
``authorization_response.allowed_upstream_headers``, ``failure_mode_allow: false``). For every request to
``https://<session_domain>/s/<session id>/...`` Envoy sends the control plane, without a body:

* the original method, and as path ``/internal/connect/ext-authz`` followed by the original ``:path``
  (path and query) *after* Envoy's own normalisation (the listener's ``normalize_path: true``,
  ``merge_slashes: true``, ``path_with_escaped_slashes_action: UNESCAPE_AND_REDIRECT``), i.e. the path Envoy
  routes on;
* ``Host`` = the original ``:authority`` (the session domain), and the allowed headers (``Cookie``,
  ``Authorization``, ``X-Forwarded-Proto``).

An answer of 200 lets the request through, copying ``X-Auth-Request-User`` onto the upstream request (replacing
any the client sent); any other answer is sent to the client as it is, status, headers and body.

The decision is :func:`sessions.connect.verify` on the original URL rebuilt from the check: the path and query
taken from the raw request URI the web server received (gunicorn's ``RAW_URI``, uWSGI's ``REQUEST_URI``), not
Django's decoded ``PATH_INFO``, so ``sessions.connect_path`` judges exactly the bytes Envoy routed.

The host rule: the check arrives with a session domain as ``Host``, which ``DJANGO_ALLOWED_HOSTS`` does not list.
``gshare.middleware.InternalHostsMiddleware`` answers it (and only it) on the ``session_domain`` of a registered
cluster (:func:`session_domain_registered`), besides the internal hosts, and never on a host
``DJANGO_ALLOWED_HOSTS`` names explicitly (a public host of the control plane).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from urllib.parse import unquote_plus

from django.conf import settings
from django.http.request import split_domain_port, validate_host

import contract
from clusters.models import Cluster
from core.internal_hosts import control_plane_host, internal_hosts, on_internal_host
from sessions import connect
from sessions.connect_path import PathRefused
from sessions.errors import CONNECT_REFUSED

#: The prefix Envoy puts before the original path (``SecurityPolicy`` ``extAuth.http.path``).
PREFIX = contract.CONNECT_EXT_AUTHZ_PATH
#: How long a process keeps the set of registered session domains, seconds: a deregistered cluster's domain stops
#: being answered within this long (its sessions are refused by the verify's own facts sooner).
DOMAINS_CACHE_SECONDS = 5.0
_domains_lock = threading.Lock()
_domains: tuple[float, frozenset[str]] | None = None


@dataclass(frozen=True)
class Check:
    """The answer to one ext_authz check.

    Attributes:
        verdict: the decision of :func:`sessions.connect.verify`.
        location: for a link opened with ``?token=`` that sets the cookie, where to send the browser (the same
            path and query without any ``token`` parameter, a relative reference); else ``""``.
    """

    verdict: connect.Verdict
    location: str = ""


def original_request_uri(raw_uri: str) -> str:
    """The original path and query of an ext_authz check: what follows the prefix in the raw request URI.

    Args:
        raw_uri: the request target as the web server received it, e.g.
            ``/internal/connect/ext-authz/s/ses_x/lab?token=...`` (a ``str`` of code points below 256, WSGI's form).

    Returns:
        ``/s/ses_x/lab?token=...``.

    Raises:
        PathRefused: the raw URI is not the prefix followed by ``/`` as written (an absolute-form target, the
            prefix percent-encoded, ``OPTIONS *``): not a check Envoy sends.
    """
    if not raw_uri.startswith(PREFIX + "/"):
        raise PathRefused("not an ext_authz check path")
    return raw_uri[len(PREFIX):]


def without_token(request_uri: str) -> str:
    """``request_uri`` without any ``token`` query parameter (named as ``parse_qs`` reads it, ``to%6Ben`` too).

    Args:
        request_uri: a path and query, e.g. ``/s/ses_x/lab?a=1&token=eyJ...``.

    Returns:
        ``/s/ses_x/lab?a=1`` (the other parameters kept byte for byte, in order; no ``?`` when none is left).
    """
    path, _, query = request_uri.partition("?")
    kept = [pair for pair in query.split("&") if pair and unquote_plus(pair.partition("=")[0]) != "token"]
    return path + ("?" + "&".join(kept) if kept else "")


def check(*, raw_uri: str, host: str, forwarded_proto: str = "", authorization: str = "", cookie: str = "") -> Check:
    """Decide an Envoy ext_authz check with the rules of :func:`sessions.connect.verify`.

    Args:
        raw_uri: the check's raw request target (``RAW_URI``), the prefix then the original path and query.
        host: the check's ``Host`` header as sent: the original ``:authority``.
        forwarded_proto: the original request's ``X-Forwarded-Proto`` (``http``/``https``; absent counts as
            ``https``). It only rebuilds the URL: the decision does not depend on it.
        authorization: the original ``Authorization`` header, if any.
        cookie: the ``gshare_connect`` cookie of the original request, if any.

    Returns:
        A :class:`Check`: the verdict (200, 401 ``token_missing``/``token_invalid``/``connect_refused``, 403
        ``connect_forbidden``), and a ``location`` when the verdict sets the cookie (the view answers 307 there).

    Raises:
        VerifyUnavailable: the database or Redis cannot be reached in time (503).
    """
    scheme = forwarded_proto.strip().lower() or "https"
    try:
        if scheme not in ("http", "https"):
            raise PathRefused("X-Forwarded-Proto is neither http nor https")
        request_uri = original_request_uri(raw_uri)
    except PathRefused as exc:
        return Check(connect.Verdict(401, reason=f"path refused: {exc}", code=CONNECT_REFUSED))
    verdict = connect.verify(original_url=f"{scheme}://{host}{request_uri}", authorization=authorization, cookie=cookie)
    return Check(verdict, without_token(request_uri) if verdict.set_cookie else "")


def session_domain_registered(name: str) -> bool:
    """True when ``name`` (a lowercase host name, no port) is the ``session_domain`` of a cluster not deregistered.

    The set of domains is read at most once per ``DOMAINS_CACHE_SECONDS`` per process (one query, bounded by the
    verify's statement timeout), so an unknown ``Host`` costs no query.

    Raises:
        VerifyUnavailable: the database cannot be reached in time (503).
    """
    global _domains
    now = time.monotonic()
    cached = _domains
    if cached is None or cached[0] <= now:
        with connect.bounded_database():
            rows = Cluster.objects.registered().exclude(session_domain="").values_list("session_domain", flat=True)
            domains = frozenset(d.lower() for d in rows)
        with _domains_lock:
            _domains = cached = (now + DOMAINS_CACHE_SECONDS, domains)
    return name in cached[1]


def forget_session_domains() -> None:
    """Drop this process's set of session domains (tests; read again on the next check)."""
    global _domains
    with _domains_lock:
        _domains = None


def ext_authz_host_allowed(request) -> bool:
    """True when Envoy's ext_authz check may be answered on the request's host.

    On an internal host (``GSHARE_INTERNAL_HOSTS``), as every internal route: :func:`on_internal_host`. Otherwise on
    the ``session_domain`` of a registered cluster (``sessions.ext_authz.session_domain_registered``, a cached set),
    Envoy's ``Host`` for the check being the original ``:authority``; but never on a host an explicit
    ``DJANGO_ALLOWED_HOSTS`` entry (not ``*``) matches, nor on the host of ``GSHARE_CONTROL_PLANE_URL``: those are
    public hosts of the control plane (``clusters.routing_mode.is_control_plane_host`` refuses them as session domains).
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
    if validate_host(domain, [host for host in settings.ALLOWED_HOSTS if host != "*"]) or domain == control_plane_host():
        return False
    return session_domain_registered(domain)
