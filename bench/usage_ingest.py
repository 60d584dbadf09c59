"""Benchmark: usage ingestion (``POST /internal/v1/usage``) on a real gunicorn against a raw psycopg COPY.

    .venv/bin/python bench/usage_ingest.py [--samples 100000] [--batch 1000] [--sessions 100] [--workers 2] [--clients 4]
                                           [--rounds 3] [--quick]

In a throwaway database (``gshare_bench``, see ``bench/_benchenv.py``) it creates a connected cluster with
``--sessions`` GPUs (H100 80GB and L4, as HAMi registers them), one Running session per GPU (half whole GPUs,
half shares), their owners (``--sessions`` / 4 users) and prices, mints a real operator token for the cluster
(``clusters.operator_token.tokens.operator_token_mint``), starts ``python -m gunicorn gshare.wsgi --workers N`` on a
free loopback port against that database (``DATABASE_CONN_MAX_AGE=60``, as the chart sets it), and measures, in
each of ``--rounds`` rounds (the medians are compared):

* **endpoint**: ``--samples`` new samples posted, into the emptied table, as batches of ``--batch`` through ``POST /internal/v1/usage`` with
  the operator token, from ``--clients`` client threads (``http.client``; bodies are encoded before the clock
  starts). Like the operator's queue, each batch holds consecutive sampling ticks: one 60 s sample per
  session GPU per tick, so a batch of 1,000 over 100 sessions charges 100 ledger entries. Every answer must be
  200 with every sample accepted. Samples/s = samples / wall time.
* **baseline**: the same rows (read back from ``billing_usagesample`` after the endpoint run) written by one raw
  psycopg ``COPY billing_usagesample (...) FROM STDIN`` (``cursor.copy()``, ``write_row``) into the same table,
  emptied first (``TRUNCATE``), then committed: the table's indexes, constraints and foreign-key checks are the
  same; parsing, validation, pricing, the HTTP round trips and the ledger are what the endpoint adds.

A warm-up (two batches, not timed) lets every worker import, connect and authenticate first. Checks after each
endpoint run: every sample stored once, the ledger's charges equal the samples' costs,
and each balance equals the sum of its account's ledger. Last, a fifth of the batches is posted again and must
store nothing (its rate is printed too), and a few of them under new ``sample_id``s (an operator re-sampling the same
windows) must each be refused whole (400 ``invalid_usage_sample``, ``reason`` ``usage_window_overlap``), the books
unchanged. The ratio printed is (median endpoint samples/s) / (median COPY rows/s).
Goal (issue): at least 20,000 samples/s and a ratio of at least 0.3. Exit status 0 when both are met, 1 otherwise.

``--quick`` (CI): one round of 5,000 samples over 20 sessions from 2 clients, a few seconds; it checks that the run
itself works (every answer and check above) and gives no goal verdict.

Traffic goes to 127.0.0.1 only; every loop is bounded; the server is stopped and the database dropped at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from _benchenv import bench_environment, free_port, log, start_server, stop_server

GOAL_RATE = 20_000.0
GOAL_RATIO = 0.3
#: (model, HAMi registered memory MiB, price credits/GPU-hour): what the bench cluster's GPUs are.
MODELS = [("NVIDIA H100 80GB HBM3", 81559, Decimal("2.500000")), ("NVIDIA L4", 23034, Decimal("0.400000"))]
TICK = timedelta(seconds=60)
USAGE_PATH = "/internal/v1/usage"
#: Columns the endpoint writes, in the order the baseline COPY writes them.
COLUMNS = ["cluster_id", "sample_id", "session_id", "device_uuid", "start", "end", "gpu_util_percent", "memory_used_mib",
           "gpu_model", "share", "cost", "entry_id", "received_at"]


def post(port: int, body: bytes, token: str, timeout: float = 60.0) -> tuple[int, bytes]:
    """One POST of ``body`` to the usage route on a fresh connection: status and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", USAGE_PATH, body=body, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def make_fleet(sessions: int) -> tuple[str, str, list[tuple[str, str]]]:
    """Create the cluster, its GPUs, users, Running sessions (one GPU each, reserved) and prices.

    Returns:
        (cluster public id, operator token, [(session id, GPU uuid)]).
    """
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from billing.models import Price
    from clusters.models import Cluster, GpuDevice, Node
    from clusters.operator_token.tokens import operator_token_mint
    from sessions.models import Allocation, Session

    now = timezone.now()
    cluster = Cluster.objects.create(
        name="bench-usage", apiserver_url="https://10.0.0.1:6443", kubeconfig="apiVersion: v1\nkind: Config\n",
        session_domain="gpu.bench.gshare.test", status=Cluster.Status.CONNECTED,
    )
    nodes = [Node.objects.create(cluster=cluster, name=f"gpu-{i:03d}", ready=True, last_seen_at=now) for i in range((sessions + 7) // 8)]
    devices = GpuDevice.objects.bulk_create([
        GpuDevice(node=nodes[i // 8], cluster=cluster, uuid=f"GPU-bench-{i:08d}-0000-0000-000000000000", index=i % 8,
                  model=MODELS[i % 2][0], memory_mib=MODELS[i % 2][1], split_count=10, cores=100, last_seen_at=now)
        for i in range(sessions)
    ])
    users = get_user_model().objects.bulk_create([get_user_model()(username=f"bench-user-{i}") for i in range(max(1, sessions // 4))])
    rows = Session.objects.bulk_create([
        Session(owner=users[i % len(users)], cluster=cluster, image="quay.io/jupyter/base-notebook", gpus=1, node=nodes[i // 8].name,
                phase=Session.Phase.RUNNING, gpu_memory_mib=None if i % 2 == 0 else 8192, gpu_cores=None if i % 2 == 0 else 25,
                started_at=now)
        for i in range(sessions)
    ])
    # Before every window the bench posts (the endpoint refuses a window that begins before its session).
    Session.objects.filter(cluster=cluster).update(created_at=now - timedelta(days=20), started_at=now - timedelta(days=20))
    Allocation.objects.bulk_create([
        Allocation(session=s, device=d, memory_mib=d.memory_mib if s.gpu_memory_mib is None else s.gpu_memory_mib,
                   cores=100 if s.gpu_cores is None else s.gpu_cores, exclusive=s.gpu_memory_mib is None)
        for s, d in zip(rows, devices, strict=True)
    ])
    Price.objects.bulk_create([Price(gpu_model=model, credits_per_gpu_hour=price) for model, _, price in MODELS]
                              + [Price(gpu_model="", credits_per_gpu_hour=Decimal("1.000000"))])
    token = operator_token_mint(cluster_id=cluster.public_id)
    return cluster.public_id, token, [(s.public_id, d.uuid) for s, d in zip(rows, devices, strict=True)]


def make_bodies(pairs: list[tuple[str, str]], *, total: int, batch: int, start: datetime, prefix: str) -> list[bytes]:
    """``total`` samples as JSON bodies of ``batch`` samples: tick after tick, one sample per (session, GPU) per tick."""
    samples = []
    tick = 0
    while len(samples) < total:
        begin = start + tick * TICK
        begin_text, end_text = (t.isoformat().replace("+00:00", "Z") for t in (begin, begin + TICK))
        for n, (session_id, uuid) in enumerate(pairs):
            if len(samples) == total:
                break
            samples.append({
                "sample_id": f"{prefix}{session_id}:{uuid}:{tick}", "session_id": session_id, "device_uuid": uuid,
                "start": begin_text, "end": end_text, "gpu_util_percent": (n * 7 + tick) % 101, "memory_used_mib": 1000 + n,
            })
        tick += 1
    return [json.dumps({"samples": samples[i:i + batch]}).encode() for i in range(0, total, batch)]


def run_load(port: int, token: str, bodies: list[bytes], clients: int) -> tuple[float, int]:
    """Post every body from ``clients`` threads; (seconds, samples accepted). Any non-200 answer fails the run."""
    work: queue.Queue[bytes] = queue.Queue()
    for body in bodies:
        work.put(body)
    accepted = [0] * clients
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)

    def client(slot: int) -> None:
        barrier.wait()
        while not errors:
            try:
                body = work.get_nowait()
            except queue.Empty:
                return
            try:
                status, answer = post(port, body, token)
            except (OSError, http.client.HTTPException) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            if status != 200:
                errors.append(f"answered {status}: {answer[:500]!r}")
                return
            accepted[slot] += json.loads(answer)["accepted"]

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join(timeout=600)
    elapsed = time.perf_counter() - started
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"load failed: {errors[:3] or 'a client thread did not finish'}")
    return elapsed, sum(accepted)


def check_books(expected: int) -> None:
    """Every sample stored once; charges = samples' costs; every balance = its ledger's sum."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(DISTINCT sample_id), coalesce(sum(cost), 0) FROM billing_usagesample")
        count, distinct, costs = cursor.fetchone()
        cursor.execute("SELECT coalesce(sum(amount), 0) FROM billing_ledgerentry e WHERE kind = 'charge' "
                       "AND EXISTS (SELECT 1 FROM billing_usagesample s WHERE s.entry_id = e.id)")
        (charged,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM billing_creditaccount a WHERE a.balance <> "
                       "(SELECT coalesce(sum(amount), 0) FROM billing_ledgerentry e WHERE e.account_id = a.id)")
        (wrong,) = cursor.fetchone()
    if count != expected or distinct != expected or charged != -costs or wrong:
        raise RuntimeError(f"books do not add up: {count} rows ({distinct} distinct) for {expected} samples, charges {charged} "
                           f"for costs {costs}, {wrong} balance(s) off the ledger")


def check_resampled_refused(port: int, token: str, bodies: list[bytes]) -> int:
    """Post ``bodies`` again with every ``sample_id`` renamed (the same windows re-sampled under new ids): each must be
    refused whole, 400 ``invalid_usage_sample`` with ``reason`` ``usage_window_overlap``. Returns how many were posted."""
    for body in bodies:
        samples = json.loads(body)["samples"]
        renamed = json.dumps({"samples": [dict(s, sample_id=f"resampled:{s['sample_id']}") for s in samples]}).encode()
        status, answer = post(port, renamed, token)
        refusal = json.loads(answer) if status == 400 else {}
        if (status, refusal.get("code"), refusal.get("reason")) != (400, "invalid_usage_sample", "usage_window_overlap"):
            raise RuntimeError(f"re-sampled windows under new ids answered {status}: {answer[:500]!r}")
    return len(bodies)


def copy_baseline() -> tuple[float, int]:
    """Read the stored samples, empty the table, COPY them back with psycopg; (seconds of COPY + commit, rows)."""
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        quoted = ", ".join(f'"{c}"' for c in COLUMNS)
        rows = conn.execute(f"SELECT {quoted} FROM billing_usagesample ORDER BY id").fetchall()
        conn.execute("TRUNCATE billing_usagesample")
        conn.commit()
        started = time.perf_counter()
        with conn.cursor() as cursor, cursor.copy(f"COPY billing_usagesample ({quoted}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
        elapsed = time.perf_counter() - started
        (count,) = conn.execute("SELECT count(*) FROM billing_usagesample").fetchone()
    if count != len(rows):
        raise RuntimeError(f"COPY stored {count} rows of {len(rows)}")
    return elapsed, len(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100_000, help="samples posted per round (default 100000)")
    parser.add_argument("--batch", type=int, default=1000, help="samples per request (default 1000, at most 5000)")
    parser.add_argument("--sessions", type=int, default=100, help="Running sessions, one GPU each (default 100)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn sync workers (default 2)")
    parser.add_argument("--clients", type=int, default=4, help="client threads posting at once (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of endpoint then COPY; medians are compared (default 3)")
    parser.add_argument("--quick", action="store_true", help="one short round (5,000 samples, 20 sessions): checks the run, no goal verdict (CI)")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.batch, args.sessions, args.clients, args.rounds = 5000, 1000, 20, 2, 1
    if not 1 <= args.batch <= 5000 or args.samples < args.batch or args.sessions < 1 or args.rounds < 1:
        raise SystemExit("--batch must be 1..5000, --samples at least --batch, --sessions and --rounds at least 1")

    rates: dict[str, list[float]] = {"endpoint": [], "copy": []}
    with bench_environment() as env, tempfile.TemporaryDirectory(prefix="gshare-bench-") as tmp:
        from django.db import connection

        cluster_id, token, pairs = make_fleet(args.sessions)
        # Ten days back, on the hour: every round's windows (a day apart) stay inside what the endpoint accepts
        # (GSHARE_USAGE_MAX_AGE_SECONDS back to a few minutes ahead of now).
        start = (datetime.now(UTC) - timedelta(days=10)).replace(minute=0, second=0, microsecond=0)
        warmup = make_bodies(pairs, total=2 * args.batch, batch=args.batch, start=start - timedelta(days=1), prefix="warm:")
        port = free_port()
        logfile = Path(tmp) / "gunicorn.log"
        server = start_server(port, env, args.workers, logfile, {"DATABASE_CONN_MAX_AGE": "60"})
        log(f"gunicorn ({args.workers} workers) on 127.0.0.1:{port}; cluster {cluster_id} with {args.sessions} sessions")
        try:
            _, accepted = run_load(port, token, warmup, min(args.clients, len(warmup)))
            if accepted != 2 * args.batch:
                raise RuntimeError(f"warm-up: {accepted} samples accepted of {2 * args.batch}")
            for round_ in range(args.rounds):
                bodies = make_bodies(pairs, total=args.samples, batch=args.batch, start=start + round_ * timedelta(days=1),
                                     prefix=f"r{round_}:")
                with connection.cursor() as cursor:
                    cursor.execute("TRUNCATE billing_usagesample")
                seconds, accepted = run_load(port, token, bodies, args.clients)
                if accepted != args.samples:
                    raise RuntimeError(f"{accepted} samples accepted of {args.samples}\n{logfile.read_text()[-3000:]}")
                check_books(args.samples)
                copy_seconds, copied = copy_baseline()
                rates["endpoint"].append(args.samples / seconds)
                rates["copy"].append(copied / copy_seconds)
                log(f"round {round_ + 1}: endpoint {rates['endpoint'][-1]:.0f} samples/s ({len(bodies)} batches in {seconds:.2f} s), "
                    f"COPY {rates['copy'][-1]:.0f} rows/s")
            replay = bodies[: max(1, len(bodies) // 5)]
            replay_seconds, replayed = run_load(port, token, replay, args.clients)
            if replayed:
                raise RuntimeError(f"a replay was accepted again ({replayed} samples)")
            resampled = check_resampled_refused(port, token, replay[:3])
            check_books(args.samples)
        finally:
            stop_server(server)

    rate, copy_rate = statistics.median(rates["endpoint"]), statistics.median(rates["copy"])
    replay_rate = len(replay) * args.batch / replay_seconds
    ratio = rate / copy_rate
    met = rate >= GOAL_RATE and ratio >= GOAL_RATIO
    per_batch = min(args.batch, args.sessions)
    print("usage ingestion benchmark")
    print(f"  server: gunicorn gshare.wsgi --workers {args.workers} (sync) on 127.0.0.1; client: {args.clients} threads (http.client); "
          f"{args.rounds} rounds, medians")
    print(f"  data: {args.samples} samples per round of {args.sessions} sessions, batches of {args.batch} "
          f"({args.batch // per_batch} ticks x {per_batch} session GPUs: {per_batch} charges per batch)")
    print(f"  endpoint (POST {USAGE_PATH}):  {rate:9.0f} samples/s  (rounds: {', '.join(f'{r:.0f}' for r in rates['endpoint'])})")
    print(f"  baseline (psycopg COPY, 1 stmt):  {copy_rate:9.0f} rows/s     (rounds: {', '.join(f'{r:.0f}' for r in rates['copy'])})")
    print(f"  replay of {len(replay)} batches (all duplicates): {replay_rate:9.0f} samples/s")
    print(f"  re-sampled windows under new ids: {resampled} batches, each refused whole (400 usage_window_overlap)")
    print(f"  ratio endpoint/COPY: {ratio:.2f}")
    if args.quick:
        print("  quick run: no goal verdict")
        return 0
    print(f"  goal: >= {GOAL_RATE:,.0f} samples/s and ratio >= {GOAL_RATIO}: {'MET' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
