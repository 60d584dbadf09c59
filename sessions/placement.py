"""Placement: choosing the cluster, node and GPUs for a session request (one SQL query), and reserving them (one more).

Capacity is the inventory (``clusters.GpuDevice``: HAMi's registered memory in MiB, core capacity in
percent, split count) minus the live reservations (``sessions.Allocation``, kept summed on each GPU
and node by ``usage_recompute``), with HAMi's sharing semantics (HAMi ``pkg/scheduler`` fit rules, 2.x):

* a device with split count N hosts at most N sessions;
* memory and cores per device are never over-committed;
* a whole-GPU request (neither memory nor cores asked) needs a device with nothing on it, and then
  holds it alone;
* a share reserves what it is priced at and what HAMi enforces (``billing.pricing``, docs/billing.md): no memory
  asked takes the device's whole memory (HAMi's default, ``nvidia.com/gpumem`` unset = 100 %), no cores asked
  takes all of them (100 %: HAMi-core sets no SM limit), and a share never takes less than one split slot of
  cores (``billing.pricing.share_cores``: ``ceil(100 / split_count)`` %); the cores reserved are written back
  to the session (``Session.gpu_cores``), so the manifest and the price read them;
* all GPUs of one session are on one node (HAMi allocates a container's vGPUs on one node);
* a request's CPU and memory (``Request.cpu``, ``Request.memory_gib``: ``sessions.resources``) fit in the node's
  allocatable CPU and memory (``Node.cpu_allocatable_millicores``, ``memory_allocatable_mib``) less what its pods that
  are not sessions request and what the live sessions on it asked (``_RESOURCE_FIT``); a node whose operator reports
  no allocatable figures has no CPU or memory limit.

Policies: ``binpack`` (default) fills the busiest node and GPUs first, ``spread`` the idlest. Ties
break on cluster name, node name and GPU index, so the same state gives the same decision.
``choose`` reads without a lock; ``reserve`` checks the fit again and writes the reservation under the chosen
cluster's row lock (see ``sessions.create.session_create``).

Volumes narrow the candidate clusters before that query (``volume_clusters``): a volume whose PVC is
on a cluster keeps its sessions there, a pool is only used by the clusters it is shared with, and only
where its StorageClass exists (``storage.capacity.pools_usability``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db import connection

from billing.pricing import FULL_CORES, share_cores
from clusters.models import node_summary_update_sql
from core.exceptions import Conflict
from core.prepared import statement_cursor
from sessions import resources
from sessions.errors import VOLUME_ON_ANOTHER_CLUSTER, VOLUMES_ON_DIFFERENT_CLUSTERS
from storage.capacity import pool_clusters, pools_usability
from storage.errors import VOLUME_NOT_MOUNTABLE, VOLUME_POOL_NOT_SHARED
from storage.models import StoragePool, Volume


@dataclass(frozen=True)
class Request:
    """What a session asks for.

    Attributes:
        gpus: number of GPUs (vGPUs), >= 1.
        memory_mib: MiB per GPU, or None (whole GPU when ``cores`` is None too, else the device's memory).
        cores: percent of one GPU per GPU, or None (whole GPU when ``memory_mib`` is None too, else 100: all of them).
        models: the GPU models (``GpuDevice.model``, exact names: ``sessions.gpu_models.gpu_models_resolve``) it may
            be placed on; empty: any model.
        cpu: CPU cores (at most 3 decimal places) the node must have room for, or None: not asked.
        memory_gib: memory (GiB, at most 3 decimal places; counted in whole MiB rounded up) the node must have room
            for, or None: not asked.
    """

    gpus: int
    memory_mib: int | None = None
    cores: int | None = None
    models: tuple[str, ...] = ()
    cpu: Decimal | None = None
    memory_gib: Decimal | None = None

    @property
    def sized(self) -> bool:
        """True when it asks CPU or memory (the fit then checks the node's room for them)."""
        return self.cpu is not None or self.memory_gib is not None

    @property
    def whole(self) -> bool:
        """True for a whole-GPU request."""
        return self.memory_mib is None and self.cores is None


@dataclass(frozen=True)
class Choice:
    """A placement decision.

    Attributes:
        cluster_id: ``Cluster.pk``.
        node_id: ``Node.pk``.
        node_name: the node's Kubernetes name.
        devices: ``[(GpuDevice.pk, memory_mib reserved, cores reserved)]``, one per GPU.
    """

    cluster_id: int
    node_id: int
    node_name: str
    devices: list[tuple[int, int, int]]


#: The fit query. Nodes are walked in policy order through a partial index on ``clusters_node``
#: (fleet-wide: ``node_binpack_order`` / ``node_spread_order``: load, cluster name, node name, ready nodes
#: only; one cluster: ``node_cluster_binpack_order`` / ``node_cluster_spread_order``, the same per cluster,
#: made by ``sessions/migrations/0010_placement_scale.py``); for each, a LATERAL subquery picks its GPUs that
#: fit from the device counters (index on ``clusters_gpudevice.node_id``, a handful of rows), and ``LIMIT 1``
#: stops at the first node with enough of them. The node's summary (``free_devices`` for whole GPUs;
#: ``open_devices``, ``max_free_memory_mib``, ``max_free_cores`` for shares: bounds, never stricter than the
#: GPUs' own check) passes over the nodes that cannot fit without reading their GPUs. ``{scope}`` says where
#: (``_SCOPES``): the clusters that can take sessions (connected, with a session domain) among the candidates,
#: or one locked cluster, or one node of it.
_FIT_SQL = """
SELECT n.cluster_id, n.id, n.name, p.ids, p.memories, p.cores, p.splits
FROM clusters_node n {join}
CROSS JOIN LATERAL (
    SELECT COUNT(*) AS fits,
           array_agg(d.id ORDER BY {device_order}) AS ids,
           array_agg(d.memory_mib ORDER BY {device_order}) AS memories,
           array_agg(d.cores ORDER BY {device_order}) AS cores,
           array_agg(d.split_count ORDER BY {device_order}) AS splits
    FROM clusters_gpudevice d
    WHERE d.node_id = n.id AND d.health AND {device_fit}{model_fit}{device_scope}
) p
WHERE n.ready AND {scope} {node_fit}
  AND p.fits >= %(gpus)s{resource_fit}
ORDER BY {order}
LIMIT 1
"""

#: Whole GPU: nothing reserved on it. Share: not held whole, a split left, memory and cores left (no memory asked =
#: the device's whole memory, HAMi's default; cores: ``_SHARE_CORES``, at least one split slot).
#: ``billing.pricing.share_cores`` in SQL: the cores asked (``%(cores)s``, 100 when none) and at least one split
#: slot, ``ceil(100 / split_count)`` (integer division; ``split_count`` >= 1 by constraint).
_SHARE_CORES = "GREATEST(%(cores)s, (%(full_cores)s + {d}.split_count - 1) / {d}.split_count)"

_FITS = {
    True: {"device_fit": "d.used_count = 0", "node_fit": "AND n.free_devices >= %(gpus)s"},
    False: {
        "device_fit": (
            "NOT d.used_exclusive AND d.used_count < d.split_count"
            " AND d.used_memory_mib + COALESCE(%(mem)s, d.memory_mib) <= d.memory_mib"
            " AND d.used_cores + " + _SHARE_CORES.format(d="d") + " <= d.cores"
        ),
        "node_fit": (
            "AND n.open_devices >= %(gpus)s AND n.max_free_memory_mib >= %(mem_floor)s AND n.max_free_cores >= %(cores)s"
        ),
    },
}

#: A request that names GPU models (``Request.models``) fits only GPUs of those models; one that names none gets a fit
#: query without any model condition. The node summaries count GPUs of every model: still bounds, never stricter
#: than the GPUs' own check.
_MODEL_FIT = {False: "", True: " AND d.model = ANY(%(models)s::text[])"}

#: A request that asks CPU or memory (``Request.sized``) fits only a node with room for them: its allocatable figures
#: less its pods' that are not sessions, less the CPU and memory of the sessions holding GPUs on it (those with
#: allocations on its GPUs: exactly the live reservations, which change only under the cluster's row lock, so
#: ``reserve``'s fit under that lock is exact). Summed when the node is looked at, not kept in a counter: one scalar
#: subquery, which PostgreSQL evaluates after the node's cheaper conditions (the GPU fit), and not at all for a node
#: without allocatable figures (an older operator: no limit). The same rounding as the pod's (``sessions.resources``:
#: millicores, MiB rounded up).
_RESOURCE_FIT = {False: "", True: """
  AND ((n.cpu_allocatable_millicores IS NULL AND n.memory_allocatable_mib IS NULL) OR (
      SELECT (n.cpu_allocatable_millicores IS NULL
              OR n.cpu_allocatable_millicores - n.cpu_requested_millicores - COALESCE(SUM(CEIL(s.cpu * 1000)), 0) >= %(cpu_milli)s)
         AND (n.memory_allocatable_mib IS NULL
              OR n.memory_allocatable_mib - n.memory_requested_mib - COALESCE(SUM(CEIL(s.memory_gib * 1024)), 0) >= %(memory_mib_asked)s)
        FROM gpu_sessions_session s
       WHERE s.id IN (SELECT a.session_id FROM gpu_sessions_allocation a JOIN clusters_gpudevice ad ON ad.id = a.device_id
                       WHERE ad.node_id = n.id)))"""}

_POLICIES = {
    "binpack": {"device_order": "d.used_count DESC, d.index, d.id", "direction": "DESC"},
    "spread": {"device_order": "d.used_count ASC, d.index, d.id", "direction": "ASC"},
}

#: A cluster that can take sessions now (``sessions.create._pinned_cluster`` says the same in Python).
_TAKES_SESSIONS = "c.status = 'connected' AND c.session_domain <> ''"
_ELIGIBLE = "JOIN clusters_cluster c ON c.id = n.cluster_id"

#: Where the fit query looks. ``fleet``/``some``/``one``: the clusters that take sessions (all of them, those of
#: ``clusters``, the one of ``cluster``), read without a lock; ``cluster``/``node``: one cluster or node, read
#: under its cluster's row lock (which already checked that it takes sessions). Within one cluster the order is
#: load then node name (the cluster's name is the same for all), which the per-cluster indexes serve.
_SCOPES = {
    "fleet": {"join": _ELIGIBLE, "scope": _TAKES_SESSIONS, "order": "n.load {direction}, n.cluster_name, n.name"},
    "some": {"join": _ELIGIBLE, "scope": f"{_TAKES_SESSIONS} AND n.cluster_id = ANY(%(clusters)s::bigint[])",
             "order": "n.load {direction}, n.cluster_name, n.name"},
    "one": {"join": _ELIGIBLE, "scope": f"{_TAKES_SESSIONS} AND n.cluster_id = %(cluster)s", "order": "n.load {direction}, n.name"},
    "cluster": {"join": "", "scope": "n.cluster_id = %(cluster)s", "order": "n.load {direction}, n.name"},
    "node": {"join": "", "scope": "n.id = %(node)s", "order": "n.id"},
    # The GPUs the queue's plan chose (``sessions.queue``): only those, on their node, under the cluster's lock.
    "devices": {"join": "", "scope": "n.id = %(node)s", "order": "n.id", "device_scope": " AND d.id = ANY(%(devices)s::bigint[])"},
}


def _fit_sql(policy: str, whole: bool, scope: str, models: bool, sized: bool) -> str:
    parts = _SCOPES[scope]
    order = parts["order"].format(direction=_POLICIES[policy]["direction"])
    return _FIT_SQL.format(join=parts["join"], scope=parts["scope"], order=order, device_order=_POLICIES[policy]["device_order"],
                           model_fit=_MODEL_FIT[models], device_scope=parts.get("device_scope", ""), resource_fit=_RESOURCE_FIT[sized],
                           **_FITS[whole])


_FIT_QUERIES = {(policy, whole, scope, models, sized): _fit_sql(policy, whole, scope, models, sized)
                for policy in _POLICIES for whole in _FITS for scope in _SCOPES for models in _MODEL_FIT for sized in _RESOURCE_FIT}


def _int_array(ids: Iterable[int]) -> str:
    """``ids`` as a PostgreSQL array literal (cast in the SQL): one string parameter instead of a list
    the driver adapts element by element (measurably slower for the fleet's cluster ids)."""
    return "{" + ",".join(str(int(i)) for i in ids) + "}"


def _params(request: Request) -> dict:
    cores = FULL_CORES if request.cores is None else request.cores
    params = {"mem": request.memory_mib, "mem_floor": request.memory_mib or 0, "cores": cores, "full_cores": FULL_CORES,
              "gpus": request.gpus}
    if request.models:
        params["models"] = list(request.models)
    if request.sized:
        params["cpu_milli"] = resources.cpu_millicores(request.cpu) or 0
        params["memory_mib_asked"] = resources.memory_mib(request.memory_gib) or 0
    return params


def fit_query(*, request: Request, cluster_ids: list[int] | None, policy: str) -> tuple[str, dict]:
    """The fit query and its parameters for ``request`` over the clusters that take sessions (connected, with a
    session domain) among ``cluster_ids`` (None: the whole fleet). Also used by ``bench/placement.py --explain``.

    Raises:
        ValueError: unknown ``policy``.
    """
    if policy not in _POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}: use binpack or spread")
    params = _params(request)
    if cluster_ids is None:
        scope = "fleet"
    elif len(cluster_ids) == 1:
        scope, params["cluster"] = "one", int(next(iter(cluster_ids)))
    else:
        scope, params["clusters"] = "some", _int_array(sorted(cluster_ids))
    return _FIT_QUERIES[policy, request.whole, scope, bool(request.models), request.sized], params


def choose(*, request: Request, cluster_ids: list[int] | None = None, policy: str = "binpack") -> Choice | None:
    """Choose a node and GPUs for ``request`` among the clusters that take sessions (of ``cluster_ids``; None:
    all), or None when nothing fits now.

    One SQL query, whatever the fleet's size, taking no lock: the choice may be out of date by the time the
    caller locks its cluster, so ``reserve`` checks it again under that lock (``sessions.create.session_create``).

    Raises:
        ValueError: unknown ``policy``.
    """
    if cluster_ids is not None and not cluster_ids:
        return None
    sql, params = fit_query(request=request, cluster_ids=cluster_ids, policy=policy)
    with statement_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    cluster_id, node_id, node_name, ids, memories, cores, splits = row
    devices = []
    for device_id, device_memory, device_cores, split in list(zip(ids, memories, cores, splits, strict=True))[: request.gpus]:
        if request.whole:
            devices.append((device_id, device_memory, device_cores))
        else:
            devices.append((device_id, request.memory_mib if request.memory_mib is not None else device_memory,
                            share_cores(gpu_cores=request.cores, split_count=split)))
    return Choice(cluster_id=cluster_id, node_id=node_id, node_name=node_name, devices=devices)


@dataclass(frozen=True)
class Reservation:
    """GPUs reserved by ``reserve``.

    Attributes:
        node_id: ``Node.pk``; node_name: its Kubernetes name.
        device_ids: ``GpuDevice.pk`` of each GPU reserved, in the fit's order.
        over: pks of the node's GPUs whose reservations exceed their capacity after this one (see ``usage_recompute``).
        cores: for a share, the most cores (percent) reserved on one of its GPUs, now the session's ``gpu_cores``;
            None for whole GPUs.
    """

    node_id: int
    node_name: str
    device_ids: list[int]
    over: list[int]
    cores: int | None = None


#: Writes the ``used_*`` counters of ``usage`` (one row per GPU, recounted) to the GPUs whose counters differ: the
#: ``devices`` step of the reservation and of the recount.
_WRITE_COUNTERS = """
    UPDATE clusters_gpudevice d
       SET used_count = u.used_count, used_memory_mib = u.used_memory_mib, used_cores = u.used_cores, used_exclusive = u.used_exclusive
      FROM usage u
     WHERE d.id = u.id
       AND (d.used_count, d.used_memory_mib, d.used_cores, d.used_exclusive)
           IS DISTINCT FROM (u.used_count, u.used_memory_mib, u.used_cores, u.used_exclusive)
"""

#: ``reserve``: the fit (on one node, or one cluster) under the cluster's row lock, the INSERT of the session's
#: allocations, and the recount of that node's counters and summary from its allocations (those committed, read
#: by this statement's snapshot, which was taken after the lock, plus the rows this statement inserts, which it
#: cannot read back from the table), in one statement. The session's ``node`` is corrected when the GPUs were
#: found on another node than the one it was created with, and a share's ``gpu_cores`` becomes the cores reserved
#: (``_SHARE_CORES``: what the manifest asks HAMi to enforce and what the price reads).
_RESERVE_SQL = """
WITH pick AS ({fit}),
chosen AS (
    SELECT x.device_id, x.memory_mib, x.cores, x.split_count, x.ord
    FROM pick CROSS JOIN LATERAL unnest(pick.ids, pick.memories, pick.cores, pick.splits)
         WITH ORDINALITY AS x(device_id, memory_mib, cores, split_count, ord)
    WHERE x.ord <= %(gpus)s
),
new AS (
    INSERT INTO gpu_sessions_allocation (session_id, device_id, memory_mib, cores, exclusive)
    SELECT %(session)s, c.device_id, {memory}, {cores}, %(whole)s FROM chosen c ORDER BY c.ord
    RETURNING device_id, memory_mib, cores, exclusive
),
usage AS (
    SELECT d.id, d.node_id, d.health, d.split_count, d.memory_mib, d.cores,
           u.used_count, u.used_memory_mib, u.used_cores, u.used_exclusive
    FROM clusters_gpudevice d
    CROSS JOIN LATERAL (
        SELECT COUNT(*)::int AS used_count, COALESCE(SUM(a.memory_mib), 0)::bigint AS used_memory_mib,
               COALESCE(SUM(a.cores), 0)::int AS used_cores, COALESCE(BOOL_OR(a.exclusive), FALSE) AS used_exclusive
        FROM (SELECT a.memory_mib, a.cores, a.exclusive FROM gpu_sessions_allocation a WHERE a.device_id = d.id
              UNION ALL
              SELECT r.memory_mib, r.cores, r.exclusive FROM new r WHERE r.device_id = d.id) a
    ) u
    WHERE d.node_id = (SELECT id FROM pick)
),
devices AS ({write_counters}),
nodes AS ({nodes}),
named AS (UPDATE gpu_sessions_session s SET node = pick.name{set_cores} FROM pick
          WHERE s.id = %(session)s AND (s.node <> pick.name{cores_differ}))
SELECT pick.id, pick.name, ARRAY(SELECT c.device_id FROM chosen c ORDER BY c.ord),
       ARRAY(SELECT u.id FROM usage u WHERE u.used_count > u.split_count OR u.used_memory_mib > u.memory_mib OR u.used_cores > u.cores
             ORDER BY u.id),
       {session_cores}
FROM pick
"""

_RESERVE_QUERIES = {
    (policy, whole, scope, models, sized): _RESERVE_SQL.format(
        fit=_FIT_QUERIES[policy, whole, scope, models, sized],
        memory="c.memory_mib" if whole else "COALESCE(%(mem)s, c.memory_mib)",
        cores="c.cores" if whole else _SHARE_CORES.format(d="c"),
        set_cores="" if whole else ", gpu_cores = (SELECT MAX(r.cores) FROM new r)",
        cores_differ="" if whole else " OR s.gpu_cores IS DISTINCT FROM (SELECT MAX(r.cores) FROM new r)",
        session_cores="NULL::int" if whole else "(SELECT MAX(r.cores) FROM new r)",
        nodes=node_summary_update_sql(devices="usage"),
        write_counters=_WRITE_COUNTERS,
    )
    for policy in _POLICIES for whole in _FITS for scope in ("cluster", "node", "devices") for models in _MODEL_FIT
    for sized in _RESOURCE_FIT
}


def reserve(*, session_id: int, request: Request, cluster_id: int, node_id: int | None = None, policy: str = "binpack",
            device_ids: list[int] | None = None) -> Reservation | None:
    """Reserve GPUs for session ``session_id`` on node ``node_id`` (or, with None, the node of ``cluster_id`` the
    policy picks), or None when nothing there fits now (nothing is written then). With ``device_ids`` (and
    ``node_id``) only those GPUs of the node may be taken: the ones the queue's plan chose (``sessions.queue``).

    One statement: the fit, the ``Allocation`` rows, and the recount of the node's counters and summary
    (``usage_recompute``'s result, without a second statement). The caller holds ``cluster_id``'s row lock,
    taken before this statement, so what it reads is current and nothing changes it until the commit.

    Raises:
        ValueError: unknown ``policy``.
        IntegrityError: the counters would break a constraint (a whole GPU on a shared one: only when they were
            wrong before, see ``tests/sessions/test_placement.py``).
    """
    if policy not in _POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}: use binpack or spread")
    scope = "cluster" if node_id is None else "devices" if device_ids else "node"
    params = {**_params(request), "session": session_id, "whole": request.whole, "cluster": cluster_id, "node": node_id,
              "devices": _int_array(device_ids or [])}
    with statement_cursor() as cursor:
        cursor.execute(_RESERVE_QUERIES[policy, request.whole, scope, bool(request.models), request.sized], params)
        row = cursor.fetchone()
    if row is None:
        return None
    node, name, device_ids, over, cores = row
    return Reservation(node_id=node, node_name=name, device_ids=list(device_ids), over=list(over), cores=cores)


