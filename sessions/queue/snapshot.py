"""The database's picture for the queue's plan (``sessions.queue.plan``): the fleet's GPUs with when what holds them ends,
and the queued sessions in order.

A running session's end is the earliest of what the control plane knows will stop it: its time limit (``ends_at``),
the idle policy's coming stop (``SessionActivity.stops_at``, set while its warning runs) and its owner's credits
running out at the current burn (``billing.selectors.credits_last_until``); a session already stopping ends now.
What it cannot know: a session stopped early by its owner, a node that fails or joins, a session ahead cancelled, a
new session with a higher priority (docs/sessions.md, "Waiting in the queue").
"""

from __future__ import annotations

import collections
import itertools
import json
import operator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings

from billing import admission, pricing
from billing.selectors import credits_last_until
from core.exceptions import ApplicationError
from core.prepared import statement_cursor
from sessions import placement, resources, runtime, selectors
from sessions.models import Session
from sessions.queue.order import QUEUE_ORDER
from sessions.queue.plan import NEVER, Device, Fleet, Job, Node

#: Why a session ends when the plan counts on it (``Device.freed_by``), in the words ``waiting_for`` uses.
TIME_LIMIT = "reaches its time limit"
IDLE_STOP = "is stopped as idle"
#: (Worded as any planned end: another user reads it, and their credits are theirs to know.)
CREDITS_OUT = "is expected to end"
STOPPING = "is stopping"

#: The ready nodes of the clusters that take sessions, with the CPU (millicores) and memory (MiB) left on them.
_NODES_SQL = """
SELECT n.id, n.name, n.cluster_id, n.cluster_name, n.load,
       n.cpu_allocatable_millicores - n.cpu_requested_millicores, n.memory_allocatable_mib - n.memory_requested_mib
FROM clusters_node n
JOIN clusters_cluster c ON c.id = n.cluster_id
WHERE n.ready AND c.status = 'connected' AND c.session_domain <> ''
"""

#: The healthy GPUs, in ``Device``'s field order (the rows are its arguments); those of other nodes than
#: ``_NODES_SQL``'s are skipped as read. Neither joined nor ordered here: a scan of the table costs a third of the
#: join and sort of it on a fleet of 80,000 GPUs (``bench/queue.py``); each node's few are put in order as read.
_DEVICES_SQL = """
SELECT d.id, d.model, d.memory_mib, d.cores, d.split_count, d.used_count, d.used_memory_mib, d.used_cores, d.used_exclusive,
       d.node_id, d.index
FROM clusters_gpudevice d
WHERE d.health
"""

#: The sessions holding GPUs: what ends them (time limit, idle stop, owner: with the owner's balance and usage not billed
#: yet, for when their credits run out), what they asked per GPU and the GPUs they hold (their models, memory and node
#: come from ``_DEVICES_SQL``'s rows, or ``_OUTSIDE_SQL``'s). Times as ``_QUEUED_SQL``'s. The allocations are grouped
#: before the join, and not joined to the GPUs: 80,000 rows hashed, not sorted.
_HOLDERS_SQL = """
SELECT s.public_id, s.phase, (EXTRACT(EPOCH FROM s.ends_at) * 1000000)::bigint, (EXTRACT(EPOCH FROM act.stops_at) * 1000000)::bigint,
       s.owner_id, s.gpu_memory_mib, s.gpu_cores, g.device_ids, CEIL(s.cpu * 1000)::bigint, CEIL(s.memory_gib * 1024)::bigint,
       acc.balance, acc.accrued
FROM (SELECT a.session_id, array_agg(a.device_id ORDER BY a.device_id) AS device_ids
        FROM gpu_sessions_allocation a
       GROUP BY a.session_id) g
JOIN gpu_sessions_session s ON s.id = g.session_id
LEFT JOIN gpu_sessions_sessionactivity act ON act.session_id = s.id
LEFT JOIN billing_creditaccount acc ON acc.user_id = s.owner_id
"""

#: The held GPUs outside the picture (gone unhealthy, or on a node not ready): their model and memory (for their
#: holder's price) and node (where their holder's CPU and memory are counted).
_OUTSIDE_SQL = "SELECT d.id, d.model, d.memory_mib, d.node_id FROM clusters_gpudevice d WHERE d.id = ANY(%(ids)s)"


