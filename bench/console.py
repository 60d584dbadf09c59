"""Benchmark: render time of the console's big pages against a trivial console page, on a real gunicorn.

    .venv/bin/python bench/console.py [--requests 30] [--quick]

In a throwaway database (``gshare_bench``, see ``bench/_benchenv.py``) it loads (``bulk_create``) 10 clusters with
1,000 GPU nodes and 8,000 GPUs in all, 5,000 sessions (1,500 Running, half of them holding a GPU whole and half a
share, two shares to a GPU; 500 Scheduled or Pending; 3,000 ended in the last 30 hours, a tenth Failed), a ledger
charge per session, 200 users with credit accounts, prices and a storage pool, then recounts the GPUs' usage
counters (``sessions.placement.usage_recompute``). It starts ``python -m gunicorn gshare.wsgi --workers 2`` on a
free loopback port (``DATABASE_CONN_MAX_AGE=60``, as the chart sets it), logs in through the console's login form
as a staff user and, one request at a time (render time, not throughput), measures in interleaved rounds:

* ``/`` (the dashboard: every tile and the 24-hour chart),
* ``/clusters/gpudevice/`` (GPU management),
* ``/gpu_sessions/session/`` (sessions),
* ``/password_change/`` (a trivial console page: the same middleware, login session, top bar and templates; the
  baseline).

It prints p50 and p95 per page, each page's p50 ratio against the trivial page's, and the SQL queries each page ran
(rendered once more in-process with Django's test client). Goal (issue 11): each big page within 3x the trivial one
(ratio <= 3).

``--quick`` (CI): 20 nodes, 160 GPUs, 100 sessions and 5 requests per page, a few seconds; it checks that the run
itself works (login, every page answers 200 with its content) and gives no goal verdict.

Traffic goes to 127.0.0.1 only; every loop is bounded; the server is stopped and the database dropped at the end.
"""

from __future__ import annotations

import _benchpath  # noqa: F401 - first: keeps this folder after the standard library (bench/_benchpath.py)

# isort: split
import argparse
import datetime
import http.client
import re
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

from _benchenv import bench_environment, free_port, log, start_server, stop_server

