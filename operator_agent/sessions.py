"""Session reconcile: ``GShareSession`` -> Pod, Service, routing objects, and status back to the control plane.

Built on Kopf (the operator framework named in ``docs/architecture.md``), run in a thread of ``python -m operator_agent``
beside the inventory loop (``operator_agent.main``), standalone (one replica, no peering), for
the one namespace ``GSHARE_SESSION_NAMESPACE``. One thin handler per event:

* ``on.resume`` + ``on.create`` of a GShareSession, ``on.update`` of its ``spec`` and a
  ``timer`` every ``RESYNC_SECONDS`` -> ``SessionReconciler.reconcile``: server-side apply of the
  Service and of the routing objects of ``spec.routing`` (``operator_agent.session_routing``: an Ingress, or an
  HTTPRoute with Envoy Gateway's policies; the other mode's are deleted when the mode changes), create the
  PersistentVolumeClaims of ``spec.volumes`` that do not exist yet and then the Pod when the session has none yet,
  then ``sync_status``. PVCs have no owner: volumes outlive sessions.
  A failed call raises ``kopf.TemporaryError(delay=GSHARE_RECONCILE_INTERVAL)``; an apiserver
  refusal of the Pod itself (400/422: invalid spec, admission denied) ends the session
  ``Failed`` with the apiserver's message instead of retrying forever.
* ``on.event`` of session Pods (label ``app.kubernetes.io/managed-by=gshare-operator``) ->
  ``SessionReconciler.sync_status``: Pod phase and HAMi allocation -> GShareSession ``status``.
* ``on.event`` ``DELETED`` of a GShareSession -> ``Terminated`` reported once. Its children go
  with it (``ownerReferences``, garbage collector). No finalizer: a finalizer would block the
  deletion -- and keep the GPU pod running -- whenever the operator or the control plane is down.
  The cost: a GShareSession deleted while the operator is not running gets no ``Terminated``
  (the control plane deleted it and knows).

Owner references are written by ``operator_agent.k8s.manifests`` (the same entry
``kopf.build_owner_reference`` makes, which the tests check) rather than with ``kopf.adopt``,
so the pure manifest functions return complete, schema-validated objects; ``kopf.adopt``
would add nothing but a copy of every GShareSession label.

Kopf settings (``operator_settings``): resource/namespace scanning disabled (no cluster-wide
list/watch of CRDs and namespaces: the chart's RBAC stays namespaced to the session
namespace), Kopf's bookkeeping kept in annotations under ``operator.gshare.io/`` (a structural
CRD schema would prune ``status.kopf``). With scanning disabled Kopf only serves resources
present when it starts, so ``run_sessions`` waits until the GShareSession CRD is served.

Status (``session_status_from_pod``), written to the GShareSession ``status`` (``phase``,
``node``, ``devices``, ``message``, ``observedAt``) only when it changes:

* no Pod and none created yet: nothing (the create handler is about to create it);
* Pod ``Pending``/``Running``/``Succeeded``/``Failed`` -> the same phase; ``Unknown`` keeps the
  previous phase with a message;
* the Pod is gone while the session was ``Pending``/``Running`` (deleted, evicted and
  collected) -> ``Failed`` with a message; a session Pod is never recreated (``restartPolicy:
  Never``: a session that ended is over);
* terminal phases (``Succeeded``, ``Failed``) are final: later Pod events change nothing;
* ``node`` = ``spec.nodeName``, ``devices`` = GPU UUIDs of HAMi's ``hami.io/vgpu-devices-allocated``
  (``operator_agent.hami_pods``), ``[]`` until HAMi has bound the pod.

Reporting (``StatusReporter``): each status, with the ``observedAt`` stored in the GShareSession,
becomes a report of ``POST /internal/v1/status``::

    {"reports": [{"session": "ses_...", "phase": "Running", "node": "gpu-h100-01",
                  "devices": ["GPU-..."], "message": "", "observed_at": "2026-11-29T16:00:00.123456Z"}]}

sent by a reporter thread at once after a change (and at the latest every
``GSHARE_RECONCILE_INTERVAL`` seconds while something is unsent), at most 500 per call. Only
changes since the last successful report are sent (an in-memory map); after a restart the
resume handlers re-observe every session, so everything is sent again -- harmless, the control
plane ignores a report whose ``observed_at`` is not newer than the last one it applied. For the
same reason ``observed_at`` has microseconds and strictly increases per session. A report the
control plane refuses (4xx other than 401) is logged and dropped until that session changes
again; a 403 ``forbidden_cluster_scope`` on a batch is retried report by report so one foreign
GShareSession cannot block the others.

This node's clock may be wrong: a report is never sent stamped later than the control plane's time as the last answer
told it (``operator_agent.clock``), and a 409 ``report_from_future`` (a clock ahead beyond the control plane's
tolerance, before any answer said so) is logged with the offset and the fix (NTP on this node), then the batch is sent
once more stamped with the control plane's time that refusal carried, never the same body again.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kopf
import kubernetes.client
import urllib3.exceptions

from contract import (
    GSHARE_API_GROUP,
    GSHARE_API_VERSION,
    GSHARE_SESSION_PLURAL,
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    PHASE_TERMINATED,
    REPORT_FROM_FUTURE,
    SESSION_ID_LABEL,
    STATUS_PATH,
    rfc3339,
    session_object_name,
)
from operator_agent.config import OperatorConfig
from operator_agent.control_plane import (
    ControlPlaneClient,
    ControlPlaneError,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
)
from operator_agent.hami import HamiDecodeError
from operator_agent.hami_pods import allocated_device_uuids
from operator_agent.k8s.manifests import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    session_pod,
    session_pvc,
    session_service,
    session_volumes,
)
from operator_agent.session_routing import RoutingApplier, api_message
from operator_agent.storage import session_volume_wait

__all__ = [
    "FIELD_MANAGER",
    "KOPF_ANNOTATION_PREFIX",
    "RESYNC_SECONDS",
    "SessionReconciler",
    "StatusReporter",
    "build_registry",
    "connection_info",
    "crd_served",
    "format_time",
    "next_observed_at",
    "operator_settings",
    "run_sessions",
    "session_status_from_pod",
    "status_report",
]

logger = logging.getLogger(__name__)

FIELD_MANAGER = "gshare-operator"
"""``fieldManager`` of the operator's server-side applies."""