_BY_INDEX = operator.attrgetter("index", "pk")


def fleet_read(*, now: datetime, by_cluster: bool = True) -> Fleet:
    """The fleet as the plan sees it at ``now``: four queries (the nodes, their GPUs, the sessions holding GPUs with their
    owners' accounts, the prices), and a fifth when a held GPU is outside the picture (``_OUTSIDE_SQL``: gone
    unhealthy, or on a node not ready: its holder's price and node still count); the prices stay on the fleet
    (``Fleet.prices``) for the alternatives. Node order is placement's (``GSHARE_PLACEMENT_POLICY``: binpack, the
    busiest first). ``by_cluster``: keep the per-cluster indexes (``Fleet``), needed when a job is limited to some
    clusters."""
    spread = settings.GSHARE_PLACEMENT_POLICY == "spread"
    with statement_cursor() as cursor:
        cursor.execute(_NODES_SQL)
        node_rows = cursor.fetchall()
        cursor.execute(_DEVICES_SQL)
        device_rows = cursor.fetchall()
        cursor.execute(_HOLDERS_SQL)
        holders = cursor.fetchall()
    nodes = {pk: Node(pk=pk, name=name, cluster_id=cluster_id, cluster_name=cluster_name, devices=[], rank=load if spread else -load,
                      cpu_free=cpu_free, memory_free=memory_free)
             for pk, name, cluster_id, cluster_name, load, cpu_free, memory_free in node_rows}
    devices = {}
    for device in itertools.starmap(Device, device_rows):
        node = nodes.get(device.node_pk)
        if node is not None:  # (a node that became ready between the two reads is left to the next pass)
            devices[device.pk] = device
            node.devices.append(device)
    nodes = {pk: node for pk, node in nodes.items() if node.devices}
    for node in nodes.values():
        node.devices.sort(key=_BY_INDEX)
    outside = _outside(holders, devices)
    known = devices | outside if outside else devices
    held = [[known[pk] for pk in row[7] if pk in known] for row in holders]  # (a GPU deleted since: held no more)
    prices = pricing.prices_by_model()
    runs_out = _credits_run_out(holders, _burn(holders, held, prices), now=now)
    for (public_id, phase, ends_at, stops_at, owner, _, _, _, cpu, ram, _, _), gpus in zip(holders, held, strict=True):
        if not gpus:
            continue
        # By its GPUs' node, healthy or not: a session whose GPUs went unhealthy still holds its CPU and memory there.
        node = nodes.get(gpus[0].node_pk)
        if node is not None:
            if node.cpu_free is not None and cpu:
                node.cpu_free -= cpu
            if node.memory_free is not None and ram:
                node.memory_free -= ram
        end, why = _end_of(phase, _utc(ends_at), _utc(stops_at), runs_out.get(owner), now=now)
        for device in gpus:
            # A GPU is free once the last of its holders has ended; of holders ending together, the largest session id
            # is named (whatever order the rows came in), so the reason shown does not change from pass to pass.
            if device.free_at is None or end > device.free_at or (end == device.free_at and public_id > device.freed_by[0]):
                device.free_at, device.freed_by = end, (public_id, why)
    fleet = Fleet(nodes.values(), now=now, by_cluster=by_cluster)
    fleet.prices = prices
    return fleet


def _outside(holders: list[tuple], devices: dict[int, Device]) -> dict[int, Device]:
    """The GPUs ``holders`` (``_HOLDERS_SQL``'s rows) hold that are not in ``devices`` (gone unhealthy, or on a node not
    ready), as ``Device``s outside the picture (their model, memory and node only): ``{pk: Device}``. One query
    (``_OUTSIDE_SQL``) when there are any, none otherwise."""
    missing = [pk for pk in itertools.chain.from_iterable(row[7] for row in holders) if pk not in devices]
    if not missing:
        return {}
    with statement_cursor() as cursor:
        cursor.execute(_OUTSIDE_SQL, {"ids": missing})
        return {pk: Device(pk=pk, model=model, memory_mib=memory, cores=0, split_count=1, node_pk=node)
                for pk, model, memory, node in cursor.fetchall()}


