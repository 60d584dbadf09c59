"""Reserving the GPUs the queue's plan chose for several sessions at once (``planned_reserve``), for a pass that admits
them together (``sessions.queue.admit``).

``placement.reserve`` finds and reserves one session's GPUs in one statement; here the GPUs are already chosen, so the
fit is checked in Python on their counters read under the clusters' row locks (the same rules as the plan's,
``sessions.queue.plan.fits_now``, which are placement's), one session after the other as if each had been reserved
alone, and every allocation is then written in one statement and the nodes recounted in another
(``placement.usage_recompute``). Under those locks nothing else changes the counters, so the check is exact; the
recount's over-capacity answer is the safety net.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from billing.pricing import share_cores
from sessions import placement, resources
from sessions.models import Allocation, Session
from sessions.queue.plan import Device, Outcome, fits_now
from sessions.volume_claims import PlacementRaced

#: The chosen GPUs with their counters, whether they and their node can take sessions, and the CPU (millicores) and
#: memory (MiB) left on their node for sessions (placement's ``_RESOURCE_FIT``: allocatable less the other pods' requests
#: less the sessions holding GPUs there; NULL when the node reports no allocatable figures: no limit).
_CHOSEN_SQL = """
SELECT d.id, d.node_id, d.cluster_id, n.name, d.model, d.memory_mib, d.cores, d.split_count, d.used_count, d.used_memory_mib,
       d.used_cores, d.used_exclusive, d.health AND n.ready,
       n.cpu_allocatable_millicores - n.cpu_requested_millicores - COALESCE(r.cpu, 0),
       n.memory_allocatable_mib - n.memory_requested_mib - COALESCE(r.ram, 0)
