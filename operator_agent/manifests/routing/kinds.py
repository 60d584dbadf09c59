"""The API kinds the routing modes write (with what it takes to address them on an apiserver), and ``RoutingError``."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BACKEND", "BACKEND_TRAFFIC_POLICY", "HTTP_ROUTE", "INGRESS", "SECURITY_POLICY", "RoutingError", "RoutingKind"]


class RoutingError(ValueError):
    """A GShareSession whose ``spec`` cannot be turned into routing objects (the message says which field and why)."""


class RoutingKind(NamedTuple):
    """One namespaced API kind: ``group`` (``""`` never: routing kinds are all in named groups), ``version``,
    ``plural`` (the URL's resource) and ``kind``."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        """``<group>/<version>``, an object's ``apiVersion``."""
        return f"{self.group}/{self.version}"

    @property
    def resource(self) -> str:
        """``<plural>.<group>/<version>``, how messages name the resource (as ``kubectl api-resources`` does)."""
        return f"{self.plural}.{self.group}/{self.version}"


INGRESS = RoutingKind("networking.k8s.io", "v1", "ingresses", "Ingress")
"""Kubernetes Ingress."""

HTTP_ROUTE = RoutingKind("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute")
"""Gateway API v1.6.1 HTTPRoute (standard channel)."""

BACKEND = RoutingKind("gateway.envoyproxy.io", "v1alpha1", "backends", "Backend")
"""Envoy Gateway v1.9.0 Backend."""

SECURITY_POLICY = RoutingKind("gateway.envoyproxy.io", "v1alpha1", "securitypolicies", "SecurityPolicy")
"""Envoy Gateway v1.9.0 SecurityPolicy."""

BACKEND_TRAFFIC_POLICY = RoutingKind("gateway.envoyproxy.io", "v1alpha1", "backendtrafficpolicies",
                                     "BackendTrafficPolicy")
"""Envoy Gateway v1.9.0 BackendTrafficPolicy."""
