"""Under gunicorn's several workers the counters are summed over all of them (prometheus-client multiprocess mode).

A real ``gunicorn gshare.wsgi --workers 2 --config python:gshare.gunicorn_hooks`` with ``PROMETHEUS_MULTIPROC_DIR``
set, as the Helm chart runs the api, against this test's database; requests over HTTP on loopback.
"""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.gunicorn import run_gunicorn
from tests.factories import ClusterFactory, GpuDeviceFactory
from tests.metrics.promtool import check

pytestmark = pytest.mark.django_db(transaction=True)

VERIFIES = 24


@pytest.fixture
def gunicorn(tmp_path):
    """Start the api as the chart does; yields (base URL, the multiprocess directory)."""
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    (multiproc / "counter_99999.db").write_bytes(b"left by an earlier run")  # the master must empty the directory
    with run_gunicorn(tmp_path, env={"GSHARE_METRICS_CACHE_SECONDS": "0", "PROMETHEUS_MULTIPROC_DIR": str(multiproc)},
                      args=["--workers", "2", "--config", "python:gshare.gunicorn_hooks"]) as (url, _log):
        yield url, multiproc


def test_counters_are_summed_over_every_worker(gunicorn):
    url, multiproc = gunicorn
    GpuDeviceFactory(node__cluster=ClusterFactory(name="alpha"))
    assert not (multiproc / "counter_99999.db").exists()
    for _ in range(VERIFIES):  # a new connection each: the two workers share the listening socket
        response = requests.get(url + "/internal/connect/verify", headers={"Connection": "close"}, timeout=30)
        assert response.status_code == 401
    writers = {p.name.rsplit("_", 1)[-1] for p in multiproc.glob("histogram_*.db")}
    for _ in range(4):  # whichever worker answers the scrape, it reports every worker's count
        scrape = requests.get(url + "/metrics", headers={"Connection": "close"}, timeout=30)
        assert scrape.status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(scrape.text)}
        counts = [s.value for s in families["gshare_connect_verify_duration_seconds"].samples
                  if s.name.endswith("_count") and s.labels["outcome"] == "refused"]
        assert counts == [VERIFIES], (counts, writers)
        assert any(s.labels.get("cluster") == "alpha" for s in families["gshare_cluster_gpus"].samples)
    result = check("metrics", stdin=scrape.content)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (result.stdout + result.stderr).decode()