#: Recount of the usage counters from the allocations: ``usage`` has the columns of
#: ``clusters_gpudevice`` with the ``used_*`` ones recounted, for every GPU of the nodes concerned
#: (``{devices}``), so the nodes' summaries (``{nodes}``, ``clusters.models.NODE_SUMMARY``) come out whole.
_RECOMPUTE_SQL = """
WITH usage AS (
    SELECT d.id, d.node_id, d.health, d.split_count, d.memory_mib, d.cores,
           COUNT(a.id)::int AS used_count, COALESCE(SUM(a.memory_mib), 0)::bigint AS used_memory_mib,
           COALESCE(SUM(a.cores), 0)::int AS used_cores, COALESCE(BOOL_OR(a.exclusive), FALSE) AS used_exclusive
    FROM clusters_gpudevice d
    LEFT JOIN gpu_sessions_allocation a ON a.device_id = d.id
    WHERE {devices}
    GROUP BY d.id
),
devices AS ({write_counters}),
nodes AS ({nodes})
SELECT u.id FROM usage u
WHERE u.used_count > u.split_count OR u.used_memory_mib > u.memory_mib OR u.used_cores > u.cores
ORDER BY u.id
"""


def usage_recompute(*, node_ids: Iterable[int] | None = None, cluster_ids: Iterable[int] | None = None) -> list[int]:
    """Recount the usage counters from ``sessions.Allocation``, in one statement.

    Sets ``GpuDevice.used_count``, ``used_memory_mib``, ``used_cores``, ``used_exclusive`` of every
    GPU on the nodes concerned, and those nodes' summary (``clusters.models.NODE_SUMMARY``); rows
    already right are not written. The counters are derived, never incremented, so they cannot drift.

    Call it in the transaction that changed the allocations, after the change, holding the row lock
    of the cluster concerned (the release paths take it before deleting; ``reserve`` does the same
    recount in its own statement, under the lock ``session_create`` took). In READ COMMITTED each statement sees what was committed before it started,
    so under that lock the recount sees every other change of the cluster's allocations.

    Args:
        node_ids: recount the GPUs of these nodes (the nodes a change touched);
        cluster_ids: or of these clusters; with neither, the whole fleet. The wider scopes are a
            repair, or the step after a bulk load: hold the clusters' locks or run when nothing
            else writes.

    Returns:
        The pks of the GPUs recounted whose reservations exceed their capacity (count above split
        count, MiB above memory, cores above capacity), in pk order. Placement never causes that;
        an inventory that lowered a GPU's capacity can.
    """
    if node_ids is not None:
        ids, sql = node_ids, _RECOMPUTE_NODES_SQL
    elif cluster_ids is not None:
        ids, sql = cluster_ids, _RECOMPUTE_CLUSTERS_SQL
    else:
        ids, sql = None, _RECOMPUTE_ALL_SQL
    if ids is not None:
        ids = sorted(set(ids))
        if not ids:
            return []
    with connection.cursor() as cursor:
        cursor.execute(sql, {"ids": _int_array(ids or [])})
        return [row[0] for row in cursor.fetchall()]


