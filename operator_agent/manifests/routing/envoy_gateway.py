"""Envoy Gateway external auth of a session's HTTPRoute: a ``Backend`` for the control plane, a ``SecurityPolicy``
with HTTP ``extAuth`` to it, and a ``BackendTrafficPolicy`` with the session's timeouts.

Formats: Envoy Gateway v1.9.0 ``gateway.envoyproxy.io/v1alpha1`` Backend, SecurityPolicy and BackendTrafficPolicy
(CRD copies in ``tests/fixtures/crds``; ``api/v1alpha1/{backend,securitypolicy,ext_auth,backendtrafficpolicy,
timeout}_types.go`` upstream). How Envoy then asks the control plane: ``contract.CONNECT_EXT_AUTHZ_PATH``.

What Envoy Gateway needs besides these objects (the attach side installs it): the ``Backend`` API enabled
(``config.envoyGateway.extensionApis.enableBackend: true`` in its Helm values), and a control-plane address that is
not loopback (v1.9.0 refuses a loopback ``ip`` endpoint outside its Host infrastructure, and an ``fqdn`` with a
single label).
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract import CONNECT_EXT_AUTHZ_PATH
from operator_agent.manifests.routing.gateway_api import route_target_ref
from operator_agent.manifests.routing.kinds import (
    BACKEND,
    BACKEND_TRAFFIC_POLICY,
    SECURITY_POLICY,
    RoutingError,
    RoutingKind,
)
from operator_agent.manifests.session import session_metadata

__all__ = [
    "AUTH_RESPONSE_HEADERS",
    "HEADERS_TO_EXT_AUTH",
    "KINDS",
    "NAME",
    "STREAM_IDLE_TIMEOUT",
    "ExtAuthTarget",
    "backend_spec",
    "ext_auth_target",
    "objects",
    "session_backend",
    "session_backend_traffic_policy",
    "session_security_policy",
]

NAME = "envoy-gateway"
"""Name of this external-auth implementation (in messages)."""

KINDS: tuple[RoutingKind, ...] = (BACKEND, SECURITY_POLICY, BACKEND_TRAFFIC_POLICY)
"""The kinds this module writes (one object of each per session), in the order they are applied."""

HEADERS_TO_EXT_AUTH = ("cookie", "authorization", "x-forwarded-proto")
"""Client request headers Envoy copies into the check (besides Host = the original ``:authority``, method and path)."""

AUTH_RESPONSE_HEADERS = ("x-auth-request-user",)
"""Headers of an allowed check answer Envoy copies onto the proxied request (the authenticated user)."""

STREAM_IDLE_TIMEOUT = "1h"
"""Route idle timeout: a stream (an idle Jupyter kernel or terminal websocket) with no traffic either way for an hour
is closed -- ingress-nginx's ``proxy-read-timeout``/``proxy-send-timeout`` 3600 in the other mode."""

REQUEST_TIMEOUT = "0s"
"""Route request timeout: none (Envoy's default route timeout is 15 s for the whole response; ingress-nginx has no
overall limit either, only the idle one), so a long download or a slow save is not cut."""

# Backend ``fqdn.hostname`` (and ``tls.sni``, without the final dot): a lowercase DNS-1123 subdomain.
_HOSTNAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\.?")
_HOSTNAME_MAX = 253
# RFC 3986 path segments (pchar), at least one non-empty segment: Envoy appends the original path to it verbatim.
_PATH = re.compile(r"(/[-A-Za-z0-9._~!$&'()*+,;=:@]|/%[0-9A-Fa-f]{2})+[-A-Za-z0-9._~!$&'()*+,;=:@/%]*")
# urlsplit drops tabs and newlines anywhere and control characters or spaces around the URL (``http://ev\nil.example``
# is ``evil.example`` to it): the URL must be printable ASCII as written, so what is parsed is what was sent.
_PRINTABLE = re.compile(r"[\x21-\x7e]+")
# The authority as written: a bracketed literal or a name, then an optional port. Python 3.11's urlsplit ignores what
# follows "]" (``[::1]x``) and takes ``[v1.x]`` (an IPvFuture) for a host name.
_AUTHORITY = re.compile(r"(?P<host>\[[^\[\]]*\]|[^\[\]@:]*)(?::[0-9]*)?")
# A last label of digits or 0x-hex: an IPv4 address in a form ipaddress refuses (``127.1``, ``0x7f000001``,
# ``2130706433``) that resolvers and URL parsers (WHATWG) read as an address, not a DNS name.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
# Dot segments and encoded dots, slashes, backslashes or NULs: a proxy on the way may resolve them, so the path Envoy
# asks would not be the one written.
_AMBIGUOUS_PATH = re.compile(r"%(?:2e|2f|5c|00)|(?:^|/)\.{1,2}(?:/|$)", re.IGNORECASE)