GOAL_RATIO = 3.0
WORKERS = 2
STAFF, PASSWORD = "bench-admin", "bench-Pa55word!"
#: name -> (path, a marker the answer must contain: the page rendered, not a login form or an error page).
PAGES = {
    "trivial": ("/password_change/", 'name="old_password"'),
    "dashboard": ("/", 'id="dashboard"'),
    "gpus": ("/clusters/gpudevice/", "gpudevice"),
    "sessions": ("/gpu_sessions/session/", "session"),
}
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def seed(*, nodes: int, gpus_per_node: int, sessions: int, clusters: int = 10) -> dict[str, int]:
    """Load the fleet with ``bulk_create`` (see the module docstring); returns the counts loaded."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from billing.models import CreditAccount, LedgerEntry, Price
    from clusters.models import Cluster, GpuDevice, Node
    from sessions.models import Allocation, Session
    from sessions.placement import usage_recompute
    from storage.models import StoragePool

    User = get_user_model()
    now = datetime.datetime.now(datetime.UTC)
    User.objects.create_superuser(STAFF, "bench-admin@example.test", PASSWORD)
    fleet = Cluster.objects.bulk_create([
        Cluster(name=f"bench-{c:02d}", apiserver_url=f"https://10.0.{c}.1:6443", kubeconfig="apiVersion: v1\nkind: Config\n",
                session_domain=f"bench-{c:02d}.gpu.gshare.test", status=Cluster.Status.CONNECTED, kubernetes_version="v1.32.3",
                last_heartbeat_at=now, operator_token_expires_at=now + datetime.timedelta(days=20))
        for c in range(clusters)
    ])
    node_rows = Node.objects.bulk_create([
        Node(cluster=fleet[n % clusters], cluster_name=fleet[n % clusters].name, name=f"gpu-{n:04d}", ready=True, last_seen_at=now,
             gpu_mode="hami-core", labels={"gpu": "on", "gshare.io/gpu-mode": "hami-core"})
        for n in range(nodes)
    ], batch_size=2000)
    devices = GpuDevice.objects.bulk_create([
        GpuDevice(node=node, cluster_id=node.cluster_id, uuid=f"GPU-{node.pk:06d}-{i:02d}-bench", index=i,
                  model=H100 if node.pk % 2 else A100, memory_mib=81559, split_count=10, cores=100, last_seen_at=now,
                  health=(node.pk * gpus_per_node + i) % 97 != 0)
        for node in node_rows for i in range(gpus_per_node)
    ], batch_size=4000)
    users = User.objects.bulk_create([User(username=f"bench-user-{u:03d}", password="!") for u in range(200)])
    accounts = CreditAccount.objects.bulk_create([CreditAccount(user=u, balance=Decimal(u.pk % 40)) for u in users])
    Price.objects.bulk_create([Price(gpu_model=H100, credits_per_gpu_hour=Decimal(4)), Price(gpu_model="", credits_per_gpu_hour=Decimal(2))])
    StoragePool.objects.create(name="nfs-bench", cluster=fleet[0], storage_class="nfs-bench", manual_capacity_gb=4096)

    running, waiting = sessions * 3 // 10, sessions // 10
    shared_at = len(devices) // 2

    def held(s: int):
        """The GPU session ``s`` holds and whether whole: Running even ``s`` one GPU whole (the first half of the
        GPUs), Running odd ``s`` a 30 % share, two to a GPU, and Scheduled ones a share alone (the second half)."""
        if s < running:
            return (devices[s // 2], True) if s % 2 == 0 else (devices[shared_at + s // 4], False)
        if s < running + waiting and s % 2:
            return devices[shared_at + running // 4 + 1 + (s - running) // 2], False
        return None, False

    rows, holds = [], []
    for s in range(sessions):
        device, whole = held(s)
        if s < running:
            phase, ended = Session.Phase.RUNNING, None
        elif s < running + waiting:
            phase, ended = (Session.Phase.SCHEDULED if s % 2 else Session.Phase.PENDING), None
        else:
            phase = Session.Phase.FAILED if s % 10 == 0 else Session.Phase.TERMINATED
            ended = now - datetime.timedelta(minutes=(s * 7) % (30 * 60))
        home = device or devices[(s * 13) % len(devices)]
        rows.append(Session(
            owner=users[s % len(users)], cluster_id=home.cluster_id, node=node_rows[0].name if device is None else f"gpu-{home.node_id}",
            image="quay.io/jupyter/base-notebook", gpus=1, gpu_cores=None if (device is None and s % 2 == 0) or whole else 30,
            phase=phase, ended_at=ended, started_at=now - datetime.timedelta(hours=2) if phase == Session.Phase.RUNNING else None,
        ))
        holds.append((device, whole))
    created = Session.objects.bulk_create(rows, batch_size=2000)
    # Spread the sessions' creation over the last 30 hours so the chart has a history (created_at is auto_now_add).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE gpu_sessions_session SET created_at = COALESCE(ended_at, %s) - (id %% 360) * interval '1 minute' - interval '10 minutes'",
            [now],
        )
    allocations = [
        Allocation(session=session, device=device, memory_mib=81559 if whole else 0, cores=100 if whole else 30, exclusive=whole)
        for session, (device, whole) in zip(created, holds, strict=True) if device is not None
    ]
    Allocation.objects.bulk_create(allocations, batch_size=4000)
    usage_recompute()
    by_user = {a.user_id: a for a in accounts}
    LedgerEntry.objects.bulk_create([
        LedgerEntry(account=by_user[s.owner_id], kind="charge", amount=Decimal("-0.5"), balance_after=Decimal(0),
                    idempotency_key=f"bench-charge-{s.pk}", session=s, window_start=now - datetime.timedelta(minutes=(s.pk * 11) % 1440 + 5),
                    window_end=now - datetime.timedelta(minutes=(s.pk * 11) % 1440), gpu_seconds=Decimal(450), created_by="usage")
        for s in created
    ], batch_size=4000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # the planner's statistics, as autovacuum would have them on a real fleet
    return {"clusters": clusters, "nodes": len(node_rows), "gpus": len(devices), "sessions": len(created), "allocations": len(allocations)}


class Browser:
    """A cookie jar over ``http.client`` on 127.0.0.1 (one connection per request: gunicorn's sync workers close it)."""

    def __init__(self, port: int):
        self.port, self.cookies = port, {}

    def request(self, method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict, str]:
        """Send one request with the cookies held; keep the cookies set; answer (status, headers, text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            sent = {"Host": "127.0.0.1", **(headers or {})}
            if self.cookies:
                sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            text = response.read().decode("utf-8", "replace")
            for name, value in response.getheaders():
                if name.lower() == "set-cookie":
                    for key, morsel in SimpleCookie(value).items():
                        self.cookies[key] = morsel.value
            return response.status, dict(response.getheaders()), text
        finally:
            conn.close()

    def login(self, username: str, password: str) -> None:
        """Log in through the console's form (CSRF token from the page), as a browser does.

        Raises:
            RuntimeError: the form did not redirect (wrong password, or the page changed).
        """
        status, _, page = self.request("GET", "/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if status != 200 or token is None:
            raise RuntimeError(f"/login/ answered {status} without a CSRF token")
        body = urlencode({"csrfmiddlewaretoken": token.group(1), "username": username, "password": password, "next": "/"})
        status, headers, _ = self.request("POST", "/login/", body, {"Content-Type": "application/x-www-form-urlencoded",
                                                                    "Referer": f"http://127.0.0.1:{self.port}/login/"})
        if status != 302 or "sessionid" not in self.cookies:
            raise RuntimeError(f"logging in answered {status} {headers}")

    def render(self, name: str) -> float:
        """GET one page; seconds it took. Raises RuntimeError unless it answered 200 with its marker."""
        path, marker = PAGES[name]
        started = time.perf_counter()
        status, _, text = self.request("GET", path)
        elapsed = time.perf_counter() - started
        if status != 200 or marker not in text:
            raise RuntimeError(f"{path} answered {status} without {marker!r}: {text[:500]}")
        return elapsed


def query_counts() -> dict[str, int]:
    """SQL queries each page runs, rendered in-process with Django's test client as the staff user."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(get_user_model().objects.get(username=STAFF))
    counts = {}
    for name, (path, _marker) in PAGES.items():
        client.get(path)
        with CaptureQueriesContext(connection) as queries:
            client.get(path)
        counts[name] = len(queries)
    return counts


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30, help="requests per page, in interleaved rounds (default 30)")
    parser.add_argument("--quick", action="store_true", help="a small fleet and 5 requests per page: checks the run, no goal verdict (CI)")
    args = parser.parse_args()
    if args.quick:
        size = {"nodes": 20, "gpus_per_node": 8, "sessions": 100, "clusters": 2}
        args.requests = 5
    else:
        size = {"nodes": 1000, "gpus_per_node": 8, "sessions": 5000, "clusters": 10}

    with bench_environment() as env, tempfile.TemporaryDirectory(prefix="gshare-bench-") as tmp:
        started = time.perf_counter()
        loaded = seed(**size)
        log(f"loaded {loaded} in {time.perf_counter() - started:.1f} s")
        queries = query_counts()
        port = free_port()
        logfile = Path(tmp) / "gunicorn.log"
        server = start_server(port, env, WORKERS, logfile, {"DATABASE_CONN_MAX_AGE": "60"})
        log(f"gunicorn ({WORKERS} workers) on 127.0.0.1:{port}")
        try:
            browser = Browser(port)
            browser.login(STAFF, PASSWORD)
            for name in PAGES:  # warm-up: both workers import, connect, compile templates
                for _ in range(WORKERS * 2):
                    browser.render(name)
            times: dict[str, list[float]] = {name: [] for name in PAGES}
            for round_ in range(args.requests):
                order = list(PAGES) if round_ % 2 == 0 else list(reversed(PAGES))
                for name in order:
                    times[name].append(browser.render(name))
            log("measured " + ", ".join(f"{name} {statistics.median(t) * 1000:.0f} ms" for name, t in times.items()))
        finally:
            stop_server(server)

    base = statistics.median(times["trivial"])
    print("console render benchmark")
    print(f"  fleet: {loaded['clusters']} clusters, {loaded['nodes']} nodes, {loaded['gpus']} GPUs, {loaded['sessions']} sessions "
          f"({loaded['allocations']} allocations); logged in as staff, all clusters")
    print(f"  server: gunicorn gshare.wsgi --workers {WORKERS} (sync, DATABASE_CONN_MAX_AGE=60) on 127.0.0.1; client: one request at a time, "
          f"{args.requests} per page, interleaved")
    ratios = {}
    for name, (path, _marker) in PAGES.items():
        p50, p95 = statistics.median(times[name]), percentile(times[name], 0.95)
        ratios[name] = p50 / base
        print(f"  {name:9} GET {path:24} p50 {p50 * 1000:7.1f} ms  p95 {p95 * 1000:7.1f} ms  "
              f"ratio {ratios[name]:5.2f}  queries {queries[name]}")
    if args.quick:
        print("  quick run: no goal verdict")
        return 0
    met = all(ratio <= GOAL_RATIO for name, ratio in ratios.items() if name != "trivial")
    missed = [name for name, ratio in ratios.items() if ratio > GOAL_RATIO]
    print(f"  goal: each page's p50 within {GOAL_RATIO:g}x the trivial page's: {'MET' if met else 'MISSED (' + ', '.join(missed) + ')'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
