"""Benchmark: usage ingestion (``POST /internal/v1/usage``) on a real gunicorn against a raw psycopg COPY.

    .venv/bin/python bench/usage_ingest.py [--shape both|default|per-sample] [--samples 100000] [--batch N] [--sessions N]
                                           [--workers 2] [--clients 4] [--rounds 3] [--quick]

Two shapes of traffic, each with its goal (``--shape both``, the default, runs both with one server and reports a
verdict for each):

* ``default``: batches of 1,000 samples over 100 sessions (10 sampling ticks per batch); goal at least 20,000
  samples/s and at least 0.3 × COPY;
* ``per-sample``: batches of 1,000 samples over 1,000 sessions (one tick: every sample is another session's); goal
  at least 0.4 × COPY.

``--sessions``/``--batch`` run one custom shape instead, judged by the default shape's goal.

In a throwaway database (``gshare_bench``, see ``bench/_benchenv.py``) it creates, per shape, a connected cluster with
one GPU per session (H100 80GB and L4, as HAMi registers them), one Running session per GPU (half whole GPUs,
half shares), their owners (sessions / 4 users) and prices, mints a real operator token for the cluster
(``clusters.operator_token.tokens.operator_token_mint``), starts ``python -m gunicorn gshare.wsgi --workers N`` on a
free loopback port against that database (``DATABASE_CONN_MAX_AGE=60``, as the chart sets it), and measures, in
each of ``--rounds`` rounds (the medians are compared):

* **endpoint**: ``--samples`` new samples posted, into the emptied table, as batches through ``POST /internal/v1/usage`` with
  the operator token, from ``--clients`` client threads (``http.client``; bodies are encoded before the clock
  starts). Like the operator's queue, each batch holds consecutive sampling ticks: one 60 s sample per
  session GPU per tick; each batch adds to its sessions' accruals, and a round's samples span about 17 hours (default
  shape) or 100 minutes (per-sample), so the sessions' hourly billing periods are charged as the rounds go, by the
  first sample of the next hour (one ledger entry per session and hour, not per batch). Every answer must be
  200 with every sample accepted. Samples/s = samples / wall time.
* **baseline**: the same rows (read back from ``billing_usagesample`` after the endpoint run) written by one raw
  psycopg ``COPY billing_usagesample (...) FROM STDIN`` (``cursor.copy()``, ``write_row``) into the same table,
  emptied first (``TRUNCATE``), then committed: the table's indexes, constraints and foreign-key checks are the
  same; parsing, validation, pricing, the HTTP round trips and the ledger are what the endpoint adds.

A warm-up (two batches, not timed) lets every worker import, connect and authenticate first. Checks after each
endpoint run: every sample stored once; the round's period charges plus the accrued credits equal the samples'
costs, at most one charge per session and period; each balance equals the sum of its account's ledger and each
``accrued`` the sum of its accruals. Last, a fifth of the batches is posted again and must
store nothing (its rate is printed too), and a few of them under new ``sample_id``s (an operator re-sampling the same
windows) must each be refused whole (400 ``invalid_usage_sample``, ``reason`` ``usage_window_overlap``), the books
unchanged. The ratio printed is (median endpoint samples/s) / (median COPY rows/s).
Goals (issue 16): see the shapes above. Exit status 0 when every shape run meets its goal, 1 otherwise.

``--quick`` (CI): one round of each shape, small (5,000 samples over 20 sessions; 2,000 over 200 sessions in batches
of 200) from 2 clients, a few seconds; it checks that the run itself works (every answer and check above) and gives
no goal verdict.

Traffic goes to 127.0.0.1 only; every loop is bounded; the server is stopped and the database dropped at the end.
"""

from __future__ import annotations

import _benchpath  # noqa: F401 - first: keeps this folder after the standard library (bench/_benchpath.py)

