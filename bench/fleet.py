"""Benchmark: the whole control plane under a simulated fleet of operators and researchers.

    .venv/bin/python bench/fleet.py [--clusters 100] [--min-nodes 20] [--max-nodes 100] [--sim-minutes 10] [--speed 5]
                                    [--researchers 50] [--seed-sessions 300] [--create-rate 3] [--pool 8] [--quick]

One control plane runs as the Helm chart runs it, on this machine: ``gunicorn gshare.wsgi`` (2 sync workers,
``DATABASE_CONN_MAX_AGE=60``), a Celery worker (``--concurrency 2``) and Celery beat with django-celery-beat's
``DatabaseScheduler``, against PostgreSQL and Redis (the embedded ones unless ``DATABASE_URL``/``REDIS_URL`` name
others; a throwaway database, see ``bench/_benchenv.py``). Around it, in this process (``bench/_fleet_sim.py``):

* **operators**, one per cluster (``--clusters``, each with ``--min-nodes`` .. ``--max-nodes`` GPU nodes of 8 GPUs of
  one HAMi-registered model, and its own operator token): ``PUT /internal/v1/inventory`` every simulated minute
  (the full snapshot; one in twenty flips a node's readiness, the rest are unchanged), ``POST /internal/v1/status``
  when a session they were given changed phase (Pending, then Running), ``POST /internal/v1/usage`` every simulated
  minute with one window per Running session GPU. Through the operator's own client and builders
  (``operator_agent.control_plane_client``, ``.inventory``, ``.usage``, ``.sessions``), without retries.
* **the clusters' apiservers**: one loopback stand-in answering the worker's server-side apply and delete of
  ``GShareSession`` objects; each apply is handed to that cluster's operator, which places it on its GPUs.
* **researchers** (``--researchers``, each with an API token and credits): ``POST /api/v1/sessions`` at
  ``--create-rate`` per second (Poisson arrivals; whole GPUs and shares), ``DELETE /api/v1/sessions/<id>`` once the
  session's lifetime (1 to 8 simulated minutes) is over, and now and then ``GET /api/v1/sessions`` and
  ``GET /api/v1/billing/account``. Before the clock starts, ``--seed-sessions`` long-running sessions are created
  (not timed) so the fleet is not empty; they are stopped at random times during and after the run.
* **queued researchers**: ``POST /api/v1/sessions`` with ``"queue": true`` at ``--queue-rate`` per second, each for a
  whole node (8 GPUs) of the smallest cluster with a time limit of its lifetime (``runtime_hours``, rounded up to
  0.01 h): that cluster runs full part of the time and the rest wait in the queue. They are never stopped by hand: each
  ends at its time limit (``sessions.enforce_runtime``, every 30 s) and the queue starts the next. After the run the
  benchmark reports how good the queue's estimates were: the median and 90th percentile of the absolute error of each
  admitted session's first estimate, as a share of its actual wait (``sessions.selectors.queue_figures``).

Time: ``--sim-minutes`` simulated minutes pass in ``sim-minutes * 60 / speed`` wall seconds (10 in 120 s by default).
Operators stamp usage windows and status reports with the simulated clock, which starts behind the wall clock and ends
as far ahead of it, within the 300 s of clock skew the control plane accepts (``billing.usage.CLOCK_SKEW_SECONDS``):
``(speed - 1) * wall seconds / 2`` must stay under 240 s.

Reported per path: calls, items (nodes, reports, samples), p50 and p99 latency, calls per second, expected refusals,
errors; the worker's apply (201 to the apiserver's PATCH) and delete (202 to DELETE) times; how late the schedule ran;
the CPU seconds of each process group (psutil: the gunicorn master and workers, the Celery worker and its pool, beat,
the PostgreSQL server and its backends, Redis, and this process, which is the load generator and the apiserver
stand-in). Expected refusals: 409 ``no_capacity`` on create (a full fleet); any other non-2xx, a connection error or a
session the worker failed (its apply or delete gave up) is an error.

Calls are sent when due (open loop): a call that a busy control plane makes wait is tallied as late, and one not started
15 s after the run's end is dropped and counted, so the run stays bounded.
Verdict (not with ``--quick``): no error and no dropped call. Exit status 0 when both hold, 1 otherwise. ``--quick`` (CI): 4 small
clusters for about 12 s; it checks the run itself works (every path called, no error) and gives no verdict.

Traffic goes to 127.0.0.1 only; every loop is bounded in time; servers are stopped and the database dropped at the end.
"""

