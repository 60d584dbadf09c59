"""Benchmark: placement decisions on a fleet of 100 clusters x 1,000 nodes x 8 GPUs with 50,000 live sessions.

    .venv/bin/python bench/placement.py [--decisions 300] [--parallel-decisions 150] [--clients 4]
                                        [--policy binpack|spread] [--explain] [--seed N] [--quick]

Builds, in a throwaway database (``gshare_bench``, see ``bench/_benchenv.py``), 100 connected clusters x 1,000
nodes x 8 GPUs (800,000 GPUs; 1 % of nodes not ready, 0.3 % of GPUs unhealthy, four GPU models, split count 10),
5,000 users, and 62,000 sessions placed cluster by cluster in binpack order (20 busy, 40 average and 40 quiet
clusters), of which a random 12,000 have ended: 50,000 live. The rows are loaded with COPY and ``bulk_create``,
and the usage counters (``GpuDevice.used_*``, the node summaries) are computed while generating them, as the
services would have kept them; a recount from the allocations at the end checks them (and every decision's).

A decision is ``sessions.create.session_create`` as the API calls it, with a real price (a default ``Price`` of
2 credits per GPU-hour, ``min_balance_hours`` 1): admission (the owner's credit account locked, policy, live
sessions and their holds, the request priced on the candidate clusters), the fit query without a lock, the
chosen cluster's row lock with the session's INSERT, the fit checked again under the lock with the allocations'
INSERT and the recount, the audit row, the commit. Each decision is made by another user (the users making them
are granted credits first through ``billing.services.credit_grant``), from the request mix of the live sessions.
The only thing replaced is the Celery publish that ``transaction.on_commit`` schedules (``sessions.lifecycle.outbox.publish``): no worker
runs here, and it happens after the commit, outside the locked section.

Measured, each against a baseline taken in the same run:

1. One client, sequential, not pinned (the whole fleet): decisions/s against ``SELECT 1`` round trips/s on the
   same connection (goal: ratio >= 0.02, i.e. a decision costs at most 50 round trips), and SQL queries per
   decision, counted with ``CaptureQueriesContext`` over separate decisions (goal: <= 10, BEGIN and COMMIT
   included).
2. Clients in their own processes (own connections, own users), each pinned to its own cluster: ``--clients``
   (4) at once against one alone, the same number of decisions per client (goal: aggregate >= 1.5 x the single
   client's rate). Before, every decision locked every candidate cluster row, so this ratio was at most 1.

``--quick`` (CI): 3 clusters x 40 nodes, 500 live sessions, 30 decisions and 2 parallel clients of 10 decisions;
a few seconds; checks the run works (decisions placed, counters equal a recount), no goal verdict.
``--explain`` prints the fit query's EXPLAIN ANALYZE plans (a one-line summary of each is printed whenever a goal
is missed). Exit status: 0 when every goal is met (quick: when the run works), 1 otherwise.
"""

from __future__ import annotations

import _benchpath  # noqa: F401 - first: keeps this folder after the standard library (bench/_benchpath.py)

# isort: split
import argparse
import multiprocessing
import os
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from decimal import Decimal

from _benchenv import bench_environment, log

CLUSTERS = 100
NODES_PER_CLUSTER = 1_000
GPUS_PER_NODE = 8
USERS = 5_000
LIVE_SESSIONS = 50_000
#: Sessions generated and placed before some are ended (the ended ones leave holes, like a real fleet).
GENERATED_SESSIONS = 62_000
GOAL_QUERIES = 10
GOAL_ROUND_TRIP_RATIO = 0.02
GOAL_PARALLEL_RATIO = 1.5
PRICE = Decimal("2")
GRANT = Decimal("1000000")

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


