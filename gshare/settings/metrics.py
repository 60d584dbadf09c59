"""Prometheus metrics (``GET /metrics``, gshare/metrics/, docs/metrics.md)."""

from .env import env

#: Bearer token ``GET /metrics`` requires (``Authorization: Bearer <token>``); empty: none, the internal hosts
#: (GSHARE_INTERNAL_HOSTS) are the only guard.
GSHARE_METRICS_TOKEN = env.str("GSHARE_METRICS_TOKEN", default="")
#: Seconds the inventory metrics (computed from the database) are reused between scrapes; 0: computed every scrape.
GSHARE_METRICS_CACHE_SECONDS = env.int("GSHARE_METRICS_CACHE_SECONDS", default=5)
