"""Session status: what a session Pod implies for its GShareSession's ``status``, and the reports of it to the control
plane (``POST /internal/v1/status``).

The reconciler (``operator_agent.sessions.reconciler``) writes a status to the GShareSession and hands its report to
the ``StatusReporter``, whose thread sends it.

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

from contract import (
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    PHASE_TERMINATED,
    REPORT_FROM_FUTURE,
    STATUS_PATH,
    rfc3339,
)
from operator_agent.control_plane_client import (
    ControlPlaneClient,
    ControlPlaneError,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
)
from operator_agent.hami import HamiDecodeError
from operator_agent.hami_pods import allocated_device_uuids
from operator_agent.loop import repeat

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_REPORTS_PER_CALL",
    "TERMINAL_PHASES",
    "StatusReporter",
    "cut_message",
    "format_time",
    "next_observed_at",
    "session_status_from_pod",
    "status_essence",
    "status_report",
]

logger = logging.getLogger(__name__)

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
            "message": cut_message(f"pod phase is {pod_phase}: {status.get('message') or 'the node stopped reporting'}"),
        }
    return {"phase": phase, "node": node, "devices": devices, "message": cut_message(_pod_message(phase, status))}


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


def cut_message(message: str) -> str:
    """``message`` cut to ``MAX_MESSAGE_CHARS`` characters (the last one an ellipsis when cut)."""
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
            changed = self._sent.get(session) != status_essence(report)
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
            unsent = [dict(r) for s, r in self._current.items() if self._sent.get(s) != status_essence(r)]
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
        def wait(seconds: float) -> None:
            self._wake.wait(seconds)
            self._wake.clear()

        def step() -> float:
            try:
                self.flush()
            except Exception:  # keep reporting alive across unexpected bugs; the traceback is logged
                logger.exception("status flush failed unexpectedly")
            return auth_retry if self.auth_failed else interval

        if stop.is_set():
            return
        wait(interval)  # every flush follows a wait, which a change (``observe``, ``terminated``) ends at once
        repeat(step, stop, wait=wait)

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
                    self._sent[session] = status_essence(report)

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


def status_essence(report: Mapping[str, Any]) -> tuple:
    """What makes two reports of one session different (``observed_at`` aside)."""
    return (report["phase"], report.get("node") or None, tuple(report.get("devices") or ()), report.get("message") or "")

