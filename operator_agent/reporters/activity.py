"""GPU activity of the Running sessions, read from HAMi's vGPU monitor: ``POST /internal/v1/activity``.

Every ``GSHARE_ACTIVITY_INTERVAL`` seconds (default 30) the activity thread (``run_activity``) does one tick:

1. **Sessions.** It lists the session Pods of the session namespace (label ``gshare.io/session-id``) and keeps those in
   phase ``Running`` and not being deleted: each gives the session id (the label), its node (``spec.nodeName``) and
   its GPUs (HAMi's ``hami.io/vgpu-devices-allocated`` annotation, as the status reports and usage read it).
2. **Monitors.** It lists HAMi's device-plugin pods (label selector ``GSHARE_HAMI_MONITOR_SELECTOR``, default
   ``app.kubernetes.io/component=hami-device-plugin``) in ``GSHARE_HAMI_MONITOR_NAMESPACE``, or in every namespace
   when that is empty (the chart names HAMi's namespace, so the operator needs no cluster-wide pod access), keeps the
   Running ones and picks one per node (a ready one first, then the newest: during a rolling update two may run).
3. **Scrape.** For each node that runs a session, once per tick, it reads the monitor through the apiserver's pod
   proxy: ``GET /api/v1/namespaces/<ns>/pods/<pod>:<GSHARE_HAMI_MONITOR_PORT>/proxy/metrics``
   (the URL of ``CoreV1Api.connect_get_namespaced_pod_proxy_with_path``, sent through ``ApiClient.call_api`` so that an
   error answer's body is bounded too). The proxy, not the pod IP, because the operator then
   needs no network path to pod IPs beyond the apiserver (no NetworkPolicy hole towards the device plugin, nothing on
   the node's host network), the call is authorised like every other one by RBAC (``get`` on ``pods/proxy``, in the
   operator chart), and the demo's emulated apiserver can serve it. Nodes are scraped concurrently by at most
   ``SCRAPE_WORKERS`` threads; each scrape is bounded as a whole by ``GSHARE_HAMI_MONITOR_TIMEOUT`` (connect, answer
   and body, read in chunks against a deadline) and its body by ``hami_monitor.MAX_EXPOSITION_BYTES``, so one hung or
   flooding monitor costs one node's reading, not the tick.
4. **Report.** Each session gets one entry (``contract.ACTIVITY_PATH``): ``ok`` with every GPU of the session when its
   node's monitor answered and was parsed (``operator_agent.hami_monitor``; a GPU of which the monitor lists no series
   of the session's pod gets every value ``null``: it never initialised CUDA there); ``unknown`` with the reason and no
   GPUs otherwise (no monitor pod on the node, the proxy's or the monitor's error status, a timeout, an unreachable
   apiserver, an unparseable answer). A missing reading is never reported as zero. Entries go out in calls of at most
   ``ACTIVITY_MAX_SESSIONS`` through ``ControlPlaneClient.post_activity`` (its retries and token handling). A report
   refused with 403 ``forbidden_cluster_scope`` (it names a session the control plane does not know as this
   cluster's) is sent again in halves until the refused sessions are found; those are logged and left out while
   their Pods exist.

A failed report is not queued: the next tick sends fresh readings, and an old reading of activity is worth little. When
the session Pods cannot be listed nothing is sent that tick; when the monitor pods cannot be listed (RBAC) every
session is ``unknown`` with that reason. Scrape failures are counted in the operator's ``/metrics``
(``operator_agent.metrics``) and logged when a node's problem changes.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract import (
    ACTIVITY_MAX_SESSIONS,
    ACTIVITY_STATE_OK,
    ACTIVITY_STATE_UNKNOWN,
    FORBIDDEN_CLUSTER_SCOPE,
    PHASE_RUNNING,
    SESSION_ID_LABEL,
)
from operator_agent import kube
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import (
    ControlPlaneClient,
    ControlPlaneError,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
)
from operator_agent.hami import HamiDecodeError
from operator_agent.hami_monitor import MAX_EXPOSITION_BYTES, GpuReading, MonitorParseError, MonitorReadings, parse_monitor
from operator_agent.hami_pods import allocated_device_uuids
from operator_agent.loop import every
from operator_agent.metrics import OperatorMetrics

__all__ = [
    "SCRAPE_WORKERS",
    "ActivityReporter",
    "ActivityTarget",
    "ScrapeError",
    "activity_entries",
    "monitor_pods_by_node",
    "run_activity",
    "running_targets",
    "scrape_monitor",
]

logger = logging.getLogger(__name__)

SCRAPE_WORKERS = 4
"""Most monitors scraped at once (threads of one tick)."""

_CHUNK = 64 * 1024
_MAX_REASON = 1000  # the contract's maxLength of ``reason``
_ERROR_BODY_BYTES = 64 * 1024  # of a non-2xx answer: enough for the apiserver's Status


@dataclass(frozen=True)
class ActivityTarget:
    """A Running session whose activity is reported: its id, Pod (name and namespace), node and GPU UUIDs."""

    session_id: str
    namespace: str
    pod: str
    node: str
    devices: tuple[str, ...]


class ScrapeError(Exception):
    """A node's monitor could not be read. ``reason`` is one of ``metrics.SCRAPE_ERROR_REASONS``; the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------- what to report (pure)