FROM clusters_gpudevice d
JOIN clusters_node n ON n.id = d.node_id
LEFT JOIN LATERAL (
    SELECT SUM(CEIL(s.cpu * 1000))::bigint AS cpu, SUM(CEIL(s.memory_gib * 1024))::bigint AS ram
    FROM gpu_sessions_session s
    WHERE s.id IN (SELECT a.session_id FROM gpu_sessions_allocation a JOIN clusters_gpudevice ad ON ad.id = a.device_id
                   WHERE ad.node_id = n.id)
) r ON TRUE
WHERE d.id = ANY(%(devices)s::bigint[])
"""


#: The allocations, one array per column (Django's ``bulk_create`` builds the same INSERT at several times the cost).
_INSERT_SQL = f"""
INSERT INTO {Allocation._meta.db_table} (session_id, device_id, memory_mib, cores, exclusive)
SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::int[], %s::int[], %s::boolean[])
"""


@dataclass
class Reserved:
    """What ``planned_reserve`` reserved for one session: its node's name and, for a share, the most cores reserved on one
    of its GPUs (its ``gpu_cores`` from now on, as ``placement.reserve`` sets it; None for whole GPUs)."""

    node_name: str
    cores: int | None


def planned_reserve(items: list[tuple[Session, Outcome]]) -> dict[int, Reserved]:
    """Reserve for each locked session the node and GPUs its ``Outcome`` names. Call it holding the row locks of their
    clusters (and sessions). Three statements whatever the number of sessions.

    Args:
        items: ``[(session, outcome)]``: queued sessions, locked, and the plan's choice for each.

    Returns:
        ``{session pk: Reserved}``.

    Raises:
        PlacementRaced: a chosen GPU no longer fits its session (taken, unhealthy, its node not ready or without room for
            the CPU and memory, moved), an outcome does not name ``gpus`` distinct GPUs of its node, or a share would take
            more cores than ``_judge`` priced it at on the plan's GPUs (their split count was lowered since the plan
            read them): nothing is written by this call; the caller rolls back its transaction.
    """
    wanted = sorted({d.pk for _, outcome in items for d in outcome.devices})
    with connection.cursor() as cursor:
        cursor.execute(_CHOSEN_SQL, {"devices": wanted})
        rows = cursor.fetchall()
    devices, where, room = {}, {}, {}
    for (pk, node, cluster, name, model, memory, cores, split, used, used_memory, used_cores, exclusive, usable, cpu, ram) in rows:
        if usable:
            devices[pk] = Device(pk=pk, model=model, memory_mib=memory, cores=cores, split_count=split, used_count=used,
                                 used_memory_mib=used_memory, used_cores=used_cores, used_exclusive=exclusive)
            where[pk] = (node, cluster, name)
            room[node] = [cpu, ram]
    allocations, reserved = [], {}
    for session, outcome in items:
        whole = session.whole_gpus
        models = frozenset(session.gpu_models or ())
        cpu, ram = resources.cpu_millicores(session.cpu), resources.memory_mib(session.memory_gib)
        chosen = [devices.get(d.pk) for d in outcome.devices]
        # Distinct GPUs: one named twice would pass the fit below twice on the same counters (the SQL reservation
        # takes distinct GPUs), then break the allocations' (session, device) constraint: not a race the pass handles.
        if len({d.pk for d in outcome.devices}) != session.gpus or len(chosen) != session.gpus or any(
                d is None or where[d.pk][:2] != (outcome.node.pk, outcome.node.cluster_id) or (models and d.model not in models)
                for d in chosen):
            raise PlacementRaced
        left = room[outcome.node.pk]
        # Placement's rule (``_RESOURCE_FIT``): a session asking CPU or memory needs room for both, 0 for the one it
        # does not ask (a node already over its CPU takes no memory-only session); one asking neither is not checked.
        if cpu is not None or ram is not None:
            if (left[0] is not None and left[0] < (cpu or 0)) or (left[1] is not None and left[1] < (ram or 0)):
                raise PlacementRaced
        job = _Ask(gpus=session.gpus, memory_mib=session.gpu_memory_mib, cores=session.gpu_cores, whole=whole)
        if not all(fits_now(d, job) for d in chosen):
            raise PlacementRaced
        # A session asking none leaves the room as it is (None is "no limit", not "nothing asked").
        left[0] = left[0] if left[0] is None or cpu is None else left[0] - cpu
        left[1] = left[1] if left[1] is None or ram is None else left[1] - ram
        taken = []
        for device in chosen:
            memory = device.memory_mib if whole or session.gpu_memory_mib is None else session.gpu_memory_mib
            cores = device.cores if whole else share_cores(gpu_cores=session.gpu_cores, split_count=device.split_count)
            device.used_count += 1
            device.used_memory_mib += memory
            device.used_cores += cores
            device.used_exclusive = device.used_exclusive or whole
            allocations.append((session.pk, device.pk, memory, cores, whole))
            taken.append(cores)
        if not whole and max(taken) > priced_cores(session, outcome):
            raise PlacementRaced  # the split count dropped since the plan: priced again on the next pass's plan
        reserved[session.pk] = Reserved(node_name=where[chosen[0].pk][2], cores=None if whole else max(taken))
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_SQL, [list(column) for column in zip(*allocations, strict=True)])
    over = placement.usage_recompute(node_ids={where[pk][0] for pk in devices})
    if set(over) & {device_id for _, device_id, *_ in allocations}:
        raise PlacementRaced
    return reserved


def priced_cores(session: Session, outcome: Outcome) -> int | None:
    """The cores per GPU a share is admitted at (``sessions.queue.admit._judge``): its split slot on the plan's GPUs
    (``share_cores``, on the split counts the plan read), at most what its reservation may take; None for whole GPUs."""
    if session.whole_gpus:
        return None
    return max(share_cores(gpu_cores=session.gpu_cores, split_count=d.split_count) for d in outcome.devices)


@dataclass(frozen=True)
class _Ask:
    """A session's request as ``fits_now`` reads it (``sessions.queue.plan.Job``'s fit fields)."""

    gpus: int
    memory_mib: int | None
    cores: int | None
    whole: bool