KOPF_ANNOTATION_PREFIX = "operator.gshare.io"
"""Prefix of the annotations where Kopf keeps its per-object bookkeeping (diff base, retries)."""

RESYNC_SECONDS = 60.0
"""Period of the per-session safety timer that re-applies the children and re-reads the Pod."""

MAX_REPORTS_PER_CALL = 500
"""``POST /internal/v1/status`` accepts at most this many reports per call."""

MAX_MESSAGE_CHARS = 1000
"""Status messages are cut to this many characters (the control plane keeps 2000)."""

TERMINAL_PHASES = frozenset({PHASE_SUCCEEDED, PHASE_FAILED, PHASE_TERMINATED})
"""Phases a session never leaves."""

_POD_PHASES = {"Pending": PHASE_PENDING, "Running": PHASE_RUNNING, "Succeeded": PHASE_SUCCEEDED, "Failed": PHASE_FAILED}
_WAITING_REASONS_WORTH_A_MESSAGE = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError",
     "RunContainerError", "CrashLoopBackOff"}
)
_ENDED_MEMORY = 4096  # Terminated sessions remembered, so late events do not report them again


# --------------------------------------------------------------------------- time


def format_time(moment: datetime.datetime) -> str:
    """RFC 3339 UTC with microseconds: ``2026-11-29T16:00:00.123456Z``."""
    return rfc3339.format_utc(moment, timespec="microseconds")