def _burn(holders: list[tuple], held: list[list[Device]], prices: dict[str, Decimal]) -> dict[int, Decimal]:
    """Credits per hour each owner's Running sessions cost now (``billing.pricing``: per GPU, its model's price × the
    session's share of it), from ``_HOLDERS_SQL``'s rows and each one's GPUs."""
    rate_of: dict[tuple, Decimal] = {}
    burn: dict[int, Decimal] = {}
    for (_, phase, _, _, owner, gpu_memory, gpu_cores, *_), gpus in zip(holders, held, strict=True):
        if phase != Session.Phase.RUNNING or not gpus:
            continue
        # Usually one model and size; a session accepting several models may hold several on a node that has them.
        for (model, memory), count in collections.Counter((d.model, d.memory_mib) for d in gpus).items():
            key = (model, memory, gpu_memory, gpu_cores)
            rate = rate_of.get(key)
            if rate is None:
                share = pricing.gpu_share(device_memory_mib=memory, gpu_memory_mib=gpu_memory, gpu_cores=gpu_cores)
                rate = rate_of[key] = pricing.hourly_cost(price=pricing.price_for_model(model, prices), share=share)
            burn[owner] = burn.get(owner, Decimal(0)) + rate * count
    return burn


def _credits_run_out(holders: list[tuple], burn: dict[int, Decimal], *, now: datetime) -> dict[int, datetime]:
    """When each owner's credits run out at their current burn (``credits_last_until``), for the owners that burn, from
    ``_HOLDERS_SQL``'s rows (their accounts' balance and accrued usage)."""
    out: dict[int, datetime | None] = {}
    for row in holders:
        owner, balance, accrued = row[4], row[10], row[11]
        if owner in burn and owner not in out and balance is not None:
            out[owner] = credits_last_until(balance=balance, accrued=accrued, burn_per_hour=burn[owner], now=now)
    return {owner: until for owner, until in out.items() if until is not None}


def _end_of(phase: str, ends_at: datetime | None, stops_at: datetime | None, runs_out: datetime | None, *,
            now: datetime) -> tuple[datetime, str]:
    """When a session holding GPUs is expected to end (``NEVER`` when nothing known ends it) and why, in words."""
    if phase == Session.Phase.STOPPING:
        return now, STOPPING
    end, why = NEVER, ""
    for known, reason in ((ends_at, TIME_LIMIT), (stops_at, IDLE_STOP), (runs_out, CREDITS_OUT)):
        if known is not None and known < end:
            end, why = known, reason
    return end, why


class QueuedRow(NamedTuple):
    """A queued session's columns the plan and the passes read (a row, not a model instance: a pass reads thousands).
    ``has_volumes``: it mounts volumes; ``due``: it can no longer start (past its ``queue_expires_at``, or pinned to a
    deregistered cluster: ``queue_expire`` drops it)."""

    pk: int
    public_id: str
    owner_id: int
    gpus: int
    gpu_memory_mib: int | None
    gpu_cores: int | None
    gpu_models: list
    runtime_hours: Decimal | None
    requested_cluster_id: int | None
    priority: int
    queued_at: datetime
    cpu: Decimal | None = None
    memory_gib: Decimal | None = None
    queue_position: int | None = None
    estimated_start: datetime | None = None
    waiting_for: str = ""
    alternatives: list | None = None
    has_volumes: bool = False
    due: bool = False


def _order_sql(order: tuple[str, ...]) -> str:
    """``QUEUE_ORDER`` as SQL on ``gpu_sessions_session s``."""
    columns = {"priority": "s.priority", "queued_at": "s.queued_at", "id": "s.id"}
    return ", ".join(f"{columns[f.lstrip('-')]} DESC" if f.startswith("-") else columns[f] for f in order)


#: The queued sessions in queue order (the partial index ``session_queue_order_idx``). Times come as microseconds since
#: the epoch and JSON as text: Django's per-value loaders cost more than the rest of the read at 10,000 rows.
_QUEUED_SQL = f"""
SELECT s.id, s.public_id, s.owner_id, s.gpus, s.gpu_memory_mib, s.gpu_cores, s.gpu_models::text, s.runtime_hours,
       s.requested_cluster_id, s.priority, (EXTRACT(EPOCH FROM s.queued_at) * 1000000)::bigint, s.cpu, s.memory_gib,
       s.queue_position, (EXTRACT(EPOCH FROM s.estimated_start) * 1000000)::bigint, s.waiting_for, s.alternatives::text,
       EXISTS (SELECT 1 FROM gpu_sessions_session_volumes v WHERE v.session_id = s.id),
       (s.queue_expires_at <= %(now)s OR COALESCE(c.status = 'deregistered', FALSE))
FROM gpu_sessions_session s
LEFT JOIN clusters_cluster c ON c.id = s.requested_cluster_id
WHERE s.phase = 'Queued'
ORDER BY {_order_sql(QUEUE_ORDER)}
"""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _utc(microseconds: int | None) -> datetime | None:
    return None if microseconds is None else _EPOCH + timedelta(microseconds=microseconds)


