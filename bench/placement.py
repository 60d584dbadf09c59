"""Benchmark: placement decisions on a large synthetic fleet.

    .venv/bin/python bench/placement.py [--decisions 200] [--max-seconds 90] [--policy binpack|spread] [--explain] [--quick]

Builds, in a throwaway database (``gshare_bench``, see ``bench/_benchenv.py``), a fleet of 50
connected clusters x 200 nodes x 8 GPUs (80,000 devices) with 20,000 live sessions already placed
(plus the history of the ones that ended), then times placement decisions and counts their SQL
queries.

A decision is ``sessions.services.session_create`` exactly as the API calls it: validation,
``SELECT ... FOR UPDATE`` of the candidate clusters in primary-key order, ``placement.choose`` (the
fit query), the INSERT of the session and of its allocations, and the commit. The only thing
replaced is the Celery publish that ``transaction.on_commit`` schedules (``_enqueue``): there is no
worker here, and the publish happens after the commit, outside the locked section, so it does not
bound the decision rate. Decisions accumulate like real requests: each reserves capacity.

Baseline, measured in the same run on the same connection: a ``SELECT 1`` round-trip loop. The
ratio printed is (decisions/s) / (round trips/s): the fraction of a bare round trip's rate that a
decision achieves, which moves much less between machines than the absolute figure.

The fleet's owner gets credits through ``billing.services.credit_grant`` first: admission (balance and
policy, under the account's row lock) is part of every decision.

``--quick`` (CI): 3 clusters x 40 nodes with 500 live sessions and 30 decisions, a few seconds; it checks
that the run itself works (decisions placed, figures printed) and gives no goal verdict.

Goal (issue): at most 10 queries per decision and at least 100 decisions/s (2-core machine).
When the goal is missed the fit query is run under EXPLAIN ANALYZE and a summary of its plan is
printed (the whole plan with ``--explain``). Exit status: 0 when the goal is met, 1 when it is missed.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field

from _benchenv import bench_environment, log

CLUSTERS = 50
NODES_PER_CLUSTER = 200
GPUS_PER_NODE = 8
LIVE_SESSIONS = 20_000
#: Sessions generated and placed before some are ended (the ended ones leave holes, like a real fleet).
GENERATED_SESSIONS = 26_000
GOAL_QUERIES = 10
GOAL_RATE = 100.0

#: GPU models by cluster (HAMi registered memory in MiB).
MODELS = [("NVIDIA A100-SXM4-80GB", 81920), ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA A100-PCIE-40GB", 40960), ("NVIDIA L4", 23034)]
SPLIT_COUNT = 10

#: (weight, gpus, memory MiB per GPU or None, cores % or None): the request mix of live sessions and of timed decisions.
REQUEST_MIX = [
    (45, 1, None, None),
    (10, 2, None, None),
    (5, 4, None, None),
    (3, 8, None, None),
    (20, 1, 8192, 25),
    (12, 1, 16384, 50),
    (5, 2, 8192, 25),
]
LIVE_PHASES = [(85, "Running"), (8, "Starting"), (5, "Scheduled"), (2, "Stopping")]


def _cluster_share(index: int) -> float:
    """Relative number of sessions on cluster ``index``: 10 busy clusters (~70 % of GPUs in use), 20 average, 20 quiet."""
    return 6.0 if index < 10 else 8 / 3 if index < 30 else 1.0


@dataclass
class NodeState:
    pk: int
    name: str
    ready: bool
    devices: list[int]  # GpuDevice pks, by index
    healthy: list[bool]
    memory: int
    count: list[int] = field(default_factory=list)
    mem_used: list[int] = field(default_factory=list)
    cores_used: list[int] = field(default_factory=list)
    exclusive: list[bool] = field(default_factory=list)

    def __post_init__(self):
        n = len(self.devices)
        self.count, self.mem_used, self.cores_used, self.exclusive = [0] * n, [0] * n, [0] * n, [False] * n

    def take(self, gpus: int, memory: int | None, cores: int | None) -> list[tuple[int, int, int, bool]] | None:
        """HAMi's fit rules (the same as ``sessions/placement.py``): the devices taken, or None."""
        if not self.ready:
            return None
        whole = memory is None and cores is None
        picked = []
        for i in range(len(self.devices)):
            if not self.healthy[i]:
                continue
            if whole:
                ok = self.count[i] == 0
            else:
                ask = memory if memory is not None else self.memory
                ok = (not self.exclusive[i] and self.count[i] < SPLIT_COUNT and self.mem_used[i] + ask <= self.memory
                      and self.cores_used[i] + (cores or 0) <= 100)
            if ok:
                picked.append(i)
                if len(picked) == gpus:
                    break
        if len(picked) < gpus:
            return None
        taken = []
        for i in picked:
            mem = self.memory if whole else (memory if memory is not None else self.memory)
            cor = 100 if whole else (cores or 0)
            self.count[i] += 1
            self.mem_used[i] += mem
            self.cores_used[i] += cor
            self.exclusive[i] = whole
            taken.append((self.devices[i], mem, cor, whole))
        return taken


