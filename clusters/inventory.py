"""The set-based SQL of an inventory snapshot (``clusters.services.inventory_apply``): staging, upserts, removals.

A snapshot is COPYed into two per-connection temporary tables (nodes, GPUs) and moved into ``clusters_node`` and
``clusters_gpudevice`` by one statement each, which write only the rows whose reported values changed: a snapshot
that changes nothing writes no node or GPU row. The statements touch only the reporting cluster's rows, except
where a GPU UUID is already another cluster's: the UUID's unique index and the upsert's ``WHERE`` refuse to move it
(``device_upsert`` says how many rows it could not write), so snapshots of different clusters never wait for each
other unless they report the same UUID.

The foreign keys of these tables are deferred, so the statements need no order among themselves beyond the one in
``clusters.services.inventory_apply``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from datetime import datetime

from clusters.models import GpuDevice, Node
from contract import GPU_MODE_LABEL

#: The snapshot's nodes and GPUs, per connection, emptied at every commit (and gone with a rollback). Created in
#: every snapshot's transaction rather than remembered per connection: a pooler in transaction mode may hand each
#: transaction another server session. Emptied first too: a snapshot applied inside a caller's transaction (a test)
#: has not committed the one before.
_STAGING_DDL = """
    CREATE TEMP TABLE IF NOT EXISTS inventory_node_staging (
        name text PRIMARY KEY, labels jsonb, gpu_mode text, ready boolean, inventory_error text,
        cpu_allocatable_millicores bigint, memory_allocatable_mib bigint, cpu_requested_millicores bigint, memory_requested_mib bigint
    ) ON COMMIT DELETE ROWS;
    CREATE TEMP TABLE IF NOT EXISTS inventory_device_staging (
        uuid text PRIMARY KEY, node text, index integer, model text, memory_mib integer, split_count integer, cores integer,
        health boolean, mode text
    ) ON COMMIT DELETE ROWS;
    DELETE FROM inventory_node_staging;
    DELETE FROM inventory_device_staging"""

#: ``Node.gpu_mode``'s length: the node's ``GPU_MODE_LABEL`` value is cut to it.
_GPU_MODE_LENGTH = Node._meta.get_field("gpu_mode").max_length

_NODE_COLUMNS = ("name", "labels", "gpu_mode", "ready", "inventory_error", "cpu_allocatable_millicores", "memory_allocatable_mib",
                 "cpu_requested_millicores", "memory_requested_mib")
_DEVICE_COLUMNS = ("uuid", "node", "index", "model", "memory_mib", "split_count", "cores", "health", "mode")

#: Nodes of the snapshot: new ones inserted, changed ones (values, or back from missing) updated, the rest untouched.
#: ``last_seen_at`` is written with the values (when the node was last reported *different*); while a node is listed,
#: the time it was last reported is its cluster's ``last_heartbeat_at`` (``clusters.models.Node.reported_at``).
_NODE_UPSERT = """
    INSERT INTO clusters_node (cluster_id, cluster_name, name, labels, gpu_mode, ready, inventory_error, cpu_allocatable_millicores,
                               memory_allocatable_mib, cpu_requested_millicores, memory_requested_mib, last_seen_at, missing_since)
    SELECT %(cluster)s, %(cluster_name)s, s.name, s.labels, s.gpu_mode, s.ready, s.inventory_error, s.cpu_allocatable_millicores,
           s.memory_allocatable_mib, s.cpu_requested_millicores, s.memory_requested_mib, %(now)s, NULL
      FROM inventory_node_staging s
    ON CONFLICT (cluster_id, name) DO UPDATE
       SET cluster_name = EXCLUDED.cluster_name, labels = EXCLUDED.labels, gpu_mode = EXCLUDED.gpu_mode, ready = EXCLUDED.ready,
           inventory_error = EXCLUDED.inventory_error, cpu_allocatable_millicores = EXCLUDED.cpu_allocatable_millicores,
           memory_allocatable_mib = EXCLUDED.memory_allocatable_mib, cpu_requested_millicores = EXCLUDED.cpu_requested_millicores,
           memory_requested_mib = EXCLUDED.memory_requested_mib, last_seen_at = EXCLUDED.last_seen_at, missing_since = NULL
     WHERE (clusters_node.cluster_name, clusters_node.labels, clusters_node.gpu_mode, clusters_node.ready,
            clusters_node.inventory_error, clusters_node.cpu_allocatable_millicores, clusters_node.memory_allocatable_mib,
            clusters_node.cpu_requested_millicores, clusters_node.memory_requested_mib, clusters_node.missing_since IS NULL)
           IS DISTINCT FROM (EXCLUDED.cluster_name, EXCLUDED.labels, EXCLUDED.gpu_mode, EXCLUDED.ready, EXCLUDED.inventory_error,
                             EXCLUDED.cpu_allocatable_millicores, EXCLUDED.memory_allocatable_mib, EXCLUDED.cpu_requested_millicores,
                             EXCLUDED.memory_requested_mib, TRUE)"""

#: GPUs of the snapshot, on their nodes (upserted by ``_NODE_UPSERT`` before). ``changed`` is every staged GPU that is
#: not already stored exactly so for this cluster: new, changed, back from missing, or another cluster's (compared with
#: this cluster's rows only, so the cost follows the cluster's size, not the fleet's: another cluster's UUID looks new
#: here and is caught by the conflict below). The upsert
#: writes them in UUID order (two clusters claiming the same UUIDs lock them in the same order: no deadlock) and
#: never takes a row of another cluster (``WHERE ... cluster_id = EXCLUDED.cluster_id``), also one another cluster
#: inserted and committed while this statement waited on it. Answers (rows to write, rows written): equal unless a
#: UUID is another cluster's. Never the usage counters (``used_*``): they belong to placement and the reservations.
_DEVICE_UPSERT = """
    WITH changed AS (
        SELECT n.id AS node_id, s.*
          FROM inventory_device_staging s
          JOIN clusters_node n ON n.cluster_id = %(cluster)s AND n.name = s.node
          LEFT JOIN clusters_gpudevice d ON d.uuid = s.uuid AND d.cluster_id = %(cluster)s
         WHERE d.id IS NULL
            OR (d.cluster_id, d.node_id, d.index, d.model, d.memory_mib, d.split_count, d.cores, d.health, d.mode, d.missing_since IS NULL)
               IS DISTINCT FROM (%(cluster)s, n.id, s.index, s.model, s.memory_mib, s.split_count, s.cores, s.health, s.mode, TRUE)
    ),
    written AS (
        INSERT INTO clusters_gpudevice
            (node_id, cluster_id, uuid, index, model, memory_mib, split_count, cores, health, mode, last_seen_at, missing_since)
        SELECT node_id, %(cluster)s, uuid, index, model, memory_mib, split_count, cores, health, mode, %(now)s, NULL
          FROM changed ORDER BY uuid
        ON CONFLICT (uuid) DO UPDATE
           SET node_id = EXCLUDED.node_id, index = EXCLUDED.index, model = EXCLUDED.model, memory_mib = EXCLUDED.memory_mib,
               split_count = EXCLUDED.split_count, cores = EXCLUDED.cores, health = EXCLUDED.health, mode = EXCLUDED.mode,
               last_seen_at = EXCLUDED.last_seen_at, missing_since = NULL
         WHERE clusters_gpudevice.cluster_id = EXCLUDED.cluster_id
        RETURNING 1
    )
    SELECT (SELECT COUNT(*) FROM changed), (SELECT COUNT(*) FROM written)"""

#: Up to five staged UUIDs another cluster owns (after ``_DEVICE_UPSERT`` found some: the refusal names them).
_FOREIGN = """
    SELECT d.uuid FROM clusters_gpudevice d JOIN inventory_device_staging s ON s.uuid = d.uuid
     WHERE d.cluster_id <> %(cluster)s ORDER BY d.uuid LIMIT 5"""

#: What an inventory does with the nodes and GPUs of the cluster that the snapshot left out. A GPU a live session
#: holds (a reservation of placement, or HAMi's allocation as the operator reported it in ``Session.devices``) is kept,
#: marked missing (``health`` false, so placement passes over it; its ``used_*`` counters untouched, as its
#: reservations are; ``last_seen_at`` the cluster's previous report, the last that listed it); every other one is
#: deleted, with any reservation of an ended session left on it. A node is kept (not ready) while it has a kept GPU,
#: else deleted. The GPUs a snapshot moved off a node were moved by the upsert before this runs. One statement (the
#: query count stays constant); the foreign keys are deferred, so the deletes need no order. Built from the models on
#: first use (``clusters`` does not import ``sessions``: the relation reaches it).
_MISSING_SQL = """
WITH gone AS (
    SELECT d.id, d.node_id,
           EXISTS (SELECT 1 FROM {allocation} a JOIN {session} s ON s.id = a.session_id
                    WHERE a.device_id = d.id AND s.phase <> ALL(%(final)s::text[]))
           OR EXISTS (SELECT 1 FROM {session} s
                       WHERE s.cluster_id = %(cluster)s AND s.phase <> ALL(%(final)s::text[])
                         AND jsonb_typeof(s.devices) = 'array' AND s.devices ? d.uuid) AS held
      FROM clusters_gpudevice d
     WHERE d.cluster_id = %(cluster)s AND NOT EXISTS (SELECT 1 FROM inventory_device_staging s WHERE s.uuid = d.uuid)
),
gone_nodes AS (
    SELECT n.id, EXISTS (SELECT 1 FROM gone g WHERE g.node_id = n.id AND g.held) AS held
      FROM clusters_node n
     WHERE n.cluster_id = %(cluster)s AND NOT EXISTS (SELECT 1 FROM inventory_node_staging s WHERE s.name = n.name)
),
stale AS (DELETE FROM {allocation} a USING gone g WHERE a.device_id = g.id AND NOT g.held),
gpus_removed AS (DELETE FROM clusters_gpudevice d USING gone g WHERE d.id = g.id AND NOT g.held RETURNING d.id),
gpus_kept AS (
    UPDATE clusters_gpudevice d SET health = FALSE, missing_since = COALESCE(d.missing_since, %(now)s),
           last_seen_at = CASE WHEN d.missing_since IS NULL THEN COALESCE(%(seen)s, d.last_seen_at) ELSE d.last_seen_at END
      FROM gone g WHERE d.id = g.id AND g.held AND (d.health OR d.missing_since IS NULL)
),
nodes_removed AS (DELETE FROM clusters_node n USING gone_nodes g WHERE n.id = g.id AND NOT g.held RETURNING n.id),
nodes_kept AS (
    UPDATE clusters_node n SET ready = FALSE, missing_since = COALESCE(n.missing_since, %(now)s),
           last_seen_at = CASE WHEN n.missing_since IS NULL THEN COALESCE(%(seen)s, n.last_seen_at) ELSE n.last_seen_at END
      FROM gone_nodes g WHERE n.id = g.id AND g.held AND (n.ready OR n.missing_since IS NULL)
)
SELECT (SELECT COUNT(*) FROM nodes_removed), (SELECT COUNT(*) FROM gpus_removed),
       (SELECT COUNT(*) FROM gone_nodes WHERE held), (SELECT COUNT(*) FROM gone WHERE held)