# Every GPU of the nodes: their summaries come from those rows alone (the cheaper form to plan).
_RECOMPUTE_NODES_SQL = _RECOMPUTE_SQL.format(devices="d.node_id = ANY(%(ids)s::bigint[])", nodes=node_summary_update_sql(devices="usage"),
                                             write_counters=_WRITE_COUNTERS)
_RECOMPUTE_CLUSTERS_SQL = _RECOMPUTE_SQL.format(
    devices="d.cluster_id = ANY(%(ids)s::bigint[])", nodes=node_summary_update_sql(devices="usage", nodes_where="n2.cluster_id = ANY(%(ids)s::bigint[])"),
    write_counters=_WRITE_COUNTERS,
)
_RECOMPUTE_ALL_SQL = _RECOMPUTE_SQL.format(devices="TRUE", nodes=node_summary_update_sql(devices="usage", nodes_where="TRUE"),
                                           write_counters=_WRITE_COUNTERS)


def shortfall(*, request: Request, cluster_ids: list[int]) -> str:
    """A sentence saying what the candidate clusters lack for ``request`` (for ``no_capacity``), counting only GPUs of
    ``request.models`` when it names some. When the request asks CPU or memory and its GPUs would fit without them (one
    more fit query), it says CPU or memory is short and the most left on one node (``_room_shortfall``)."""
    if not cluster_ids:
        return "no connected cluster with a session_domain can host sessions now"
    sql = """
        SELECT COUNT(*) FILTER (WHERE d.health AND n.ready),
               COUNT(*) FILTER (WHERE d.health AND n.ready AND d.used_count = 0),
               COALESCE(MAX(GREATEST(d.memory_mib - d.used_memory_mib, 0)) FILTER (WHERE d.health AND n.ready), 0)
        FROM clusters_gpudevice d JOIN clusters_node n ON n.id = d.node_id
        WHERE d.cluster_id = ANY(%s::bigint[]) {models}
    """.format(models="AND d.model = ANY(%s::text[])" if request.models else "")
    params: list = [_int_array(cluster_ids)]
    if request.models:
        params.append(list(request.models))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        healthy, free, max_free_mib = cursor.fetchone()
    gpus = f"{healthy} healthy GPU(s) on ready nodes, {free} with nothing on them, at most {max_free_mib} MiB free on one GPU"
    if request.sized and choose(request=dataclasses.replace(request, cpu=None, memory_gib=None), cluster_ids=cluster_ids) is not None:
        return f"{gpus}; {_room_shortfall(request=request, cluster_ids=cluster_ids)}"
    return gpus