@dataclass(frozen=True)
class ExtAuthTarget:
    """Where Envoy sends its ext_authz checks, from ``spec.extAuthUrl``.

    Attributes:
        scheme: ``"http"`` or ``"https"``.
        host: a lowercase hostname (``kind == "fqdn"``) or an IP address (``kind == "ip"``; IPv6 fully written out,
            the one form the Backend CRD's address pattern accepts for every address).
        kind: ``"fqdn"`` or ``"ip"``, the Backend endpoint type.
        port: TCP port (the scheme's default when the URL has none).
        path: the URL's path without a trailing ``/`` (Envoy appends the original path, which starts with one).
    """

    scheme: str
    host: str
    kind: str
    port: int
    path: str


def ext_auth_target(url: str) -> ExtAuthTarget:
    """Parse ``spec.extAuthUrl`` (``<control plane URL>/internal/connect/ext-authz``).

    Raises:
        RoutingError: not an ``http``/``https`` URL with a host and a path, written in printable ASCII; carries
            credentials, a query or a fragment (Envoy appends the original path to the path, so neither could be
            kept); a dot segment or an encoded ``.``/``/``/``\\``/NUL in the path; a port outside 1-65535; a host
            that is neither an IP address (without zone; IPv6 in brackets) nor a DNS name of at most 253 characters
            whose last label is not a number; ``https`` to an IP address (the certificate's name could not be checked:
            ``session_backend``).
    """
    if not isinstance(url, str) or not url:
        raise RoutingError("spec.extAuthUrl is missing: the control plane sets it for gateway-api routing")
    if not _PRINTABLE.fullmatch(url):
        raise RoutingError(f"spec.extAuthUrl {url!r} has a space, a control or a non-ASCII character (an "
                           "internationalized name goes in its xn-- form)")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RoutingError(f"spec.extAuthUrl {url!r} is not a URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise RoutingError(f"spec.extAuthUrl {url!r} is not an http or https URL")
    if parts.username is not None or parts.password is not None:
        raise RoutingError(f"spec.extAuthUrl {url!r} carries credentials, which Envoy would not send")
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise RoutingError(f"spec.extAuthUrl {url!r} has a query or fragment: Envoy appends the original path to the "
                           "URL's path, so it can only be a path")
    if port == 0:
        raise RoutingError(f"spec.extAuthUrl {url!r} has port 0")
    port = port or (443 if scheme == "https" else 80)
    path = parts.path.rstrip("/")
    if _AMBIGUOUS_PATH.search(path):
        raise RoutingError(f"spec.extAuthUrl {url!r} has a dot segment or an encoded '.', '/', '\\' or NUL in its path")
    if not path or not _PATH.fullmatch(path):
        raise RoutingError(f"spec.extAuthUrl {url!r} needs a path (the control plane's {CONNECT_EXT_AUTHZ_PATH}) "
                           "made of URL path characters")
    host = parts.hostname or ""
    written = _AUTHORITY.fullmatch(parts.netloc)
    if not host or written is None:
        raise RoutingError(f"spec.extAuthUrl {url!r} has no host, or an authority that is not host[:port]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if written["host"].startswith("[") != isinstance(address, ipaddress.IPv6Address):
        raise RoutingError(f"spec.extAuthUrl {url!r}: only an IPv6 address goes in brackets, and it must")
    if address is not None:
        if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
            raise RoutingError(f"spec.extAuthUrl {url!r} has an IPv6 zone, which a Backend cannot carry")
        if scheme == "https":
            raise RoutingError(f"spec.extAuthUrl {url!r}: https to an IP address leaves Envoy no name to check the "
                               "control plane's certificate against (Envoy Gateway v1.9.0 would check it against the "
                               "session domain, which the control plane's certificate does not name): use the "
                               "control plane's DNS name, or http to its in-cluster Service address")
        text = address.exploded if isinstance(address, ipaddress.IPv6Address) else str(address)
        return ExtAuthTarget(scheme=scheme, host=text, kind="ip", port=port, path=path)
    if "%" in host:  # a zone on something ipaddress did not take for an address
        raise RoutingError(f"spec.extAuthUrl {url!r} has an invalid host")
    if len(host) > _HOSTNAME_MAX or not _HOSTNAME.fullmatch(host):
        raise RoutingError(f"spec.extAuthUrl {url!r}: host {host!r} is not a DNS name (letters, digits, '-' and '.'; "
                           "an internationalized name in its xn-- form)")
    if _NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1]):
        raise RoutingError(f"spec.extAuthUrl {url!r}: host {host!r} ends in a number, so it reads as an IPv4 address, "
                           "not a DNS name: write the address as four decimal numbers (10.96.0.15) or use a DNS name")
    return ExtAuthTarget(scheme=scheme, host=host, kind="fqdn", port=port, path=path)


def session_backend(gss: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Backend`` (``gateway.envoyproxy.io/v1alpha1``) that is the control plane, from ``spec.extAuthUrl``.

    ``endpoints: [{fqdn: {hostname, port}}]`` for a DNS name, ``[{ip: {address, port}}]`` for an IP literal (``http``
    only). For an ``https`` URL, ``tls: {wellKnownCACertificates: System, sni: <hostname>}``: the system trust store
    checks the chain, and the ``sni`` is also the name the certificate must carry -- Envoy Gateway v1.9.0 turns a
    literal SNI with no ``subjectAltNames`` into an exact DNS ``match_typed_subject_alt_names`` on the upstream TLS
    context (``buildValidationContext`` in ``internal/xds/translator/translator.go``; its ext-auth-backend testdata
    shows it for an ext_authz Backend), the same matcher a ``BackendTLSPolicy`` ``validation.hostname`` makes. Without
    ``sni`` it would send, and check, the original request's Host (the session domain).

    Raises:
        RoutingError: ``spec.extAuthUrl`` cannot be used (``ext_auth_target``).
    """
    return {"apiVersion": BACKEND.api_version, "kind": BACKEND.kind, "metadata": session_metadata(gss),
            "spec": backend_spec(gss["spec"].get("extAuthUrl"))}


def backend_spec(url: str) -> dict[str, Any]:
    """The ``spec`` of a ``Backend`` for the control plane at ``url`` (see :func:`session_backend`).

    Raises:
        RoutingError: ``url`` cannot be used (``ext_auth_target``).
    """
    target = ext_auth_target(url)
    if target.kind == "ip":
        endpoint = {"ip": {"address": target.host, "port": target.port}}
    else:
        endpoint = {"fqdn": {"hostname": target.host, "port": target.port}}
    spec: dict[str, Any] = {"endpoints": [endpoint]}
    if target.scheme == "https":  # ext_auth_target only takes https with a DNS name
        spec["tls"] = {"wellKnownCACertificates": "System", "sni": target.host.rstrip(".")}
    return spec


def session_security_policy(gss: Mapping[str, Any], route: Mapping[str, Any]) -> dict[str, Any]:
    """The ``SecurityPolicy`` (``gateway.envoyproxy.io/v1alpha1``) that makes Envoy ask the control plane about every
    request of ``route``.

    ``targetRefs: [route]``; ``extAuth.http``: ``backendRefs: [the session's Backend]``, ``path`` = the path of
    ``spec.extAuthUrl`` (Envoy sends ``<path><original path and query>``), ``headersToBackend: [x-auth-request-user]``;
    ``headersToExtAuth: [cookie, authorization, x-forwarded-proto]``; ``failOpen: false`` (no answer = refused). No
    ``bodyToExtAuth``: the check has no body, so request bodies are neither buffered nor limited.

    Raises:
        RoutingError: ``spec.extAuthUrl`` cannot be used (``ext_auth_target``).
    """
    target = ext_auth_target(gss["spec"].get("extAuthUrl"))
    metadata = session_metadata(gss)
    return {
        "apiVersion": SECURITY_POLICY.api_version,
        "kind": SECURITY_POLICY.kind,
        "metadata": metadata,
        "spec": {
            "targetRefs": [route_target_ref(route)],
            "extAuth": {
                "http": {
                    "backendRefs": [{"group": BACKEND.group, "kind": BACKEND.kind, "name": metadata["name"]}],
                    "path": target.path,
                    "headersToBackend": list(AUTH_RESPONSE_HEADERS),
                },
                "headersToExtAuth": list(HEADERS_TO_EXT_AUTH),
                "failOpen": False,
            },
        },
    }


def session_backend_traffic_policy(gss: Mapping[str, Any], route: Mapping[str, Any]) -> dict[str, Any]:
    """The ``BackendTrafficPolicy`` (``gateway.envoyproxy.io/v1alpha1``) with the session route's timeouts.

    ``targetRefs: [route]``; ``timeout.http``: ``streamIdleTimeout: 1h`` (Envoy's route ``idle_timeout``, which
    overrides the listener's ``stream_idle_timeout``, 5 minutes by Envoy's default: idle websockets stay open an hour) and
    ``requestTimeout: 0s`` (no overall limit on a response). No ``requestBuffer``: request bodies stream through
    unlimited, as ``proxy-body-size: "0"`` does for ingress-nginx.
    """
    return {
        "apiVersion": BACKEND_TRAFFIC_POLICY.api_version,
        "kind": BACKEND_TRAFFIC_POLICY.kind,
        "metadata": session_metadata(gss),
        "spec": {
            "targetRefs": [route_target_ref(route)],
            "timeout": {"http": {"requestTimeout": REQUEST_TIMEOUT, "streamIdleTimeout": STREAM_IDLE_TIMEOUT}},
        },
    }


def objects(gss: Mapping[str, Any], route: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Backend, SecurityPolicy and BackendTrafficPolicy of the session whose HTTPRoute is ``route``.

    Raises:
        RoutingError: ``spec.extAuthUrl`` cannot be used.
    """
    return [session_backend(gss), session_security_policy(gss, route), session_backend_traffic_policy(gss, route)]
