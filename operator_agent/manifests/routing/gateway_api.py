"""Gateway API routing: one ``HTTPRoute`` per session on the cluster's Gateway, guarded by an external-auth policy.

Format: Gateway API v1.6.1 ``gateway.networking.k8s.io/v1`` HTTPRoute (standard channel; CRD copy in
``tests/fixtures/crds``). The route only routes; who may pass is the external-auth implementation's objects
(``operator_agent.manifests.routing.EXTERNAL_AUTH``), which target this route by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract import GATEWAY_NAME_DEFAULT, GATEWAY_NAMESPACE_DEFAULT, session_object_name
from operator_agent.manifests.routing.kinds import HTTP_ROUTE, RoutingKind
from operator_agent.manifests.session import session_metadata, session_port

__all__ = ["GATEWAY_KIND", "KINDS", "route_target_ref", "session_gateway", "session_http_route"]

GATEWAY_KIND = "Gateway"
"""Kind of an HTTPRoute's parent (``gateway.networking.k8s.io``)."""

KINDS: tuple[RoutingKind, ...] = (HTTP_ROUTE,)
"""The kinds this module writes (one object of each per session)."""


def session_gateway(gss: Mapping[str, Any]) -> tuple[str, str]:
    """``(name, namespace)`` of the Gateway the session's route attaches to: ``spec.gateway``, else the contract's
    defaults (``gshare-sessions`` in ``gshare-system``) for a GShareSession written before the field existed."""
    gateway = gss["spec"].get("gateway") or {}
    return (gateway.get("name") or GATEWAY_NAME_DEFAULT, gateway.get("namespace") or GATEWAY_NAMESPACE_DEFAULT)


def session_http_route(gss: Mapping[str, Any]) -> dict[str, Any]:
    """The session's HTTPRoute (``gateway.networking.k8s.io/v1``).

    * ``parentRefs``: the Gateway ``session_gateway(gss)`` (in another namespace: the Gateway's listener must allow
      routes from the session namespace, ``allowedRoutes.namespaces``);
    * ``hostnames: [spec.host]``; one rule matching ``PathPrefix`` ``spec.path`` (``/s/<session id>/``) to the
      session Service (same name) on ``spec.port``;
    * name, labels and owner: ``manifests.session_metadata``.
    """
    spec = gss["spec"]
    gateway_name, gateway_namespace = session_gateway(gss)
    return {
        "apiVersion": HTTP_ROUTE.api_version,
        "kind": HTTP_ROUTE.kind,
        "metadata": session_metadata(gss),
        "spec": {
            "parentRefs": [{"group": HTTP_ROUTE.group, "kind": GATEWAY_KIND, "name": gateway_name,
                            "namespace": gateway_namespace}],
            "hostnames": [spec["host"]],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": spec["path"]}}],
                "backendRefs": [{"name": session_object_name(spec["sessionId"]), "port": session_port(spec)}],
            }],
        },
    }


def route_target_ref(route: Mapping[str, Any]) -> dict[str, str]:
    """A policy's ``targetRefs`` entry for ``route`` (an HTTPRoute from ``session_http_route``): Gateway API
    ``LocalPolicyTargetReferenceWithSectionName`` ``{group, kind, name}``, same namespace as the policy."""
    return {"group": HTTP_ROUTE.group, "kind": HTTP_ROUTE.kind, "name": route["metadata"]["name"]}