def running_targets(pods: Iterable[Mapping[str, Any]]) -> list[ActivityTarget]:
    """The sessions to report, from the session Pods (JSON dicts): Running, not being deleted, labelled, on a node.

    A Pod whose HAMi annotation cannot be decoded is reported with no GPUs (the status report logs the problem).
    Sorted by session id; a session id is listed once (its first Pod).
    """
    targets: dict[str, ActivityTarget] = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        session_id = (metadata.get("labels") or {}).get(SESSION_ID_LABEL)
        node = (pod.get("spec") or {}).get("nodeName")
        if (not session_id or not node or metadata.get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase") != PHASE_RUNNING or session_id in targets):
            continue
        try:
            devices = tuple(allocated_device_uuids(pod))
        except HamiDecodeError:
            devices = ()
        targets[session_id] = ActivityTarget(session_id=session_id, namespace=metadata.get("namespace") or "",
                                             pod=metadata.get("name") or "", node=node, devices=devices)
    return [targets[key] for key in sorted(targets)]


def monitor_pods_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Per node name, the ``(namespace, name)`` of the device-plugin pod to scrape: Running, ready first, then newest."""
    best: dict[str, tuple[tuple, tuple[str, str]]] = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        status = pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or status.get("phase") != "Running" or metadata.get("deletionTimestamp"):
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        rank = (ready, str(metadata.get("creationTimestamp") or ""), str(metadata.get("name") or ""))
        if node not in best or rank > best[node][0]:
            best[node] = (rank, (metadata.get("namespace") or "", metadata.get("name") or ""))
    return {node: choice for node, (_, choice) in best.items()}


def _gpu_entry(uuid: str, reading: GpuReading | None, sampled_at: str) -> dict[str, Any]:
    reading = reading or GpuReading()
    return {"device_uuid": uuid, "last_kernel_seconds": reading.last_kernel_seconds,
            "utilization_percent": reading.utilization_percent, "memory_used_bytes": reading.memory_used_bytes,
            "memory_limit_bytes": reading.memory_limit_bytes, "sampled_at": sampled_at}


def activity_entries(targets: Sequence[ActivityTarget], readings: Mapping[str, tuple[MonitorReadings, str]],
                     problems: Mapping[str, str], *, now: str) -> list[dict[str, Any]]:
    """The session entries of ``POST /internal/v1/activity``.

    Args:
        targets: the sessions (``running_targets``).
        readings: per node, the parsed monitor answer and when it was read (RFC 3339 UTC).
        problems: per node that could not be read, why (the ``reason`` of its sessions' ``unknown`` entries).
        now: RFC 3339 UTC, the ``sampled_at`` of ``unknown`` entries.

    Returns:
        One entry per target, as ``contract.ACTIVITY_SCHEMA`` describes (a node in neither mapping is ``unknown``).
    """
    entries = []
    for target in targets:
        if target.node in readings:
            parsed, sampled_at = readings[target.node]
            of_pod = parsed.for_pod(target.namespace, target.pod)
            entries.append({"session": target.session_id, "node": target.node, "state": ACTIVITY_STATE_OK,
                            "reason": "", "sampled_at": sampled_at,
                            "gpus": [_gpu_entry(uuid, of_pod.get(uuid), sampled_at) for uuid in target.devices]})
        else:
            reason = problems.get(target.node) or f"node {target.node}'s HAMi vGPU monitor was not read"
            entries.append({"session": target.session_id, "node": target.node, "state": ACTIVITY_STATE_UNKNOWN,
                            "reason": _cut(reason), "sampled_at": now, "gpus": []})
    return entries


# --------------------------------------------------------------------------- scraping


def scrape_monitor(core_v1: kube.CoreV1Api, namespace: str, pod: str, *, port: int, timeout: float,
                   max_bytes: int = MAX_EXPOSITION_BYTES, clock: Callable[[], float] = time.monotonic) -> bytes:
    """The body of the monitor's ``/metrics``, through the apiserver's pod proxy.

    Args:
        core_v1: apiserver client (its pool is shared by the scraping threads; urllib3 pools are thread-safe).
        namespace, pod: the device-plugin pod.
        port: the monitor's container port.
        timeout: seconds for the whole scrape (connect, answer, body).
        max_bytes: largest body accepted.
        clock: monotonic seconds.

    Returns:
        The body, at most ``max_bytes``.

    Raises:
        ScrapeError: ``http_error`` (the proxy's or monitor's non-2xx status, with the apiserver's message),
            ``timeout``, ``unreachable`` (no connection, TLS), ``parse_error`` (the body is larger than ``max_bytes``).
    """
    deadline = clock() + timeout
    where = f"pod {namespace}/{pod} port {port}"
    api = core_v1.api_client
    # The URL of CoreV1Api.connect_get_namespaced_pod_proxy_with_path, called without it: on a non-2xx status that
    # method reads the whole body (no bound in size or time) before raising, so a flooding or trickling error answer
    # would hold this thread past every deadline. Every body is read here, in chunks, against the deadline.
    request = api.param_serialize(
        method="GET", resource_path="/api/v1/namespaces/{namespace}/pods/{name}/proxy/{path}",
        path_params={"namespace": namespace, "name": f"{pod}:{port}", "path": "metrics"},
        header_params={"Accept": "*/*"}, auth_settings=["BearerToken"])
    try:
        with kube.apiserver_call():
            response = api.call_api(*request, _request_timeout=(timeout, timeout)).response
    except kube.ApiException as exc:  # status 0: TLS or a request that could not be made
        raise ScrapeError("unreachable", f"cannot reach the apiserver to read {where}: {_cut(str(exc.reason), 300)}") from None
    except kube.KubeUnavailable as exc:
        if exc.timeout:
            raise ScrapeError("timeout", f"no answer within {timeout:g} s reading {where} ({exc.kind})") from None
        if exc.timed_out:
            raise ScrapeError("timeout", f"no answer within {timeout:g} s reading {where}") from None
        raise ScrapeError("unreachable", f"cannot reach the apiserver to read {where}: {_cut(str(exc), 300)}") from None
    try:
        with kube.apiserver_call():
            return _read_answer(response, where, deadline, timeout, max_bytes, clock)
    except kube.KubeUnavailable as exc:
        if exc.timeout:
            raise ScrapeError("timeout", f"{where} did not finish its answer within {timeout:g} s ({exc.kind})") from None
        raise ScrapeError("unreachable", f"the answer of {where} was cut off: {_cut(str(exc), 300)}") from None
    finally:
        response.close()
        response.release_conn()


def _read_answer(response, where: str, deadline: float, timeout: float, max_bytes: int,
                 clock: Callable[[], float]) -> bytes:
    """The monitor's body from the pod proxy's ``response`` (see ``scrape_monitor``); raises ``ScrapeError`` for an
    error status, a body past ``max_bytes`` or past ``deadline``, and lets transport errors through."""
    if not 200 <= response.status <= 299:
        try:
            body = _read_bounded(response, deadline, _ERROR_BODY_BYTES, clock)
        except (_TooLarge, _TooSlow) as cut:
            body = cut.args[0]  # the start of the apiserver's Status is enough for its message
        raise ScrapeError("http_error", f"the apiserver's pod proxy answered {response.status} {response.reason or ''} "
                                        f"reading {where}: {_body_message(body)}".strip())
    try:
        return _read_bounded(response, deadline, max_bytes, clock)
    except _TooSlow:
        raise ScrapeError("timeout", f"{where} did not finish its answer within {timeout:g} s") from None
    except _TooLarge:
        raise ScrapeError("parse_error", f"{where} answered more than {max_bytes} bytes: not the vGPU monitor") from None


class _TooLarge(Exception):
    """The body passed its bound; ``args[0]`` holds what was read."""


class _TooSlow(Exception):
    """The deadline passed before the body ended; ``args[0]`` holds what was read."""


def _read_bounded(response, deadline: float, max_bytes: int, clock: Callable[[], float]) -> bytes:
    """The body of a urllib3 response, read in chunks of what has arrived (``read1``) so the deadline is checked
    between the chunks of a trickling body. Raises ``_TooLarge`` past ``max_bytes``, ``_TooSlow`` past ``deadline``."""
    chunks: list[bytes] = []
    size = 0
    read = getattr(response, "read1", None) or response.read
    while True:
        if clock() > deadline:
            raise _TooSlow(b"".join(chunks))
        chunk = read(_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        chunks.append(chunk)
        if size > max_bytes:
            raise _TooLarge(b"".join(chunks)[:max_bytes])


def _api_message(exc: kube.ApiException) -> str:
    """The ``message`` of the apiserver's Status body, else the start of the body."""
    return _body_message(exc.body)


def _body_message(body: bytes | str | None) -> str:
    """The ``message`` of a Kubernetes ``Status`` body (JSON), else the body's start (at most 300 characters)."""
    body = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    try:
        data = json.loads(body)
    except ValueError:
        return _cut(body.strip(), 300)
    return _cut(str(data.get("message") or ""), 300) if isinstance(data, dict) else _cut(body.strip(), 300)


def _cut(text: str, limit: int = _MAX_REASON) -> str:
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _rfc3339(moment: float) -> str:
    value = datetime.datetime.fromtimestamp(moment, tz=datetime.UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


# --------------------------------------------------------------------------- the tick


class ActivityReporter:
    """Reads the sessions and monitors through the apiserver and reports one tick (see the module docstring).

    Args:
        api_client: client of the data-plane apiserver (this thread's own; the scraping threads share its pool).
        client: the control-plane client.
        config: namespace, selector, port, timeouts.
        metrics: where scrape failures and durations are recorded, or ``None``.
        clock: seconds since the epoch (``sampled_at``).
    """

    def __init__(self, api_client: kube.ApiClient, client: ControlPlaneClient, config: OperatorConfig, *,
                 metrics: OperatorMetrics | None = None, clock: Callable[[], float] = time.time):
        self.core = kube.core_v1(api_client)
        # Scrapes get their own client without urllib3's default retries (3): a read timeout retried would scrape the
        # node again and take four times GSHARE_HAMI_MONITOR_TIMEOUT; one scrape per node and tick, the next tick retries.
        self.scrape_core = kube.core_v1(kube.without_retries(api_client))
        self.client = client
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self._problems: dict[str, str] = {}  # node -> the last problem logged
        self._refused: set[str] = set()  # sessions the control plane refused as not this cluster's

    def collect(self) -> list[dict[str, Any]] | None:
        """The session entries of this tick, or ``None`` when the session Pods cannot be listed."""
        timeout = {"_request_timeout": self.config.http_timeout}
        try:
            with kube.apiserver_call():
                pods = self.core.list_namespaced_pod(self.config.session_namespace, label_selector=SESSION_ID_LABEL,
                                                     **timeout)
        except kube.ApiException as exc:
            logger.warning("activity not reported: cannot list session pods (apiserver answered %s %s)", exc.status,
                           exc.reason)
            return None
        except kube.KubeUnavailable as exc:
            logger.warning("activity not reported: cannot reach the apiserver (%s)", exc)
            return None
        targets = running_targets(self.core.api_client.sanitize_for_serialization(pods.items))
        if not targets:
            return []
        now = _rfc3339(self._clock())
        try:
            with kube.apiserver_call():
                if self.config.hami_monitor_namespace:
                    monitors = self.core.list_namespaced_pod(self.config.hami_monitor_namespace,
                                                             label_selector=self.config.hami_monitor_selector, **timeout)
                else:
                    monitors = self.core.list_pod_for_all_namespaces(label_selector=self.config.hami_monitor_selector,
                                                                     **timeout)
        except kube.ApiException as exc:
            where = f"namespace {self.config.hami_monitor_namespace}" if self.config.hami_monitor_namespace else "any namespace"
            why = (f"cannot list HAMi's device-plugin pods ({self.config.hami_monitor_selector}, {where}): the apiserver "
                   f"answered {exc.status} {exc.reason}: {_api_message(exc)}")
            logger.warning("activity of %d sessions unknown: %s", len(targets), why)
            return activity_entries(targets, {}, {t.node: why for t in targets}, now=now)
        except kube.KubeUnavailable as exc:
            why = f"cannot reach the apiserver to list HAMi's device-plugin pods: {exc}"
            logger.warning("activity of %d sessions unknown: %s", len(targets), why)
            return activity_entries(targets, {}, {t.node: why for t in targets}, now=now)
        by_node = monitor_pods_by_node(self.core.api_client.sanitize_for_serialization(monitors.items))
        readings, problems = self._scrape(sorted({t.node for t in targets}), by_node)
        return activity_entries(targets, readings, problems, now=now)

    def _scrape(self, nodes: list[str], by_node: Mapping[str, tuple[str, str]]) -> tuple[
            dict[str, tuple[MonitorReadings, str]], dict[str, str]]:
        readings: dict[str, tuple[MonitorReadings, str]] = {}
        failures: dict[str, ScrapeError] = {}
        durations: dict[str, float] = {}
        for node in nodes:
            if node not in by_node:
                failures[node] = ScrapeError("no_monitor_pod", (
                    f"no Running HAMi device-plugin pod ({self.config.hami_monitor_selector}"
                    f"{' in namespace ' + self.config.hami_monitor_namespace if self.config.hami_monitor_namespace else ''})"
                    f" on node {node}"))
        wanted = [node for node in nodes if node in by_node]
        timeout = self.config.hami_monitor_timeout
        if wanted:
            workers = min(SCRAPE_WORKERS, len(wanted))
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hami-monitor")
            try:
                futures = {pool.submit(self._scrape_one, node, *by_node[node]): node for node in wanted}
                # Every scrape bounds itself; this bound is for a thread stuck where no timeout reaches (one extra
                # second per round of workers).
                rounds = math.ceil(len(wanted) / workers)
                done, _ = concurrent.futures.wait(futures, timeout=rounds * (timeout + 1))
                for future, node in futures.items():
                    if future not in done:
                        failures[node] = ScrapeError("timeout", f"node {node}'s HAMi vGPU monitor did not answer within "
                                                                f"{timeout:g} s")
                        continue
                    outcome, seconds = future.result()
                    durations[node] = seconds
                    if isinstance(outcome, ScrapeError):
                        failures[node] = outcome
                    else:
                        readings[node] = outcome
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
        if self.metrics is not None:
            for node, failure in failures.items():
                self.metrics.scrape_failed(node, failure.reason)
            self.metrics.scraped(durations)
        self._log(nodes, failures)
        return readings, {node: str(failure) for node, failure in failures.items()}

    def _scrape_one(self, node: str, namespace: str, pod: str) -> tuple[tuple[MonitorReadings, str] | ScrapeError, float]:
        started = time.monotonic()
        try:
            body = scrape_monitor(self.scrape_core, namespace, pod, port=self.config.hami_monitor_port,
                                  timeout=self.config.hami_monitor_timeout)
            sampled_at = _rfc3339(self._clock())
            outcome: tuple[MonitorReadings, str] | ScrapeError = (parse_monitor(body), sampled_at)
        except ScrapeError as exc:
            outcome = exc
        except MonitorParseError as exc:
            outcome = ScrapeError("parse_error", f"pod {namespace}/{pod} on node {node}: {exc}")
        except Exception:  # a bug must cost this node's reading, not the report; the traceback is logged
            logger.exception("reading the HAMi vGPU monitor of node %s failed unexpectedly", node)
            outcome = ScrapeError("internal_error", f"the operator failed reading node {node}'s monitor (see its log)")
        return outcome, time.monotonic() - started

    def _log(self, nodes: Iterable[str], failures: Mapping[str, ScrapeError]) -> None:
        for node in nodes:
            failure = failures.get(node)
            before = self._problems.get(node)
            if failure is not None and str(failure) != before:
                logger.warning("GPU activity on node %s unknown: %s", node, failure)
                self._problems[node] = str(failure)
            elif failure is None and before is not None:
                logger.info("GPU activity on node %s read again from its HAMi vGPU monitor", node)
                del self._problems[node]

    def close(self) -> None:
        """Close the scraping client's connections."""
        self.scrape_core.api_client.close()

    def tick(self) -> bool:
        """Collect and send this tick's report; ``True`` when it was sent (or there was nothing to send)."""
        entries = self.collect()
        if entries is None:
            return False
        present = {entry["session"] for entry in entries}
        self._refused &= present  # a refused session whose Pod is gone is forgotten
        entries = [entry for entry in entries if entry["session"] not in self._refused]
        if not entries:
            return True
        sent = True
        for start in range(0, len(entries), ACTIVITY_MAX_SESSIONS):
            sent = self._send(entries[start:start + ACTIVITY_MAX_SESSIONS]) and sent
        return sent

    def _send(self, batch: list[dict[str, Any]]) -> bool:
        """POST ``batch``; on 403 ``forbidden_cluster_scope`` send its halves, down to the sessions refused alone.

        The control plane refuses a whole report naming one session it does not know as this cluster's (a stray Pod
        with the session label, a session it has forgotten); halving finds those few in O(k log n) calls, and they are
        left out of the next reports while their Pods exist, so one of them cannot hide every other session's activity.
        """
        try:
            answer = self.client.post_activity({"sessions": batch})
        except ControlPlaneRejected as exc:
            if exc.status != 403 or exc.code != FORBIDDEN_CLUSTER_SCOPE:
                return False  # logged by the client; the next tick sends fresh readings
            if len(batch) > 1:
                middle = len(batch) // 2
                first = self._send(batch[:middle])
                return self._send(batch[middle:]) and first
            session = batch[0]["session"]
            self._refused.add(session)
            logger.error("activity of session %s left out of the reports: the control plane says it is not this "
                         "cluster's (403 %s: %s)", session, exc.code, exc.detail)
            return True
        except ControlPlaneUnavailable as exc:
            logger.warning("activity not reported (%d sessions): %s", len(batch), exc)
            return False
        except ControlPlaneError:  # 401 and token problems were logged by the client
            return False
        known = sum(1 for entry in batch if entry["state"] == ACTIVITY_STATE_OK)
        logger.debug("activity reported: %d sessions (%d read, %d unknown), %s accepted", len(batch), known,
                     len(batch) - known, answer.get("accepted"))
        return True


def run_activity(config: OperatorConfig, api_client: kube.ApiClient, client: ControlPlaneClient,
                 stop: threading.Event, *, metrics: OperatorMetrics | None = None) -> None:
    """Report the sessions' GPU activity every ``config.activity_interval`` seconds (start to start, first at once).

    Args:
        config: operator settings.
        api_client: client of the data-plane apiserver (not shared with another loop).
        client: control-plane client (its own ``requests`` session, the shared ``TokenSource``).
        stop: set to stop; a wait between ticks ends at once.
        metrics: the operator's metrics, or ``None``.
    """
    reporter = ActivityReporter(api_client, client, config, metrics=metrics)
    try:
        every(config.activity_interval, reporter.tick, stop, logger=logger, what="activity tick")
    finally:
        reporter.close()
