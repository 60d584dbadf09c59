"""The operator's own ``/metrics`` (Prometheus text format, ``prometheus_client``), on ``GSHARE_METRICS_PORT``.

Served by ``prometheus_client.start_http_server`` on all interfaces (the chart's container port ``metrics``, 8080 by
default; ``GSHARE_METRICS_PORT=0`` serves nothing) from the operator's own ``CollectorRegistry``, so nothing another
library registers globally leaks into it. Every name starts with ``gshare_operator_``:

=========================================================== ======= ====================================================
name                                                        type    meaning
=========================================================== ======= ====================================================
``gshare_operator_report_age_seconds{report}``              gauge   seconds since the last report the control plane
                                                                    accepted (2xx), ``report`` one of ``inventory``,
                                                                    ``status``, ``storage``, ``usage``, ``activity``;
                                                                    counted from the operator's start while none has
                                                                    been accepted yet (so an alert on a large age also
                                                                    fires for an operator that never got through)
``gshare_operator_usage_queue_samples``                     gauge   usage samples waiting in the on-disk queue
                                                                    (absent until the queue file exists)
``gshare_operator_usage_queue_oldest_sample_age_seconds``   gauge   seconds since the end of the oldest unsent sample's
                                                                    window (0 when the queue is empty)
``gshare_operator_hami_monitor_scrape_errors_total``        counter failed scrapes of HAMi's vGPU monitor, by ``node``
``{node, reason}``                                                  and ``reason``: ``no_monitor_pod``, ``http_error``
                                                                    (the proxy's or the monitor's error status),
                                                                    ``timeout``, ``unreachable``, ``parse_error``,
                                                                    ``internal_error`` (a bug: see the log)
``gshare_operator_hami_monitor_scrape_duration_seconds``    gauge   how long the last scrape of the node's monitor took
``{node}``                                                          (nodes no longer scraped are dropped)
=========================================================== ======= ====================================================

The queue figures are read at each scrape of ``/metrics`` from the queue file with a read-only connection
(``operator_agent.reporters.usage.queue_stats``); the report ages from the times ``ControlPlaneClient`` records on success
(``OperatorMetrics.report_succeeded`` as its ``on_success``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from contract import ACTIVITY_PATH, INVENTORY_PATH, STATUS_PATH, STORAGE_PATH, USAGE_PATH
from operator_agent.reporters.usage import queue_stats

__all__ = ["REPORTS", "SCRAPE_ERROR_REASONS", "OperatorMetrics", "serve_metrics"]

REPORTS = {INVENTORY_PATH: "inventory", STATUS_PATH: "status", STORAGE_PATH: "storage", USAGE_PATH: "usage",
           ACTIVITY_PATH: "activity"}
"""Route -> the ``report`` label of ``gshare_operator_report_age_seconds``."""

SCRAPE_ERROR_REASONS = ("no_monitor_pod", "http_error", "timeout", "unreachable", "parse_error", "internal_error")
"""Values of the ``reason`` label of ``gshare_operator_hami_monitor_scrape_errors_total``."""


class OperatorMetrics:
    """The operator's metrics: its registry, the last success of each report, the monitor scrape figures.

    Thread-safe: the loops record into it while ``/metrics`` is served from another thread.

    Args:
        usage_queue_path: the usage queue file whose depth is reported, or ``None`` for none.
        clock: seconds since the epoch.
    """

    def __init__(self, *, usage_queue_path: str | None = None, clock: Callable[[], float] = time.time):
        self.registry = CollectorRegistry()
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._last_success: dict[str, float] = {}
        self._usage_queue_path = usage_queue_path
        self.scrape_errors = Counter(
            "gshare_operator_hami_monitor_scrape_errors", "Failed scrapes of HAMi's vGPU monitor, by node and reason",
            ["node", "reason"], registry=self.registry)
        self.scrape_duration = Gauge(
            "gshare_operator_hami_monitor_scrape_duration_seconds",
            "Seconds the last scrape of the node's HAMi vGPU monitor took", ["node"], registry=self.registry)
        self._scraped_nodes: set[str] = set()
        self.registry.register(_ReportCollector(self))

    def report_succeeded(self, path: str) -> None:
        """Record that the control plane accepted a call to ``path`` now (routes not in ``REPORTS`` are ignored)."""
        report = REPORTS.get(path)
        if report is not None:
            with self._lock:
                self._last_success[report] = self._clock()

    def report_ages(self) -> dict[str, float]:
        """Seconds since each report's last success (since the start for one that never succeeded)."""
        now = self._clock()
        with self._lock:
            return {report: max(0.0, now - self._last_success.get(report, self._started)) for report in REPORTS.values()}

    def scrape_failed(self, node: str, reason: str) -> None:
        """Count one failed monitor scrape of ``node`` (``reason`` one of ``SCRAPE_ERROR_REASONS``)."""
        self.scrape_errors.labels(node=node, reason=reason).inc()

    def scraped(self, durations: dict[str, float]) -> None:
        """Set the last scrape duration (seconds) of each node scraped this tick; forget the nodes not in it."""
        with self._lock:
            for node in self._scraped_nodes - set(durations):
                self.scrape_duration.remove(node)
            self._scraped_nodes = set(durations)
        for node, seconds in durations.items():
            self.scrape_duration.labels(node=node).set(seconds)

    def queue(self) -> tuple[int, float] | None:
        """``(depth, oldest sample age in seconds)`` of the usage queue, ``None`` when it cannot be read."""
        if not self._usage_queue_path:
            return None
        stats = queue_stats(self._usage_queue_path)
        if stats is None:
            return None
        depth, oldest_ms = stats
        age = 0.0 if oldest_ms is None else max(0.0, self._clock() - oldest_ms / 1000)
        return depth, age


class _ReportCollector(Collector):
    """The figures computed at scrape time: report ages and the usage queue."""

    def __init__(self, metrics: OperatorMetrics):
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ages = GaugeMetricFamily("gshare_operator_report_age_seconds",
                                 "Seconds since the control plane last accepted this report", labels=["report"])
        for report, age in sorted(self._metrics.report_ages().items()):
            ages.add_metric([report], age)
        yield ages
        queue = self._metrics.queue()
        if queue is not None:
            depth, age = queue
            yield GaugeMetricFamily("gshare_operator_usage_queue_samples", "Usage samples waiting to be sent",
                                    value=depth)
            yield GaugeMetricFamily("gshare_operator_usage_queue_oldest_sample_age_seconds",
                                    "Seconds since the end of the oldest unsent usage sample's window", value=age)

    def describe(self) -> Iterable:
        return []


def serve_metrics(metrics: OperatorMetrics, port: int, addr: str = "0.0.0.0") -> tuple[WSGIServer, threading.Thread]:
    """Serve ``metrics`` at ``http://<addr>:<port>/metrics`` in a daemon thread (``prometheus_client``'s server).

    Args:
        metrics: what to serve.
        port: TCP port (0: a free one, see ``server.server_port``).
        addr: address to bind; all interfaces by default (the pod's metrics port).

    Returns:
        ``(server, thread)``; ``server.shutdown()`` stops it.

    Raises:
        OSError: the port cannot be bound.
    """
    return start_http_server(port, addr=addr, registry=metrics.registry)
