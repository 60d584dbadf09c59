"""A cluster's session routing (``Cluster.routing``: ``gateway-api`` or ``ingress-nginx``): the rules its settings
follow, and what the connection test reads of the controller that routes its sessions.

* ``routing_settings_refusal`` / ``session_domain_refusal``: why a routing, Gateway or session domain is refused
  (400, stable codes), or None; registration, ``PATCH /api/v1/clusters/{id}`` and the console all ask them.
* ``routing_key``: the settings a GShareSession's routing objects follow (re-applied when they change).
* ``routing_probe``: the connection test's ``routing`` report, read with the cluster's registered credential.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import validate_host

from clusters.errors import INVALID_GATEWAY_NAME, INVALID_GATEWAY_NAMESPACE, INVALID_ROUTING, SESSION_DOMAIN_IS_CONTROL_PLANE
from clusters.models import Cluster, cluster_name_validator, dns_name_validator
from contract import ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX, ROUTING_MODES
from core.exceptions import ApplicationError
from core.internal_hosts import internal_hosts
from kube import Deadline, KubeGateway, KubeRefused, KubeUnavailable
from kube.gateway import GATEWAY_CLASSES, GATEWAYS, INGRESS_CLASSES

#: ``spec.controller`` of the IngressClass the ingress-nginx chart installs (``controller.ingressClassResource.controllerValue``).
INGRESS_NGINX_CONTROLLER = "k8s.io/ingress-nginx"
#: ``spec.controllerName`` of Envoy Gateway's GatewayClass (Envoy Gateway v1.9.0, ``gateway.envoyproxy.io/gatewayclass-controller``).
ENVOY_GATEWAY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"
#: The settings that decide a session's routing objects (``spec.routing`` and ``spec.gateway`` of its GShareSession).
ROUTING_FIELDS = ("routing", "gateway_name", "gateway_namespace")
#: How the attach command installs each mode's controller (docs/attach.md).
ATTACH_COMMAND = "`manage.py attach_cluster --routing {mode}`"


class RoutingRefused(ApplicationError):
    """400: a routing setting or session domain that cannot be used."""

    status = 400
    code = INVALID_ROUTING


def routing_key(cluster: Cluster) -> tuple[str, str, str]:
    """``(routing, gateway_name, gateway_namespace)``: what a GShareSession's routing objects are built from (the
    Gateway counts only in ``gateway-api`` mode)."""
    if cluster.routing == ROUTING_GATEWAY_API:
        return cluster.routing, cluster.gateway_name, cluster.gateway_namespace
    return cluster.routing, "", ""


def routing_settings_refusal(changes: dict) -> RoutingRefused | None:
    """Why ``changes`` (any of ``routing``, ``gateway_name``, ``gateway_namespace``, as given) cannot be stored, or None.

    Codes: ``invalid_routing`` (not one of ``gateway-api``, ``ingress-nginx``), ``invalid_gateway_name`` (not a
    lowercase DNS name, RFC 1123, at most 253 characters), ``invalid_gateway_namespace`` (not a DNS label, at most 63).
    """
    if "routing" in changes and changes["routing"] not in ROUTING_MODES:
        return RoutingRefused(
            f"routing must be one of {', '.join(ROUTING_MODES)} ({ROUTING_GATEWAY_API}: an HTTPRoute per session on the "
            f"cluster's Gateway with Envoy Gateway's ext_authz; {ROUTING_INGRESS_NGINX}: an Ingress per session with "
            "ingress-nginx's auth-url, retired upstream on 2026-03-24); nothing was changed.",
            code=INVALID_ROUTING,
        )
    for field, validator, code, what in (
        ("gateway_name", dns_name_validator, INVALID_GATEWAY_NAME, "a lowercase DNS name (RFC 1123), e.g. gshare-sessions"),
        ("gateway_namespace", cluster_name_validator, INVALID_GATEWAY_NAMESPACE, "a DNS label (1-63 lowercase letters, digits or '-'), e.g. gshare-system"),
    ):
        if field not in changes:
            continue
        value = changes[field]
        if not isinstance(value, str) or not value or not validator.regex.fullmatch(value):
            return RoutingRefused(f"{field} must be {what}; nothing was changed.", code=code)
    return None


def is_control_plane_host(domain: str) -> bool:
    """Whether ``domain`` is a host the control plane itself answers at: the host of ``GSHARE_CONTROL_PLANE_URL``, or
    one a ``DJANGO_ALLOWED_HOSTS`` or ``GSHARE_INTERNAL_HOSTS`` entry matches as Django matches ``ALLOWED_HOSTS``
    (``.example.com`` covers example.com and its subdomains; ``*`` names none). The same rule as the ext_authz check's
    (``sessions.ext_authz.ext_authz_host_allowed``), which never answers on such a host."""
    # A trailing dot names the same host (Django's split_domain_port drops it from a Host header too).
    own = (urlsplit(settings.GSHARE_CONTROL_PLANE_URL).hostname or "").lower().rstrip(".")
    patterns = [host for host in (*settings.ALLOWED_HOSTS, *internal_hosts()) if host != "*"]
    domain = domain.lower()
    return domain == own or validate_host(domain, patterns)


def session_domain_refusal(domain: str) -> RoutingRefused | None:
    """``session_domain_is_control_plane`` (400) when ``domain`` is a host of the control plane
    (``is_control_plane_host``): a session route there (an HTTPRoute or Ingress for ``/s/...``) would shadow the control
    plane, and its checks would never be answered; else None."""
    if domain and is_control_plane_host(domain):
        return RoutingRefused(
            f"session_domain {domain!r} is a host of the control plane itself (the host of GSHARE_CONTROL_PLANE_URL, or "
            "matched by a DJANGO_ALLOWED_HOSTS or GSHARE_INTERNAL_HOSTS entry; .example.com covers its subdomains): session "
            "routes there would shadow the control plane. Give the cluster a name of its own that no such entry matches, "
            "whose DNS record points at its ingress node (e.g. lab-c1.sessions.example.net); nothing was changed.",
            code=SESSION_DOMAIN_IS_CONTROL_PLANE,
        )
    return None


def _condition(obj: dict, kind: str) -> tuple[bool, str]:
    """Whether ``obj``'s ``status.conditions`` has ``kind`` True for its current generation, and what it says
    (Gateway API v1.6.1 ``metav1.Condition``: ``type``, ``status``, ``reason``, ``message``, ``observedGeneration``)."""
    conditions = ((obj.get("status") or {}).get("conditions")) or []
    generation = (obj.get("metadata") or {}).get("generation")
    for condition in conditions if isinstance(conditions, list) else []:
        if not isinstance(condition, dict) or condition.get("type") != kind:
            continue
        said = f"{kind}={condition.get('status')} ({condition.get('reason') or 'no reason'}"
        said += f": {condition.get('message')})" if condition.get("message") else ")"
        observed = condition.get("observedGeneration")
        if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
            return False, f"{said}, for generation {observed} of {generation}: the controller has not seen the latest spec yet"
        return condition.get("status") == "True", said
    return False, f"no {kind} condition: no controller has taken it up"


def _name(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("name") or "?")


def _forbidden(what: str) -> str:
    return (
        f"The registered credential may not read {what} (403): it predates the routing check. Re-run "
        "`manage.py attach_cluster` with the admin kubeconfig (it extends the ServiceAccount gshare-control-plane with "
        "get/list on ingressclasses, gatewayclasses and gateways, read-only, and keeps the cluster's id), or grant them by "
        "hand (docs/attach.md)."
    )


def _ingress_nginx(kube: KubeGateway) -> dict:
    try:
        classes = kube.list(INGRESS_CLASSES)
    except KubeRefused as exc:
        if exc.status == 403:
            return {"controller": None, "detail": _forbidden("IngressClasses (networking.k8s.io)")}
        raise
    found = [_name(c) for c in classes if (c.get("spec") or {}).get("controller") == INGRESS_NGINX_CONTROLLER]
    if found:
        return {"controller": True, "detail": f"IngressClass {', '.join(sorted(found))} (controller {INGRESS_NGINX_CONTROLLER}) found."}
    return {"controller": False, "detail": (
        f"No IngressClass with controller {INGRESS_NGINX_CONTROLLER}: session Ingresses have nothing to serve them. Install "
        f"it with {ATTACH_COMMAND.format(mode=ROUTING_INGRESS_NGINX)} (ingress-nginx is retired upstream since 2026-03-24), "
        f"or move the cluster to Gateway API: {ATTACH_COMMAND.format(mode=ROUTING_GATEWAY_API)}, then `PATCH "
        f'/api/v1/clusters/<id>` with `{{"routing": "{ROUTING_GATEWAY_API}"}}`.'
    )}


def _gateway_api(kube: KubeGateway, cluster: Cluster) -> dict:
    install = (
        f"Install Envoy Gateway and the Gateway with {ATTACH_COMMAND.format(mode=ROUTING_GATEWAY_API)} (docs/attach.md)"
    )
    gateway_ref = f"{cluster.gateway_namespace}/{cluster.gateway_name}"
    try:
        classes = kube.list(GATEWAY_CLASSES)
    except KubeRefused as exc:
        if exc.status == 404:  # no Gateway API CRDs on the cluster: nothing routes HTTPRoutes
            return {"controller": False, "gateway_programmed": False, "detail": (
                f"The cluster serves no Gateway API (gateway.networking.k8s.io answers 404: its CRDs are not installed), so "
                f"nothing routes session HTTPRoutes. {install}; it installs the CRDs, the controller and Gateway {gateway_ref}."
            )}
        if exc.status == 403:
            return {"controller": None, "gateway_programmed": None, "detail": _forbidden("GatewayClasses and Gateways (gateway.networking.k8s.io)")}
        raise
    envoy = [c for c in classes if (c.get("spec") or {}).get("controllerName") == ENVOY_GATEWAY_CONTROLLER]
    accepted = [c for c in envoy if _condition(c, "Accepted")[0]]
    if accepted:
        controller, found = True, f"GatewayClass {', '.join(sorted(map(_name, accepted)))} (controller {ENVOY_GATEWAY_CONTROLLER}) is Accepted."
    elif envoy:
        said = "; ".join(f"{_name(c)}: {_condition(c, 'Accepted')[1]}" for c in envoy)
        controller, found = False, (
            f"GatewayClass {', '.join(sorted(map(_name, envoy)))} names {ENVOY_GATEWAY_CONTROLLER} but is not Accepted ({said}): "
            "Envoy Gateway is not running (`kubectl -n envoy-gateway-system get deploy envoy-gateway`)."
        )
    else:
        controller, found = False, f"No GatewayClass with controllerName {ENVOY_GATEWAY_CONTROLLER}. {install}."
    try:
        gateway = kube.get(GATEWAYS, cluster.gateway_name, namespace=cluster.gateway_namespace, missing_ok=True)
    except KubeRefused as exc:
        if exc.status == 403:
            return {"controller": controller, "gateway_programmed": None, "detail": f"{found} {_forbidden('Gateways')}"}
        raise
    if gateway is None:
        return {"controller": controller, "gateway_programmed": False, "detail": (
            f"{found} The Gateway {gateway_ref} the session HTTPRoutes attach to does not exist. {install}, or name the "
            f'Gateway the cluster has: `PATCH /api/v1/clusters/{cluster.public_id}` with `{{"gateway_name": ..., '
            '"gateway_namespace": ...}`.'
        )}
    programmed, said = _condition(gateway, "Programmed")
    if programmed:
        return {"controller": controller, "gateway_programmed": True, "detail": f"{found} Gateway {gateway_ref} is programmed ({said})."}
    return {"controller": controller, "gateway_programmed": False, "detail": (
        f"{found} Gateway {gateway_ref} is not programmed ({said}): its listeners serve nothing yet. See "
        f"`kubectl -n {cluster.gateway_namespace} describe gateway {cluster.gateway_name}` and Envoy Gateway's log "
        "(`kubectl -n envoy-gateway-system logs deploy/envoy-gateway`)."
    )}


def routing_probe(cluster: Cluster, *, timeout: float, reachable: bool = True) -> dict:
    """What routes the cluster's sessions, read now through its registered credential (read-only calls).

    ``ingress-nginx``: an IngressClass with ``spec.controller`` ``k8s.io/ingress-nginx``. ``gateway-api``: a
    GatewayClass with ``spec.controllerName`` ``gateway.envoyproxy.io/gatewayclass-controller`` and condition
    ``Accepted=True``, and the cluster's Gateway (``gateway_namespace``/``gateway_name``) with ``Programmed=True``
    (Gateway API v1.6.1 conditions; one for an older ``metadata.generation`` does not count). A cluster without the
    Gateway API CRDs (404 on the group) has no controller: said with the fix, not an error.

    Args:
        cluster: the registered cluster (its kubeconfig is decrypted in memory only).
        timeout: seconds for all the calls together.
        reachable: False when the connection test's probe found the apiserver not answering: nothing is read.

    Returns:
        ``{"mode", "controller": bool | None, "gateway_programmed": bool | None, "detail": sentence}``; None is unknown
        (the credential may not read it, the apiserver did not answer) and ``gateway_programmed`` is None in
        ``ingress-nginx`` mode (no Gateway).
    """
    report = {"mode": cluster.routing, "controller": None, "gateway_programmed": None, "detail": ""}
    if not reachable:
        return {**report, "detail": "Not checked: the apiserver did not answer."}
    try:
        with KubeGateway.for_cluster(cluster, deadline=Deadline(timeout)) as kube:
            if cluster.routing == ROUTING_GATEWAY_API:
                report.update(_gateway_api(kube, cluster))
            else:
                report.update(_ingress_nginx(kube))
    except KubeUnavailable as exc:
        report["detail"] = f"Not checked: the apiserver {exc} to the routing reads."
    except KubeRefused as exc:
        report["detail"] = f"Not checked: the apiserver refused the routing reads ({exc.status} {exc.summary})."
    except ApplicationError as exc:  # the stored kubeconfig cannot be used (never quoted: it holds the credential)
        report["detail"] = f"Not checked: {exc.code}."
    return report
