"""The internal-host rule: the internal plane (``/internal``, ``/.well-known``, ``/metrics``) answers only on the
hosts in ``GSHARE_INTERNAL_HOSTS``; everywhere else those paths are unknown routes."""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http.request import split_domain_port, validate_host

import contract

#: Path prefixes of the internal plane: the operators' routes and ingress-nginx's connect verify (``/internal``),
#: the JWKS (``/.well-known``) and metrics (``/metrics``, should the control plane ever serve them).
INTERNAL_PATH_PREFIXES = ("/internal", "/.well-known", "/metrics")
_EXT_AUTHZ_PREFIX = contract.CONNECT_EXT_AUTHZ_PATH + "/"
#: The session path prefix (``https://<session_domain>/s/<id>/``) each cluster's fallback route sends here.
SESSION_PATH_PREFIX = "/s/"


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


def is_ext_authz_check(path: str) -> bool:
    """True when ``path`` (``request.path_info``) is under ``contract.CONNECT_EXT_AUTHZ_PATH`` + ``/``."""
    return path.startswith(_EXT_AUTHZ_PREFIX)


def control_plane_host() -> str:
    """The host of ``GSHARE_CONTROL_PLANE_URL`` (lowercase, no trailing dot): a public host even when
    ``DJANGO_ALLOWED_HOSTS`` is ``*``, as ``clusters.routing_mode.is_control_plane_host`` counts it."""
    return (urlsplit(settings.GSHARE_CONTROL_PLANE_URL).hostname or "").lower().rstrip(".")