def next_observed_at(previous: str | None, now: datetime.datetime | None = None) -> str:
    """``now`` as ``format_time``, but strictly later than ``previous`` (an earlier ``observed_at`` of the session).

    The control plane ignores a report whose ``observed_at`` is not newer than the last one it
    applied, so two changes observed within the same microsecond (or with the clock stepping
    back) must still be ordered.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    before = rfc3339.parse(previous)
    if before is not None and now <= before:
        now = before + datetime.timedelta(microseconds=1)
    return format_time(now)


# --------------------------------------------------------------------------- status (pure)


def session_status_from_pod(
    pod: Mapping[str, Any] | None, previous: Mapping[str, Any] | None, *, pod_name: str = "the session pod"
) -> dict[str, Any] | None:
    """The session status a Pod implies, given the GShareSession's current ``status``.

    Args:
        pod: the session Pod as JSON (``metadata``/``spec``/``status``), or ``None`` when it does not exist.
        previous: the GShareSession's ``status`` (``phase``, ``node``, ``devices``, ``message``,
            ``observedAt``), ``{}``/``None`` before the first one.
        pod_name: how the Pod is named in the message when it has disappeared.

    Returns:
        ``{"phase", "node", "devices", "message"}`` (``node`` ``""`` until scheduled, ``devices`` GPU
        UUIDs, ``message`` ``""`` when there is nothing to say), or ``None`` when there is nothing to
        report yet (no Pod and no phase: the Pod is about to be created). A terminal ``previous`` is
        returned unchanged. See the module docstring for the mapping.
    """
    previous = previous or {}
    before = previous.get("phase")
    kept = {
        "phase": before,
        "node": previous.get("node") or "",
        "devices": list(previous.get("devices") or []),
        "message": previous.get("message") or "",
    }
    if before in TERMINAL_PHASES:
        return kept
    if pod is None:
        if before is None:
            return None
        kept.update(phase=PHASE_FAILED, message=f"{pod_name} disappeared before it ended (deleted or evicted)")
        return kept
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    try:
        devices = allocated_device_uuids(pod)
    except HamiDecodeError as exc:
        logger.warning("%s: cannot decode HAMi's allocation annotation, reporting no devices: %s", pod_name, exc)
        devices = []
    node = spec.get("nodeName") or ""
    pod_phase = status.get("phase") or "Pending"
    phase = _POD_PHASES.get(pod_phase)
    if phase is None:  # "Unknown": the node stopped reporting; keep what we knew
        return {
            "phase": before or PHASE_PENDING,
            "node": node or kept["node"],
            "devices": devices or kept["devices"],
            "message": _cut(f"pod phase is {pod_phase}: {status.get('message') or 'the node stopped reporting'}"),
        }
    return {"phase": phase, "node": node, "devices": devices, "message": _cut(_pod_message(phase, status))}


def status_report(session_id: str, status: Mapping[str, Any]) -> dict[str, Any]:
    """One StatusReport of ``POST /internal/v1/status`` from a GShareSession ``status``.

    Returns:
        ``{"session": "ses_...", "phase", "node": str | None, "devices": [GPU UUID, ...],
        "message": str, "observed_at": RFC 3339 UTC}`` (``node`` ``None`` when unscheduled).
    """
    return {
        "session": session_id,
        "phase": status["phase"],
        "node": status.get("node") or None,
        "devices": list(status.get("devices") or []),
        "message": status.get("message") or "",
        "observed_at": status["observedAt"],
    }


def _pod_message(phase: str, status: Mapping[str, Any]) -> str:
    """Why a Pod is in ``phase``, from its conditions and container statuses (``""`` when all is well)."""
    containers = list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])
    if phase == PHASE_PENDING:
        for container in containers:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _WAITING_REASONS_WORTH_A_MESSAGE:
                detail = f": {waiting['message']}" if waiting.get("message") else ""
                return f"container {container.get('name')} is waiting: {waiting['reason']}{detail}"
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                text = f"not scheduled ({condition.get('reason') or 'Unschedulable'})"
                return f"{text}: {condition['message']}" if condition.get("message") else text
        return ""
    if phase in (PHASE_SUCCEEDED, PHASE_FAILED):
        if status.get("reason") or status.get("message"):
            return ": ".join(filter(None, [status.get("reason"), status.get("message")]))
        for container in containers:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated and (phase == PHASE_FAILED or terminated.get("exitCode")):
                text = f"container {container.get('name')} exited with code {terminated.get('exitCode')}"
                if terminated.get("reason"):
                    text += f" ({terminated['reason']})"
                if terminated.get("message"):
                    text += f": {terminated['message']}"
                return text
    return ""


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


# --------------------------------------------------------------------------- reporting


class StatusReporter:
    """Sends session status changes with ``POST /internal/v1/status``; thread-safe.

    ``observe`` records a session's latest report; ``terminated`` records its end; ``flush`` sends
    everything that differs (phase, node, devices, message) from the last report the control plane
    accepted for that session; ``run`` flushes on every change until stopped.

    Args:
        client: the control-plane client (its own ``requests`` session: it is used from this thread only).
        clock: returns the current UTC time (for ``Terminated`` reports).
    """

    def __init__(self, client: ControlPlaneClient, *, clock: Callable[[], datetime.datetime] | None = None):
        self._client = client
        self._clock = clock or (lambda: datetime.datetime.now(datetime.UTC))
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._current: dict[str, dict[str, Any]] = {}
        self._sent: dict[str, tuple] = {}
        self._ended: set[str] = set()
        self._ended_order: deque[str] = deque()
        self.auth_failed = False
        """Whether the last ``flush`` stopped on a 401 or an unreadable token file."""

    def observe(self, report: Mapping[str, Any]) -> None:
        """Record ``report`` (a ``status_report`` dict) as the session's latest; wakes ``run`` if it changed."""
        session = report["session"]
        with self._lock:
            if session in self._ended:
                return
            self._current[session] = dict(report)
            changed = self._sent.get(session) != _essence(report)
        if changed:
            self._wake.set()

    def terminated(self, session_id: str, message: str = "the GShareSession was deleted") -> None:
        """Record that the session's GShareSession is gone: one ``Terminated`` report, then the session is forgotten."""
        with self._lock:
            if session_id in self._ended:
                return
            last = self._current.get(session_id) or {}
            self._current[session_id] = {
                "session": session_id,
                "phase": PHASE_TERMINATED,
                "node": last.get("node"),
                "devices": list(last.get("devices") or []),
                "message": message,
                "observed_at": next_observed_at(last.get("observed_at"), self._clock()),
            }
            self._remember_ended(session_id)
        self._wake.set()

    def pending(self) -> list[dict[str, Any]]:
        """Reports not yet accepted by the control plane, sorted by ``observed_at`` (copies)."""
        with self._lock:
            unsent = [dict(r) for s, r in self._current.items() if self._sent.get(s) != _essence(r)]
        return sorted(unsent, key=lambda r: (r["observed_at"], r["session"]))

    def flush(self) -> bool:
        """Send the pending reports, at most ``MAX_REPORTS_PER_CALL`` per call.

        Returns:
            ``True`` when nothing is left to send (sent, or refused and dropped), ``False`` when the
            control plane could not be reached or the token was refused or unreadable (the reports
            stay pending; ``auth_failed`` tells which).
        """
        self.auth_failed = False
        pending = self.pending()
        for start in range(0, len(pending), MAX_REPORTS_PER_CALL):
            batch = pending[start : start + MAX_REPORTS_PER_CALL]
            if not self._send(batch, split_on_refusal=True):
                return False
        return True

    def run(self, stop: threading.Event, interval: float, auth_retry: float) -> None:
        """Flush after every change (and every ``interval`` seconds while reports are pending) until ``stop`` is set.

        Args:
            stop: set to end the loop (call ``wake`` so it notices at once).
            interval: seconds between retries of pending reports.
            auth_retry: seconds to wait after a 401 or an unreadable token file before trying again.
        """
        delay = interval
        while not stop.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if stop.is_set():
                break
            try:
                self.flush()
            except Exception:  # keep reporting alive across unexpected bugs; the traceback is logged
                logger.exception("status flush failed unexpectedly")
            delay = auth_retry if self.auth_failed else interval

    def wake(self) -> None:
        """Make ``run`` look at once (used on shutdown)."""
        self._wake.set()

    def _send(self, batch: list[dict[str, Any]], *, split_on_refusal: bool, restamped: bool = False) -> bool:
        """POST one batch; ``False`` when it must be retried later (unreachable, 401, no token)."""
        batch = _not_after(batch, self._client.clock.control_plane_now())
        try:
            self._client.request("POST", STATUS_PATH, json_body={"reports": batch})
        except ControlPlaneRejected as exc:
            if exc.code == REPORT_FROM_FUTURE and not restamped:
                logger.error(
                    "status reports refused: this node's clock is %s s ahead of the control plane's (%s); enable NTP "
                    "(chrony or systemd-timesyncd) on this node; sending them once more stamped with the control plane's "
                    "time", exc.body.get("ahead_seconds", "?"), exc.code)
                return self._send(batch, split_on_refusal=split_on_refusal, restamped=True)
            if split_on_refusal and len(batch) > 1:
                logger.warning("status batch of %d reports refused (%s %s); sending them one by one",
                               len(batch), exc.status, exc.code)
                return all(self._send([report], split_on_refusal=False, restamped=restamped) for report in batch)
            for report in batch:
                logger.error("status report for %s dropped: the control plane refused it (%s %s: %s)",
                             report["session"], exc.status, exc.code, exc.detail)
            self._mark_sent(batch)
            return True
        except ControlPlaneUnavailable as exc:
            logger.warning("session status not reported: %s", exc)
            return False
        except ControlPlaneError:  # 401 or token file problem, logged by the client with code and detail
            self.auth_failed = True
            return False
        self._mark_sent(batch)
        logger.info("session status reported: %s", ", ".join(f"{r['session']} {r['phase']}" for r in batch))
        return True

    def _mark_sent(self, batch: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            for report in batch:
                session = report["session"]
                if report["phase"] == PHASE_TERMINATED:
                    self._current.pop(session, None)
                    self._sent.pop(session, None)
                elif self._current.get(session, {}).get("phase") != PHASE_TERMINATED:
                    self._sent[session] = _essence(report)

    def _remember_ended(self, session_id: str) -> None:
        self._ended.add(session_id)
        self._ended_order.append(session_id)
        while len(self._ended_order) > _ENDED_MEMORY:
            self._ended.discard(self._ended_order.popleft())


def _not_after(batch: list[dict[str, Any]], now: datetime.datetime) -> list[dict[str, Any]]:
    """``batch`` with each ``observed_at`` later than ``now`` (the control plane's time, ``ClockOffset``) stamped
    ``now``: a clock ahead must not date a change after the control plane's present."""
    stamp = format_time(now)
    return [{**r, "observed_at": stamp} if (rfc3339.parse(r["observed_at"]) or now) > now else r for r in batch]


def _essence(report: Mapping[str, Any]) -> tuple:
    """What makes two reports of one session different (``observed_at`` aside)."""
    return (report["phase"], report.get("node") or None, tuple(report.get("devices") or ()), report.get("message") or "")


# --------------------------------------------------------------------------- Kubernetes side


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

    def __init__(self, api_client: kubernetes.client.ApiClient, reporter: StatusReporter, namespace: str, *,
                 request_timeout: float | None = None):
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
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
            kubernetes.client.exceptions.ApiException, urllib3 errors: the apiserver failed; retry later.
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
                        failed = {"phase": PHASE_FAILED, "node": "", "devices": [], "message": _cut(refusal)}
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
            new = {**new, "message": _cut(problem + (f" ({new['message']})" if new.get("message") else ""))}
        if status.get("observedAt") and _essence(new) == _essence(status):
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
        why, first (``operator_agent.storage.session_volume_wait``: e.g. a StorageClass missing on this cluster)."""
        volumes = (gss.get("spec") or {}).get("volumes") or []
        if new["phase"] != PHASE_PENDING or not volumes:
            return new
        waiting = session_volume_wait(self.core.api_client, self.namespace, volumes, **self._timeout_kwargs)
        if not waiting:
            return new
        return {**new, "message": _cut(f"waiting for {waiting}" + (f" ({new['message']})" if new.get("message") else ""))}

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
        except kubernetes.client.exceptions.ApiException as exc:
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
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _get_pod(self, name: str, owner_uid: str | None) -> dict[str, Any] | None:
        """The session Pod as JSON, ``None`` when absent or owned by another object."""
        try:
            pod = self.core.api_client.sanitize_for_serialization(
                self.core.read_namespaced_pod(name, self.namespace, **self._timeout_kwargs)
            )
        except kubernetes.client.exceptions.ApiException as exc:
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
            except kubernetes.client.exceptions.ApiException as exc:
                if exc.status == 409:
                    continue  # already there (an earlier session, a retry, or a move): left alone
                if exc.status in (400, 422):
                    return f"the apiserver refused the PersistentVolumeClaim {name} of volume {volume['name']}: {api_message(exc)}"
                raise
            logger.info("persistentvolumeclaim %s/%s created for volume %s (%s)", self.namespace, name,
                        volume["name"], volume["volumeId"])
        return None

    def _create_pod(self, pod: dict[str, Any]) -> str | None:
        """Create the Pod; ``None`` when created or already there, else the apiserver's refusal (400/422)."""
        try:
            self.core.create_namespaced_pod(self.namespace, pod, field_manager=FIELD_MANAGER, **self._timeout_kwargs)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 409:
                return None
            if exc.status in (400, 422):
                return f"the apiserver refused the session pod: {api_message(exc)}"
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


# --------------------------------------------------------------------------- Kopf wiring


def operator_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    """Kopf settings of the session operator (see the module docstring)."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.scanning.disabled = True
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_ANNOTATION_PREFIX, v1=False)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=KOPF_ANNOTATION_PREFIX, v1=False)
    settings.persistence.finalizer = f"{KOPF_ANNOTATION_PREFIX}/finalizer"  # unused: no handler needs one
    settings.posting.reporting_component = FIELD_MANAGER
    settings.execution.default_backoff = config.reconcile_interval
    settings.networking.request_timeout = max(config.http_timeout, 60.0)
    return settings


def build_registry(reconciler: SessionReconciler, configuration: kubernetes.client.Configuration,
                   *, retry_delay: float) -> kopf.OperatorRegistry:
    """The Kopf handlers of the session operator, bound to ``reconciler``.

    Args:
        reconciler: does the work; handlers only translate events and errors.
        configuration: the apiserver connection Kopf logs in with (same as ``reconciler``'s).
        retry_delay: seconds before a failed reconcile is retried (``kopf.TemporaryError(delay=...)``).
    """
    registry = kopf.OperatorRegistry()
    resource = (GSHARE_API_GROUP, GSHARE_API_VERSION, GSHARE_SESSION_PLURAL)

    @kopf.on.login(id="kubeconfig", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(configuration)

    @kopf.on.resume(*resource, id="reconcile", registry=registry)
    @kopf.on.create(*resource, id="reconcile", registry=registry)
    @kopf.on.update(*resource, id="reconcile", field="spec", registry=registry)
    @kopf.timer(*resource, id="resync", interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, registry=registry)
    def reconcile_session(name: str, **_: Any) -> None:
        _temporarily(lambda: reconciler.reconcile(name), f"GShareSession {name}", retry_delay)

    @kopf.on.event(*resource, id="session-deleted", registry=registry)
    def session_event(event: Mapping[str, Any], **_: Any) -> None:
        if event.get("type") == "DELETED":
            reconciler.session_deleted(_plain(event["object"]))

    @kopf.on.event("", "v1", "pods", id="pod-status", labels={MANAGED_BY_LABEL: MANAGED_BY}, registry=registry)
    def pod_event(body: Mapping[str, Any], **_: Any) -> None:
        session_id = (body.get("metadata", {}).get("labels") or {}).get(SESSION_ID_LABEL)
        if session_id:
            _temporarily(lambda: reconciler.sync_status(session_object_name(session_id)), f"pod of {session_id}",
                         retry_delay, raise_temporary=False)

    return registry


def connection_info(configuration: kubernetes.client.Configuration) -> kopf.ConnectionInfo:
    """Kopf's credentials from a ``kubernetes`` client configuration (kubeconfig or in-cluster).

    The bearer token is read afresh (``refresh_api_key_hook``: the in-cluster token file is
    re-read), so Kopf's re-login after a 401 picks up a rotated service-account token.
    """
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook(configuration)
    # What the kubernetes client itself sends as the Authorization header ("Bearer <token>"); the
    # api_key entry is "BearerToken" from client v33, "authorization" before.
    bearer = (configuration.auth_settings().get("BearerToken") or {}).get("value")
    authorization = bearer or configuration.get_api_key_with_prefix("authorization") or ""
    scheme, _, token = authorization.strip().partition(" ")
    if not token:
        scheme, token = ("Bearer", scheme) if scheme else (None, None)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def _temporarily(work: Callable[[], object], what: str, delay: float, *, raise_temporary: bool = True) -> None:
    """Run ``work``; turn apiserver failures into ``kopf.TemporaryError(delay=delay)`` (or a log line)."""
    try:
        work()
    except kubernetes.client.exceptions.ApiException as exc:
        message = f"{what}: apiserver answered {exc.status} {exc.reason}: {api_message(exc)}"
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        message = f"{what}: cannot reach the apiserver: {exc}"
    else:
        return
    if raise_temporary:
        raise kopf.TemporaryError(message, delay=delay)
    logger.warning("%s (the next event or the resync timer retries)", message)


def _plain(value: Any) -> Any:
    """A Kopf body view as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


class _NotMainThreadFilter(logging.Filter):
    """Drops Kopf's warning that it ignores OS signals: ``operator_agent.main`` handles them and sets the stop flag."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "OS signals are ignored" not in record.getMessage()


def crd_served(api_client: kubernetes.client.ApiClient, *, request_timeout: float | None = None) -> bool:
    """Whether the apiserver serves ``gsharesessions.gshare.io/v1alpha1`` (discovery, no RBAC needed).

    Raises:
        kubernetes.client.exceptions.ApiException (other than 404), urllib3 errors.
    """
    kwargs: dict[str, Any] = {} if request_timeout is None else {"_request_timeout": request_timeout}
    try:
        resources = kubernetes.client.CustomObjectsApi(api_client).get_api_resources(
            GSHARE_API_GROUP, GSHARE_API_VERSION, **kwargs
        )
    except kubernetes.client.exceptions.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == GSHARE_SESSION_PLURAL for r in resources.resources or [])


def run_sessions(
    config: OperatorConfig,
    api_client: kubernetes.client.ApiClient,
    client: ControlPlaneClient,
    stop: threading.Event,
    *,
    ready: threading.Event | None = None,
) -> None:
    """Reconcile the GShareSessions of ``config.session_namespace`` and report their status until ``stop`` is set.

    Starts the reporter thread, waits until the GShareSession CRD is served, then runs Kopf in
    this thread (``kopf.run`` with ``stop`` as its stop flag). If Kopf ends on its own (an error it
    could not handle), it is started again after ``config.reconcile_interval`` seconds (at least 1).

    Args:
        config: operator settings (namespace, intervals, timeouts).
        api_client: client of the data-plane apiserver.
        client: control-plane client for the status reports (not shared with another thread).
        stop: set to stop; the caller joins this thread afterwards.
        ready: set once Kopf has started (for tests).
    """
    reporter = StatusReporter(client)
    reconciler = SessionReconciler(api_client, reporter, config.session_namespace, request_timeout=config.http_timeout)
    flusher = threading.Thread(
        target=reporter.run, args=(stop, config.reconcile_interval, config.backoff_max), name="status-reporter", daemon=True
    )
    flusher.start()
    logging.getLogger("kopf._core.reactor.running").addFilter(_NotMainThreadFilter())
    if not logger.isEnabledFor(logging.DEBUG):
        # Kopf logs "Handler ... succeeded" at INFO for every watch event of every session and pod;
        # this module logs the transitions that matter. Kopf's warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    restart_delay = max(config.reconcile_interval, 1.0)
    waiting_logged = False
    try:
        while not stop.is_set():
            try:
                served = crd_served(api_client, request_timeout=config.http_timeout)
            except kubernetes.client.exceptions.ApiException as exc:
                logger.warning("cannot look up the GShareSession resource: apiserver answered %s %s", exc.status, exc.reason)
                stop.wait(restart_delay)
                continue
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                logger.warning("cannot reach the apiserver to look up the GShareSession resource: %s", exc)
                stop.wait(restart_delay)
                continue
            if not served:
                if not waiting_logged:
                    logger.warning("the GShareSession CRD (%s.%s/%s) is not installed: sessions are not reconciled until it is",
                                   GSHARE_SESSION_PLURAL, GSHARE_API_GROUP, GSHARE_API_VERSION)
                    waiting_logged = True
                stop.wait(max(restart_delay, 10.0))
                continue
            logger.info("reconciling GShareSessions in namespace %s", config.session_namespace)
            try:
                kopf.run(
                    registry=build_registry(reconciler, api_client.configuration, retry_delay=config.reconcile_interval),
                    settings=operator_settings(config),
                    standalone=True,
                    clusterwide=False,
                    namespaces=[config.session_namespace],
                    stop_flag=stop,
                    ready_flag=ready,
                )
            except Exception as exc:  # Kopf gave up (e.g. the apiserver vanished): start it again
                logger.error("session reconciler stopped: %s: %s; restarting in %gs", type(exc).__name__, exc, restart_delay)
            if not stop.is_set():
                stop.wait(restart_delay)
    finally:
        reporter.wake()
        flusher.join(timeout=max(config.http_timeout, 1.0) + 1.0)