def queued_sessions(*, now: datetime | None = None) -> list[QueuedRow]:
    """The queued sessions in queue order (``QUEUE_ORDER``), one query; ``due`` is judged at ``now`` (None: never due;
    judged at ``NEVER`` the statement would call every session due, hence False here)."""
    models: dict[str, list] = {}
    alternatives: dict[str, list] = {}
    with statement_cursor() as cursor:
        cursor.execute(_QUEUED_SQL, {"now": now or NEVER})
        rows = cursor.fetchall()
    out = []
    for (pk, public_id, owner, gpus, memory, cores, gpu_models, hours, cluster, priority, queued_at, cpu, ram, position, estimate,
         waiting, offers, volumes, due) in rows:
        if gpu_models not in models:
            models[gpu_models] = json.loads(gpu_models)
        if offers not in alternatives:
            alternatives[offers] = json.loads(offers)
        out.append(QueuedRow(pk, public_id, owner, gpus, memory, cores, models[gpu_models], hours, cluster, priority, _utc(queued_at),
                             cpu, ram, position, _utc(estimate), waiting, alternatives[offers], volumes,
                             now is not None and bool(due)))
    return out


def jobs_of(sessions: list[QueuedRow]) -> list[Job]:
    """The plan's jobs for ``sessions`` (queued, in order): their models, the clusters their pin, their owner's policy and
    their volumes allow, and how long they will run (their ``runtime_hours``, else their policy's maximum; none: no
    limit). A session whose volumes no cluster may take now gets an empty set of clusters (it waits). One query, and
    two more per queued session with volumes."""
    policies = admission.policies_for(user_ids={s.owner_id for s in sessions}) if sessions else {}
    jobs = []
    for session in sessions:
        policy = policies[session.owner_id]
        clusters = policy.allowed_clusters
        if session.requested_cluster_id is not None:
            clusters = frozenset({session.requested_cluster_id}) & clusters if clusters is not None else frozenset({session.requested_cluster_id})
        if session.has_volumes:
            clusters = _volume_scope(Session.objects.select_related("owner", "requested_cluster").get(pk=session.pk), clusters)
        jobs.append(job_of(session=session, policy=policy, clusters=clusters, has_volumes=session.has_volumes))
    return jobs


def job_of(*, session, policy, clusters: frozenset[int] | None, key: int | None = None, has_volumes: bool = False) -> Job:
    """One queued session's (a ``QueuedRow``) or unsaved request's (a ``Session``) ``Job``."""
    hours = session.runtime_hours if session.runtime_hours is not None else (policy.max_runtime_hours or None)
    return Job(key=session.pk if key is None else key, public_id=session.public_id if session.pk else "", gpus=session.gpus,
               memory_mib=session.gpu_memory_mib, cores=session.gpu_cores, models=frozenset(session.gpu_models or ()),
               clusters=clusters, duration=None if hours is None else runtime.hours_delta(Decimal(hours)),
               policy_clusters=policy.allowed_clusters, has_volumes=has_volumes,
               cpu_milli=resources.cpu_millicores(session.cpu), ram_mib=resources.memory_mib(session.memory_gib))


def _volume_scope(session: Session, clusters: frozenset[int] | None) -> frozenset[int] | None:
    """``clusters`` narrowed to where the session's volumes may be mounted now (empty when nowhere)."""
    volumes = selectors.session_volumes(owner=session.owner, volume_ids=[v.public_id for v in session.volumes.all()])
    try:
        allowed = placement.volume_clusters(volumes=volumes, pinned=session.requested_cluster)
    except ApplicationError:  # a volume moved, or its pool is nowhere usable now: the session waits
        return frozenset()
    if allowed is None:
        return clusters if clusters is not None else None
    return allowed if clusters is None else allowed & clusters
