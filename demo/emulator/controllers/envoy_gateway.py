"""Stand-in for Envoy Gateway's controller (envoyproxy/gateway v1.9.0): the status it writes on Gateway API objects.

While the Deployment ``envoy-gateway`` exists in ``envoy-gateway-system`` (what the ``gateway-helm`` chart installs;
``demo/data/charts/gateway-helm`` in the demo), a pass after every relevant change writes, with the reasons and
messages Envoy Gateway writes (``internal/gatewayapi/status`` and its translator's test data):

- GatewayClasses of ``spec.controllerName: gateway.envoyproxy.io/gatewayclass-controller``: ``Accepted=True``
  (``Accepted``, "Valid GatewayClass");
- Gateways of such a class: per listener ``Accepted``/``ResolvedRefs``/``Programmed`` (an HTTPS listener whose
  certificate Secret is missing: ``ResolvedRefs=False`` ``InvalidCertificateRef``), ``supportedKinds`` and
  ``attachedRoutes``; the Gateway ``Accepted`` (from its listeners) and ``Programmed``: True with ``status.addresses``
  the InternalIP of the node Envoy runs on, when the controller's default ``envoyProxy`` (ConfigMap
  ``envoy-gateway-config``) pins Envoy to a node (``kubernetes.io/hostname`` node selector, the host-network placement
  gShare's attach sets); otherwise False ``AddressNotAssigned`` (a LoadBalancer Service no load balancer serves, as on
  a bare-metal cluster);
- HTTPRoutes whose ``parentRefs`` name such a Gateway: ``status.parents[]`` ``Accepted`` (a listener admits the
  route's namespace and hostname; else ``NotAllowedByListeners``/``NoMatchingListenerHostname``) and ``ResolvedRefs``
  (every Service ``backendRef`` exists; else ``BackendNotFound``), ``controllerName`` Envoy Gateway's.

Every condition carries the object's ``metadata.generation`` as ``observedGeneration``; ``lastTransitionTime``
changes only when a condition's status does. Nothing is written while the Deployment is absent: a Gateway then keeps
whatever status it had (none, for a new one), as with a stopped controller. No Envoy proxy is run: routing the
requests is the demo ingress's (``demo/ingress_nginx.py``).
"""

from __future__ import annotations

import copy
import datetime
import logging
from typing import TYPE_CHECKING, Any

import yaml

from demo.emulator.controllers import Controller, DelayedPass
from demo.emulator.store import StoreEvent

if TYPE_CHECKING:
    from demo.emulator.server import KubeApiEmulator

logger = logging.getLogger(__name__)

CONTROLLER_NAME = "gateway.envoyproxy.io/gatewayclass-controller"
NAMESPACE = "envoy-gateway-system"
DEPLOYMENT = "envoy-gateway"
CONFIG_MAP = "envoy-gateway-config"
GROUP = "gateway.networking.k8s.io"
#: What a store event's ``kind`` is for each object the pass reads.
WATCHED = {("apps", "deployments"), ("", "configmaps"), ("", "services"), ("", "secrets"), ("", "namespaces"), ("", "nodes"),
           (GROUP, "gatewayclasses"), (GROUP, "gateways"), (GROUP, "httproutes")}
PASS_SECONDS = 0.05


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": ""}


def merge_conditions(old: list[dict] | None, new: list[dict]) -> list[dict]:
    """``new`` conditions with each ``lastTransitionTime`` kept from ``old`` when that type's status is unchanged."""
    before = {c.get("type"): c for c in old or [] if isinstance(c, dict)}
    now = _now()
    merged = []
    for entry in new:
        previous = before.get(entry["type"])
        stamp = previous.get("lastTransitionTime") if previous and previous.get("status") == entry["status"] else None
        merged.append({**entry, "lastTransitionTime": stamp or now})
    return merged