# isort: split
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
#: name: (sessions, batch, goal samples/s or None, goal ratio to COPY).
SHAPES = {"default": (100, 1000, GOAL_RATE, GOAL_RATIO), "per-sample": (1000, 1000, None, 0.4)}
#: --quick: name: (samples, sessions, batch).
QUICK = {"default": (5000, 20, 1000), "per-sample": (2000, 200, 200)}
#: (model, HAMi registered memory MiB, price credits/GPU-hour): what the bench cluster's GPUs are.
MODELS = [("NVIDIA H100 80GB HBM3", 81559, Decimal("2.500000")), ("NVIDIA L4", 23034, Decimal("0.400000"))]
TICK = timedelta(seconds=60)
USAGE_PATH = "/internal/v1/usage"
#: Columns the endpoint writes, in the order the baseline COPY writes them.
COLUMNS = ["cluster_id", "sample_id", "session_id", "device_uuid", "start", "end", "gpu_util_percent", "memory_used_mib",
           "gpu_model", "share", "cost", "billing_period", "received_at"]


def post(port: int, body: bytes, token: str, timeout: float = 60.0) -> tuple[int, bytes]:
    """One POST of ``body`` to the usage route on a fresh connection: status and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", USAGE_PATH, body=body, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def make_fleet(sessions: int, name: str = "bench-usage") -> tuple[str, str, list[tuple[str, str]]]:
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
        name=name, apiserver_url="https://10.0.0.1:6443", kubeconfig="apiVersion: v1\nkind: Config\n",
        session_domain=f"gpu.{name}.gshare.test", status=Cluster.Status.CONNECTED,
    )
    nodes = [Node.objects.create(cluster=cluster, name=f"gpu-{i:03d}", ready=True, last_seen_at=now) for i in range((sessions + 7) // 8)]
    tag = abs(hash(name)) % 10**8
    devices = GpuDevice.objects.bulk_create([
        GpuDevice(node=nodes[i // 8], cluster=cluster, uuid=f"GPU-bench-{i:08d}-{tag:08d}-0000-000000000000", index=i % 8,
                  model=MODELS[i % 2][0], memory_mib=MODELS[i % 2][1], split_count=10, cores=100, last_seen_at=now)
        for i in range(sessions)
    ])
    users = get_user_model().objects.bulk_create([get_user_model()(username=f"{name}-user-{i}") for i in range(max(1, sessions // 4))])
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
    if not Price.objects.exists():
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


def check_books(cluster_id: str, expected: int, since: datetime, until: datetime) -> None:
    """The cluster's samples (all in [since, until)) stored once; their sessions' period charges of that span plus
    their accruals equal the samples' costs, one charge per session and period at most; every balance = its ledger's
    sum and every ``accrued`` = its accruals' sum."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(DISTINCT u.sample_id), coalesce(sum(u.cost), 0) FROM billing_usagesample u "
                       "JOIN clusters_cluster c ON c.id = u.cluster_id WHERE c.public_id = %s", [cluster_id])
        count, distinct, costs = cursor.fetchone()
        sessions = "SELECT s.id FROM gpu_sessions_session s JOIN clusters_cluster c ON c.id = s.cluster_id WHERE c.public_id = %s"
        cursor.execute(f"SELECT coalesce(sum(amount), 0), count(*), count(DISTINCT (session_id, period_start)) FROM billing_ledgerentry "
                       f"WHERE kind = 'charge' AND session_id IN ({sessions}) AND period_start >= %s AND period_start < %s",
                       [cluster_id, since, until])
        charged, charges, distinct_charges = cursor.fetchone()
        cursor.execute(f"SELECT coalesce(sum(amount), 0) FROM billing_accrual WHERE session_id IN ({sessions}) "
                       "AND period_start >= %s AND period_start < %s", [cluster_id, since, until])
        (accrued,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM billing_creditaccount a WHERE a.balance <> "
                       "(SELECT coalesce(sum(amount), 0) FROM billing_ledgerentry e WHERE e.account_id = a.id) OR a.accrued <> "
                       "(SELECT coalesce(sum(amount), 0) FROM billing_accrual r WHERE r.account_id = a.id)")
        (wrong,) = cursor.fetchone()
    if count != expected or distinct != expected or accrued - charged != costs or charges != distinct_charges or wrong:
        raise RuntimeError(f"books do not add up: {count} rows ({distinct} distinct) for {expected} samples, charges {charged} "
                           f"({charges} for {distinct_charges} periods) plus accrued {accrued} for costs {costs}, {wrong} "
                           "account(s) off the ledger or the accruals")