def _cluster_share(index: int, clusters: int) -> float:
    """Relative number of sessions on cluster ``index``: the first fifth busy, the next two fifths average, the rest quiet."""
    return 6.0 if index < clusters // 5 else 8 / 3 if index < clusters * 3 // 5 else 1.0


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
        return [(self.devices[i], *self._reserve(i, whole, memory, cores)) for i in picked]

    def _reserve(self, i: int, whole: bool, memory: int | None, cores: int | None) -> tuple[int, int, bool]:
        mem = self.memory if whole else (memory if memory is not None else self.memory)
        cor = 100 if whole else (cores or 0)
        self.count[i] += 1
        self.mem_used[i] += mem
        self.cores_used[i] += cor
        self.exclusive[i] = whole
        return mem, cor, whole

    def release(self, device_id: int, mem: int, cor: int) -> None:
        i = self.devices.index(device_id)
        self.count[i] -= 1
        self.mem_used[i] -= mem
        self.cores_used[i] -= cor
        self.exclusive[i] = False

    def summary(self) -> tuple[int, int, int, int, int]:
        """``clusters.models.NODE_SUMMARY`` of this node: load, free, open devices, most free MiB and cores on an open one."""
        open_ = [i for i in range(len(self.devices)) if self.healthy[i] and not self.exclusive[i] and self.count[i] < SPLIT_COUNT]
        return (sum(self.count), sum(1 for i in range(len(self.devices)) if self.healthy[i] and self.count[i] == 0), len(open_),
                max((max(self.memory - self.mem_used[i], 0) for i in open_), default=0),
                max((max(100 - self.cores_used[i], 0) for i in open_), default=0))


def _draw(rng: random.Random, mix):
    return rng.choices([m[1:] for m in mix], weights=[m[0] for m in mix])[0]