def hostname_matches(listener_host: str | None, route_hosts: list[str]) -> bool:
    """Whether a listener's ``hostname`` (none: any; ``*.example.org``: one or more labels) admits one of a route's
    ``hostnames`` (none: the listener's), as the Gateway API's hostname intersection rules say."""
    if not listener_host or not route_hosts:
        return True
    for host in route_hosts:
        if host == listener_host:
            return True
        if listener_host.startswith("*.") and host.endswith(listener_host[1:]) and len(host) > len(listener_host) - 1:
            return True
        if host.startswith("*.") and listener_host.endswith(host[1:]):
            return True
    return False


def namespace_allowed(listener: dict, gateway_namespace: str, route_namespace: str, labels: dict[str, str]) -> bool:
    """Whether a listener's ``allowedRoutes.namespaces`` (``Same`` by default, ``All``, ``Selector`` with
    ``matchLabels``) admits routes of ``route_namespace`` (whose labels are ``labels``)."""
    rule = ((listener.get("allowedRoutes") or {}).get("namespaces") or {})
    source = rule.get("from") or "Same"
    if source == "All":
        return True
    if source == "Same":
        return route_namespace == gateway_namespace
    selector = rule.get("selector") or {}
    if selector.get("matchExpressions"):
        return False  # not emulated: such a listener admits nothing here
    return all(labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items())


