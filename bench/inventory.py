"""Benchmark: inventory reports (``PUT /internal/v1/inventory``) of a 100-cluster fleet on a real gunicorn, against a
raw upsert of the same rows.

    .venv/bin/python bench/inventory.py [--clusters 100] [--nodes 1000] [--sample 8] [--reps 5] [--workers 2] [--quick]

In a throwaway database (``gshare_bench``, see ``bench/_benchenv.py``) it registers ``--clusters`` connected clusters,
mints a real operator token for each (``clusters.operator_token.tokens.operator_token_mint``), starts ``python -m
gunicorn gshare.wsgi --workers N`` on a free loopback port (``DATABASE_CONN_MAX_AGE=60``, as the chart sets it) and
builds each cluster's snapshot as its operator does: ``--nodes`` Node objects with 8 GPUs each, whose HAMi
registration annotation is a real one (the 8x H100 of HAMi issue #961 in v2.10 JSON, or the 8x H20 MIG node of issue
#1422 in the 9-field legacy format, from ``demo/data/hami``; every GPU UUID made unique per node), decoded by
``operator_agent.reporters.inventory.node_to_snapshot``. Every cluster then sends its first snapshot (all rows new). Then, on a
sample of ``--sample`` clusters, one request at a time (bodies encoded before the clock starts, a new connection per
request, client-side wall time, medians):

* **changed**: a full snapshot in which every GPU changed (HAMi registered memory 256 MiB lower, then back): every
  GPU row is rewritten;
* **unchanged, full**: the same snapshot sent again whole (what an operator does every ``FULL_SNAPSHOT_EVERY``);
* **unchanged, digest-only**: ``{"digest", "checks"}``, what an operator sends when its snapshot did not change;
* **baseline**: the same 8,000 GPU rows of one more cluster upserted by one raw psycopg ``COPY`` into a temporary table
  + ``INSERT ... SELECT ... ON CONFLICT (uuid) DO UPDATE`` (every row changed), committed.

CPU: the CPU seconds of the gunicorn processes and of the PostgreSQL server's processes (``psutil``: the live ones, and
the postmaster's reaped children) over a batch of each kind of report, per report. "A minute of the fleet" is 100
reports: 10 changed (a tenth of the clusters changes every minute), 10 unchanged full (each operator re-sends it every
10 minutes) and 80 digest-only; the goal is that it costs at most 30 CPU seconds (half of one core). Without a local
PostgreSQL server (``DATABASE_URL`` elsewhere) only the gunicorn processes are counted, and the output says so.

Parallel: ``--workers`` clusters send a changed snapshot at once, against the same number sent one after the other
(the ratio of the two wall times is printed: it needs a free core to show, so it is no verdict on a busy machine),
while another connection samples ``pg_locks`` every 2 ms for a lock request not granted: snapshots of different
clusters must never wait for each other (a fleet-wide lock would show in most samples).

Goals (issue 16): changed / baseline <= 2; digest-only / changed <= 0.10; a minute of the fleet <= 30 CPU s; no lock
wait between the concurrent snapshots of different clusters. Exit status 0 when all are met, 1 otherwise.

``--quick`` (CI): 3 clusters x 50 nodes, two repetitions, a few seconds; it checks that the run itself works (every
answer as expected) and gives no goal verdict.

Traffic goes to 127.0.0.1 only; every loop is bounded; the server is stopped and the database dropped at the end.
"""

from __future__ import annotations

import _benchpath  # noqa: F401 - first: keeps this folder after the standard library (bench/_benchpath.py)

# isort: split
import argparse
import copy
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from _benchenv import ROOT, bench_environment, free_port, log, start_server, stop_server