def _copy(cursor, table: str, columns: list[str], rows) -> None:
    with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def build_fleet(rng: random.Random) -> dict:
    """Insert the clusters, nodes, devices, users, sessions and allocations (counters included); return what the timed part needs."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from clusters.models import Cluster
    from sessions.models import Session

    now = timezone.now()
    started = time.perf_counter()
    with transaction.atomic():
        clusters = Cluster.objects.bulk_create([
            Cluster(
                name=f"bench-{c:03d}", apiserver_url=f"https://10.0.{c}.1:6443", kubeconfig="apiVersion: v1\nkind: Config\n",
                session_domain=f"c{c:03d}.bench.gshare.test", status=Cluster.Status.CONNECTED, last_heartbeat_at=now,
            )
            for c in range(CLUSTERS)
        ])
        with connection.cursor() as cursor:
            _copy(cursor, "clusters_node", ["cluster_id", "cluster_name", "name", "labels", "gpu_mode", "ready", "inventory_error", "last_seen_at"],
                  ((cluster.pk, cluster.name, f"gpu-{n:04d}", '{"gpu": "on"}', "", rng.random() > 0.01, "", now)
                   for cluster in clusters for n in range(NODES_PER_CLUSTER)))
            cursor.execute("SELECT id, cluster_id, name, ready FROM clusters_node ORDER BY id")
            nodes = cursor.fetchall()
            health = {}

            def devices():
                for node_id, cluster_id, _, _ in nodes:
                    model, memory = MODELS[cluster_id % len(MODELS)]
                    for i in range(GPUS_PER_NODE):
                        healthy = rng.random() > 0.003
                        health[(node_id, i)] = healthy
                        yield (node_id, cluster_id, f"GPU-bench-{node_id:07d}-{i}", i, model, memory, SPLIT_COUNT, 100, healthy, "hami-core", now)

            _copy(cursor, "clusters_gpudevice",
                  ["node_id", "cluster_id", "uuid", "index", "model", "memory_mib", "split_count", "cores", "health", "mode", "last_seen_at"], devices())
            cursor.execute("SELECT node_id, id FROM clusters_gpudevice ORDER BY node_id, index")
            device_ids: dict[int, list[int]] = {}
            for node_id, device_id in cursor.fetchall():
                device_ids.setdefault(node_id, []).append(device_id)
    log(f"fleet: {len(clusters)} clusters, {len(nodes)} nodes, {len(nodes) * GPUS_PER_NODE} devices in {time.perf_counter() - started:.1f} s")

    started = time.perf_counter()
    by_cluster: dict[int, list[NodeState]] = {}
    states: dict[int, NodeState] = {}
    for node_id, cluster_id, name, ready in nodes:
        state = NodeState(pk=node_id, name=name, ready=ready, devices=device_ids[node_id],
                          healthy=[health[(node_id, i)] for i in range(GPUS_PER_NODE)], memory=MODELS[cluster_id % len(MODELS)][1])
        by_cluster.setdefault(cluster_id, []).append(state)
        states[node_id] = state
    for nodes_of in by_cluster.values():
        rng.shuffle(nodes_of)  # the order the cluster's nodes were filled in
    cursors = dict.fromkeys(by_cluster, 0)  # first node of each cluster that may still take a whole GPU

    # Place the generated sessions cluster by cluster, busiest node first (what binpack does), then end a random part of them.
    weights = [_cluster_share(c, CLUSTERS) for c in range(CLUSTERS)]
    placed = []  # (cluster_id, node, (gpus, memory, cores), allocations)
    for _ in range(GENERATED_SESSIONS):
        cluster = clusters[rng.choices(range(CLUSTERS), weights=weights)[0]]
        gpus, memory, cores = _draw(rng, REQUEST_MIX)
        nodes_of = by_cluster[cluster.pk]
        start = cursors[cluster.pk]
        for position in range(start, len(nodes_of)):
            state = nodes_of[position]
            taken = state.take(gpus, memory, cores)
            if taken:
                placed.append((cluster.pk, state, (gpus, memory, cores), taken))
                break
            if position == cursors[cluster.pk] and not any(c == 0 and h for c, h in zip(state.count, state.healthy, strict=True)):
                cursors[cluster.pk] += 1  # no whole GPU left on it: later requests start after it
    rng.shuffle(placed)
    live, ended = placed[:LIVE_SESSIONS], placed[LIVE_SESSIONS:]
    for _, state, _, taken in ended:
        for device_id, mem, cor, _ in taken:
            state.release(device_id, mem, cor)
    if len(live) < LIVE_SESSIONS:
        log(f"warning: only {len(live)} sessions fit the fleet")

    User = get_user_model()
    with transaction.atomic():
        users = User.objects.bulk_create([User(username=f"bench-user-{u:05d}", password="!") for u in range(USERS)], batch_size=5000)
        phases = [p for _, p in LIVE_PHASES]
        phase_weights = [w for w, _ in LIVE_PHASES]
        rows = []
        for cluster_id, state, (gpus, memory, cores), _ in live:
            phase = rng.choices(phases, weights=phase_weights)[0]
            rows.append(Session(owner=rng.choice(users), image="quay.io/jupyter/pytorch-notebook:cuda12-2024-11-25", gpus=gpus,
                                gpu_memory_mib=memory, gpu_cores=cores, cluster_id=cluster_id, node=state.name, phase=phase,
                                started_at=now if phase in ("Running", "Stopping") else None))
        for cluster_id, state, (gpus, memory, cores), _ in ended:
            rows.append(Session(owner=rng.choice(users), image="quay.io/jupyter/base-notebook", gpus=gpus, gpu_memory_mib=memory,
                                gpu_cores=cores, cluster_id=cluster_id, node=state.name, phase=Session.Phase.TERMINATED, started_at=now,
                                ended_at=now))
        sessions = Session.objects.bulk_create(rows, batch_size=5000)
        allocations = 0
        with connection.cursor() as cursor:
            def allocation_rows():
                nonlocal allocations
                for session, (_, _, _, taken) in zip(sessions[: len(live)], live, strict=True):
                    for device_id, mem, cor, whole in taken:
                        allocations += 1
                        yield (session.pk, device_id, mem, cor, whole)

            _copy(cursor, "gpu_sessions_allocation", ["session_id", "device_id", "memory_mib", "cores", "exclusive"], allocation_rows())
            # The counters, as the services keep them (sessions.placement.usage_recompute), computed while generating.
            cursor.execute("CREATE TEMPORARY TABLE bench_devices (id bigint, c int, m bigint, k int, x bool) ON COMMIT DROP")
            _copy(cursor, "bench_devices", ["id", "c", "m", "k", "x"],
                  ((d, s.count[i], s.mem_used[i], s.cores_used[i], s.exclusive[i] and s.count[i] > 0)
                   for s in states.values() if any(s.count) for i, d in enumerate(s.devices)))
            cursor.execute("UPDATE clusters_gpudevice d SET used_count = b.c, used_memory_mib = b.m, used_cores = b.k, used_exclusive = b.x "
                           "FROM bench_devices b WHERE d.id = b.id")
            cursor.execute("CREATE TEMPORARY TABLE bench_nodes (id bigint, l int, f int, o int, m int, k int) ON COMMIT DROP")
            _copy(cursor, "bench_nodes", ["id", "l", "f", "o", "m", "k"], ((s.pk, *s.summary()) for s in states.values()))
            cursor.execute("UPDATE clusters_node n SET load = b.l, free_devices = b.f, open_devices = b.o, max_free_memory_mib = b.m, "
                           "max_free_cores = b.k FROM bench_nodes b WHERE n.id = b.id")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # a live database has statistics and a visibility map; a freshly loaded one has neither
    used = len({device_id for *_, taken in live for device_id, *_ in taken})
    log(f"sessions: {len(live)} live ({allocations} allocations, {used} of {len(nodes) * GPUS_PER_NODE} GPUs in use), "
        f"{len(ended)} ended, {USERS} users, in {time.perf_counter() - started:.1f} s")
    quiet = sorted(by_cluster, key=lambda pk: sum(s.summary()[0] for s in by_cluster[pk]))
    return {"users": users, "live": len(live), "allocations": allocations, "gpus_in_use": used, "quiet_clusters": quiet}


#: Stored counters that differ from a recount of the allocations (GPUs), and GPUs over capacity.
_CHECK_SQL = """
WITH recount AS (
    SELECT d.id, d.split_count, d.memory_mib, d.cores, d.used_count, d.used_memory_mib, d.used_cores, d.used_exclusive,
           COUNT(a.id)::int AS c, COALESCE(SUM(a.memory_mib), 0)::bigint AS m, COALESCE(SUM(a.cores), 0)::int AS k,
           COALESCE(BOOL_OR(a.exclusive), FALSE) AS x
    FROM clusters_gpudevice d LEFT JOIN gpu_sessions_allocation a ON a.device_id = d.id
    GROUP BY d.id
)
SELECT COUNT(*) FILTER (WHERE (used_count, used_memory_mib, used_cores, used_exclusive) IS DISTINCT FROM (c, m, k, x)),
       COUNT(*) FILTER (WHERE c > split_count OR m > memory_mib OR k > cores)