"""


@functools.cache
def _missing_statement() -> tuple[str, tuple[str, ...]]:
    """``_MISSING_SQL`` with the reservation and session tables filled in, and the final session phases."""
    allocation = GpuDevice._meta.get_field("allocations").related_model
    session = allocation._meta.get_field("session").related_model
    sql = _MISSING_SQL.format(allocation=allocation._meta.db_table, session=session._meta.db_table)
    return sql, tuple(str(phase) for phase in session.TERMINAL_PHASES)


def _copy(cursor, table: str, columns: tuple[str, ...], rows: Iterable[tuple]) -> None:
    """``COPY table (columns) FROM STDIN`` the tuples ``rows`` (psycopg's ``cursor.copy()``)."""
    with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        write = copy.write_row
        for row in rows:
            write(row)


def stage(cursor, nodes: list[dict]) -> int:
    """COPY a validated snapshot's nodes and GPUs into this transaction's staging tables; return the GPU count.

    Args:
        cursor: a Django cursor inside the snapshot's transaction.
        nodes: ``{"name", "labels"?, "ready", "hami_error"?, "devices": [{"uuid", "index", "model", "memory_mib",
            "split_count", "cores", "health", "mode"?}]}`` and the CPU/memory figures, optional
            (``contract.INVENTORY_RESOURCE_FIELDS``) (``clusters.internal.schemas``).
    """
    cursor.execute(_STAGING_DDL)
    dumps = json.dumps
    # Cut to their columns' lengths: a label value is any string (the schema bounds none), an error any length.
    _copy(cursor, "inventory_node_staging", _NODE_COLUMNS, (
        (node["name"], dumps(labels := node.get("labels") or {}), labels.get(GPU_MODE_LABEL, "")[:_GPU_MODE_LENGTH], bool(node["ready"]),
         (node.get("hami_error") or "")[:500], *_resources(node))
        for node in nodes
    ))
    # int(): the schema's integers include integral floats (``1.0``, ``8.1559e4``), which COPY's text would refuse.
    devices = [
        (device["uuid"], node["name"], int(device["index"]), device["model"], int(device["memory_mib"]), int(device["split_count"]),
         int(device["cores"]), bool(device["health"]), device.get("mode") or "")
        for node in nodes
        for device in node["devices"]
    ]
    _copy(cursor, "inventory_device_staging", _DEVICE_COLUMNS, devices)
    return len(devices)


def _resources(node: dict) -> tuple:
    """A node's ``(allocatable millicores, allocatable MiB, requested millicores, requested MiB)``: the allocatable ones
    None unless the snapshot has both (an older operator: no CPU or memory limit), the requested ones 0 when absent."""
    cpu, memory = node.get("cpu_allocatable_millicores"), node.get("memory_allocatable_mib")
    if cpu is None or memory is None:
        return None, None, 0, 0
    return int(cpu), int(memory), int(node.get("cpu_requested_millicores") or 0), int(node.get("memory_requested_mib") or 0)


def node_upsert(cursor, *, cluster_id: int, cluster_name: str, now: datetime) -> None:
    """Insert the staged nodes that are new and update the changed ones (``_NODE_UPSERT``)."""
    cursor.execute(_NODE_UPSERT, {"cluster": cluster_id, "cluster_name": cluster_name, "now": now})


def device_upsert(cursor, *, cluster_id: int, now: datetime) -> list[str]:
    """Insert the staged GPUs that are new and update the changed ones (``_DEVICE_UPSERT``).

    Returns:
        ``[]``, or up to five staged UUIDs that belong to another cluster: then nothing may be kept (the caller
        raises, rolling the transaction back), as some rows of the snapshot were not written.
    """
    cursor.execute(_DEVICE_UPSERT, {"cluster": cluster_id, "now": now})
    to_write, written = cursor.fetchone()
    if to_write == written:
        return []
    cursor.execute(_FOREIGN, {"cluster": cluster_id})
    return [row[0] for row in cursor.fetchall()]


def missing_apply(cursor, *, cluster_id: int, now: datetime, seen: datetime | None) -> tuple[int, int, int, int]:
    """Remove, or keep as missing, the cluster's nodes and GPUs not staged (``_MISSING_SQL``).

    Args:
        seen: the cluster's previous report (``last_heartbeat_at`` before this one), recorded as the ``last_seen_at``
            of what goes missing now.

    Returns:
        ``(nodes removed, GPUs removed, nodes kept missing, GPUs kept missing)``.
    """
    sql, final = _missing_statement()
    cursor.execute(sql, {"cluster": cluster_id, "final": list(final), "now": now, "seen": seen})
    return cursor.fetchone()