def _draw(rng: random.Random, mix):
    return rng.choices([m[1:] for m in mix], weights=[m[0] for m in mix])[0]


def build_fleet(rng: random.Random) -> dict:
    """Insert the clusters, nodes, devices, users, sessions and allocations; return what the timed part needs."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from clusters.models import Cluster, GpuDevice, Node
    from sessions.models import Session

    now = timezone.now()
    started = time.perf_counter()
    with transaction.atomic():
        clusters = Cluster.objects.bulk_create([
            Cluster(
                name=f"bench-{c:02d}", apiserver_url=f"https://10.0.{c}.1:6443", kubeconfig="apiVersion: v1\nkind: Config\n",
                session_domain=f"c{c:02d}.bench.gshare.test", status=Cluster.Status.CONNECTED, last_heartbeat_at=now,
            )
            for c in range(CLUSTERS)
        ])
        nodes = Node.objects.bulk_create(
            [
                Node(cluster=cluster, cluster_name=cluster.name, name=f"gpu-{n:03d}", labels={"gpu": "on"}, ready=rng.random() > 0.01,
                     last_seen_at=now)
                for cluster in clusters
                for n in range(NODES_PER_CLUSTER)
            ],
            batch_size=2000,
        )
        columns = ["node_id", "cluster_id", "uuid", "index", "model", "memory_mib", "split_count", "cores", "health", "mode", "last_seen_at"]
        with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {GpuDevice._meta.db_table} ({', '.join(columns)}) FROM STDIN") as copy:
            for node in nodes:
                model, memory = MODELS[node.cluster_id % len(MODELS)]
                for i in range(GPUS_PER_NODE):
                    copy.write_row((node.pk, node.cluster_id, f"GPU-bench-{node.pk:06d}-{i}", i, model, memory, SPLIT_COUNT, 100,
                                    rng.random() > 0.003, "hami-core", now))
    log(f"fleet: {len(clusters)} clusters, {len(nodes)} nodes, {len(nodes) * GPUS_PER_NODE} devices in {time.perf_counter() - started:.1f} s")

    devices: dict[int, list[tuple[int, bool]]] = {}
    for pk, node_id, _index, health in GpuDevice.objects.order_by("node_id", "index").values_list("pk", "node_id", "index", "health"):
        devices.setdefault(node_id, []).append((pk, health))
    by_cluster: dict[int, list[NodeState]] = {}
    for node in nodes:
        memory = MODELS[node.cluster_id % len(MODELS)][1]
        ids = devices[node.pk]
        by_cluster.setdefault(node.cluster_id, []).append(
            NodeState(pk=node.pk, name=node.name, ready=node.ready, devices=[d for d, _ in ids], healthy=[h for _, h in ids], memory=memory)
        )
    for states in by_cluster.values():
        rng.shuffle(states)  # the order the cluster's nodes were filled in

    # Place the generated sessions cluster by cluster, busiest node first (what binpack does), then end a random part of them.
    started = time.perf_counter()
    weights = [_cluster_share(c) for c in range(CLUSTERS)]
    placed = []  # (cluster_id, node name, (gpus, memory, cores), allocations)
    for _ in range(GENERATED_SESSIONS):
        cluster = clusters[rng.choices(range(CLUSTERS), weights=weights)[0]]
        gpus, memory, cores = _draw(rng, REQUEST_MIX)
        for state in by_cluster[cluster.pk]:
            taken = state.take(gpus, memory, cores)
            if taken:
                placed.append((cluster.pk, state.name, (gpus, memory, cores), taken))
                break
    rng.shuffle(placed)
    live, ended = placed[:LIVE_SESSIONS], placed[LIVE_SESSIONS:]
    if len(live) < LIVE_SESSIONS:
        log(f"warning: only {len(live)} sessions fit the fleet")

    User = get_user_model()
    with transaction.atomic():
        users = User.objects.bulk_create([User(username=f"bench-user-{u:03d}", password="!") for u in range(200)])
        phases = [p for _, p in LIVE_PHASES]
        phase_weights = [w for w, _ in LIVE_PHASES]
        rows = []
        for cluster_id, node, (gpus, memory, cores), _ in live:
            phase = rng.choices(phases, weights=phase_weights)[0]
            rows.append(Session(owner=rng.choice(users), image="quay.io/jupyter/pytorch-notebook:cuda12-2024-11-25", gpus=gpus,
                                gpu_memory_mib=memory, gpu_cores=cores, cluster_id=cluster_id, node=node, phase=phase,
                                started_at=now if phase in ("Running", "Stopping") else None))
        for cluster_id, node, (gpus, memory, cores), _ in ended:
            rows.append(Session(owner=rng.choice(users), image="quay.io/jupyter/base-notebook", gpus=gpus, gpu_memory_mib=memory,
                                gpu_cores=cores, cluster_id=cluster_id, node=node, phase=Session.Phase.TERMINATED, started_at=now, ended_at=now))
        sessions = Session.objects.bulk_create(rows, batch_size=2000)
        allocations = 0
        table = "gpu_sessions_allocation"
        with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} (session_id, device_id, memory_mib, cores, exclusive) FROM STDIN") as copy:
            for session, (_, _, _, taken) in zip(sessions[: len(live)], live, strict=True):
                for device_id, mem, cor, whole in taken:
                    copy.write_row((session.pk, device_id, mem, cor, whole))
                    allocations += 1
        # The rows above were loaded directly (COPY, bulk_create), not through the services: count the
        # reservations onto the GPUs and nodes once, as the services keep them.
        counted = time.perf_counter()
        from sessions import placement

        placement.usage_recompute()
        log(f"usage counters recomputed for the whole fleet in {time.perf_counter() - counted:.1f} s")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # a live database has statistics; a freshly loaded one has none until autovacuum runs
    used = len({device_id for *_, taken in live for device_id, *_ in taken})
    log(f"sessions: {len(live)} live ({allocations} allocations, {used} of {len(nodes) * GPUS_PER_NODE} GPUs in use), "
        f"{len(ended)} ended, in {time.perf_counter() - started:.1f} s")
    return {"owner": users[0], "live": len(live), "allocations": allocations, "gpus_in_use": used}


def select1_rate(count: int) -> float:
    """Round trips per second of ``SELECT 1`` on Django's connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        started = time.perf_counter()
        for _ in range(count):
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return count / (time.perf_counter() - started)