INVENTORY_PATH = "/internal/v1/inventory"
GOAL_CHANGED_RATIO = 2.0
GOAL_UNCHANGED_RATIO = 0.10
GOAL_MINUTE_CPU = 30.0
#: A minute of the fleet (per 100 clusters): changed, unchanged full, digest-only reports.
MINUTE_MIX = {"changed": 10, "full": 10, "digest": 80}
#: Real HAMi node registrations (8 GPUs each) the nodes are made of, alternating by cluster.
ANNOTATIONS = [
    ROOT / "demo/data/hami/node-nvidia-register.v2.10.json.h100x8.derived.json",
    ROOT / "demo/data/hami/node-nvidia-register.v2.5-v2.7.legacy9.h20x8-mig-scaled.txt",
]
CHECKS_AT = "2026-11-29T16:00:00Z"


def put(port: int, body: bytes, token: str, timeout: float = 120.0) -> tuple[int, dict, float]:
    """One PUT on a fresh connection: status, decoded body, seconds."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("PUT", INVENTORY_PATH, body=body, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    return response.status, json.loads(data or b"{}"), time.perf_counter() - started


def expect(status: int, answer: dict, *, unchanged: bool) -> None:
    if status != 200 or answer.get("unchanged") is not unchanged:
        raise RuntimeError(f"answered {status}: {json.dumps(answer)[:500]}")


def node_json(cluster: int, node: int, annotation: str, uuids: list[str]) -> dict:
    """A Node as the apiserver serves it, labelled gpu=on, Ready, with the HAMi annotation's GPU UUIDs made unique."""
    from contract import HAMI_NODE_REGISTER_ANNOTATION

    for i, uuid in enumerate(uuids):
        annotation = annotation.replace(uuid, f"{uuid[:-12]}{cluster:04d}{node:06d}{i:02d}")
    name = f"gpu-{cluster:03d}-{node:05d}"
    return {
        "metadata": {"name": name, "labels": {"gpu": "on", "gshare.io/gpu-mode": "hami-core", "kubernetes.io/hostname": name,
                                              "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
                     "annotations": {HAMI_NODE_REGISTER_ANNOTATION: annotation}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def snapshots(cluster: int, nodes: int) -> dict[str, bytes]:
    """The cluster's bodies: ``a`` and ``b`` (every GPU's memory differs between them), ``digest`` (of ``a``)."""
    from contract import inventory_digest
    from operator_agent.hami import decode_node_register
    from operator_agent.reporters.inventory import node_to_snapshot

    annotation = ANNOTATIONS[cluster % len(ANNOTATIONS)].read_text()
    uuids = [device.uuid for device in decode_node_register(annotation)]
    a = [node_to_snapshot(node_json(cluster, n, annotation, uuids)) for n in range(nodes)]
    b = copy.deepcopy(a)
    for node in b:
        for device in node["devices"]:
            device["memory_mib"] -= 256
    checks = {"session_domain_resolves": {"ok": True, "detail": "resolves to the ingress node", "checked_at": CHECKS_AT}}
    digest = inventory_digest(a)
    return {
        "a": json.dumps({"nodes": a, "digest": digest, "checks": checks}).encode(),
        "b": json.dumps({"nodes": b, "digest": inventory_digest(b), "checks": checks}).encode(),
        "digest": json.dumps({"digest": digest, "checks": checks}).encode(),
    }


def make_clusters(count: int) -> list[tuple[int, str]]:
    """``count`` connected clusters and an operator token each: ``[(pk, token)]``."""
    from django.utils import timezone

    from clusters.models import Cluster
    from clusters.operator_token.tokens import operator_token_mint

    now = timezone.now()
    clusters = Cluster.objects.bulk_create([
        Cluster(name=f"bench-{c:03d}", apiserver_url=f"https://10.1.{c // 250}.{c % 250 + 1}:6443", kubeconfig="apiVersion: v1\nkind: Config\n",
                session_domain=f"c{c:03d}.bench.gshare.test", status=Cluster.Status.CONNECTED, last_heartbeat_at=now)
        for c in range(count)
    ])
    return [(cluster.pk, operator_token_mint(cluster_id=cluster.public_id)) for cluster in clusters]


class CpuMeter:
    """CPU seconds used by gunicorn (master and workers) and the local PostgreSQL server (all its processes)."""

    def __init__(self, server_pid: int):
        import psutil
        from django.db import connection

        self.roots = [psutil.Process(server_pid)]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (backend,) = cursor.fetchone()
        self.postgres = False
        try:
            parent = psutil.Process(backend).parent()
            if parent is not None and "postgres" in parent.name():
                self.roots.append(parent)
                self.postgres = True
        except psutil.Error:
            pass

    def seconds(self) -> float:
        import psutil

        total = 0.0
        for root in self.roots:
            times = root.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system  # + reaped children
            for child in root.children(recursive=True):
                try:
                    times = child.cpu_times()
                except psutil.Error:
                    continue
                total += times.user + times.system
        return total


def raw_upsert_baseline(cluster_pk: int, reps: int) -> list[float]:
    """Seconds of each raw upsert (COPY into a temp table + INSERT ... ON CONFLICT DO UPDATE, commit) of the cluster's
    GPU rows, every row changed each time."""
    import psycopg
    from django.utils import timezone

    columns = ("node_id", "cluster_id", "uuid", "index", "model", "memory_mib", "split_count", "cores", "health", "mode", "last_seen_at")
    seconds = []
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM clusters_gpudevice WHERE cluster_id = %s ORDER BY uuid", [cluster_pk]).fetchall()
        conn.execute(f"CREATE TEMP TABLE raw_staging ON COMMIT DELETE ROWS AS SELECT {', '.join(columns)} FROM clusters_gpudevice WITH NO DATA")
        conn.commit()
        variants = [[(*row[:5], row[5] - 128, *row[6:10], timezone.now()) for row in rows], [(*row[:10], timezone.now()) for row in rows]]
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in ("uuid", "cluster_id"))
        for rep in range(reps):
            started = time.perf_counter()
            with conn.cursor() as cursor:
                with cursor.copy(f"COPY raw_staging ({', '.join(columns)}) FROM STDIN") as copy_:
                    for row in variants[rep % 2]:
                        copy_.write_row(row)
                cursor.execute(f"INSERT INTO clusters_gpudevice ({', '.join(columns)}) SELECT {', '.join(columns)} FROM raw_staging "
                               f"ON CONFLICT (uuid) DO UPDATE SET {updates}")
                if cursor.rowcount != len(rows):
                    raise RuntimeError(f"the raw upsert wrote {cursor.rowcount} rows of {len(rows)}")
            conn.commit()
            seconds.append(time.perf_counter() - started)
    return seconds


def concurrently(port: int, jobs: list[tuple[bytes, str]]) -> tuple[float, int, int]:
    """Send each (body, token) from its own thread at once, while another connection samples ``pg_locks`` for lock
    requests of this database not granted. Returns (wall seconds, samples, samples that saw a wait). Every answer must
    be a 200."""
    import psycopg

    barrier = threading.Barrier(len(jobs) + 1)
    errors: list[str] = []
    done = threading.Event()
    samples = [0, 0]

    def send(body: bytes, token: str) -> None:
        barrier.wait()
        status, answer, _ = put(port, body, token)
        if status != 200:
            errors.append(f"{status}: {json.dumps(answer)[:300]}")

    def sample() -> None:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            while not done.is_set():
                (waiting,) = conn.execute("SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                                          "WHERE NOT l.granted AND d.datname = current_database()").fetchone()
                samples[0] += 1
                samples[1] += waiting > 0
                time.sleep(0.002)

    threads = [threading.Thread(target=send, args=job, daemon=True) for job in jobs]
    sampler = threading.Thread(target=sample, daemon=True)
    for thread in threads:
        thread.start()
    sampler.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join(timeout=300)
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join(timeout=10)
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"concurrent snapshots failed: {errors[:3] or 'a thread did not finish'}")
    return elapsed, samples[0], samples[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=100, help="clusters in the fleet, each with its own token (default 100)")
    parser.add_argument("--nodes", type=int, default=1000, help="nodes per cluster, 8 GPUs each (default 1000)")
    parser.add_argument("--sample", type=int, default=8, help="clusters whose reports are timed one at a time (default 8)")
    parser.add_argument("--reps", type=int, default=4, help="timed reports of each kind per sampled cluster (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn sync workers, and clusters sent at once (default 2)")
    parser.add_argument("--quick", action="store_true", help="3 clusters x 50 nodes, 2 repetitions: checks the run, no goal verdict (CI)")
    args = parser.parse_args()
    if args.quick:
        args.clusters, args.nodes, args.sample, args.reps = 3, 50, 2, 2
    args.sample = min(args.sample, args.clusters)
    if args.clusters < 2 or args.nodes < 1 or args.reps < 2 or args.workers < 1 or args.clusters < args.workers + 1:
        raise SystemExit("--clusters must be at least 2 and above --workers; --nodes at least 1; --reps at least 2")

    times: dict[str, list[float]] = {"changed": [], "full": [], "digest": []}
    cpu: dict[str, float] = {}
    with bench_environment() as env, tempfile.TemporaryDirectory(prefix="gshare-bench-") as tmp:
        started = time.perf_counter()
        fleet = make_clusters(args.clusters + 1)  # the last one is the raw baseline's
        bodies = [snapshots(c, args.nodes) for c in range(args.clusters + 1)]
        log(f"{args.clusters + 1} clusters x {args.nodes} nodes x 8 GPUs: tokens and snapshots ({len(bodies[0]['a']) / 1e6:.1f} MB each) "
            f"built in {time.perf_counter() - started:.1f} s")
        port = free_port()
        logfile = Path(tmp) / "gunicorn.log"
        server = start_server(port, env, args.workers, logfile, {"DATABASE_CONN_MAX_AGE": "60"})
        try:
            meter = CpuMeter(server.pid)
            started = time.perf_counter()
            first = []
            for (_, token), body in zip(fleet, bodies, strict=True):  # every cluster's first snapshot: all rows new
                status, answer, seconds = put(port, body["a"], token)
                expect(status, answer, unchanged=False)
                if answer["gpus"] != args.nodes * 8:
                    raise RuntimeError(f"{answer['gpus']} GPUs applied of {args.nodes * 8}")
                first.append(seconds)
            log(f"first snapshots of {len(fleet)} clusters in {time.perf_counter() - started:.1f} s")
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("ANALYZE clusters_gpudevice; ANALYZE clusters_node")
            baseline = raw_upsert_baseline(fleet[-1][0], 2 * args.reps)

            sample = list(zip(fleet[: args.sample], bodies[: args.sample], strict=True))
            for kind, unchanged, pick in (("changed", False, None), ("full", False, "a"), ("digest", True, "digest")):
                cpu_before = meter.seconds()
                count = 0
                for rep in range(args.reps):
                    for (_, token), body in sample:
                        # changed: b then a, so every one rewrites every GPU; the others follow an "a" (the last changed).
                        payload = body["b" if rep % 2 == 0 else "a"] if pick is None else body[pick]
                        status, answer, seconds = put(port, payload, token)
                        expect(status, answer, unchanged=unchanged)
                        times[kind].append(seconds)
                        count += 1
                    if pick is None and rep == args.reps - 1 and rep % 2 == 0:  # end on "a" for the unchanged ones
                        for (_, token), body in sample:
                            expect(*put(port, body["a"], token)[:2], unchanged=False)
                cpu[kind] = (meter.seconds() - cpu_before) / count
            serial_jobs = [(bodies[c]["b"], fleet[c][1]) for c in range(args.sample, args.sample + args.workers)]
            if args.sample + args.workers > args.clusters:
                serial_jobs = [(bodies[c]["b"], fleet[c][1]) for c in range(args.workers)]
            parallel_jobs = [(bodies[c]["b"], fleet[c][1]) for c in range(args.clusters - args.workers, args.clusters)]
            serial = sum(concurrently(port, [job])[0] for job in serial_jobs)
            parallel, lock_samples, lock_waits = concurrently(port, parallel_jobs)
        finally:
            stop_server(server)

    median = {kind: statistics.median(values) for kind, values in times.items()}
    raw = statistics.median(baseline)
    changed_ratio = median["changed"] / raw
    unchanged_ratio = median["digest"] / median["changed"]
    minute = sum(MINUTE_MIX[kind] * cpu[kind] for kind in MINUTE_MIX) * args.clusters / 100
    worst = cpu["changed"] * args.clusters
    speedup = serial / parallel
    gpus = args.nodes * 8
    print("inventory benchmark")
    print(f"  fleet: {args.clusters} clusters x {args.nodes} nodes x 8 GPUs (HAMi annotations: 8x H100 v2.10 JSON, 8x H20 MIG legacy "
          f"9-field; decoded by the operator's code), one operator token each")
    print(f"  server: gunicorn gshare.wsgi --workers {args.workers} (sync) on 127.0.0.1; one request at a time unless said; "
          f"client wall time, medians")
    print(f"  first snapshot (all {gpus} GPUs new), every cluster:  {statistics.median(first) * 1000:7.1f} ms  (max {max(first) * 1000:.1f})")
    print(f"  timed on {args.sample} sampled clusters x {args.reps} reports each:")
    print(f"    changed (every GPU rewritten):        {median['changed'] * 1000:7.1f} ms   CPU {cpu['changed'] * 1000:6.1f} ms/report")
    print(f"    unchanged, full snapshot:             {median['full'] * 1000:7.1f} ms   CPU {cpu['full'] * 1000:6.1f} ms/report")
    print(f"    unchanged, digest-only:               {median['digest'] * 1000:7.1f} ms   CPU {cpu['digest'] * 1000:6.1f} ms/report")
    print(f"  baseline: raw COPY + INSERT ... ON CONFLICT DO UPDATE of {gpus} GPU rows (psycopg, committed): {raw * 1000:.1f} ms")
    counted = "gunicorn + PostgreSQL server processes" if meter.postgres else "gunicorn processes only (PostgreSQL is not local)"
    print(f"  CPU ({counted}), a minute of {args.clusters} clusters "
          f"({', '.join(f'{n * args.clusters // 100} {k}' for k, n in MINUTE_MIX.items())}): {minute:.1f} s; every cluster changed "
          f"every minute: {worst:.1f} s")
    print(f"  parallel: {args.workers} clusters' changed snapshots at once {parallel:.2f} s, one after the other {serial:.2f} s: "
          f"speed-up {speedup:.2f} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: a speed-up needs a free core)")
    print(f"    lock waits while they ran: {lock_waits} of {lock_samples} samples of pg_locks saw a lock request not granted")
    print(f"  ratios: changed / raw upsert {changed_ratio:.2f}; digest-only / changed {unchanged_ratio:.3f}; "
          f"unchanged full / changed {median['full'] / median['changed']:.2f}")
    if args.quick:
        print("  quick run: no goal verdict")
        return 0
    goals = {
        f"changed <= {GOAL_CHANGED_RATIO}x raw upsert": changed_ratio <= GOAL_CHANGED_RATIO,
        f"digest-only <= {GOAL_UNCHANGED_RATIO:.0%} of changed": unchanged_ratio <= GOAL_UNCHANGED_RATIO,
        f"a minute of the fleet <= {GOAL_MINUTE_CPU:.0f} CPU s": minute <= GOAL_MINUTE_CPU,
        "snapshots of different clusters never wait on a lock": lock_waits == 0 and lock_samples > 0,
    }
    for goal, met in goals.items():
        print(f"  goal: {goal}: {'MET' if met else 'MISSED'}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
