"""Under gunicorn's several workers the counters are summed over all of them (prometheus-client multiprocess mode).

A real ``gunicorn gshare.wsgi --workers 2 --config python:gshare.gunicorn_hooks`` with ``PROMETHEUS_MULTIPROC_DIR``
set, as the Helm chart runs the api, against this test's database; requests over HTTP on loopback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from django.conf import settings
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from gshare import embedded
from tests.factories import ClusterFactory, GpuDeviceFactory
from tests.metrics.promtool import check

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
VERIFIES = 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _test_database_url() -> str:
    """The URL of this test's database: the server's URL (DATABASE_URL or the embedded server) with its name."""
    base = os.environ.get("DATABASE_URL") or embedded.embedded_database_url()
    return urlsplit(base)._replace(path="/" + connection.settings_dict["NAME"]).geturl()


@pytest.fixture
def gunicorn(tmp_path):
    """Start the api as the chart does; yields (base URL, the multiprocess directory)."""
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    (multiproc / "counter_99999.db").write_bytes(b"left by an earlier run")  # the master must empty the directory
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_", "GSHARE_", "PROMETHEUS_"))}
    env.update({
        "DJANGO_SETTINGS_MODULE": "gshare.settings", "DATABASE_URL": _test_database_url(), "REDIS_URL": settings.REDIS_URL,
        "GSHARE_HOME": str(tmp_path / "home"), "GSHARE_METRICS_CACHE_SECONDS": "0", "GSHARE_LOG_LEVEL": "WARNING",
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
    })
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "gshare.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "2",
             "--config", "python:gshare.gunicorn_hooks", "--no-control-socket"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                if requests.get(url + "/internal/ping", timeout=5).status_code == 204:
                    break
            except requests.RequestException:  # not listening yet, or a worker still loading the application
                pass
            assert time.monotonic() < deadline, "gunicorn did not answer in 60 s:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        yield url, multiproc
    finally:
        server.terminate()
        server.wait(30)


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