from __future__ import annotations

import _benchpath  # noqa: F401 - first: keeps this folder after the standard library (bench/_benchpath.py)

# isort: split
import argparse
import heapq
import itertools
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from _benchenv import bench_environment, free_port, log, start_server, stop_server
from _fleet_setup import (
    CHART_ENV,
    CpuMeter,
    database_server_pid,
    make_fleet,
    purge_broker,
    redis_server_pid,
    start_celery,
    stop_process,
)
from _fleet_sim import (
    BASELINE,
    CALL_DUE,
    MODELS,
    Apiserver,
    Researcher,
    SimClock,
    SimCluster,
    Tally,
    create_session,
    hami_node,
    ping,
    read,
    stop_session,
)

SKEW_BUDGET_S = 240.0  # of the control plane's 300 s: what the simulated clock may be off the wall clock
INTERVAL_SIM_S = 60.0  # the operator's inventory and usage intervals (chart defaults: 30 s and 60 s; one a minute here)
STATUS_CHECK_SIM_S = 5.0  # how often an operator looks for phase changes to report
DROP_AFTER_S = 15.0  # a call not started this long after the run's end is dropped (and counted): the run stays bounded
PATHS = ["inventory (full)", "inventory (digest only)", "status", "usage", "create", "stop", "list", "account", "apply (worker)", "delete (worker)", BASELINE]


class Scheduler:
    """Calls functions at wall times (``time.monotonic``) on a thread pool; open loop: a late call is tallied as late,
    never skipped. ``at`` may be called from the pool's threads."""

    def __init__(self, pool: ThreadPoolExecutor, tally: Tally, deadline: float):
        self._pool, self._tally, self._deadline = pool, tally, deadline
        self._heap: list = []
        self._seq = itertools.count()
        self._cond = threading.Condition()

    def at(self, due: float, fn, *, inline: bool = False) -> None:
        """Call ``fn`` at ``due``: on the pool, or (``inline``: quick bookkeeping that must not queue behind slow calls)
        on the scheduler's own thread."""
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), fn, inline))
            self._cond.notify()

    def _run_one(self, due: float, fn) -> None:
        now = time.monotonic()
        if now > self._deadline:
            self._tally.drop()
            return
        self._tally.late(max(0.0, now - due))
        CALL_DUE.value = due
        try:
            fn()
        except Exception as exc:  # a bug in the simulation must show, not vanish in the pool
            self._tally.error("simulation", f"{type(exc).__name__}: {exc}")
        finally:
            CALL_DUE.value = None

    def run(self, until: float) -> None:
        """Submit every call due before ``until``, as it falls due; drop the ones after it."""
        while True:
            with self._cond:
                now = time.monotonic()
                if now >= until:
                    return
                if not self._heap or self._heap[0][0] > now:
                    wait = (self._heap[0][0] if self._heap else until) - now
                    self._cond.wait(timeout=min(wait, until - now, 0.5))
                    continue
                due, _, fn, inline = heapq.heappop(self._heap)
            if due >= until:
                continue
            if inline:
                fn()
            else:
                self._pool.submit(self._run_one, due, fn)