def ledger_counts(cluster_id: str) -> tuple[int, int]:
    """(charge entries, accruals) of the cluster's sessions."""
    from django.db import connection

    with connection.cursor() as cursor:
        sessions = "SELECT s.id FROM gpu_sessions_session s JOIN clusters_cluster c ON c.id = s.cluster_id WHERE c.public_id = %s"
        cursor.execute(f"SELECT (SELECT count(*) FROM billing_ledgerentry WHERE kind = 'charge' AND session_id IN ({sessions})), "
                       f"(SELECT count(*) FROM billing_accrual WHERE samples > 0 AND session_id IN ({sessions}))", [cluster_id, cluster_id])
        return cursor.fetchone()


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


def run_shape(name: str, *, port: int, samples: int, sessions: int, batch: int, clients: int, rounds: int, start: datetime,
              logfile: Path) -> dict:
    """Measure one shape (its own cluster and sessions) on the running server: ``rounds`` rounds of endpoint then COPY,
    the replay and the re-sampled refusal. Returns the figures."""
    from django.db import connection

    cluster_id, token, pairs = make_fleet(sessions, name=f"bench-{name}")
    log(f"{name}: cluster {cluster_id} with {sessions} sessions, batches of {batch}")
    warmup = make_bodies(pairs, total=2 * batch, batch=batch, start=start - timedelta(days=1), prefix="warm:")
    _, accepted = run_load(port, token, warmup, min(clients, len(warmup)))
    if accepted != 2 * batch:
        raise RuntimeError(f"warm-up: {accepted} samples accepted of {2 * batch}")
    rates: dict[str, list[float]] = {"endpoint": [], "copy": []}
    for round_ in range(rounds):
        day = start + round_ * timedelta(days=1)
        bodies = make_bodies(pairs, total=samples, batch=batch, start=day, prefix=f"r{round_}:")
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE billing_usagesample")
        seconds, accepted = run_load(port, token, bodies, clients)
        if accepted != samples:
            raise RuntimeError(f"{accepted} samples accepted of {samples}\n{logfile.read_text()[-3000:]}")
        check_books(cluster_id, samples, day, day + timedelta(days=1))
        copy_seconds, copied = copy_baseline()
        rates["endpoint"].append(samples / seconds)
        rates["copy"].append(copied / copy_seconds)
        log(f"{name} round {round_ + 1}: endpoint {rates['endpoint'][-1]:.0f} samples/s ({len(bodies)} batches in {seconds:.2f} s), "
            f"COPY {rates['copy'][-1]:.0f} rows/s")
    replay = bodies[: max(1, len(bodies) // 5)]
    replay_seconds, replayed = run_load(port, token, replay, clients)
    if replayed:
        raise RuntimeError(f"a replay was accepted again ({replayed} samples)")
    resampled = check_resampled_refused(port, token, replay[:3])
    check_books(cluster_id, samples, day, day + timedelta(days=1))
    charges, accruals = ledger_counts(cluster_id)
    return {"rates": rates, "replay_rate": len(replay) * batch / replay_seconds, "replay": len(replay), "resampled": resampled,
            "charges": charges, "accruals": accruals, "batches": rounds * len(bodies) + len(warmup)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["both", *SHAPES], default="both", help="which shape(s) to run (default both)")
    parser.add_argument("--samples", type=int, default=100_000, help="samples posted per round (default 100000)")
    parser.add_argument("--batch", type=int, default=None, help="samples per request (a custom shape; at most 5000)")
    parser.add_argument("--sessions", type=int, default=None, help="Running sessions, one GPU each (a custom shape)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn sync workers (default 2)")
    parser.add_argument("--clients", type=int, default=4, help="client threads posting at once (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of endpoint then COPY; medians are compared (default 3)")
    parser.add_argument("--quick", action="store_true", help="one short round of each shape: checks the run, no goal verdict (CI)")
    args = parser.parse_args()
    names = list(SHAPES) if args.shape == "both" else [args.shape]
    if args.sessions is not None or args.batch is not None:
        default_sessions, default_batch, *_ = SHAPES[names[0]]
        plan = {"custom": (args.samples, args.sessions or default_sessions, args.batch or default_batch, GOAL_RATE, GOAL_RATIO)}
    else:
        plan = {name: (args.samples, *SHAPES[name][:2], *SHAPES[name][2:]) for name in names}
    if args.quick:
        plan = {name: (*QUICK[name], None, None) for name in (names if "custom" not in plan else ["default"])}
        args.clients, args.rounds = 2, 1
    for samples, sessions, batch, *_ in plan.values():
        if not 1 <= batch <= 5000 or samples < batch or sessions < 1 or args.rounds < 1:
            raise SystemExit("--batch must be 1..5000, --samples at least --batch, --sessions and --rounds at least 1")

    results = {}
    with bench_environment() as env, tempfile.TemporaryDirectory(prefix="gshare-bench-") as tmp:
        # Days back, on the hour: every round's windows (a day apart, each shape its own days) stay inside what the
        # endpoint accepts (GSHARE_USAGE_MAX_AGE_SECONDS back to a few minutes ahead of now).
        base = (datetime.now(UTC) - timedelta(days=12)).replace(minute=0, second=0, microsecond=0)
        port = free_port()
        logfile = Path(tmp) / "gunicorn.log"
        server = start_server(port, env, args.workers, logfile, {"DATABASE_CONN_MAX_AGE": "60"})
        log(f"gunicorn ({args.workers} workers) on 127.0.0.1:{port}")
        try:
            for n, (name, (samples, sessions, batch, _, _)) in enumerate(plan.items()):
                results[name] = run_shape(name, port=port, samples=samples, sessions=sessions, batch=batch, clients=args.clients,
                                          rounds=args.rounds, start=base + n * timedelta(days=args.rounds + 2), logfile=logfile)
        finally:
            stop_server(server)

    print("usage ingestion benchmark")
    print(f"  server: gunicorn gshare.wsgi --workers {args.workers} (sync) on 127.0.0.1; client: {args.clients} threads (http.client); "
          f"{args.rounds} rounds, medians")
    met_all = True
    for name, (samples, sessions, batch, goal_rate, goal_ratio) in plan.items():
        figures = results[name]
        rates = figures["rates"]
        rate, copy_rate = statistics.median(rates["endpoint"]), statistics.median(rates["copy"])
        ratio = rate / copy_rate
        per_batch = min(batch, sessions)
        print(f"  shape {name}: {samples} samples per round of {sessions} sessions, batches of {batch} "
              f"({batch // per_batch} ticks x {per_batch} session GPUs)")
        print(f"    endpoint (POST {USAGE_PATH}):  {rate:9.0f} samples/s  (rounds: {', '.join(f'{r:.0f}' for r in rates['endpoint'])})")
        print(f"    baseline (psycopg COPY, 1 stmt):  {copy_rate:9.0f} rows/s     (rounds: {', '.join(f'{r:.0f}' for r in rates['copy'])})")
        print(f"    ledger: {figures['charges']} period charges and {figures['accruals']} open accruals for {figures['batches']} batches "
              "(one charge per session and hour)")
        print(f"    replay of {figures['replay']} batches (all duplicates): {figures['replay_rate']:9.0f} samples/s")
        print(f"    re-sampled windows under new ids: {figures['resampled']} batches, each refused whole (400 usage_window_overlap)")
        print(f"    ratio endpoint/COPY: {ratio:.2f}")
        if args.quick:
            continue
        met = ratio >= goal_ratio and (goal_rate is None or rate >= goal_rate)
        met_all = met_all and met
        wanted = (f">= {goal_rate:,.0f} samples/s and " if goal_rate is not None else "") + f"ratio >= {goal_ratio}"
        print(f"    goal: {wanted}: {'MET' if met else 'MISSED'}")
    if args.quick:
        print("  quick run: no goal verdict")
        return 0
    return 0 if met_all else 1


if __name__ == "__main__":
    sys.exit(main())
