"""The routing objects of a session, by routing mode (``spec.routing``: ``contract.ROUTING_MODES``).

* ``ingress-nginx`` (also a GShareSession without ``spec.routing``): an Ingress with ingress-nginx's ``auth-url``
  (``ingress_nginx``);
* ``gateway-api``: an HTTPRoute on the cluster's Gateway (``gateway_api``) plus the objects of the external-auth
  implementation ``EXTERNAL_AUTH`` that make the proxy ask the control plane about every request (today Envoy
  Gateway's Backend + SecurityPolicy + BackendTrafficPolicy, ``envoy_gateway``).

Another external-auth implementation (Istio's ``AuthorizationPolicy`` with a CUSTOM provider, say) is one module
with the ``ExternalAuth`` shape -- ``NAME``, ``KINDS`` and ``objects(gss, route)`` -- chosen below.

Every builder is pure (a new dict per call, nothing read from a cluster); the tests validate each object against the
upstream CRD schemas copied in ``tests/fixtures/crds``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from contract import ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX, ROUTING_MODES
from operator_agent.manifests.routing import envoy_gateway, gateway_api, ingress_nginx
from operator_agent.manifests.routing.kinds import RoutingError, RoutingKind

__all__ = [
    "EXTERNAL_AUTH",
    "ExternalAuth",
    "RoutingError",
    "RoutingKind",
    "all_kinds",
    "mode_kinds",
    "routing_mode",
    "routing_objects",
    "stale_kinds",
]


class ExternalAuth(Protocol):
    """An external-auth implementation for Gateway API routes (a module)."""

    NAME: str
    """Its name, for messages (``envoy-gateway``)."""

    KINDS: tuple[RoutingKind, ...]
    """The kinds its ``objects`` returns, one object each per session."""

    def objects(self, gss: Mapping[str, Any], route: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The objects that put the control plane's check in front of ``route`` (the session's HTTPRoute).

        Raises:
            RoutingError: the GShareSession's ``spec`` cannot be used.
        """
        ...


EXTERNAL_AUTH: ExternalAuth = envoy_gateway
"""The external-auth implementation of ``gateway-api`` routing."""


def routing_mode(gss: Mapping[str, Any]) -> str:
    """The session's routing mode: ``spec.routing``, ``ingress-nginx`` when absent (GShareSessions written before it).

    Raises:
        RoutingError: ``spec.routing`` is not one of ``ROUTING_MODES`` (the CRD's enum prevents it on a real apiserver).
    """
    mode = (gss.get("spec") or {}).get("routing") or ROUTING_INGRESS_NGINX
    if mode not in ROUTING_MODES:
        raise RoutingError(f"spec.routing {mode!r} is not one of {', '.join(ROUTING_MODES)}")
    return mode


def mode_kinds(mode: str) -> tuple[RoutingKind, ...]:
    """The kinds routing mode ``mode`` writes, in the order ``routing_objects`` returns them (the order to apply)."""
    if mode == ROUTING_GATEWAY_API:
        return EXTERNAL_AUTH.KINDS + gateway_api.KINDS
    return ingress_nginx.KINDS


def routing_objects(gss: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The routing objects of the session in its mode (``routing_mode``), ready for server-side apply.

    Returns:
        ``[Ingress]`` for ``ingress-nginx``; ``[Backend, SecurityPolicy, BackendTrafficPolicy, HTTPRoute]`` for
        ``gateway-api``: the route last, so that applied in this order it never exists without the policy that
        guards it (a policy may target a route that does not exist yet; a route without its policy would be open to
        anyone while, say, Envoy Gateway's CRDs are missing). All named ``session_object_name(sessionId)`` in the
        GShareSession's namespace, labelled and owned like the session's Pod.

    Raises:
        RoutingError: the ``spec`` cannot be routed (unknown mode; for ``gateway-api`` an unusable ``extAuthUrl``).
    """
    if routing_mode(gss) == ROUTING_GATEWAY_API:
        route = gateway_api.session_http_route(gss)
        return [*EXTERNAL_AUTH.objects(gss, route), route]
    return ingress_nginx.objects(gss)


def stale_kinds(mode: str) -> tuple[RoutingKind, ...]:
    """The kinds a session in ``mode`` must not have: those of every other mode (deleted when the mode changes), each
    mode's in the reverse of its apply order (an HTTPRoute goes before the policy that guards it)."""
    wanted = mode_kinds(mode)
    stale: list[RoutingKind] = []
    for other in ROUTING_MODES:
        stale.extend(kind for kind in reversed(mode_kinds(other)) if kind not in wanted and kind not in stale)
    return tuple(stale)


def all_kinds() -> tuple[RoutingKind, ...]:
    """Every kind some routing mode writes (each once)."""
    kinds: list[RoutingKind] = []
    for mode in ROUTING_MODES:
        kinds.extend(kind for kind in mode_kinds(mode) if kind not in kinds)
    return tuple(kinds)