def seed(port: int, researchers: list[Researcher], count: int, rng: random.Random, clients: int) -> list[tuple[Researcher, str]]:
    """Create ``count`` sessions through the API before the clock starts (not timed); refusals other than no_capacity fail."""
    tally = Tally()
    made: list[tuple[Researcher, str]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        person = researchers[i % len(researchers)]
        session_id = create_session(port, person, random.Random(rng.random()), tally)
        if session_id:
            with lock:
                made.append((person, session_id))

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(count)))
    if tally.errors:
        raise RuntimeError(f"seeding failed: {tally.error_samples[:3]}")
    return made


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank on the sorted list)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def books(tally: Tally) -> dict:
    """What the database holds after the run: samples stored, sessions by phase (a Failed one is an error)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM billing_usagesample")
        (samples,) = cursor.fetchone()
        cursor.execute("SELECT phase, count(*) FROM gpu_sessions_session GROUP BY phase ORDER BY phase")
        phases = dict(cursor.fetchall())
        cursor.execute("SELECT count(*) FROM clusters_gpudevice")
        (gpus,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM billing_ledgerentry")
        (entries,) = cursor.fetchone()
    from django.utils import timezone

    from sessions.selectors import queue_figures

    queue = queue_figures(since=timezone.now() - timedelta(hours=1))
    return {"samples": samples, "phases": phases, "gpus": gpus, "ledger_entries": entries, "queue": queue}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--min-nodes", type=int, default=20, help="GPU nodes of the smallest cluster (8 GPUs each)")
    parser.add_argument("--max-nodes", type=int, default=100, help="GPU nodes of the largest cluster")
    parser.add_argument("--sim-minutes", type=float, default=10.0, help="simulated minutes (default 10)")
    parser.add_argument("--speed", type=float, default=5.0, help="simulated seconds per wall second (default 5)")
    parser.add_argument("--researchers", type=int, default=50)
    parser.add_argument("--seed-sessions", type=int, default=300, help="sessions created before the clock starts")
    parser.add_argument("--create-rate", type=float, default=3.0, help="session creations per wall second")
    parser.add_argument("--queue-rate", type=float, default=0.5, help="queued 8-GPU requests per wall second (default 0.5)")
    parser.add_argument("--pool", type=int, default=8, help="client threads sending the scheduled calls")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn sync workers (default 2)")
    parser.add_argument("--quick", action="store_true", help="4 small clusters for about 12 s: checks the run, no verdict (CI)")
    args = parser.parse_args()
    if args.quick:
        args.clusters, args.min_nodes, args.max_nodes, args.sim_minutes, args.speed = 4, 4, 8, 2.0, 10.0
        args.researchers, args.seed_sessions, args.create_rate, args.pool, args.queue_rate = 4, 8, 2.0, 4, 1.0
    wall = args.sim_minutes * 60 / args.speed
    skew = (args.speed - 1) * wall / 2
    if skew > SKEW_BUDGET_S or args.clusters < 1 or not 1 <= args.min_nodes <= args.max_nodes:
        raise SystemExit(f"(speed - 1) * wall seconds / 2 = {skew:.0f} s must be at most {SKEW_BUDGET_S:.0f} s (lower --speed or "
                         "--sim-minutes); --clusters at least 1; 1 <= --min-nodes <= --max-nodes")
    rng = random.Random(16)
    node_counts = [rng.randint(args.min_nodes, args.max_nodes) for _ in range(args.clusters)]
    tally = Tally()

    with bench_environment() as env, tempfile.TemporaryDirectory(prefix="gshare-fleet-") as tmp:
        tmpdir = Path(tmp)
        apiserver = Apiserver()
        apiserver.start()
        fleet = make_fleet(clusters=args.clusters, node_counts=node_counts, researchers=args.researchers, apiserver=apiserver,
                           models=MODELS, token_dir=tmpdir / "tokens")
        purge_broker(os.environ["REDIS_URL"])
        port = free_port()
        processes = {}
        server = start_server(port, env, args.workers, tmpdir / "gunicorn.log", CHART_ENV)
        try:
            processes["worker"] = start_celery("worker", env, tmpdir / "worker.log", tmpdir)
            processes["beat"] = start_celery("beat", env, tmpdir / "beat.log", tmpdir)
            base = f"http://127.0.0.1:{port}"
            clock = SimClock(speed=args.speed, offset_s=-skew)
            clusters = []
            for i, ((public_id, token_file), nodes) in enumerate(zip(fleet["clusters"], node_counts, strict=True)):
                model, memory, _ = MODELS[i % len(MODELS)]
                node_json = [hami_node(f"gpu-{n:03d}", i, n, model=model, memory_mib=memory) for n in range(nodes)]
                clusters.append(SimCluster(i, public_id, token_file, node_json, clock, tally, base, int(INTERVAL_SIM_S * 1000),
                                           random.Random(i)))
                apiserver.clusters[i] = clusters[-1]
            researchers = [Researcher(name, token) for name, token in fleet["researchers"]]

            # Attach: each operator's first snapshot creates its nodes and GPUs (not timed).
            started = time.perf_counter()
            attach = Tally()
            with ThreadPoolExecutor(4) as pool:
                for cluster in clusters:
                    cluster.tally = attach
                list(pool.map(lambda c: c.inventory_tick(change=False), clusters))
                for cluster in clusters:
                    cluster.tally = tally
            if attach.errors:
                raise RuntimeError(f"first inventory failed: {attach.error_samples[:3]}")
            log(f"first inventory of {len(clusters)} clusters in {time.perf_counter() - started:.1f} s")
            started = time.perf_counter()
            seeded = seed(port, researchers, args.seed_sessions, rng, clients=4)
            log(f"{len(seeded)} sessions seeded in {time.perf_counter() - started:.1f} s")

            meter = CpuMeter({
                "gunicorn (master + workers)": server.pid, "celery worker": processes["worker"].pid, "celery beat": processes["beat"].pid,
                "postgresql": database_server_pid(), "redis": redis_server_pid(os.environ["REDIS_URL"]),
                "load generator (this process)": os.getpid(),
            }, own_only=("load generator (this process)",))
            run(args, clusters, researchers, seeded, tally, port, wall, rng, meter)
            finals = books(tally)
        finally:
            for process in processes.values():
                stop_process(process)
            stop_server(server)
            apiserver.stop()
            purge_broker(os.environ["REDIS_URL"])
        return report(args, tally, meter, finals, wall, node_counts, apiserver.calls)


def run(args, clusters: list[SimCluster], researchers: list[Researcher], seeded, tally: Tally, port: int, wall: float,
        rng: random.Random, meter: CpuMeter) -> None:
    """The measured part: schedule every operator's and researcher's calls over ``wall`` seconds and send them."""
    interval = INTERVAL_SIM_S / args.speed
    with ThreadPoolExecutor(args.pool) as pool:
        begin = time.monotonic() + 0.5
        until = begin + wall
        clusters[0].clock.start(begin)  # one clock for the whole fleet
        scheduler = Scheduler(pool, tally, deadline=until + DROP_AFTER_S)
        for cluster in clusters:
            # Operators started at different moments: each has its own phase in the minute.
            inventory_at, usage_at = rng.uniform(0, interval), rng.uniform(0, interval)
            for k in range(int(wall / interval) + 1):
                change = rng.random() < 0.05
                scheduler.at(begin + inventory_at + k * interval, lambda c=cluster, ch=change: c.inventory_tick(change=ch))
                scheduler.at(begin + usage_at + k * interval, cluster.usage_tick)
        check = STATUS_CHECK_SIM_S / args.speed

        def status_sweep(due: float) -> None:
            # Only operators with a phase change to report send a call (as the operator's StatusReporter does).
            for cluster in clusters:
                if cluster.has_due_reports():
                    scheduler.at(due, cluster.status_tick)
            if due + check < until:
                scheduler.at(due + check, lambda: status_sweep(due + check), inline=True)

        scheduler.at(begin, lambda: status_sweep(begin), inline=True)
        for person, session_id in seeded:  # long-running sessions: half of them end during the run
            scheduler.at(begin + rng.uniform(0, 2 * wall), lambda p=person, s=session_id: stop_session(port, p, s, tally))

        smallest = min(range(len(clusters)), key=lambda i: (len(clusters[i].nodes), i))

        def queue_up(person: Researcher) -> None:
            lifetime = rng.uniform(60, 480) / args.speed
            hours = max(1, -(-int(lifetime) // 36)) / 100  # 0.01 h = 36 s, rounded up
            create_session(port, person, random.Random(rng.random()), tally, body={
                "image": "quay.io/jupyter/pytorch-notebook:cuda12-2024-11-25", "gpus": 8, "cluster": clusters[smallest].public_id,
                "queue": True, "runtime_hours": f"{hours:.2f}"})

        t = begin
        while args.queue_rate > 0:
            t += rng.expovariate(args.queue_rate)
            if t >= until:
                break
            person = rng.choice(researchers)
            scheduler.at(t, lambda p=person: queue_up(p))

        def create(person: Researcher) -> None:
            session_id = create_session(port, person, random.Random(rng.random()), tally)
            if session_id:
                lifetime = rng.uniform(60, 480) / args.speed
                scheduler.at(time.monotonic() + lifetime, lambda: stop_session(port, person, session_id, tally))

        t = begin
        while True:
            t += rng.expovariate(args.create_rate)
            if t >= until:
                break
            person = rng.choice(researchers)
            scheduler.at(t, lambda p=person: create(p))
        for k in range(int(wall)):  # each second a researcher looks at their sessions; every other, at their account
            scheduler.at(begin + k + rng.random(), lambda: ping(port, tally))
            person = rng.choice(researchers)
            scheduler.at(begin + k + rng.random(), lambda p=person: read(port, p, "list", "/api/v1/sessions", tally))
            if k % 2 == 0:
                person = rng.choice(researchers)
                scheduler.at(begin + k + rng.random(), lambda p=person: read(port, p, "account", "/api/v1/billing/account", tally))

        stop_sampling = threading.Event()

        def sample_cpu() -> None:
            while not stop_sampling.wait(1.0):
                meter.sample()

        sampler = threading.Thread(target=sample_cpu, daemon=True)
        time.sleep(max(0.0, begin - time.monotonic()))
        meter.start()
        sampler.start()
        log(f"running {args.sim_minutes:g} simulated minutes in {wall:.0f} s: {len(clusters)} operators, {len(researchers)} researchers")
        scheduler.run(until)
    meter.stop()  # the pool has finished what was in flight
    stop_sampling.set()
    time.sleep(min(5.0, 2 * interval))  # let the worker finish the deletes of the last stops before the books are read


def report(args, tally: Tally, meter: CpuMeter, finals: dict, wall: float, node_counts: list[int], apiserver_calls) -> int:
    """Print the tables and the verdict; the exit status."""
    measured = meter.stopped - meter.started if meter.stopped else wall
    failed = finals["phases"].get("Failed", 0)
    errors = sum(tally.errors.values()) + failed
    behind = tally.dropped
    print("fleet benchmark")
    print(f"  control plane: gunicorn gshare.wsgi --workers {args.workers} (sync), celery worker --concurrency 2, celery beat "
          f"(DatabaseScheduler), PostgreSQL, Redis; DATABASE_CONN_MAX_AGE=60")
    print(f"  fleet: {args.clusters} clusters, {sum(node_counts)} nodes, {finals['gpus']} GPUs ({min(node_counts)}-{max(node_counts)} "
          f"nodes x 8 per cluster); {args.researchers} researchers")
    print(f"  time: {args.sim_minutes:g} simulated minutes in {measured:.1f} s (x{args.speed:g}); inventory and usage every "
          f"simulated minute per cluster; {args.pool} client threads")
    print()
    baseline = percentile(tally.latencies[BASELINE], 0.5) if tally.latencies.get(BASELINE) else None
    print(f"  {'path':<24} {'calls':>7} {'items':>8} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>8} {'refused':>8} {'errors':>7} "
          f"{'p50/ping':>9}")
    for path in PATHS + sorted(set(tally.latencies) - set(PATHS)):
        values = tally.latencies.get(path, [])
        refused = sum(tally.refused.get(path, {}).values())
        if not values and not tally.errors.get(path):
            continue
        p50 = f"{percentile(values, 0.5) * 1000:.1f}" if values else "-"
        p99 = f"{percentile(values, 0.99) * 1000:.1f}" if values else "-"
        items = tally.items.get(path, 0)
        ratio = f"{percentile(values, 0.5) / baseline:.1f}" if values and baseline else "-"
        print(f"  {path:<24} {len(values):>7} {items if items else '':>8} {p50:>8} {p99:>8} {len(values) / measured:>8.1f} "
              f"{refused:>8} {tally.errors.get(path, 0):>7} {ratio:>9}")
    for path, codes in tally.refused.items():
        print(f"  expected refusals of {path}: " + ", ".join(f"{n} x {code}" for code, n in sorted(codes.items())))
    if tally.lag:
        print(f"  schedule: calls started late by p50 {percentile(tally.lag, 0.5) * 1000:.0f} ms, p99 "
              f"{percentile(tally.lag, 0.99) * 1000:.0f} ms, max {max(tally.lag) * 1000:.0f} ms; {behind} not started "
              f"{DROP_AFTER_S:.0f} s after the end (dropped)")
    print(f"  database after the run: {finals['samples']} usage samples, {finals['ledger_entries']} ledger entries; sessions "
          + ", ".join(f"{phase} {n}" for phase, n in finals["phases"].items()))
    print(f"  apiserver stand-in: {dict(apiserver_calls)}")
    queue = finals["queue"]
    if queue["admitted"]:
        print(f"  queue: {queue['admitted']} sessions started by the queue, {queue['queued']} still waiting; estimate error (first "
              f"estimate vs actual start): median {queue['error_p50_seconds']:.0f} s ({100 * queue['error_p50_share']:.0f} % of the "
              f"wait), p90 {queue['error_p90_seconds']:.0f} s ({100 * queue['error_p90_share']:.0f} % of the wait)")
    else:
        print(f"  queue: no session was started by the queue ({queue['queued']} waiting)")
    print()
    seconds = meter.seconds()
    print(f"  {'process':<32} {'CPU s':>7} {'cores':>6} {'% of 2 cores':>13}")
    cores = os.cpu_count() or 2
    for name, value in sorted(seconds.items(), key=lambda item: -item[1]):
        print(f"  {name:<32} {value:>7.1f} {value / measured:>6.2f} {100 * value / measured / cores:>12.0f}%")
    total = sum(seconds.values())
    print(f"  {'total':<32} {total:>7.1f} {total / measured:>6.2f} {100 * total / measured / cores:>12.0f}%")
    missing = {"postgresql", "redis"} - set(seconds)
    if missing:
        print(f"  not measured (not on this machine): {', '.join(sorted(missing))}")
    if failed:
        print(f"  {failed} session(s) Failed: the worker gave up applying or deleting them")
    for line in tally.error_samples:
        print(f"  error: {line}")
    if args.quick:
        called = {path.split(" ")[0] for path in ("inventory (full)", "inventory (digest only)", "status", "usage", "create", "stop")
                  if tally.latencies.get(path)}
        print(f"  quick run: no verdict ({errors} errors; paths called: {', '.join(sorted(called))})")
        return 0 if not errors and len(called) == 5 else 1
    met = not errors and not behind
    print(f"  verdict: {'PASS' if met else 'FAIL'}: {errors} errors (must be 0), {behind} calls dropped because the control plane "
          "fell behind the fleet's schedule (must be 0)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