#: The most CPU (millicores) and memory (MiB) left on one ready node of the clusters (nodes with allocatable figures).
_ROOM_SQL = """
SELECT MAX(n.cpu_allocatable_millicores - n.cpu_requested_millicores - u.cpu),
       MAX(n.memory_allocatable_mib - n.memory_requested_mib - u.memory)
FROM clusters_node n
CROSS JOIN LATERAL (
    SELECT COALESCE(SUM(CEIL(s.cpu * 1000)), 0) AS cpu, COALESCE(SUM(CEIL(s.memory_gib * 1024)), 0) AS memory
    FROM gpu_sessions_session s
    WHERE s.id IN (SELECT a.session_id FROM gpu_sessions_allocation a JOIN clusters_gpudevice ad ON ad.id = a.device_id
                   WHERE ad.node_id = n.id)
) u
WHERE n.cluster_id = ANY(%s::bigint[]) AND n.ready
"""


def _room_shortfall(*, request: Request, cluster_ids: list[int]) -> str:
    """What is short when the GPUs fit but not the CPU or memory: the request's, and the most left on one node."""
    with connection.cursor() as cursor:
        cursor.execute(_ROOM_SQL, [_int_array(cluster_ids)])
        cpu_left, memory_left = cursor.fetchone()
    asked, left = [], []
    if request.cpu is not None:
        asked.append(f"{request.cpu.normalize():f} CPU core(s)")
        if cpu_left is not None:
            left.append(f"{Decimal(max(cpu_left, 0)) / 1000:f} CPU core(s)")
    if request.memory_gib is not None:
        asked.append(f"{request.memory_gib.normalize():f} GiB of memory")
        if memory_left is not None:
            left.append(f"{(Decimal(max(memory_left, 0)) / 1024).quantize(Decimal('0.001')).normalize():f} GiB of memory")
    most = f" (at most {' and '.join(left)} left on one node)" if left else ""
    return (f"CPU or memory is short: the GPUs asked are free, but no node that has them has room for {' and '.join(asked)}"
            f"{most}; ask for less cpu or memory_gib")


