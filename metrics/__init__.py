"""Prometheus metrics of the control plane: ``GET /metrics`` on the internal hosts (docs/metrics.md).

Two sources, one exposition:

- ``inventory``: gauges and the credits-burned counter computed per scrape from the control plane's own tables
  (every attached cluster's nodes and GPUs, sessions, operator tokens, the ledger), in a fixed number of queries
  and cached for ``GSHARE_METRICS_CACHE_SECONDS``;
- ``instruments``: counters and histograms incremented where the events happen (usage ingestion, placement,
  connect verify). Under gunicorn they live in prometheus-client's multiprocess files
  (``PROMETHEUS_MULTIPROC_DIR``, ``gshare.gunicorn_hooks``) so a scrape answered by any worker sums all of them.
"""