_TRANSACTION = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")
_SCAN = re.compile(r"(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan) (?:using \S+ )?on (\S+).*actual time=\S+ rows=([\d.]+) loops=(\d+)")


def summarize(plan: list[str]) -> str:
    """One line from an EXPLAIN ANALYZE plan: execution time, rows read per table, sorts that spilled to disk."""
    execution = next((line.split(":", 1)[1].strip() for line in plan if line.startswith("Execution Time")), "?")
    reads: dict[str, list[int]] = {}
    for line in plan:
        match = _SCAN.search(line)
        if match:
            reads.setdefault(match.group(1), []).append(int(float(match.group(2)) * int(match.group(3))))
    spilled = sum("external merge" in line for line in plan)
    tables = ", ".join(f"{table} {len(rows)}x ({sum(rows)} rows)" for table, rows in sorted(reads.items()))
    grouped = next((re.search(r"actual time=\S+ rows=(\d+)", line).group(1) for line in plan if "GroupAggregate" in line and "actual" in line), "?")
    return f"{execution}; scans: {tables}; candidate nodes grouped: {grouped}; sorts spilled to disk: {spilled}"


def explain(policy: str) -> list[tuple[str, list[str]]]:
    """EXPLAIN (ANALYZE, BUFFERS) of the fit query for a 1-GPU whole and a shared request, over all connected clusters."""
    from django.db import connection, transaction

    from clusters.models import Cluster
    from sessions import placement

    ids = list(Cluster.objects.filter(status=Cluster.Status.CONNECTED).order_by("pk").values_list("pk", flat=True))
    out = []
    for label, request in (
        ("1 whole GPU", placement.Request(gpus=1)),
        ("8 whole GPUs", placement.Request(gpus=8)),
        ("1 GPU share, 8192 MiB 25%", placement.Request(gpus=1, memory_mib=8192, cores=25)),
    ):
        sql, params = placement.fit_query(request=request, cluster_ids=ids, policy=policy)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            out.append((f"{label} ({policy})", [row[0] for row in cursor.fetchall()]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=200, help="placement decisions to time (default 200)")
    parser.add_argument("--max-seconds", type=float, default=90.0, help="stop timing decisions after this long (default 90)")
    parser.add_argument("--policy", choices=["binpack", "spread"], help="GSHARE_PLACEMENT_POLICY for this run (default: the setting)")
    parser.add_argument("--explain", action="store_true", help="print the fit query's whole EXPLAIN ANALYZE plan (also when the goal is met)")
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--quick", action="store_true", help="a small fleet and 30 decisions: checks the run, no goal verdict (CI)")
    args = parser.parse_args()
    if args.quick:
        global CLUSTERS, NODES_PER_CLUSTER, LIVE_SESSIONS, GENERATED_SESSIONS
        CLUSTERS, NODES_PER_CLUSTER, LIVE_SESSIONS, GENERATED_SESSIONS = 3, 40, 500, 650
        args.decisions = min(args.decisions, 30)
    if args.policy:
        os.environ["GSHARE_PLACEMENT_POLICY"] = args.policy

    with bench_environment():
        from django.conf import settings
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from billing.services import credit_grant
        from gshare.exceptions import Conflict
        from sessions import placement, services

        rng = random.Random(args.seed)
        fleet = build_fleet(rng)
        credit_grant(user=fleet["owner"], amount=10**9, reason="placement benchmark", idempotency_key="bench-placement",
                     created_by="command:bench")
        policy = settings.GSHARE_PLACEMENT_POLICY

        enqueued: list[int] = []
        services._enqueue = lambda task_name, session_pk: enqueued.append(session_pk)  # no Celery worker: record, do not publish
        fit_seconds: list[float] = []
        real_choose = placement.choose

        def timed_choose(**kwargs):
            started = time.perf_counter()
            try:
                return real_choose(**kwargs)
            finally:
                fit_seconds.append(time.perf_counter() - started)

        placement.choose = timed_choose

        def decide(request) -> tuple[float, int, bool]:
            gpus, memory, cores = request
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                try:
                    services.session_create(owner=fleet["owner"], image="quay.io/jupyter/pytorch-notebook", gpus=gpus,
                                            gpu_memory_mib=memory, gpu_cores=cores)
                    placed = True
                except Conflict as exc:
                    if exc.code != "no_capacity":
                        raise
                    placed = False
                elapsed = time.perf_counter() - started
            return elapsed, len(queries.captured_queries), placed, sum(not q["sql"].lstrip().startswith(_TRANSACTION) for q in queries.captured_queries)

        req_rng = random.Random(args.seed + 1)
        for _ in range(10):  # warm-up: connection, plan cache, Python imports
            decide(_draw(req_rng, REQUEST_MIX))
        fit_seconds.clear()

        baseline_before = select1_rate(2000)
        latencies, query_counts, statement_counts, refused = [], [], [], 0
        loop_started = time.perf_counter()
        for _ in range(args.decisions):
            elapsed, queries, placed, statements = decide(_draw(req_rng, REQUEST_MIX))
            latencies.append(elapsed)
            query_counts.append(queries)
            statement_counts.append(statements)
            refused += not placed
            if time.perf_counter() - loop_started > args.max_seconds:
                break
        wall = time.perf_counter() - loop_started
        baseline_after = select1_rate(2000)
        baseline = (baseline_before + baseline_after) / 2

        done = len(latencies)
        rate = done / wall
        ratio = rate / baseline
        latencies.sort()
        p95 = latencies[min(done - 1, int(done * 0.95))]
        fit_share = sum(fit_seconds) / sum(latencies)
        queries_max = max(query_counts)
        goal_met = queries_max <= GOAL_QUERIES and rate >= GOAL_RATE

        print("placement benchmark")
        print(f"  fleet: {CLUSTERS} clusters x {NODES_PER_CLUSTER} nodes x {GPUS_PER_NODE} GPUs = {CLUSTERS * NODES_PER_CLUSTER * GPUS_PER_NODE} devices; "
              f"{fleet['live']} live sessions, {fleet['allocations']} allocations, {fleet['gpus_in_use']} GPUs in use; policy {policy}")
        print("  decision = sessions.services.session_create as the API calls it (cluster row locks, fit query, INSERTs, commit);")
        print("             only its on-commit Celery publish (_enqueue) is recorded instead of sent: no worker runs here,")
        print("             and it happens after the commit, outside the locked section")
        print(f"  decisions timed: {done} in {wall:.2f} s ({refused} answered no_capacity), sequential on one connection")
        print(f"  decisions/s: {rate:.1f}   latency median {statistics.median(latencies) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms")
        print(f"  fit query (placement.choose): {fit_share:.0%} of decision time, median {statistics.median(fit_seconds) * 1000:.1f} ms")
        print(f"  queries/decision: median {statistics.median(query_counts):.0f}, max {queries_max} "
              f"(of which BEGIN/COMMIT {queries_max - max(statement_counts)}; CaptureQueriesContext)")
        print(f"  baseline SELECT 1 round trips/s: {baseline:.0f} (before {baseline_before:.0f}, after {baseline_after:.0f})")
        print(f"  ratio decisions/s / round trips/s: {ratio:.4f} (a decision costs {1 / ratio:.0f} round trips)")
        if not args.quick:
            print(f"  goal: <= {GOAL_QUERIES} queries and >= {GOAL_RATE:.0f} decisions/s: {'MET' if goal_met else 'MISSED'}")
        print(f"  note: every decision locks all {CLUSTERS} candidate cluster rows, so decisions are serialised fleet-wide;")
        print("        this sequential rate is also the ceiling with many API workers")
        if (not goal_met and not args.quick) or args.explain:
            plans = explain(policy)
            print()
            print("fit query, EXPLAIN (ANALYZE, BUFFERS) over all connected clusters:")
            for label, plan in plans:
                print(f"  {label}: {summarize(plan)}")
            if args.explain:
                for label, plan in plans:
                    print(f"\n--- {label} ---")
                    print("\n".join(plan))
    if args.quick:
        placed = done - refused
        print(f"  quick run: {placed} of {done} decisions placed; no goal verdict")
        return 0 if placed > 0 else 1
    return 0 if goal_met else 1


if __name__ == "__main__":
    sys.exit(main())
