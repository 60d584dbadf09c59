"""Session reconcile: ``GShareSession`` -> PersistentVolumeClaims, Pod, Service and routing objects, and its ``status``.

``SessionReconciler`` does the work the Kopf handlers (``operator_agent.sessions.kopf_handlers``) ask for:

* ``reconcile``: server-side apply of the Service and of the routing objects of ``spec.routing``
  (``operator_agent.sessions.routing_applier``: an Ingress, or an HTTPRoute with Envoy Gateway's policies; the other
  mode's are deleted when the mode changes), create the PersistentVolumeClaims of ``spec.volumes`` that do not exist
  yet and then the Pod when the session has none yet, then ``sync_status``. PVCs have no owner: volumes outlive
  sessions. An apiserver refusal of the Pod itself (400/422: invalid spec, admission denied) ends the session
  ``Failed`` with the apiserver's message instead of retrying forever.
* ``sync_status``: Pod phase and HAMi allocation -> GShareSession ``status`` (``operator_agent.reporters.status``:
  the mapping, and the reporter that sends each change to the control plane).
* ``session_deleted``: ``Terminated`` reported once. Its children go with the GShareSession (``ownerReferences``,
  garbage collector).

Owner references are written by ``operator_agent.manifests.session`` (the same entry
``kopf.build_owner_reference`` makes, which the tests check) rather than with ``kopf.adopt``,
so the pure manifest functions return complete, schema-validated objects; ``kopf.adopt``
would add nothing but a copy of every GShareSession label.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from contract import (
    GSHARE_API_GROUP,
    GSHARE_API_VERSION,
    GSHARE_SESSION_PLURAL,
    PHASE_FAILED,
    PHASE_PENDING,
)
from operator_agent import kube
from operator_agent.manifests.session import (
    session_pod,
    session_pvc,
    session_service,
    session_volumes,
)
from operator_agent.reporters.status import (
    TERMINAL_PHASES,
    StatusReporter,
    cut_message,
    next_observed_at,
    session_status_from_pod,
    status_essence,
    status_report,
)
from operator_agent.reporters.storage import session_volume_wait
from operator_agent.sessions.routing_applier import RoutingApplier

__all__ = ["FIELD_MANAGER", "SessionReconciler"]

logger = logging.getLogger(__name__)

FIELD_MANAGER = "gshare-operator"
"""``fieldManager`` of the operator's server-side applies."""


