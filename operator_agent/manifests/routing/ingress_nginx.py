"""ingress-nginx routing: one ``networking.k8s.io/v1`` Ingress per session, guarded by the ``auth-url`` annotation.

Format: Kubernetes API reference v1.32 (Ingress) and ingress-nginx's "External Authentication" and "Custom
timeouts" annotations (``docs/user-guide/nginx-configuration/annotations.md``). ingress-nginx is retired upstream
since 2026-03-24; this mode stays for clusters that already run it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract import session_object_name
from operator_agent.manifests.routing.kinds import INGRESS, RoutingKind
from operator_agent.manifests.session import PORT_NAME, session_metadata

__all__ = ["AUTH_RESPONSE_HEADERS", "INGRESS_CLASS", "KINDS", "PROXY_TIMEOUT_SECONDS", "objects", "session_ingress"]

INGRESS_CLASS = "nginx"
"""IngressClass of the data-plane cluster's ingress-nginx."""

PROXY_TIMEOUT_SECONDS = "3600"
"""ingress-nginx proxy read/send timeout, seconds: idle Jupyter websockets (kernels, terminals) stay open an hour."""

AUTH_RESPONSE_HEADERS = "X-Auth-Request-User"
"""Headers of the verify answer ingress-nginx copies onto the proxied request (the authenticated user)."""

KINDS: tuple[RoutingKind, ...] = (INGRESS,)
"""The kinds this mode writes (one object of each per session)."""


def objects(gss: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The session's routing objects in this mode: ``[session_ingress(gss)]``."""
    return [session_ingress(gss)]


def session_ingress(gss: Mapping[str, Any]) -> dict[str, Any]:
    """The session's Ingress (``networking.k8s.io/v1``) for ingress-nginx.

    ``ingressClassName: nginx``; one rule ``spec.host`` + ``spec.path`` (``Prefix``) to the session
    Service's ``http`` port. ingress-nginx annotations:

    * ``auth-url: spec.authUrl`` -- every request is first checked by the control plane's
      ``/internal/connect/verify`` (2xx lets it through, 401/403 refuse it);
    * ``auth-response-headers: X-Auth-Request-User`` -- the verified user reaches the pod;
    * ``auth-always-set-cookie: "true"`` -- the ``Set-Cookie`` of the verify answer reaches the
      browser whatever the pod answers (by default ingress-nginx adds it only when the upstream
      answers 200/201/204/206/30x, so a first visit answered 404 by the pod would lose the cookie);
    * ``proxy-read-timeout``/``proxy-send-timeout: "3600"`` -- kernel websockets are not cut after
      the default 60 s of silence;
    * ``proxy-body-size: "0"`` -- no request body limit, so saving a notebook larger than
      ingress-nginx's default 1 MiB does not fail with 413.

    No ``auth-signin``: the connect flow hands the browser its cookie; an unauthenticated request
    gets the verify endpoint's 401/403. Name, labels and owner: ``manifests.session_metadata``.
    """
    spec = gss["spec"]
    metadata = session_metadata(gss)
    metadata["annotations"] = {
        "nginx.ingress.kubernetes.io/auth-url": spec["authUrl"],
        "nginx.ingress.kubernetes.io/auth-response-headers": AUTH_RESPONSE_HEADERS,
        "nginx.ingress.kubernetes.io/auth-always-set-cookie": "true",
        "nginx.ingress.kubernetes.io/proxy-read-timeout": PROXY_TIMEOUT_SECONDS,
        "nginx.ingress.kubernetes.io/proxy-send-timeout": PROXY_TIMEOUT_SECONDS,
        "nginx.ingress.kubernetes.io/proxy-body-size": "0",
    }
    return {
        "apiVersion": INGRESS.api_version,
        "kind": INGRESS.kind,
        "metadata": metadata,
        "spec": {
            "ingressClassName": INGRESS_CLASS,
            "rules": [
                {
                    "host": spec["host"],
                    "http": {
                        "paths": [
                            {
                                "path": spec["path"],
                                "pathType": "Prefix",
                                "backend": {
                                    "service": {
                                        "name": session_object_name(spec["sessionId"]),
                                        "port": {"name": PORT_NAME},
                                    }
                                },
                            }
                        ]
                    },
                }
            ],
        },
    }