#: Most volumes one session may mount.
MAX_VOLUMES = 8


def _move_hint(volume) -> str:
    return f"`POST /api/v1/storage/volumes/{volume.public_id}/move`"


def _pool_clusters(pool) -> frozenset[int] | None:
    """Cluster pks that may use ``pool`` (``storage.capacity.pool_clusters``), or None for a pool shared
    with all (no restriction, and no query). Reads ``pool.allowed_clusters`` (prefetch it)."""
    if pool.sharing == StoragePool.Sharing.ALL:
        return None
    return frozenset(pool_clusters(pool))


def volume_clusters(*, volumes, pinned=None) -> frozenset[int] | None:
    """The clusters a session mounting ``volumes`` may be placed on, or None when they do not restrict it.

    Given volumes with ``cluster``, ``pool``, ``pool.cluster`` and ``pool.allowed_clusters`` loaded
    (``sessions.selectors.session_volumes``): no query when every volume is bound, else one (where
    their pools are usable). ``session_create`` filters its candidate clusters with the result before
    locking them, so the fit query and the locks are those of any placement.

    Rules: a volume whose PVC is on cluster A (``Volume.cluster``) keeps the session on A; every
    volume's pool must be shared with the session's cluster (the pool's own cluster, sharing
    ``all``, or one of its ``allowed_clusters``); and a volume not bound yet (its PVC is still to be
    provisioned) only goes where its pool's StorageClass exists (``pools_usability``).

    Args:
        volumes: the session's volumes.
        pinned: the ``Cluster`` the request pinned, or None.

    Returns:
        The allowed cluster pks (at most ``{pinned.pk}`` when pinned), or None for "any cluster".

    Raises:
        Conflict: 409 ``volumes_on_different_clusters`` (two volumes held by different clusters);
            409 ``volume_on_another_cluster`` (pinned to B, a volume is on A: the detail names A and
            the fix); 409 ``volume_pool_not_shared`` (no cluster the session could use may use the
            pool of one of its volumes; the detail names the pool); 409 ``volume_not_mountable`` (the
            pool's StorageClass is missing on every cluster the session could use: the detail names them,
            the class and the fix).
    """
    holders: dict[int, object] = {}
    for volume in sorted(volumes, key=lambda v: v.name):
        if volume.cluster_id is not None:
            holders.setdefault(volume.cluster_id, volume)
    if len(holders) > 1:
        where = "; ".join(f"{v.name} ({v.public_id}) on {v.cluster.name} ({v.cluster.public_id})" for v in holders.values())
        raise Conflict(
            f"These volumes are held by different clusters and a session runs on one: {where}. Move them onto one "
            f"cluster first ({_move_hint(next(iter(holders.values())))}), or mount them in separate sessions.",
            code=VOLUMES_ON_DIFFERENT_CLUSTERS,
        )
    allowed: frozenset[int] | None = None
    scope = "any cluster"
    if holders:
        ((holder_id, volume),) = holders.items()
        held = volume.cluster
        if pinned is not None and pinned.pk != holder_id:
            raise Conflict(
                f"Volume {volume.name} ({volume.public_id}) is on cluster {held.name} ({held.public_id}), so sessions that "
                f"mount it run there: pin the session to {held.name} (`\"cluster\": \"{held.public_id}\"`) or leave "
                f"`cluster` out, or move the volume to {pinned.name} first ({_move_hint(volume)}).",
                code=VOLUME_ON_ANOTHER_CLUSTER,
            )
        allowed, scope = frozenset({holder_id}), f"cluster {held.name} ({held.public_id}), which holds volume {volume.name}"
    elif pinned is not None:
        allowed, scope = frozenset({pinned.pk}), f"cluster {pinned.name} ({pinned.public_id})"
    # Only volumes whose PVC is still to be provisioned (or is stuck) need their pool's StorageClass where they go.
    unbound: dict[int, object] = {}
    for volume in sorted(volumes, key=lambda v: v.name):
        if volume.status != Volume.Status.BOUND:
            unbound.setdefault(volume.pool_id, volume)
    usability = pools_usability(v.pool for v in unbound.values()) if unbound else {}
    seen: set[int] = set()
    for volume in sorted(volumes, key=lambda v: v.name):
        pool = volume.pool
        if pool.pk in seen:
            continue
        seen.add(pool.pk)
        shared = _pool_clusters(pool)
        if shared is None:
            allowed = _mountable(unbound.get(pool.pk), usability.get(pool.pk), allowed, scope)
            continue
        narrowed = shared if allowed is None else allowed & shared
        if not narrowed:
            users = sorted({pool.cluster.name, *(c.name for c in pool.allowed_clusters.all() if c.pk in shared)})
            raise Conflict(
                f"Storage pool {pool.name} ({pool.public_id}) of volume {volume.name} ({volume.public_id}) is not shared with "
                f"{scope}; it may be used by {', '.join(users)}. Start the session on one of those, or ask an administrator "
                f"to share the pool (`PATCH /api/v1/storage/pools/{pool.public_id}`).",
                code=VOLUME_POOL_NOT_SHARED,
            )
        allowed, scope = _mountable(unbound.get(pool.pk), usability.get(pool.pk), narrowed, scope), f"the clusters pool {pool.name} is shared with"
    return allowed


