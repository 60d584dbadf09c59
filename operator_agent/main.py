"""The operator process: the GPU inventory loop, the session reconciler, the volume sync and usage metering.

The main thread reports the GPU inventory every ``GSHARE_INVENTORY_INTERVAL`` seconds; a
second thread runs the Kopf-based session reconciler (``operator_agent.sessions.kopf_handlers.run_sessions``:
GShareSession -> PVCs, Pod, Service, Ingress, status reports), a third the volume-sync tick
(``operator_agent.reporters.storage.run_volume_sync``: ``POST /internal/v1/storage`` every
``GSHARE_VOLUME_SYNC_INTERVAL`` seconds) and a fourth usage metering (``operator_agent.reporters.usage.run_usage``: a
sample per GPU of every Running session every ``GSHARE_USAGE_INTERVAL`` seconds, kept in an on-disk queue and sent
with ``POST /internal/v1/usage``) and a fifth the GPU activity report (``operator_agent.reporters.activity.run_activity``:
each Running session's activity read from HAMi's vGPU monitor on its node, ``POST /internal/v1/activity`` every
``GSHARE_ACTIVITY_INTERVAL`` seconds); all stop with the same SIGTERM/SIGINT. The operator's own ``/metrics``
(``operator_agent.metrics``) is served on ``GSHARE_METRICS_PORT`` (0: not served); a port that cannot be bound is
logged and the operator runs without it.
``--once`` reports the inventory once and starts none of the other threads.

With each inventory the loop sends the session-path checks of the previous tick (``operator_agent.session_path``:
``session_domain`` resolves to the ingress node, the ``auth-url`` answers), run after each report with what the
control plane's answer names, and the offset of this node's clock from the control plane's (``clock_offset_seconds``),
learnt from the ``server_time`` of every loop's answers (``operator_agent.clock``; none before the first answer).

Each tick lists the nodes labelled ``gpu=on`` and sends the snapshot with ``PUT /internal/v1/inventory``
(``operator_agent.reporters.inventory.report_inventory``, through ``operator_agent.control_plane_client``), digest-only
when it is the one the control plane acknowledged last; a successful report logs ``inventory reported: N nodes, M
GPUs``. A failed tick is logged and the next tick tries again with a fresh snapshot and a freshly read token. SIGTERM
and SIGINT stop the loop and the session reconciler (a backoff sleep is cut short; a request in flight finishes within
``GSHARE_HTTP_TIMEOUT``) and the process exits 0. A second signal ends it at once.
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
Nodes for a value that one ``list`` call every 30 s gives directly. The loop (``operator_agent.loop.every``) is a
few lines with injectable parts, so it is simpler to test than the equivalent Kopf operator.
Kopf runs the ``GShareSession`` handlers, which *are* per-object (``operator_agent.sessions.kopf_handlers``);
this tick stays a thread beside it.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from operator_agent import __version__, kube
from operator_agent.clock import ClockOffset
from operator_agent.config import ConfigError, OperatorConfig, kubernetes_api_client
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.loop import every
from operator_agent.metrics import OperatorMetrics, serve_metrics
from operator_agent.reporters.activity import run_activity
from operator_agent.reporters.inventory import InventoryState, report_inventory
from operator_agent.reporters.storage import run_volume_sync
from operator_agent.reporters.usage import run_usage
from operator_agent.session_path import SessionPathChecks
from operator_agent.sessions.kopf_handlers import run_sessions
from operator_agent.token import SecretTokenStore, TokenRefresher, TokenSource

__all__ = ["main", "run"]

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


def run(
    config: OperatorConfig,
    core_v1: kube.CoreV1Api,
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

    def tick() -> None:
        if refresher is not None:
            try:
                refresher.maybe_refresh()
            except Exception:  # a refresh bug must not stop the reports; the traceback is logged
                logger.exception("operator token refresh failed unexpectedly")
        report_inventory(core_v1, client, config, checks, state)

    every(config.inventory_interval, tick, stop, logger=logger, what="inventory tick")


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
    api_client: kube.ApiClient
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
    core_v1 = kube.core_v1(api_client)
    secret_store = None
    if config.token_secret_configured:
        # The Secret is read by both loops: its own client, so the inventory's connection pool is not shared.
        secret_store = SecretTokenStore(
            kube.core_v1(kubernetes_api_client(environ)), namespace=config.operator_namespace,
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
        # Each loop is announced before its thread starts: its first tick runs at once and may log first otherwise.
        logger.info("volume sync every %gs (volume StorageClass: %s)", config.volume_sync_interval,
                    config.volume_storage_class or "none set")
        start_loop("volume-sync", run_volume_sync, VOLUME_SYNC_JOIN_TIMEOUT, "volume sync")
        start_loop("usage", run_usage, USAGE_JOIN_TIMEOUT, "usage metering")
        logger.info("GPU activity every %gs from HAMi's vGPU monitor (pods %s, port %d)", config.activity_interval,
                    config.hami_monitor_selector, config.hami_monitor_port)
        start_loop("activity", functools.partial(run_activity, metrics=metrics), ACTIVITY_JOIN_TIMEOUT, "GPU activity")
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
