"""The operator process: the GPU inventory loop, the session reconciler, the volume sync and usage metering.

The main thread reports the GPU inventory every ``GSHARE_INVENTORY_INTERVAL`` seconds; a
second thread runs the Kopf-based session reconciler (``operator_agent.sessions.run_sessions``:
GShareSession -> PVCs, Pod, Service, Ingress, status reports), a third the volume-sync tick
(``operator_agent.storage.run_volume_sync``: ``POST /internal/v1/storage`` every
``GSHARE_VOLUME_SYNC_INTERVAL`` seconds) and a fourth usage metering (``operator_agent.usage.run_usage``: a
sample per GPU of every Running session every ``GSHARE_USAGE_INTERVAL`` seconds, kept in an on-disk queue and sent
with ``POST /internal/v1/usage``) and a fifth the GPU activity report (``operator_agent.gpu_activity.run_activity``:
each Running session's activity read from HAMi's vGPU monitor on its node, ``POST /internal/v1/activity`` every
``GSHARE_ACTIVITY_INTERVAL`` seconds); all stop with the same SIGTERM/SIGINT. The operator's own ``/metrics``
(``operator_agent.metrics``) is served on ``GSHARE_METRICS_PORT`` (0: not served); a port that cannot be bound is
logged and the operator runs without it.
``--once`` reports the inventory once and starts none of the other threads.

With each inventory the loop sends the session-path checks of the previous tick (``operator_agent.session_path``:
``session_domain`` resolves to the ingress node, the ``auth-url`` answers), run after each report with what the
control plane's answer names, and the offset of this node's clock from the control plane's (``clock_offset_seconds``),
learnt from the ``server_time`` of every loop's answers (``operator_agent.clock``; none before the first answer).

Each tick lists the nodes labelled ``gpu=on`` (``operator_agent.inventory``) and sends the
snapshot with ``PUT /internal/v1/inventory`` (``operator_agent.control_plane``), digest-only when it is the one the
control plane acknowledged last (``report_inventory``); a successful report logs ``inventory reported: N nodes, M GPUs``. A failed tick is logged and
the next tick tries again with a fresh snapshot and a freshly read token. SIGTERM and
SIGINT stop the loop and the session reconciler (a backoff sleep is cut short; a request in
flight finishes within ``GSHARE_HTTP_TIMEOUT``) and the process exits 0. A second signal ends it at once.
Invalid configuration exits 2 with a message naming the variable.

Before each tick the operator token is refreshed when it is getting old (``operator_agent.token``:
``POST /internal/v1/token``, then written back to the token Secret when one is configured). Both
loops share one ``TokenSource``, so they always send the same, newest token.

Why a plain loop and not Kopf for this tick: Kopf's timers are *per-object* handlers
(``@kopf.timer('nodes', ...)`` runs once per Node, each on its own schedule), whereas the
inventory is one *cluster-wide* snapshot: the control plane upserts the listed nodes and
removes the ones that are gone, which only works if every report lists every GPU node at
once. Emulating that with per-Node timers would need a debounce/aggregation layer plus a
Kopf-managed dummy object to hang a singleton timer on, and would add watch streams on all
Nodes for a value that one ``list`` call every 30 s gives directly. The loop is a few dozen
lines with injectable parts, so it is simpler to test than the equivalent Kopf operator.
Kopf runs the ``GShareSession`` handlers, which *are* per-object (``operator_agent.sessions``);
this tick stays a thread beside it.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import kubernetes.client
import urllib3.exceptions

from contract import INVENTORY_SNAPSHOT_REQUIRED, inventory_digest
from operator_agent import __version__
from operator_agent.clock import ClockOffset
from operator_agent.config import ConfigError, OperatorConfig, kubernetes_api_client
from operator_agent.control_plane import ControlPlaneClient, ControlPlaneError, ControlPlaneRejected, ControlPlaneUnavailable
from operator_agent.gpu_activity import run_activity
from operator_agent.inventory import collect_inventory, snapshot_counts
from operator_agent.metrics import OperatorMetrics, serve_metrics
from operator_agent.session_path import SessionPathChecks
from operator_agent.sessions import run_sessions
from operator_agent.storage import run_volume_sync
from operator_agent.token import SecretTokenStore, TokenRefresher, TokenSource
from operator_agent.usage import run_usage

__all__ = ["FULL_SNAPSHOT_EVERY", "InventoryState", "main", "report_inventory", "run"]

logger = logging.getLogger("operator_agent")

EXIT_OK = 0
EXIT_TICK_FAILED = 1
EXIT_CONFIG = 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SESSIONS_JOIN_TIMEOUT = 30.0
"""Seconds the process waits for the session reconciler to stop after SIGTERM/SIGINT."""

VOLUME_SYNC_JOIN_TIMEOUT = 30.0
"""Seconds the process waits for the volume-sync thread to stop (a request in flight finishes within the timeout)."""

USAGE_JOIN_TIMEOUT = 30.0
"""Seconds the process waits for the usage thread to stop (a request in flight finishes within the timeout)."""

ACTIVITY_JOIN_TIMEOUT = 30.0
"""Seconds the process waits for the activity thread to stop (a request in flight finishes within the timeout)."""


FULL_SNAPSHOT_EVERY = 600.0
"""Seconds after which the full snapshot is sent even when nothing changed (digest-only reports in between)."""


@dataclass
class InventoryState:
    """What the inventory loop remembers between ticks: the digest the control plane last answered (``""``: none, the
    next report is a full snapshot) and when the last full snapshot was accepted (``time.monotonic()``)."""

    digest: str = ""
    full_at: float = float("-inf")


def report_inventory(core_v1: kubernetes.client.CoreV1Api, client: ControlPlaneClient, config: OperatorConfig,
                     checks: SessionPathChecks | None = None, state: InventoryState | None = None) -> bool:
    """Run one tick: collect the inventory and report it. Return ``True`` on success; never raises for I/O failures.

    Sent by ``send_inventory``: digest-only when ``state`` says the control plane holds this snapshot already; without
    ``state`` (``--once``) the full snapshot.

    With ``checks``, the report carries the latest session-path checks (``operator_agent.session_path``), and they are
    run again after the report with what the control plane's answer names (reported at the next tick).
    """
    try:
        snapshot = collect_inventory(core_v1, request_timeout=config.http_timeout)
    except kubernetes.client.exceptions.ApiException as exc:
        logger.warning("cannot list GPU nodes from the apiserver: %s %s", exc.status, exc.reason)
        return False
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        logger.warning("cannot reach the apiserver to list GPU nodes: %s", exc)
        return False
    extra = {"checks": checks.payload()} if checks is not None and checks.payload() else {}
    extra.update(client.clock.payload())  # the offset learnt from earlier answers (none before the first)
    try:
        answer = send_inventory(client, snapshot, state=state, extra=extra)
    except ControlPlaneUnavailable as exc:
        logger.warning("inventory not reported: %s", exc)
        return False
    except ControlPlaneError:
        # 401/403/4xx and token-file problems were logged by the client with code and detail.
        return False
    nodes, gpus = snapshot_counts(snapshot)
    logger.info("inventory reported: %d nodes, %d GPUs%s", nodes, gpus, " (unchanged: digest only)" if answer.get("unchanged") else "")
    if checks is not None:
        try:
            checks.update(core_v1, answer, timeout=min(config.http_timeout, 5.0))
        except Exception:  # a check's bug must not stop the reports; the traceback is logged
            logger.exception("session path checks failed unexpectedly")
    return True


def send_inventory(client: ControlPlaneClient, snapshot: dict, *, state: InventoryState | None = None,
                   extra: dict | None = None) -> dict:
    """``PUT /internal/v1/inventory`` once for ``snapshot`` (``{"nodes": [...]}`` of ``operator_agent.inventory``), digest-only
    when it can be; return the control plane's answer.

    The snapshot gets its digest (``contract.inventory_digest`` of its nodes) and ``extra`` (e.g. ``{"checks": ...}``).
    With ``state``, a snapshot whose digest is the one the control plane answered last is reported digest-only
    (``{"digest", **extra}``: no node is sent, read or written), unless ``FULL_SNAPSHOT_EVERY`` seconds passed since the
    last full one; when the control plane answers that it needs the full snapshot (409 ``inventory_snapshot_required``,
    or 400 ``invalid_inventory`` from a control plane that predates digests), it is sent at once. Without ``state`` the
    full snapshot is sent. ``state`` is updated from the answer.

    Raises:
        ControlPlaneUnavailable: the control plane did not answer (after the client's retries).
        ControlPlaneError: any other refusal (logged by the client with code and detail).
    """
    extra = extra or {}
    digest = inventory_digest(snapshot["nodes"])
    snapshot["digest"] = digest
    snapshot.update(extra)
    answer = None
    if state is not None and state.digest == digest and time.monotonic() - state.full_at < FULL_SNAPSHOT_EVERY:
        try:
            answer = client.put_inventory({"digest": digest, **extra})
        except ControlPlaneRejected as exc:
            if exc.code not in (INVENTORY_SNAPSHOT_REQUIRED, "invalid_inventory"):
                raise
            logger.info("control plane asks for the full inventory snapshot (%s): sending it", exc.code)
    if answer is None:
        answer = client.put_inventory(snapshot)
        if state is not None:
            state.full_at = time.monotonic()
    if state is not None:
        state.digest = answer.get("digest") if isinstance(answer.get("digest"), str) else ""
    return answer


def run(
    config: OperatorConfig,
    core_v1: kubernetes.client.CoreV1Api,
    client: ControlPlaneClient,
    stop: threading.Event,
    refresher: TokenRefresher | None = None,
    checks: SessionPathChecks | None = None,
) -> None:
    """Report the inventory every ``config.inventory_interval`` seconds (start to start) until ``stop`` is set.

    With ``refresher``, the operator token is refreshed first when it is due; with ``checks``, the session-path checks
    are run and reported with each inventory (``report_inventory``).
    """
    state = InventoryState()
    while not stop.is_set():
        started = time.monotonic()
        if refresher is not None:
            try:
                refresher.maybe_refresh()
            except Exception:  # a refresh bug must not stop the reports; the traceback is logged
                logger.exception("operator token refresh failed unexpectedly")
        try:
            report_inventory(core_v1, client, config, checks, state)
        except Exception:  # keep the operator alive across unexpected bugs; the traceback is logged
            logger.exception("inventory tick failed unexpectedly")
        remaining = config.inventory_interval - (time.monotonic() - started)
        if remaining > 0:
            stop.wait(remaining)


def install_signal_handlers(stop: threading.Event) -> None:
    """Make SIGTERM/SIGINT set ``stop``; a second signal gets the default behaviour (immediate exit)."""

    def handle(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)



@dataclass(frozen=True)
class _Loop:
    """A background loop of the operator: its thread, its own clients, and how long to wait for it on shutdown (s)."""

    thread: threading.Thread
    api_client: kubernetes.client.ApiClient
    client: ControlPlaneClient
    join_timeout: float
    what: str

def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Entry point of ``python -m operator_agent``; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m operator_agent", description="gShare data-plane operator")
    parser.add_argument("--once", action="store_true", help="report the inventory once and exit (1 if it failed)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    args = parser.parse_args(argv)

    try:
        config = OperatorConfig.from_environ(environ)
    except ConfigError as exc:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=True)
        logger.error("invalid configuration: %s", exc)
        return EXIT_CONFIG
    logging.basicConfig(level=config.log_level_number, format=LOG_FORMAT, force=True)
    try:
        api_client = kubernetes_api_client(environ)
    except ConfigError as exc:
        logger.error("invalid configuration: %s", exc)
        return EXIT_CONFIG

    stop = threading.Event()
    install_signal_handlers(stop)
    core_v1 = kubernetes.client.CoreV1Api(api_client)
    secret_store = None
    if config.token_secret_configured:
        # The Secret is read by both loops: its own client, so the inventory's connection pool is not shared.
        secret_store = SecretTokenStore(
            kubernetes.client.CoreV1Api(kubernetes_api_client(environ)), namespace=config.operator_namespace,
            name=config.token_secret_name, cluster_id=config.cluster_id, request_timeout=config.http_timeout,
        )
    tokens = TokenSource(config.token_file, secret=secret_store, cluster_id=config.cluster_id)
    metrics = OperatorMetrics(usage_queue_path=config.usage_queue_path)
    clock = ClockOffset()  # learnt from every loop's answers, reported with the inventory
    client = ControlPlaneClient(config, sleep=stop.wait, stopped=stop.is_set, tokens=tokens,
                                on_success=metrics.report_succeeded, clock=clock)
    logger.info(
        "gshare operator %s for cluster %s: reporting to %s every %gs",
        __version__,
        config.cluster_id,
        config.control_plane_url,
        config.inventory_interval,
    )
    if secret_store is not None:
        logger.info("operator token: read from %s and %s; refreshed tokens are written back to the Secret", config.token_file, secret_store.where)
    loops: list[_Loop] = []

    def start_loop(name: str, target, join_timeout: float, what: str) -> None:
        # Each loop gets its own apiserver and control-plane clients (a requests.Session is not shared between
        # threads); the TokenSource is shared, so every loop sends the same, newest token.
        api = kubernetes_api_client(environ)
        loop_client = ControlPlaneClient(config, sleep=stop.wait, stopped=stop.is_set, tokens=tokens,
                                         on_success=metrics.report_succeeded, clock=clock)
        thread = threading.Thread(target=target, args=(config, api, loop_client, stop), name=name, daemon=True)
        loops.append(_Loop(thread, api, loop_client, join_timeout, what))
        thread.start()

    metrics_server = None
    try:
        if args.once:
            return EXIT_OK if report_inventory(core_v1, client, config) else EXIT_TICK_FAILED
        if config.metrics_port:
            try:
                metrics_server, _ = serve_metrics(metrics, config.metrics_port, addr=config.metrics_address)
            except OSError as exc:
                logger.error("operator /metrics not served: cannot listen on %s port %d (%s); set GSHARE_METRICS_PORT to "
                             "a free port, or 0 to turn it off", config.metrics_address, config.metrics_port, exc)
            else:
                logger.info("operator metrics at http://%s:%d/metrics", config.metrics_address, config.metrics_port)
        start_loop("sessions", run_sessions, SESSIONS_JOIN_TIMEOUT, "session reconciler")
        start_loop("volume-sync", run_volume_sync, VOLUME_SYNC_JOIN_TIMEOUT, "volume sync")
        logger.info("volume sync every %gs (volume StorageClass: %s)", config.volume_sync_interval,
                    config.volume_storage_class or "none set")
        start_loop("usage", run_usage, USAGE_JOIN_TIMEOUT, "usage metering")
        start_loop("activity", functools.partial(run_activity, metrics=metrics), ACTIVITY_JOIN_TIMEOUT, "GPU activity")
        logger.info("GPU activity every %gs from HAMi's vGPU monitor (pods %s, port %d)", config.activity_interval,
                    config.hami_monitor_selector, config.hami_monitor_port)
        checks = SessionPathChecks()
        try:
            run(config, core_v1, client, stop, refresher=TokenRefresher(tokens, client), checks=checks)
        finally:
            checks.http.close()
    finally:
        stop.set()
        for loop in loops:
            loop.thread.join(loop.join_timeout)
            if loop.thread.is_alive():
                logger.warning("%s did not stop within %gs", loop.what, loop.join_timeout)
        for loop in reversed(loops):
            loop.client.session.close()
            loop.api_client.close()
        client.session.close()
        api_client.close()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        if secret_store is not None:
            secret_store.core_v1.api_client.close()
    logger.info("operator stopped")
    return EXIT_OK