class SessionReconciler:
    """Makes a GShareSession's Pod, Service and routing objects exist and keeps its ``status`` and reports current.

    Every public method may be called from several threads at once (Kopf runs sync handlers in a
    thread pool): the work on one session is serialised by a per-session lock.

    Args:
        api_client: client of the data-plane cluster's apiserver.
        reporter: where status reports go.
        namespace: the session namespace.
        request_timeout: seconds per apiserver call.
    """

    def __init__(self, api_client: kube.ApiClient, reporter: StatusReporter, namespace: str, *,
                 request_timeout: float | None = None):
        self.core = kube.core_v1(api_client)
        self.custom = kube.custom_objects(api_client)
        self.routing = RoutingApplier(api_client, namespace, field_manager=FIELD_MANAGER, request_timeout=request_timeout)
        self.reporter = reporter
        self.namespace = namespace
        self._timeout_kwargs: dict[str, Any] = {} if request_timeout is None else {"_request_timeout": request_timeout}
        self._locks: dict[str, threading.RLock] = {}
        self._locks_guard = threading.Lock()
        self._routing_problems: dict[str, str] = {}

    def reconcile(self, name: str) -> dict[str, Any] | None:
        """Ensure the children of GShareSession ``name`` and sync its status.

        The Service and the routing objects are applied (server-side apply, ``fieldManager=gshare-operator``) while
        the session is not over; a routing problem that retrying cannot fix (e.g. the mode's CRDs are not installed)
        is put in ``status.message`` while it lasts (``RoutingApplier.apply``); the Pod is created only while the session has no phase yet (never
        recreated), after the PersistentVolumeClaim of each ``spec.volumes`` entry (``_ensure_pvcs``). An
        apiserver refusal of a PVC or of the Pod (400/422) makes the session ``Failed``.

        Returns:
            The session's status after the call, or ``None`` when the GShareSession is gone or being deleted.

        Raises:
            kube.ApiException, or a transport error (``kube.apiserver_call`` makes it ``KubeUnavailable``): the
            apiserver failed; retry later.
        """
        with self._lock(name):
            gss = self._get_session(name)
            if gss is None or gss["metadata"].get("deletionTimestamp"):
                return None
            status = gss.get("status") or {}
            if status.get("phase") not in TERMINAL_PHASES:
                self._apply(session_service(gss))
                self._note_routing_problem(gss, self.routing.apply(gss))
                if not status.get("phase"):
                    refusal = self._ensure_pvcs(gss) or self._create_pod(session_pod(gss))
                    if refusal is not None:
                        failed = {"phase": PHASE_FAILED, "node": "", "devices": [], "message": cut_message(refusal)}
                        return self._write_status(gss, failed)
            return self._sync(gss)

    def sync_status(self, name: str) -> dict[str, Any] | None:
        """Re-read GShareSession ``name`` and its Pod; update ``status`` and the reporter.

        Returns:
            The session's status after the call; ``None`` when the GShareSession is gone or being
            deleted, or when it has no Pod and no phase yet.
        """
        with self._lock(name):
            gss = self._get_session(name)
            if gss is None or gss["metadata"].get("deletionTimestamp"):
                return None
            return self._sync(gss)

    def session_deleted(self, gss: Mapping[str, Any]) -> None:
        """The GShareSession is gone: report ``Terminated`` once."""
        session_id = (gss.get("spec") or {}).get("sessionId")
        if not session_id:
            return
        self.reporter.terminated(session_id)
        with self._locks_guard:
            self._locks.pop(gss["metadata"]["name"], None)
        self.routing.forget(gss["metadata"]["name"])
        self._routing_problems.pop(gss["metadata"]["name"], None)
        logger.info("session %s: GShareSession deleted, reporting Terminated", session_id)

    def _sync(self, gss: Mapping[str, Any]) -> dict[str, Any] | None:
        status = dict(gss.get("status") or {})
        name = gss["metadata"]["name"]
        pod = None if status.get("phase") in TERMINAL_PHASES else self._get_pod(name, gss["metadata"].get("uid"))
        new = session_status_from_pod(pod, status, pod_name=f"pod {self.namespace}/{name}")
        if new is None:
            return None
        new = self._with_volume_wait(gss, new)
        problem = self._routing_problems.get(name)
        if problem and new["phase"] not in TERMINAL_PHASES:
            new = {**new, "message": cut_message(problem + (f" ({new['message']})" if new.get("message") else ""))}
        if status.get("observedAt") and status_essence(new) == status_essence(status):
            self.reporter.observe(status_report(gss["spec"]["sessionId"], status))
            return status
        return self._write_status(gss, new)

    def _note_routing_problem(self, gss: Mapping[str, Any], problem: str | None) -> None:
        """Remember (and log once) the session's routing problem for ``_sync``'s status message; ``None`` clears it."""
        name = gss["metadata"]["name"]
        before = self._routing_problems.get(name)
        if problem is None:
            if before is not None:
                logger.info("session %s: routing applied", gss["spec"]["sessionId"])
            self._routing_problems.pop(name, None)
        elif problem != before:
            logger.warning("session %s: %s", gss["spec"]["sessionId"], problem)
            self._routing_problems[name] = problem

    def _with_volume_wait(self, gss: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """A Pending session with volumes whose PVCs are not all bound: its message says which volume it waits for and
        why, first (``operator_agent.reporters.storage.session_volume_wait``: e.g. a StorageClass missing on this cluster)."""
        volumes = (gss.get("spec") or {}).get("volumes") or []
        if new["phase"] != PHASE_PENDING or not volumes:
            return new
        waiting = session_volume_wait(self.core.api_client, self.namespace, volumes, **self._timeout_kwargs)
        if not waiting:
            return new
        return {**new, "message": cut_message(f"waiting for {waiting}" + (f" ({new['message']})" if new.get("message") else ""))}

    def _write_status(self, gss: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
        previous = gss.get("status") or {}
        status = {
            "phase": new["phase"],
            "node": new.get("node") or "",
            "devices": list(new.get("devices") or []),
            "message": new.get("message") or "",
            "observedAt": next_observed_at(previous.get("observedAt")),
        }
        try:
            self.custom.patch_namespaced_custom_object_status(
                GSHARE_API_GROUP, GSHARE_API_VERSION, self.namespace, GSHARE_SESSION_PLURAL, gss["metadata"]["name"],
                {"status": status}, _content_type="application/merge-patch+json", **self._timeout_kwargs,
            )
        except kube.ApiException as exc:
            if exc.status == 404:
                return status  # deleted meanwhile: its DELETED event reports Terminated
            raise
        session_id = gss["spec"]["sessionId"]
        if previous.get("phase") != status["phase"]:
            logger.info("session %s: %s -> %s%s", session_id, previous.get("phase") or "new", status["phase"],
                        f" ({status['message']})" if status["message"] else "")
        self.reporter.observe(status_report(session_id, status))
        return status

    def _get_session(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                GSHARE_API_GROUP, GSHARE_API_VERSION, self.namespace, GSHARE_SESSION_PLURAL, name, **self._timeout_kwargs
            )
        except kube.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _get_pod(self, name: str, owner_uid: str | None) -> dict[str, Any] | None:
        """The session Pod as JSON, ``None`` when absent or owned by another object."""
        try:
            pod = self.core.api_client.sanitize_for_serialization(
                self.core.read_namespaced_pod(name, self.namespace, **self._timeout_kwargs)
            )
        except kube.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        owners = [ref.get("uid") for ref in (pod.get("metadata") or {}).get("ownerReferences") or []]
        if owner_uid and owner_uid not in owners:
            logger.warning("pod %s/%s is not owned by its GShareSession (uid %s); ignoring it", self.namespace, name, owner_uid)
            return None
        return pod

    def _ensure_pvcs(self, gss: Mapping[str, Any]) -> str | None:
        """Create the PVC of each ``spec.volumes`` entry that does not exist yet (``session_pvc``).

        Create-if-absent, never apply: an existing PVC is left exactly as it is (a moved volume's PVC was
        created pre-bound by the control plane, with ``spec.volumeName``; a PVC's spec is immutable anyway).
        A PVC carries no owner reference, so it outlives the session.

        Returns:
            ``None`` when every PVC exists, else the apiserver's refusal (400/422) of one of them.
        """
        for volume in session_volumes(gss):
            pvc = session_pvc(volume, self.namespace)
            name = pvc["metadata"]["name"]
            try:
                self.core.create_namespaced_persistent_volume_claim(
                    self.namespace, pvc, field_manager=FIELD_MANAGER, **self._timeout_kwargs
                )
            except kube.ApiException as exc:
                if exc.status == 409:
                    continue  # already there (an earlier session, a retry, or a move): left alone
                if exc.status in (400, 422):
                    return f"the apiserver refused the PersistentVolumeClaim {name} of volume {volume['name']}: {kube.api_message(exc)}"
                raise
            logger.info("persistentvolumeclaim %s/%s created for volume %s (%s)", self.namespace, name,
                        volume["name"], volume["volumeId"])
        return None

    def _create_pod(self, pod: dict[str, Any]) -> str | None:
        """Create the Pod; ``None`` when created or already there, else the apiserver's refusal (400/422)."""
        try:
            self.core.create_namespaced_pod(self.namespace, pod, field_manager=FIELD_MANAGER, **self._timeout_kwargs)
        except kube.ApiException as exc:
            if exc.status == 409:
                return None
            if exc.status in (400, 422):
                return f"the apiserver refused the session pod: {kube.api_message(exc)}"
            raise
        logger.info("pod %s/%s created", self.namespace, pod["metadata"]["name"])
        return None

    def _apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply the session Service ``obj``, taking over conflicting fields."""
        self.core.patch_namespaced_service(obj["metadata"]["name"], self.namespace, obj, field_manager=FIELD_MANAGER,
                                           force=True, _content_type="application/apply-patch+yaml",
                                           **self._timeout_kwargs)

    def _lock(self, name: str) -> threading.RLock:
        with self._locks_guard:
            return self._locks.setdefault(name, threading.RLock())

