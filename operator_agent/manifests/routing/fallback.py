"""The cluster's fallback route for the session path prefix ``/s/``: what answers a session URL no session serves.

A session's own route (``/s/<session id>/``) is deleted with the session, and the ingress would then answer its
default backend ("default backend - 404"). These objects, one set per session namespace and routing mode, send every
other ``/s/`` request, with its ``Host`` (the session domain) and path unchanged, to the control plane, which answers
its "session ended" page (``sessions.ended`` there: on a registered cluster's session domain, for an ended session and
an unknown id alike). No check guards them: the page is public and reveals nothing.

Precedence: a session's route always wins, being the longer prefix. ingress-nginx sorts a host's locations and nginx
takes the longest matching prefix location (``/s/<id>/`` over ``/s/``); Gateway API v1.6.1 gives precedence, across
all rules of the routes attached to a listener, to the ``PathPrefix`` match with the most characters.

* ``ingress-nginx``: an ``ExternalName`` Service for the control plane (the host and port of ``spec.authUrl``, the
  control plane's address the cluster already reaches) and an Ingress ``<session domain>/s/`` (``Prefix``) to it,
  ``backend-protocol: HTTPS`` for an ``https`` URL (ingress-nginx proxies with the original ``Host`` by default);
* ``gateway-api``: a ``Backend`` for the control plane from ``spec.extAuthUrl`` (as the sessions' ext_authz one) and
  an HTTPRoute ``<session domain>/s/`` (``PathPrefix``) to it, on the sessions' Gateway.

Every builder is pure; the objects are named :data:`FALLBACK_NAME`, carry no owner (they outlive every session) and
the label ``app.kubernetes.io/component: session-ended``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from contract import ROUTING_GATEWAY_API
from operator_agent.manifests.routing import envoy_gateway, ingress_nginx
from operator_agent.manifests.routing.gateway_api import GATEWAY_KIND, session_gateway
from operator_agent.manifests.routing.kinds import BACKEND, HTTP_ROUTE, INGRESS, RoutingError

__all__ = ["FALLBACK_NAME", "LABELS", "SESSION_PATH_PREFIX", "fallback_objects", "fallback_service"]

FALLBACK_NAME = "gshare-session-ended"
"""Name of every fallback object (one of each kind per session namespace)."""

SESSION_PATH_PREFIX = "/s/"
"""The session path prefix (``https://<session domain>/s/<session id>/``)."""

LABELS = {"app.kubernetes.io/managed-by": "gshare", "app.kubernetes.io/component": "session-ended"}
"""Labels of the fallback objects."""


def _metadata(gss: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": FALLBACK_NAME, "namespace": gss["metadata"]["namespace"], "labels": dict(LABELS)}


def fallback_service(gss: Mapping[str, Any]) -> dict[str, Any]:
    """``ingress-nginx``'s backend: an ``ExternalName`` Service (``core/v1``) for the host of ``spec.authUrl``, port
    ``http`` = its port (the scheme's default when it has none).

    Raises:
        RoutingError: ``spec.authUrl`` is not an ``http``/``https`` URL with a host.
    """
    url = gss["spec"].get("authUrl") or ""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RoutingError(f"spec.authUrl {url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RoutingError(f"spec.authUrl {url!r} is not an http or https URL with a host")
    port = port or (443 if parts.scheme == "https" else 80)
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _metadata(gss),
        "spec": {"type": "ExternalName", "externalName": parts.hostname.rstrip("."),
                 "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}]},
    }


def _ingress(gss: Mapping[str, Any], service: Mapping[str, Any]) -> dict[str, Any]:
    metadata = _metadata(gss)
    if (gss["spec"].get("authUrl") or "").lower().startswith("https:"):
        metadata["annotations"] = {"nginx.ingress.kubernetes.io/backend-protocol": "HTTPS"}
    return {
        "apiVersion": INGRESS.api_version, "kind": INGRESS.kind, "metadata": metadata,
        "spec": {"ingressClassName": ingress_nginx.INGRESS_CLASS, "rules": [{
            "host": gss["spec"]["host"],
            "http": {"paths": [{"path": SESSION_PATH_PREFIX, "pathType": "Prefix", "backend": {
                "service": {"name": service["metadata"]["name"], "port": {"name": "http"}}}}]},
        }]},
    }


def _http_route(gss: Mapping[str, Any]) -> dict[str, Any]:
    gateway_name, gateway_namespace = session_gateway(gss)
    return {
        "apiVersion": HTTP_ROUTE.api_version, "kind": HTTP_ROUTE.kind, "metadata": _metadata(gss),
        "spec": {
            "parentRefs": [{"group": HTTP_ROUTE.group, "kind": GATEWAY_KIND, "name": gateway_name, "namespace": gateway_namespace}],
            "hostnames": [gss["spec"]["host"]],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": SESSION_PATH_PREFIX}}],
                       "backendRefs": [{"group": BACKEND.group, "kind": BACKEND.kind, "name": FALLBACK_NAME}]}],
        },
    }


def _backend(gss: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": BACKEND.api_version, "kind": BACKEND.kind, "metadata": _metadata(gss),
            "spec": envoy_gateway.backend_spec(gss["spec"].get("extAuthUrl"))}


def fallback_objects(gss: Mapping[str, Any], mode: str) -> list[dict[str, Any]]:
    """The fallback objects of the cluster in routing ``mode``, for the session domain and control plane a
    GShareSession names (``spec.host``, ``spec.authUrl`` / ``spec.extAuthUrl``, ``spec.gateway``), in apply order
    (the backend before the route that sends to it).

    Returns:
        ``[Service, Ingress]`` for ``ingress-nginx``; ``[Backend, HTTPRoute]`` for ``gateway-api``.

    Raises:
        RoutingError: the URL the mode needs cannot be used.
    """
    if mode == ROUTING_GATEWAY_API:
        return [_backend(gss), _http_route(gss)]
    service = fallback_service(gss)
    return [service, _ingress(gss, service)]