FROM recount
"""


def check_counters() -> tuple[int, int]:
    """``(GPUs whose counters differ from a recount, GPUs over capacity)``: both 0 when placement kept its invariants."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(_CHECK_SQL)
        return cursor.fetchone()


def select1_rate(count: int) -> float:
    """Round trips per second of ``SELECT 1`` on Django's connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        started = time.perf_counter()
        for _ in range(count):
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return count / (time.perf_counter() - started)


def grant(users) -> None:
    """Credits for the users who make decisions (through the service, as an operator would)."""
    from billing.models import Price
    from billing.services import credit_grant

    Price.objects.update_or_create(gpu_model="", defaults={"credits_per_gpu_hour": PRICE})
    for user in users:
        credit_grant(user=user, amount=GRANT, reason="placement benchmark", idempotency_key=f"bench-{user.pk}", created_by="command:bench")


def _patch_enqueue() -> None:
    from sessions.lifecycle import outbox

    outbox.publish = lambda task_name, session_pk: True  # no Celery worker: nothing is published


def decide(user, request, cluster: str | None = None) -> bool:
    """One ``session_create``; True when placed, False when answered ``no_capacity``."""
    from core.exceptions import Conflict
    from sessions import create

    gpus, memory, cores = request
    try:
        create.session_create(owner=user, image="quay.io/jupyter/pytorch-notebook", gpus=gpus, gpu_memory_mib=memory,
                                gpu_cores=cores, cluster=cluster)
    except Conflict as exc:
        if exc.code != "no_capacity":
            raise
        return False
    return True


def _client(args) -> tuple[int, int, float, float]:
    """A client process: ``count`` decisions pinned to ``cluster`` by its own users, after the start barrier.

    Returns:
        ``(placed, refused, started, finished)`` (``time.time()`` stamps, comparable across processes).
    """
    user_ids, cluster, count, seed, barrier = args
    from django.contrib.auth import get_user_model
    from django.db import connections

    connections.close_all()  # never share the parent's connection
    _patch_enqueue()
    users = list(get_user_model().objects.filter(pk__in=user_ids).order_by("pk"))
    rng = random.Random(seed)
    decide(users[0], _draw(rng, REQUEST_MIX), cluster)  # warm-up: connection, plan cache
    placed = refused = 0
    barrier.wait()
    started = time.time()
    for i in range(count):
        if decide(users[(i + 1) % len(users)], _draw(rng, REQUEST_MIX), cluster):
            placed += 1
        else:
            refused += 1
    finished = time.time()
    connections.close_all()
    return placed, refused, started, finished


def parallel(clients: int, clusters: list[str], users, count: int, seed: int) -> tuple[float, int, int]:
    """``clients`` processes, each pinned to its own cluster with its own users: ``(decisions/s together, placed, refused)``."""
    from django.db import connections

    connections.close_all()
    context = multiprocessing.get_context("fork")
    barrier = context.Manager().Barrier(clients)
    per = len(users) // clients
    jobs = [([u.pk for u in users[i * per:(i + 1) * per]], clusters[i], count, seed + i, barrier) for i in range(clients)]
    with context.Pool(clients) as pool:
        results = pool.map(_client, jobs)
    started, finished = min(r[2] for r in results), max(r[3] for r in results)
    placed, refused = sum(r[0] for r in results), sum(r[1] for r in results)
    return (placed + refused) / (finished - started), placed, refused


_SCAN = re.compile(r"(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan) (?:using \S+ )?on (\S+).*actual time=\S+ rows=([\d.]+) loops=(\d+)")


def summarize(plan: list[str]) -> str:
    """One line from an EXPLAIN ANALYZE plan: execution time, rows read per table."""
    execution = next((line.split(":", 1)[1].strip() for line in plan if line.startswith("Execution Time")), "?")
    reads: dict[str, list[int]] = {}
    for line in plan:
        match = _SCAN.search(line)
        if match:
            reads.setdefault(match.group(1), []).append(int(float(match.group(2)) * int(match.group(3))))
    tables = ", ".join(f"{table} {len(rows)}x ({sum(rows)} rows)" for table, rows in sorted(reads.items()))
    return f"{execution}; scans: {tables}"


def explain(policy: str, pinned: int) -> list[tuple[str, list[str]]]:
    """EXPLAIN (ANALYZE, BUFFERS) of the fit query (whole fleet, and one cluster) and of admission's read (``admission_read``)."""
    from django.db import connection, transaction

    from billing import admission
    from sessions import placement
    from sessions.models import Session

    out = []
    for label, request, ids in (
        ("1 whole GPU, fleet", placement.Request(gpus=1), None),
        ("8 whole GPUs, fleet", placement.Request(gpus=8), None),
        ("1 GPU share 8192 MiB 25%, fleet", placement.Request(gpus=1, memory_mib=8192, cores=25), None),
        ("1 whole GPU, one cluster", placement.Request(gpus=1), [pinned]),
    ):
        sql, params = placement.fit_query(request=request, cluster_ids=ids, policy=policy)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            out.append((f"fit: {label} ({policy})", [row[0] for row in cursor.fetchall()]))
    owner = Session.objects.filter(phase=Session.Phase.RUNNING).values_list("owner_id", flat=True).first()
    params = {"user": owner, "scope": None, "default_hours": admission.settings_policy().min_balance_hours,
              "ended": list(Session.HOLDING_EXCLUDED_PHASES)}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + admission.admission_query(Session.Phase.QUEUED), params)
        out.append(("admission: policy, live sessions, prices and GPU models of every cluster", [row[0] for row in cursor.fetchall()]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=300, help="sequential decisions to time, one client, not pinned (default 300)")
    parser.add_argument("--parallel-decisions", type=int, default=150, help="decisions per client in the parallel runs (default 150)")
    parser.add_argument("--clients", type=int, default=4, help="clients placing at once, each on its own cluster (default 4)")
    parser.add_argument("--policy", choices=["binpack", "spread"], help="GSHARE_PLACEMENT_POLICY for this run (default: the setting)")
    parser.add_argument("--explain", action="store_true", help="print the EXPLAIN ANALYZE plans of the fit and admission queries")
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--quick", action="store_true", help="a small fleet and few decisions: checks the run, no goal verdict (CI)")
    args = parser.parse_args()
    if args.quick:
        global CLUSTERS, NODES_PER_CLUSTER, USERS, LIVE_SESSIONS, GENERATED_SESSIONS
        CLUSTERS, NODES_PER_CLUSTER, USERS, LIVE_SESSIONS, GENERATED_SESSIONS = 3, 40, 200, 500, 650
        args.decisions, args.parallel_decisions, args.clients = min(args.decisions, 30), min(args.parallel_decisions, 10), 2
    if args.policy:
        os.environ["GSHARE_PLACEMENT_POLICY"] = args.policy

    with bench_environment():
        from django.conf import settings
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from clusters.models import Cluster

        rng = random.Random(args.seed)
        fleet = build_fleet(rng)
        users = fleet["users"]
        deciders = users[: args.decisions + 40 + args.clients * 10]
        started = time.perf_counter()
        grant(deciders)
        log(f"credits granted to {len(deciders)} users in {time.perf_counter() - started:.1f} s")
        policy = settings.GSHARE_PLACEMENT_POLICY
        _patch_enqueue()
        req_rng = random.Random(args.seed + 1)

        # 1. One client, not pinned. Queries first (counting adds its own overhead), then the timed decisions.
        queue = iter(deciders)
        for _ in range(10):  # warm-up: connection, plan cache, Python imports
            decide(next(queue), _draw(req_rng, REQUEST_MIX))
        query_counts = []
        for _ in range(20):
            with CaptureQueriesContext(connection) as queries:
                decide(next(queue), _draw(req_rng, REQUEST_MIX))
            query_counts.append(len(queries.captured_queries))
        sample = [q["sql"] for q in queries.captured_queries]
        baseline_before = select1_rate(3000)
        latencies, refused = [], 0
        loop_started = time.perf_counter()
        for _ in range(args.decisions):
            started = time.perf_counter()
            refused += not decide(next(queue), _draw(req_rng, REQUEST_MIX))
            latencies.append(time.perf_counter() - started)
        wall = time.perf_counter() - loop_started
        baseline_after = select1_rate(3000)
        baseline = (baseline_before + baseline_after) / 2
        rate = len(latencies) / wall
        ratio = rate / baseline
        latencies.sort()
        p95 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))]

        # 2. Parallel clients, each pinned to its own (quiet) cluster, against one client alone.
        rest = users[len(deciders):]
        names = dict(Cluster.objects.values_list("pk", "name"))
        pinned = [names[pk] for pk in fleet["quiet_clusters"][: args.clients]]
        grant(rest[: args.parallel_decisions * (args.clients + 1) + 2 * (args.clients + 1)])
        group = args.parallel_decisions + 2
        alone, alone_placed, alone_refused = parallel(1, pinned[:1], rest[:group], args.parallel_decisions, args.seed + 10)
        together, together_placed, together_refused = parallel(
            args.clients, pinned, rest[group: group * (args.clients + 1)], args.parallel_decisions, args.seed + 20)
        speedup = together / alone
        wrong, over = check_counters()

        queries_max = max(query_counts)
        goals = {
            f"<= {GOAL_QUERIES} queries per decision": queries_max <= GOAL_QUERIES,
            f"decisions/s >= {GOAL_ROUND_TRIP_RATIO} x SELECT 1 round trips/s": ratio >= GOAL_ROUND_TRIP_RATIO,
            f"{args.clients} clients on {args.clients} clusters >= {GOAL_PARALLEL_RATIO} x one client": speedup >= GOAL_PARALLEL_RATIO,
        }
        print("placement benchmark")
        print(f"  fleet: {CLUSTERS} clusters x {NODES_PER_CLUSTER} nodes x {GPUS_PER_NODE} GPUs = {CLUSTERS * NODES_PER_CLUSTER * GPUS_PER_NODE} "
              f"devices; {fleet['live']} live sessions, {fleet['allocations']} allocations, {fleet['gpus_in_use']} GPUs in use; "
              f"{USERS} users; policy {policy}; price {PRICE} credits/GPU-hour")
        print("  decision = sessions.create.session_create as the API calls it (admission with a real price, fit, the chosen")
        print("             cluster's lock, INSERTs, recount, audit row, commit); only its on-commit Celery publish is not sent")
        print(f"  1. one client, not pinned: {len(latencies)} decisions in {wall:.2f} s ({refused} answered no_capacity)")
        print(f"     decisions/s: {rate:.1f}   latency median {statistics.median(latencies) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms")
        print(f"     queries/decision: median {statistics.median(query_counts):.0f}, max {queries_max} (BEGIN and COMMIT included)")
        print(f"     baseline SELECT 1 round trips/s: {baseline:.0f} (before {baseline_before:.0f}, after {baseline_after:.0f})")
        print(f"     ratio decisions/s / round trips/s: {ratio:.4f} (a decision costs {1 / ratio:.0f} round trips)")
        print(f"  2. clients pinned to their own cluster, own process and users, {args.parallel_decisions} decisions each:")
        print(f"     one client: {alone:.1f} decisions/s ({alone_refused} no_capacity)")
        print(f"     {args.clients} clients ({', '.join(pinned)}): {together:.1f} decisions/s together ({together_refused} no_capacity)")
        print(f"     ratio {args.clients} clients / one: {speedup:.2f}")
        print(f"  counters after the run: {wrong} GPU(s) differ from a recount of the allocations, {over} over capacity")
        if args.quick:
            placed = len(latencies) - refused + alone_placed + together_placed
            works = placed > 0 and wrong == 0 and over == 0 and queries_max > 0
            print(f"  quick run: {placed} decisions placed; {'works' if works else 'BROKEN'}; no goal verdict")
        else:
            for goal, met in goals.items():
                print(f"  goal {goal}: {'MET' if met else 'MISSED'}")
            print(f"  verdict: {'all goals met' if all(goals.values()) and not wrong and not over else 'goal MISSED'}")
        if (not args.quick and not all(goals.values())) or args.explain:
            print("\n  queries of the last counted decision:")
            for sql in sample:
                print(f"    {' '.join(sql.split())[:150]}")
            plans = explain(policy, fleet["quiet_clusters"][0])
            print("\n  EXPLAIN (ANALYZE, BUFFERS):")
            for label, plan in plans:
                print(f"    {label}: {summarize(plan)}")
            if args.explain:
                for label, plan in plans:
                    print(f"\n--- {label} ---")
                    print("\n".join(plan))
    if args.quick:
        return 0 if works else 1
    return 0 if all(goals.values()) and not wrong and not over else 1


if __name__ == "__main__":
    sys.exit(main())
