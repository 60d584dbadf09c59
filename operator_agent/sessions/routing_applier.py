"""Apply a session's routing objects (``operator_agent.manifests.routing``) and remove those of its previous routing mode.

Used by ``operator_agent.sessions.reconciler.SessionReconciler`` under its per-session lock. Every routing object -- the Ingress
as much as the Gateway API and Envoy Gateway custom resources -- goes through ``CustomObjectsApi`` (the same
``/apis/<group>/<version>/namespaces/<ns>/<plural>/<name>`` URL the typed clients use), server-side applied with the
operator's field manager.

After a session's own objects, the cluster's fallback route for ``/s/`` (``operator_agent.manifests.routing.fallback``: what
answers a stopped session's URL) is applied in the same mode, once per process and whenever the session domain, the
control plane's address or the mode change; the other mode's fallback objects are deleted then.

Objects are applied in ``routing_objects``' order and deleted in ``stale_kinds``' order: an HTTPRoute is applied after,
and deleted before, the policy that guards it, and is not applied at all when one of them could not be.

When ``spec.routing`` changes (the control plane re-applies live sessions after a PATCH of the cluster's routing), the
new mode's objects are applied first and the other mode's are deleted after, so the session stays reachable through the
switch; a mode that cannot be applied (its CRDs are not installed) leaves the old objects in place. Which mode a
session was last applied in is kept in memory: after a restart the first reconcile of each session deletes the other
mode's objects once (404 = already gone).

A problem the operator cannot fix by retrying -- the cluster does not serve a kind the mode needs, the RBAC does not
allow it, the apiserver refuses an object, the ``spec`` cannot be routed -- is returned as a message for the session's
``status.message`` instead of raised, so Kopf does not retry it in a loop; the resync timer tries again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from contract import ROUTING_GATEWAY_API
from operator_agent import kube
from operator_agent.manifests.routing import RoutingError, RoutingKind, all_kinds, routing_mode, routing_objects, stale_kinds
from operator_agent.manifests.routing.fallback import FALLBACK_NAME, fallback_objects
from operator_agent.manifests.routing.kinds import BACKEND, HTTP_ROUTE, INGRESS

__all__ = ["RoutingApplier", "kind_of"]

logger = logging.getLogger(__name__)


def kind_of(obj: Mapping[str, Any]) -> RoutingKind:
    """The ``RoutingKind`` of a routing object (by ``apiVersion`` and ``kind``).

    Raises:
        ValueError: not a kind any routing mode writes.
    """
    for kind in all_kinds():
        if kind.api_version == obj["apiVersion"] and kind.kind == obj["kind"]:
            return kind
    raise ValueError(f"{obj['apiVersion']} {obj['kind']} is not a routing kind")


class RoutingApplier:
    """Server-side applies a session's routing objects and deletes its other mode's.

    Args:
        api_client: client of the data-plane apiserver.
        namespace: the session namespace.
        field_manager: ``fieldManager`` of the applies.
        request_timeout: seconds per apiserver call (``None``: the client's default).
    """

    def __init__(self, api_client: kube.ApiClient, namespace: str, *, field_manager: str,
                 request_timeout: float | None = None):
        self.custom = kube.custom_objects(api_client)
        self.namespace = namespace
        self.field_manager = field_manager
        self._timeout_kwargs: dict[str, Any] = {} if request_timeout is None else {"_request_timeout": request_timeout}
        self._applied_mode: dict[str, str] = {}
        self.core = kube.core_v1(api_client)
        self._fallback: tuple[str, str] | None = None

    def apply(self, gss: Mapping[str, Any]) -> str | None:
        """Apply the routing objects of ``gss`` (a GShareSession as served) in its mode; then, if the session was not
        known to be in that mode, delete its objects of the other mode.

        Returns:
            ``None`` when every object is applied, else why not (for ``status.message``; also logged once per change).

        Raises:
            kube.ApiException, or a transport error (``kube.apiserver_call`` makes it ``KubeUnavailable``): the
            apiserver failed otherwise; retry later.
        """
        name = gss["metadata"]["name"]
        try:
            mode = routing_mode(gss)
            objects = routing_objects(gss)
        except RoutingError as exc:
            return f"routing: {exc}"
        for obj in objects:
            problem = self._apply(obj, mode)
            if problem is not None:
                return problem
        if self._applied_mode.get(name) != mode:
            for kind in stale_kinds(mode):
                self._delete(kind, name)
            if name in self._applied_mode:
                logger.info("session %s: routing switched to %s", name, mode)
            self._applied_mode[name] = mode
        self.apply_fallback(gss, mode)
        return None

    def apply_fallback(self, gss: Mapping[str, Any], mode: str) -> bool:
        """Apply the cluster's fallback route for ``/s/`` (``operator_agent.manifests.routing.fallback``) in ``mode``, for the
        session domain and control plane ``gss`` names, when they differ from what this process last applied; then
        delete the other mode's fallback objects. A failure is logged and tried again on the next session's apply:
        it never keeps a session from its own route.

        Returns:
            True when the fallback is in place (applied now or before).
        """
        try:
            objects = fallback_objects(gss, mode)
        except RoutingError as exc:
            logger.warning("fallback route for /s/ not applied: %s", exc)
            return False
        key = (mode, json.dumps(objects, sort_keys=True))
        if self._fallback == key:
            return True
        try:
            for obj in objects:
                if obj["kind"] == "Service":
                    self.core.patch_namespaced_service(FALLBACK_NAME, self.namespace, obj, field_manager=self.field_manager,
                                                       force=True, _content_type="application/apply-patch+yaml", **self._timeout_kwargs)
                    continue
                problem = self._apply(obj, mode)
                if problem is not None:
                    logger.warning("fallback route for /s/ not applied: %s", problem)
                    return False
            for kind in stale_kinds(mode):
                if kind in (INGRESS, HTTP_ROUTE, BACKEND):
                    self._delete(kind, FALLBACK_NAME)
            if mode == ROUTING_GATEWAY_API:
                try:
                    self.core.delete_namespaced_service(FALLBACK_NAME, self.namespace, **self._timeout_kwargs)
                except kube.ApiException as exc:
                    if exc.status not in (404, 403):
                        raise
        except (kube.ApiException, OSError) as exc:
            logger.warning("fallback route for /s/ not applied (%s); trying again with the next session", type(exc).__name__)
            return False
        logger.info("fallback route for %s/s/ applied (%s)", gss["spec"].get("host"), mode)
        self._fallback = key
        return True

    def forget(self, name: str) -> None:
        """The GShareSession ``name`` is gone: drop what is remembered about it."""
        self._applied_mode.pop(name, None)

    def _apply(self, obj: dict[str, Any], mode: str) -> str | None:
        kind = kind_of(obj)
        name = obj["metadata"]["name"]
        try:
            self.custom.patch_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural, name, obj, field_manager=self.field_manager,
                force=True, _content_type="application/apply-patch+yaml", **self._timeout_kwargs,
            )
        except kube.ApiException as exc:
            if exc.status == 404 and not self._served(kind):
                return (f"routing: this cluster does not serve {kind.resource}, which {mode} routing needs: "
                        + _install_hint(mode))
            if exc.status == 403:
                return (f"routing: the operator may not write {kind.resource} in namespace {self.namespace} "
                        f"({kube.api_message(exc)}): upgrade the gshare-operator chart, whose Role grants it")
            if exc.status in (400, 422):
                return f"routing: the apiserver refused the {kind.kind} {name}: {kube.api_message(exc)}"
            raise
        return None

    def _delete(self, kind: RoutingKind, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(kind.group, kind.version, self.namespace, kind.plural, name,
                                                        **self._timeout_kwargs)
        except kube.ApiException as exc:
            if exc.status in (404, 405):  # gone already, or the kind is not served here (nothing of it to delete)
                return
            if exc.status == 403:
                logger.warning("session %s: may not delete its %s (%s)", name, kind.resource, kube.api_message(exc))
                return
            raise
        logger.info("%s %s/%s deleted: the session's routing mode changed", kind.kind, self.namespace, name)

    def _served(self, kind: RoutingKind) -> bool:
        """Whether the apiserver serves ``kind`` (discovery of its group version; no RBAC needed)."""
        try:
            resources = self.custom.get_api_resources(kind.group, kind.version, **self._timeout_kwargs)
        except kube.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.name == kind.plural for r in resources.resources or [])


def _install_hint(mode: str) -> str:
    if mode == ROUTING_GATEWAY_API:
        return ("install Envoy Gateway v1.9.0 with its Gateway API CRDs (`manage.py attach_cluster --routing "
                "gateway-api` does), or switch the cluster's routing to ingress-nginx")
    return "install the networking.k8s.io/v1 Ingress API (Kubernetes 1.19 or later)"