def _mountable(volume, usability, allowed: frozenset[int] | None, scope: str) -> frozenset[int] | None:
    """``allowed`` without the clusters that lack the StorageClass of ``volume``'s pool (``volume``: the first
    volume of that pool not bound yet, ``usability`` its pool's ``PoolUsability``; both None when every volume of
    the pool is bound). Raises 409 ``volume_not_mountable`` when no cluster is left."""
    if usability is None or not usability.unusable:
        return allowed
    unusable = usability.unusable
    base = allowed if allowed is not None else usability.usable_ids | frozenset(unusable)
    kept = base - frozenset(unusable)
    if kept:
        return kept
    pool = volume.pool
    lacking = [unusable[pk] for pk in sorted(base, key=lambda pk: unusable[pk].cluster.name)]
    names = ", ".join(u.cluster.name for u in lacking)
    elsewhere = sorted(u.cluster.name for u in usability.uses if u.usable)
    if volume.cluster_id is not None:
        fix = (f"its PVC on {volume.cluster.name} cannot be provisioned there: delete the volume "
               f"(`DELETE /api/v1/storage/volumes/{volume.public_id}`) and create it on a pool usable elsewhere")
    elif elsewhere:
        fix = f"start the session on {', '.join(elsewhere)} (`\"cluster\"`) or leave `cluster` out"
    else:
        fix = "use a volume on another pool (`GET /api/v1/storage/pools` shows each pool's usable_on)"
    raise Conflict(
        f"Volume {volume.name} ({volume.public_id}) is on storage pool {pool.name} ({pool.public_id}), whose StorageClass "
        f"{pool.storage_class} does not exist on {scope}: {'; '.join(u.reason for u in lacking[:3])}. Its PVC would wait there "
        f"forever. Fix: {fix}, or ask an administrator to create StorageClass {pool.storage_class} on {names} (docs/storage.md).",
        code=VOLUME_NOT_MOUNTABLE,
        extra={"clusters": [u.cluster.public_id for u in lacking[:10]], "storage_class": pool.storage_class},
    )
