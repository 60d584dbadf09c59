"""Step 7 of ``attach_cluster``: registration through the control plane's API, ``POST /api/v1/clusters`` (the control
plane probes the cluster), or, for a cluster registered already, its registration kept and brought up to date with
``PATCH /api/v1/clusters/{id}`` (the credential is sent every time)."""

from __future__ import annotations

from collections.abc import Callable

from attach import fixes
from attach.api_client import ControlPlaneClient, ControlPlaneError
from attach.context import StepContext
from contract import ROUTING_GATEWAY_API
from core.exceptions import ApplicationError

TITLE = "register with the control plane"


def run(ctx: StepContext) -> str:
    """Register the cluster, or update its registration; sets ``state.cluster``.

    Raises:
        AttachStopped: the name is registered for another cluster, or the control plane refused (the fix follows its
            error code: ``attach.fixes.registration_fix``).
        ControlPlaneError: the control plane did not answer as its API does.
    """
    options, state = ctx.options, ctx.state
    storage_class = state.storage.storage_class if state.storage else ""
    with ctx.control_plane() as api:
        existing = api.cluster_named(options.name)
        if existing is not None:
            known_uid = existing.get("kube_system_uid") or ""
            same = (known_uid == state.kube_system_uid if known_uid and state.kube_system_uid
                    else existing.get("apiserver_url") == state.server)
            if not same:
                raise ctx.stop(f"the name {options.name} is registered for another cluster ({existing['id']} at "
                               f"{existing.get('apiserver_url')}, kube-system uid {known_uid or 'unknown'})",
                               f"pick another --name, or deregister the other one: DELETE /api/v1/clusters/{existing['id']}")
            changes: dict[str, str] = {key: value for key, value in (("session_domain", options.session_domain),
                                                                     ("ingress_node", options.ingress_node),
                                                                     ("volume_storage_class", storage_class),
                                                                     *routing_fields(ctx).items())
                                       if value and existing.get(key) != value}
            # The credential is sent every time: the control plane keeps it when it is the one it holds, else checks
            # that it reaches the same cluster (kube-system uid) and replaces it in place.
            try:
                updated = api.update(existing["id"], {**changes, "kubeconfig": state.registered_kubeconfig})
            except ControlPlaneError as exc:
                raise ctx.stop(f"the registration of {existing['name']} ({existing['id']}) could not be updated: {exc.detail} "
                               f"(code {exc.code or exc.status})",
                               fixes.registration_fix(_as_application_error(exc), rerun=options.argv,
                                                      session_domain=existing.get("session_domain") or "",
                                                      cluster_lookup=_lookup(api))) from None
            state.cluster = updated
            listed = f", updated {', '.join(sorted(changes))}" if changes else ""
            return f"ok: already registered as {existing['id']} (kept{listed}; credential checked)"
        try:
            cluster = api.register({"name": options.name, "kubeconfig": state.registered_kubeconfig,
                                    "session_domain": options.session_domain, "ingress_node": options.ingress_node,
                                    "volume_storage_class": storage_class, **routing_fields(ctx)})
        except ControlPlaneError as exc:
            if not exc.code:
                raise
            raise ctx.stop(f"registration refused: {exc.detail} (code {exc.code})",
                           fixes.registration_fix(_as_application_error(exc), rerun=options.argv,
                                                  cluster_lookup=_lookup(api))) from None
    state.cluster = cluster
    return f"ok: registered as {cluster['id']}"


def routing_fields(ctx: StepContext) -> dict[str, str]:
    """The cluster's routing as step 5 set it up: ``routing``, and for gateway-api its Gateway's name and namespace."""
    state = ctx.state
    if state.routing != ROUTING_GATEWAY_API:
        return {"routing": state.routing} if state.routing else {}
    return {"routing": state.routing, "gateway_name": state.gateway_name, "gateway_namespace": state.gateway_namespace}


def _as_application_error(exc: ControlPlaneError) -> ApplicationError:
    """The control plane's refusal as the ApplicationError it was raised as there (code, detail, extra), for the fixes."""
    return ApplicationError(exc.detail, code=exc.code or "application_error", status=exc.status or 502, extra=exc.extra)


def _lookup(api: ControlPlaneClient) -> Callable[[str], dict | None]:
    """``clu_...`` id -> the cluster as the API shows it, or None when it cannot be read (for a fix's wording only)."""
    def lookup(cluster_id: str) -> dict | None:
        try:
            return api.cluster(cluster_id)
        except ControlPlaneError:
            return None
    return lookup
