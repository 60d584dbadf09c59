"""Placement: choosing the cluster, node and GPUs for a session request, in one SQL query.

Capacity is the inventory (``clusters.GpuDevice``: HAMi's registered memory in MiB, core capacity in
percent, split count) minus the live reservations (``sessions.Allocation``), with HAMi's sharing
semantics (HAMi ``pkg/scheduler`` fit rules, 2.x):

* a device with split count N hosts at most N sessions;
* memory and cores per device are never over-committed;
* a whole-GPU request (neither memory nor cores asked) needs a device with nothing on it, and then
  holds it alone; a shared request with no memory takes the device's whole memory (HAMi's default,
  ``nvidia.com/gpumem`` unset = 100 %);
* all GPUs of one session are on one node (HAMi allocates a container's vGPUs on one node).

Policies: ``binpack`` (default) fills the busiest node and GPUs first, ``spread`` the idlest. Ties
break on cluster name, node name and GPU index, so the same state gives the same decision.
The caller holds row locks on the candidate clusters (see ``sessions.services.session_create``).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection


@dataclass(frozen=True)
class Request:
    """What a session asks for.

    Attributes:
        gpus: number of GPUs (vGPUs), >= 1.
        memory_mib: MiB per GPU, or None (whole GPU when ``cores`` is None too, else the device's memory).
        cores: percent of one GPU per GPU, or None.
    """

    gpus: int
    memory_mib: int | None = None
    cores: int | None = None

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


_FIT_SQL = """
WITH usage AS (
    SELECT a.device_id, COUNT(*) AS n, SUM(a.memory_mib) AS mem, SUM(a.cores) AS cores, BOOL_OR(a.exclusive) AS excl
    FROM gpu_sessions_allocation a
    JOIN clusters_gpudevice d0 ON d0.id = a.device_id
    WHERE d0.cluster_id = ANY(%(clusters)s)
    GROUP BY a.device_id
),
node_load AS (
    SELECT d1.node_id, COUNT(*) AS load
    FROM gpu_sessions_allocation a1
    JOIN clusters_gpudevice d1 ON d1.id = a1.device_id
    WHERE d1.cluster_id = ANY(%(clusters)s)
    GROUP BY d1.node_id
),
fit AS (
    SELECT d.id, d.node_id, d.cluster_id, d.index, d.memory_mib, d.cores, COALESCE(u.n, 0) AS used
    FROM clusters_gpudevice d
    JOIN clusters_node n ON n.id = d.node_id
    LEFT JOIN usage u ON u.device_id = d.id
    WHERE d.cluster_id = ANY(%(clusters)s) AND d.health AND n.ready
      AND (
        (%(whole)s AND u.device_id IS NULL)
        OR (NOT %(whole)s
            AND NOT COALESCE(u.excl, FALSE)
            AND COALESCE(u.n, 0) < d.split_count
            AND COALESCE(u.mem, 0) + COALESCE(%(mem)s, d.memory_mib) <= d.memory_mib
            AND COALESCE(u.cores, 0) + %(cores)s <= d.cores)
      )
)
SELECT f.cluster_id, f.node_id, n.name,
       array_agg(f.id ORDER BY {device_order}),
       array_agg(f.memory_mib ORDER BY {device_order}),
       array_agg(f.cores ORDER BY {device_order})
FROM fit f
JOIN clusters_node n ON n.id = f.node_id
JOIN clusters_cluster c ON c.id = f.cluster_id
LEFT JOIN node_load l ON l.node_id = f.node_id
GROUP BY f.cluster_id, f.node_id, n.name, c.name, l.load
HAVING COUNT(*) >= %(gpus)s
ORDER BY COALESCE(l.load, 0) {node_direction}, c.name, n.name
LIMIT 1
"""

_POLICIES = {
    "binpack": {"device_order": "f.used DESC, f.index, f.id", "node_direction": "DESC"},
    "spread": {"device_order": "f.used ASC, f.index, f.id", "node_direction": "ASC"},
}


def choose(*, request: Request, cluster_ids: list[int], policy: str = "binpack") -> Choice | None:
    """Choose a node and GPUs among ``cluster_ids`` for ``request``, or None when nothing fits now.

    One SQL query, whatever the fleet's size.

    Raises:
        ValueError: unknown ``policy``.
    """
    if policy not in _POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}: use binpack or spread")
    if not cluster_ids:
        return None
    sql = _FIT_SQL.format(**_POLICIES[policy])
    params = {
        "clusters": list(cluster_ids),
        "whole": request.whole,
        "mem": request.memory_mib,
        "cores": request.cores or 0,
        "gpus": request.gpus,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    cluster_id, node_id, node_name, ids, memories, cores = row
    devices = []
    for device_id, device_memory, device_cores in list(zip(ids, memories, cores, strict=True))[: request.gpus]:
        if request.whole:
            devices.append((device_id, device_memory, device_cores))
        else:
            devices.append((device_id, request.memory_mib if request.memory_mib is not None else device_memory, request.cores or 0))
    return Choice(cluster_id=cluster_id, node_id=node_id, node_name=node_name, devices=devices)


def shortfall(*, request: Request, cluster_ids: list[int]) -> str:
    """A sentence saying what the candidate clusters lack for ``request`` (for ``no_capacity``)."""
    if not cluster_ids:
        return "no connected cluster with a session_domain can host sessions now"
    sql = """
        SELECT COUNT(*) FILTER (WHERE d.health AND n.ready),
               COUNT(*) FILTER (WHERE d.health AND n.ready AND NOT EXISTS (
                   SELECT 1 FROM gpu_sessions_allocation a WHERE a.device_id = d.id)),
               COALESCE(MAX(d.memory_mib - COALESCE((
                   SELECT SUM(a.memory_mib) FROM gpu_sessions_allocation a WHERE a.device_id = d.id), 0))
                   FILTER (WHERE d.health AND n.ready), 0)
        FROM clusters_gpudevice d JOIN clusters_node n ON n.id = d.node_id
        WHERE d.cluster_id = ANY(%s)
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(cluster_ids)])
        healthy, free, max_free_mib = cursor.fetchone()
    return (
        f"{healthy} healthy GPU(s) on ready nodes, {free} with nothing on them, at most {max_free_mib} MiB free on one GPU"
    )