class EnvoyGateway(Controller):
    """The Envoy Gateway stand-in of one emulator (see the module docstring)."""

    def __init__(self, api: KubeApiEmulator) -> None:
        super().__init__(api)
        self._pass = DelayedPass(api, self._status_pass, lambda: PASS_SECONDS, name="emulated-envoy-gateway",
                                 what="Envoy Gateway")

    def on_event(self, event: StoreEvent) -> None:
        """Kick a pass on a change of anything the status depends on (its own status writes end in a pass that writes
        nothing)."""
        if event.kind in WATCHED:
            self._pass.kick()

    def start(self) -> None:
        """Judge a seed's Gateway API objects."""
        self._pass.kick()

    # ----------------------------------------------------------------- reading the store

    def _spec(self, group: str, plural: str, version: str = "v1"):
        try:
            return self.api.served(group, version, plural)
        except KeyError:  # the CRD is not installed
            return None

    def _get(self, group: str, plural: str, namespace: str | None, name: str) -> dict | None:
        spec = self._spec(group, plural)
        return None if spec is None else self.api.get_object(spec, namespace, name)

    def running(self) -> bool:
        """Whether Envoy Gateway's Deployment exists (and is not being deleted)."""
        deployment = self._get("apps", "deployments", NAMESPACE, DEPLOYMENT)
        return deployment is not None and not (deployment.get("metadata") or {}).get("deletionTimestamp")

    def envoy_address(self) -> str:
        """The InternalIP of the node the controller's default ``envoyProxy`` pins Envoy to, or "" (no such pin)."""
        config_map = self._get("", "configmaps", NAMESPACE, CONFIG_MAP)
        try:
            config = yaml.safe_load(((config_map or {}).get("data") or {}).get("envoy-gateway.yaml") or "") or {}
            kubernetes = config["envoyProxy"]["provider"]["kubernetes"]
            node = kubernetes["envoyDeployment"]["pod"]["nodeSelector"]["kubernetes.io/hostname"]
        except (yaml.YAMLError, KeyError, TypeError):
            return ""
        found = self._get("", "nodes", None, str(node))
        for address in ((found or {}).get("status") or {}).get("addresses") or []:
            if address.get("type") == "InternalIP":
                return str(address.get("address") or "")
        return ""

    # ----------------------------------------------------------------- the pass

    async def _status_pass(self) -> None:
        if not self.running():
            return
        classes_spec, gateways_spec = self._spec(GROUP, "gatewayclasses"), self._spec(GROUP, "gateways")
        if classes_spec is None:
            return
        ours: set[str] = set()
        for gateway_class in self.api.live_objects(classes_spec):
            if (gateway_class.get("spec") or {}).get("controllerName") != CONTROLLER_NAME:
                continue
            ours.add(gateway_class["metadata"]["name"])
            generation = int(gateway_class["metadata"].get("generation") or 1)
            await self._write_status(classes_spec, gateway_class, {"conditions": [
                _condition("Accepted", True, "Accepted", "Valid GatewayClass", generation)]})
        if gateways_spec is None:
            return
        gateways = {(g["metadata"]["namespace"], g["metadata"]["name"]): g for g in self.api.live_objects(gateways_spec)
                    if (g.get("spec") or {}).get("gatewayClassName") in ours}
        routes_spec = self._spec(GROUP, "httproutes")
        routes = self.api.live_objects(routes_spec) if routes_spec is not None else []
        attached: dict[tuple[str, str, str], int] = {}
        for route in routes:
            await self._route_status(routes_spec, route, gateways, attached)
        address = self.envoy_address()
        for gateway in gateways.values():
            await self._gateway_status(gateways_spec, gateway, address, attached)

    async def _write_status(self, spec, current: dict, status: dict) -> None:
        """Store ``current`` with ``status`` (conditions merged for their transition times) when it differs."""
        old = current.get("status") or {}
        new_status = {**old, **status}
        if "conditions" in status:
            new_status["conditions"] = merge_conditions(old.get("conditions"), status["conditions"])
        if new_status == old:
            return
        updated = copy.deepcopy(current)
        updated["status"] = new_status
        await self.api.write_object(spec, updated, current)

    def _namespace_labels(self, name: str) -> dict[str, str]:
        namespace = self._get("", "namespaces", None, name)
        # The apiserver labels every namespace with its name.
        return {**(((namespace or {}).get("metadata") or {}).get("labels") or {}), "kubernetes.io/metadata.name": name}

    def _listener_refs(self, gateway: dict, listener: dict) -> tuple[bool, str, str]:
        """``(resolved, reason, message)`` of a listener's certificate references."""
        if listener.get("protocol") != "HTTPS":
            return True, "ResolvedRefs", "Listener references have been resolved"
        namespace = gateway["metadata"]["namespace"]
        for ref in ((listener.get("tls") or {}).get("certificateRefs") or []):
            ref_namespace = ref.get("namespace") or namespace
            if (ref.get("kind") or "Secret") != "Secret" or self._get("", "secrets", ref_namespace, ref.get("name") or "") is None:
                return False, "InvalidCertificateRef", f"Secret {ref_namespace}/{ref.get('name')} does not exist."
        return True, "ResolvedRefs", "Listener references have been resolved"

    async def _gateway_status(self, spec, gateway: dict, address: str, attached: dict[tuple[str, str, str], int]) -> None:
        namespace, name = gateway["metadata"]["namespace"], gateway["metadata"]["name"]
        generation = int(gateway["metadata"].get("generation") or 1)
        listeners, valid, invalid = [], 0, []
        for listener in (gateway.get("spec") or {}).get("listeners") or []:
            resolved, reason, message = self._listener_refs(gateway, listener)
            kinds = ((listener.get("allowedRoutes") or {}).get("kinds")
                     or [{"group": GROUP, "kind": "HTTPRoute"}, {"group": GROUP, "kind": "GRPCRoute"}])
            listeners.append({
                "name": listener.get("name"), "attachedRoutes": attached.get((namespace, name, listener.get("name")), 0),
                "supportedKinds": [{"group": k.get("group", GROUP), "kind": k.get("kind")} for k in kinds],
                "conditions": merge_conditions(None, [
                    _condition("Programmed", resolved, "Programmed" if resolved else "Invalid",
                               "Sending translated listener configuration to the data plane" if resolved
                               else "Listener is invalid, see other Conditions for details.", generation),
                    _condition("Accepted", True, "Accepted", "Listener has been successfully translated", generation),
                    _condition("ResolvedRefs", resolved, reason, message, generation),
                ]),
            })
            if resolved:
                valid += 1
            else:
                invalid.append(str(listener.get("name")))
        old_listeners = {entry.get("name"): entry for entry in (gateway.get("status") or {}).get("listeners") or []}
        for entry in listeners:
            entry["conditions"] = merge_conditions((old_listeners.get(entry["name"]) or {}).get("conditions"), entry["conditions"])
        if invalid and not valid:
            accepted = _condition("Accepted", False, "ListenersNotValid", f"No listeners are valid: {', '.join(sorted(invalid))}", generation)
        elif invalid:
            accepted = _condition("Accepted", True, "ListenersNotValid", f"Listeners not valid: {', '.join(sorted(invalid))}", generation)
        else:
            accepted = _condition("Accepted", True, "Accepted", "The Gateway has been scheduled by Envoy Gateway", generation)
        if address:
            programmed = _condition("Programmed", True, "Programmed", "Address assigned to the Gateway, 1/1 envoy replicas available",
                                    generation)
        else:
            programmed = _condition("Programmed", False, "AddressNotAssigned", "No addresses have been assigned to the Gateway", generation)
        status: dict[str, Any] = {"conditions": [accepted, programmed], "listeners": listeners}
        status["addresses"] = [{"type": "IPAddress", "value": address}] if address else []
        await self._write_status(spec, gateway, status)

    async def _route_status(self, spec, route: dict, gateways: dict[tuple[str, str], dict],
                            attached: dict[tuple[str, str, str], int]) -> None:
        namespace = route["metadata"]["namespace"]
        generation = int(route["metadata"].get("generation") or 1)
        route_spec = route.get("spec") or {}
        resolved, reason, message = True, "ResolvedRefs", "Resolved all the Object references for the Route"
        for rule_index, rule in enumerate(route_spec.get("rules") or []):
            for ref_index, ref in enumerate(rule.get("backendRefs") or []):
                if (ref.get("kind") or "Service") != "Service" or (ref.get("group") or "") != "":
                    continue
                ref_namespace = ref.get("namespace") or namespace
                if resolved and self._get("", "services", ref_namespace, ref.get("name") or "") is None:
                    resolved, reason = False, "BackendNotFound"
                    message = f"Failed to process route rule {rule_index} backendRef {ref_index}: service {ref_namespace}/{ref.get('name')} not found."
        parents = [p for p in (route.get("status") or {}).get("parents") or [] if p.get("controllerName") != CONTROLLER_NAME]
        labels = self._namespace_labels(namespace)
        for parent in route_spec.get("parentRefs") or []:
            if (parent.get("group") or GROUP) != GROUP or (parent.get("kind") or "Gateway") != "Gateway":
                continue
            key = (parent.get("namespace") or namespace, parent.get("name"))
            gateway = gateways.get(key)
            if gateway is None:
                continue
            admitted = []
            for listener in (gateway.get("spec") or {}).get("listeners") or []:
                if parent.get("sectionName") and parent["sectionName"] != listener.get("name"):
                    continue
                if not namespace_allowed(listener, key[0], namespace, labels):
                    continue
                if hostname_matches(listener.get("hostname"), route_spec.get("hostnames") or []):
                    admitted.append(listener.get("name"))
            if admitted:
                accepted = _condition("Accepted", True, "Accepted", "Route is accepted", generation)
                for listener_name in admitted:
                    attached[(*key, listener_name)] = attached.get((*key, listener_name), 0) + 1
            elif any(namespace_allowed(lst, key[0], namespace, labels) for lst in (gateway.get("spec") or {}).get("listeners") or []):
                accepted = _condition("Accepted", False, "NoMatchingListenerHostname",
                                      "There were no hostname intersections between the HTTPRoute and this parent ref's Listener(s).",
                                      generation)
            else:
                accepted = _condition("Accepted", False, "NotAllowedByListeners",
                                      "No listeners included by this parent ref allowed this attachment.", generation)
            old = next((p for p in (route.get("status") or {}).get("parents") or []
                        if p.get("controllerName") == CONTROLLER_NAME and p.get("parentRef") == parent), {})
            parents.append({"parentRef": copy.deepcopy(parent), "controllerName": CONTROLLER_NAME,
                            "conditions": merge_conditions(old.get("conditions"), [
                                accepted, _condition("ResolvedRefs", resolved, reason, message, generation)])})
        if parents or (route.get("status") or {}).get("parents"):
            await self._write_status(spec, route, {"parents": parents})
