"""Benchmark: ``/internal/connect/verify`` (ingress-nginx auth-url) and Envoy's ext_authz check against a no-op view,
on a real gunicorn.

    .venv/bin/python bench/connect_verify.py [--client auto|wrk|python] [--rounds 3] [--seconds 5] [--requests 3000] [--quick]

In a throwaway database (``gshare_bench``, see ``bench/_benchenv.py``) it creates a connected
cluster, a Running session on it and a connect token (``sessions.services.session_connect``), starts
``python -m gunicorn gshare.wsgi --workers 2`` on a free loopback port against that database and
Redis database 15, and load-tests, with the same client and in the same run:

* ``GET /internal/connect/verify`` with ``X-Original-URL: https://<session_domain>/s/<id>/`` and the
  ``gshare_connect`` cookie (answer 200), what a browser sends on every request: one RS256 signature
  check per token and process, and the cached facts of the session and of its user. The cookie is the
  one the verify sets when the link (``?token=``) is opened, once, before the measurements;
  Each 200 also notes the connection (``sessions.activity.connection_note``: a per-process check, and one Redis write
  per session and minute; the run checks the note is there), as in production;
* ``GET /internal/connect/ext-authz/s/<id>/`` with ``Host: <session_domain>`` and the same cookie (answer 200),
  what Envoy sends for the same request (``sessions.ext_authz``): the same verify, plus the host rule's cached set
  of session domains and the raw URI's prefix; answered by the internal-hosts middleware before the rest of the
  stack. Its link (``?token=``) is checked to answer 307 with the cookie first;
* ``GET /internal/ping`` (answer 204): the same Django stack (middleware, URL routing) doing nothing,
  the baseline.

Client: ``wrk`` when it is on PATH (``apt-get install -y wrk``; fixed duration per measurement),
else Python threads with ``http.client`` (fixed request count). Measurements alternate between the
endpoints for ``--rounds`` rounds; the medians are compared. The ratios printed are
(verify requests/s) / (ping requests/s) and (ext-authz requests/s) / (ping requests/s). Goal (issue): each >= 0.7.

``--quick`` (CI): one round of 300 requests per endpoint with the Python client, a few seconds; it checks that
the run itself works (the link sets a cookie, verify answers 200 to it, a tampered cookie 401) and gives no goal verdict.

Traffic goes to 127.0.0.1 only; every loop is bounded; the server is stopped and the database
dropped at the end.
"""

from __future__ import annotations

import _benchpath  # noqa: F401 - first: keeps this folder after the standard library (bench/_benchpath.py)

# isort: split
import argparse
import http.client
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from _benchenv import bench_environment, free_port, log, start_server, stop_server

GOAL_RATIO = 0.7
#: ``contract.CONNECT_EXT_AUTHZ_PATH`` (read here without importing the project before its settings).
EXT_AUTHZ_PATH = "/internal/connect/ext-authz"
WORKERS = 2


def request(port: int, path: str, headers: dict[str, str], timeout: float = 5.0) -> tuple[int, dict[str, str]]:
    """One GET on a fresh connection: status and headers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    finally:
        conn.close()


def python_load(port: int, path: str, headers: dict[str, str], expected: int, total: int, threads: int) -> float:
    """Send ``total`` GETs from ``threads`` threads (``http.client``, reconnecting when the server closes); requests/s."""
    errors: list[str] = []
    per_thread = [total // threads + (1 if i < total % threads else 0) for i in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def run(count: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        barrier.wait()
        try:
            for _ in range(count):
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                response.read()
                if response.status != expected:
                    errors.append(f"{path} answered {response.status}")
                    return
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{path}: {type(exc).__name__}: {exc}")
        finally:
            conn.close()

    workers = [threading.Thread(target=run, args=(n,), daemon=True) for n in per_thread]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join(timeout=300)
    elapsed = time.perf_counter() - started
    if errors or any(worker.is_alive() for worker in workers):
        raise RuntimeError(f"load failed: {errors[:3] or 'a client thread did not finish'}")
    return total / elapsed


def wrk_load(wrk: str, port: int, path: str, headers: dict[str, str], seconds: float, connections: int) -> float:
    """Run wrk for ``seconds`` on ``connections`` connections (2 threads); requests/s. Any non-2xx answer or socket error fails."""
    command = [wrk, "-t2", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s"]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    command.append(f"http://127.0.0.1:{port}{path}")
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if rate is None:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    if bad or (socket_errors and any(int(n) for n in socket_errors.groups())):
        raise RuntimeError(f"wrk saw errors on {path}:\n{out}")
    return float(rate.group(1))


def make_session() -> tuple[str, str, str, int]:
    """Create a user, a connected cluster and a Running session on it; return (host, session id, link token, user pk)."""
    from django.contrib.auth import get_user_model

    from clusters.models import Cluster
    from sessions.models import Session
    from sessions.services import session_connect

    owner = get_user_model().objects.create_user("bench-owner", password=None)
    cluster = Cluster.objects.create(
        name="bench-verify", apiserver_url="https://10.0.0.1:6443", kubeconfig="apiVersion: v1\nkind: Config\n",
        session_domain="gpu.bench.gshare.test", status=Cluster.Status.CONNECTED,
    )
    session = Session.objects.create(owner=owner, image="quay.io/jupyter/base-notebook", gpus=1, cluster=cluster, node="gpu-000",
                                     phase=Session.Phase.RUNNING)
    link = session_connect(session=session, user=owner)
    token = parse_qs(urlsplit(link).query)["token"][0]
    return cluster.session_domain, session.public_id, token, owner.pk


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=["auto", "wrk", "python"], default="auto", help="load generator (auto: wrk if on PATH)")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per endpoint, alternating (default 3)")
    parser.add_argument("--seconds", type=float, default=5.0, help="wrk: duration of one measurement (default 5)")
    parser.add_argument("--requests", type=int, default=3000, help="python client: requests per measurement (default 3000)")
    parser.add_argument("--connections", type=int, default=8, help="concurrent connections (default 8)")
    parser.add_argument("--quick", action="store_true", help="one short round with the Python client: checks the run, no goal verdict (CI)")
    args = parser.parse_args()
    if args.quick:
        args.client, args.rounds, args.requests = "python", 1, 300
    wrk = shutil.which("wrk") if args.client in ("auto", "wrk") else None
    if args.client == "wrk" and wrk is None:
        raise SystemExit("wrk is not on PATH: apt-get install -y wrk, or use --client python")

    with bench_environment() as env, tempfile.TemporaryDirectory(prefix="gshare-bench-") as tmp:
        from django.core.cache import cache

        from sessions.connect import COOKIE_NAME, connect_cache_key, user_cache_key

        host, session_id, token, owner_pk = make_session()
        page = f"https://{host}/s/{session_id}/"
        port = free_port()
        logfile = Path(tmp) / "gunicorn.log"
        server = start_server(port, env, WORKERS, logfile)
        log(f"gunicorn ({WORKERS} workers) on 127.0.0.1:{port}")
        try:
            status, headers = request(port, "/internal/connect/verify", {"X-Original-URL": f"{page}?token={token}"})
            cookie = SimpleCookie(headers.get("Set-Cookie", ""))
            if status != 200 or COOKIE_NAME not in cookie:
                raise RuntimeError(f"the link answered {status} {headers}: no cookie to measure with\n{logfile.read_text()[-3000:]}")
            value = cookie[COOKIE_NAME].value
            verify_headers = {"X-Original-URL": page, "Cookie": f"{COOKIE_NAME}={value}"}
            status, headers = request(port, "/internal/connect/verify", verify_headers)
            if status != 200 or headers.get("X-Auth-Request-User") != "bench-owner" or "Set-Cookie" in headers:
                raise RuntimeError(f"verify answered {status} {headers}: the benchmark would measure a refusal\n{logfile.read_text()[-3000:]}")
            refused = request(port, "/internal/connect/verify", {**verify_headers, "Cookie": f"{COOKIE_NAME}={value[:-4]}AAAA"})[0]
            if refused != 401:
                raise RuntimeError(f"verify answered {refused} to a tampered cookie (expected 401)")
            from sessions import activity

            if session_id not in (activity.connections_pending([session_id]) or {}):
                raise RuntimeError("verify let the cookie in but noted no connection in Redis (sessions.activity.connection_note)")
            check_path = f"{EXT_AUTHZ_PATH}/s/{session_id}/"
            status, headers = request(port, f"{check_path}?token={token}", {"Host": host})
            if status != 307 or COOKIE_NAME not in SimpleCookie(headers.get("Set-Cookie", "")):
                raise RuntimeError(f"the ext-authz check answered the link {status} {headers} (expected 307 and the cookie)")
            check_headers = {"Host": host, "Cookie": f"{COOKIE_NAME}={value}", "X-Forwarded-Proto": "https"}
            status, headers = request(port, check_path, check_headers)
            if status != 200 or headers.get("X-Auth-Request-User") != "bench-owner":
                raise RuntimeError(f"the ext-authz check answered {status} {headers}: the benchmark would measure a refusal")
            endpoints = {
                "ping": ("/internal/ping", {}, 204), "verify": ("/internal/connect/verify", verify_headers, 200),
                "ext-authz": (check_path, check_headers, 200),
            }

            def measure(name: str, warmup: bool = False) -> float:
                path, hdrs, expected = endpoints[name]
                if wrk and not warmup:
                    return wrk_load(wrk, port, path, hdrs, args.seconds, args.connections)
                total = 400 if warmup else args.requests
                return python_load(port, path, hdrs, expected, total, min(args.connections, 8))

            for name in endpoints:  # warm-up: every worker imports, connects to Redis, caches the public key
                measure(name, warmup=True)
            rates: dict[str, list[float]] = {"ping": [], "verify": [], "ext-authz": []}
            for round_ in range(args.rounds):
                order = ["ping", "verify", "ext-authz"] if round_ % 2 == 0 else ["ext-authz", "verify", "ping"]
                for name in order:
                    rates[name].append(measure(name))
                    log(f"round {round_ + 1}: {name} {rates[name][-1]:.0f} req/s")
        finally:
            stop_server(server)
            try:
                cache.delete_many([connect_cache_key(session_id), user_cache_key(owner_pk)])
            except Exception as exc:  # cleanup must not hide the first error
                log(f"could not delete the cache key: {exc}")

    ping, verify, check = (statistics.median(rates[name]) for name in ("ping", "verify", "ext-authz"))
    ratio, check_ratio = verify / ping, check / ping
    client = f"wrk -t2 -c{args.connections} -d{args.seconds:g}s" if wrk else f"python http.client, {min(args.connections, 8)} threads, {args.requests} requests"
    print("connect verify benchmark")
    print(f"  server: gunicorn gshare.wsgi --workers {WORKERS} (sync) on 127.0.0.1; client: {client}; {args.rounds} rounds, alternating")
    print(f"  ping   (GET /internal/ping, 204):            {ping:8.0f} req/s  (rounds: {', '.join(f'{r:.0f}' for r in rates['ping'])})")
    print(f"  verify (GET /internal/connect/verify, 200):  {verify:8.0f} req/s  (rounds: {', '.join(f'{r:.0f}' for r in rates['verify'])})")
    print(f"  ext-authz (GET {EXT_AUTHZ_PATH}/s/<id>/, 200): {check:8.0f} req/s  "
          f"(rounds: {', '.join(f'{r:.0f}' for r in rates['ext-authz'])})")
    print(f"  ratio verify/ping: {ratio:.2f}")
    print(f"  ratio ext-authz/ping: {check_ratio:.2f}")
    if args.quick:
        print("  quick run: no goal verdict")
        return 0
    met = min(ratio, check_ratio) >= GOAL_RATIO
    print(f"  goal: each ratio >= {GOAL_RATIO}: {'MET' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
