"""The database's picture for the queue's plan (``sessions.queue.plan``): the fleet's GPUs with when what holds them ends,
and the queued sessions in order.

A running session's end is the earliest of what the control plane knows will stop it: its time limit (``ends_at``),
the idle policy's coming stop (``SessionActivity.stops_at``, set while its warning runs) and its owner's credits
running out at the current burn (``billing.selectors.credits_last_until``); a session already stopping ends now.
What it cannot know: a session stopped early by its owner, a node that fails or joins, a session ahead cancelled, a
new session with a higher priority (docs/sessions.md, "Waiting in the queue").
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings

from billing import admission, pricing
from billing.models import CreditAccount
from billing.selectors import credits_last_until
from core.exceptions import ApplicationError
from core.prepared import statement_cursor
from sessions import placement, runtime, selectors
from sessions.models import Session
from sessions.queue.order import QUEUE_ORDER
from sessions.queue.plan import NEVER, Device, Fleet, Job, Node

#: Why a session ends when the plan counts on it (``Device.freed_by``), in the words ``waiting_for`` uses.
TIME_LIMIT = "reaches its time limit"
IDLE_STOP = "is stopped as idle"
CREDITS_OUT = "runs out of credits"
STOPPING = "is stopping"

#: The fleet's healthy GPUs on ready nodes of the clusters that take sessions, each with the live sessions holding it
#: (id, phase, time limit, idle stop, owner, what it asked per GPU), in one query.
_FLEET_SQL = """
SELECT n.id, n.name, n.cluster_id, n.cluster_name, n.load,
       d.id, d.model, d.memory_mib, d.cores, d.split_count, d.used_count, d.used_memory_mib, d.used_cores, d.used_exclusive,
       h.ids, h.phases, h.ends, h.stops, h.owners, h.memories, h.cores
FROM clusters_node n
JOIN clusters_cluster c ON c.id = n.cluster_id
JOIN clusters_gpudevice d ON d.node_id = n.id AND d.health
LEFT JOIN LATERAL (
    SELECT array_agg(s.public_id ORDER BY s.id) AS ids, array_agg(s.phase ORDER BY s.id) AS phases,
           array_agg(s.ends_at ORDER BY s.id) AS ends, array_agg(act.stops_at ORDER BY s.id) AS stops,
           array_agg(s.owner_id ORDER BY s.id) AS owners, array_agg(s.gpu_memory_mib ORDER BY s.id) AS memories,
           array_agg(s.gpu_cores ORDER BY s.id) AS cores
    FROM gpu_sessions_allocation a
    JOIN gpu_sessions_session s ON s.id = a.session_id
    LEFT JOIN gpu_sessions_sessionactivity act ON act.session_id = s.id
    WHERE a.device_id = d.id
) h ON d.used_count > 0
WHERE n.ready AND c.status = 'connected' AND c.session_domain <> ''
ORDER BY n.id, d.index, d.id
"""


def fleet_read(*, now: datetime, by_cluster: bool = True) -> Fleet:
    """The fleet as the plan sees it at ``now`` (two queries: the GPUs with their holders, then the holders' owners'
    accounts; and the prices). Node order is placement's (``GSHARE_PLACEMENT_POLICY``: binpack, the busiest first).
    ``by_cluster``: keep the per-cluster indexes (``Fleet``), needed when a job is limited to some clusters."""
    spread = settings.GSHARE_PLACEMENT_POLICY == "spread"
    with statement_cursor() as cursor:
        cursor.execute(_FLEET_SQL)
        rows = cursor.fetchall()
    nodes: dict[int, Node] = {}
    holders: list[tuple[Device, list[tuple]]] = []
    burn: dict[int, Decimal] = {}
    prices = pricing.prices_by_model() if rows else {}
    for (node_id, node_name, cluster_id, cluster_name, load, pk, model, memory, cores, split, used, used_memory, used_cores, exclusive,
         ids, phases, ends, stops, owners, memories, shares) in rows:
        node = nodes.get(node_id)
        if node is None:
            node = nodes[node_id] = Node(pk=node_id, name=node_name, cluster_id=cluster_id, cluster_name=cluster_name, devices=[],
                                         rank=load if spread else -load)
        device = Device(pk=pk, model=model, memory_mib=memory, cores=cores, split_count=split, used_count=used,
                        used_memory_mib=used_memory, used_cores=used_cores, used_exclusive=exclusive)
        node.devices.append(device)
        if ids:
            held = list(zip(ids, phases, ends, stops, owners, strict=True))
            holders.append((device, held))
            for _, phase, _, _, owner, gpu_memory, gpu_cores in zip(ids, phases, ends, stops, owners, memories, shares, strict=True):
                if phase == Session.Phase.RUNNING:
                    share = pricing.gpu_share(device_memory_mib=memory, gpu_memory_mib=gpu_memory, gpu_cores=gpu_cores)
                    burn[owner] = burn.get(owner, Decimal(0)) + pricing.hourly_cost(price=pricing.price_for_model(model, prices), share=share)
    runs_out = _credits_run_out(burn, now=now)
    for device, held in holders:
        device.free_at, device.freed_by = _last_end(held, runs_out, now=now)
    return Fleet(nodes.values(), now=now, by_cluster=by_cluster)


def _credits_run_out(burn: dict[int, Decimal], *, now: datetime) -> dict[int, datetime]:
    """When each owner's credits run out at their current burn (``credits_last_until``), for the owners that burn."""
    if not burn:
        return {}
    accounts = CreditAccount.objects.filter(user_id__in=sorted(burn)).values_list("user_id", "balance", "accrued")
    out = {}
    for user_id, balance, accrued in accounts:
        until = credits_last_until(balance=balance, accrued=accrued, burn_per_hour=burn[user_id], now=now)
        if until is not None:
            out[user_id] = until
    return out


def _last_end(held: list[tuple], runs_out: dict[int, datetime], *, now: datetime) -> tuple[datetime, tuple[str, str] | None]:
    """When the last of a GPU's holders ends (``NEVER`` when one has no known end) and ``(its id, why)``."""
    last, by = now, None
    for public_id, phase, ends_at, stops_at, owner in held:
        if phase == Session.Phase.STOPPING:
            end, why = now, STOPPING
        else:
            end, why = NEVER, ""
            for known, reason in ((ends_at, TIME_LIMIT), (stops_at, IDLE_STOP), (runs_out.get(owner), CREDITS_OUT)):
                if known is not None and known < end:
                    end, why = known, reason
        if end >= last:
            last, by = end, (public_id, why)
    return last, by


class QueuedRow(NamedTuple):
    """A queued session's columns the plan and the passes read (a row, not a model instance: a pass reads thousands)."""

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


def queued_sessions() -> list[QueuedRow]:
    """The queued sessions in queue order (``QUEUE_ORDER``), one query."""
    return [QueuedRow(*row) for row in Session.objects.queued().order_by(*QUEUE_ORDER).values_list(*QueuedRow._fields)]


def jobs_of(sessions: list[QueuedRow]) -> list[Job]:
    """The plan's jobs for ``sessions`` (queued, in order): their models, the clusters their pin, their owner's policy and
    their volumes allow, and how long they will run (their ``runtime_hours``, else their policy's maximum; none: no
    limit). A session whose volumes no cluster may take now gets an empty set of clusters (it waits). Two queries, and
    two more per queued session with volumes."""
    policies = admission.policies_for(user_ids={s.owner_id for s in sessions}) if sessions else {}
    through = Session.volumes.through
    with_volumes = set(through.objects.filter(session__phase=Session.Phase.QUEUED).values_list("session_id", flat=True)) if sessions else set()
    jobs = []
    for session in sessions:
        policy = policies[session.owner_id]
        clusters = policy.allowed_clusters
        if session.requested_cluster_id is not None:
            clusters = frozenset({session.requested_cluster_id}) & clusters if clusters is not None else frozenset({session.requested_cluster_id})
        if session.pk in with_volumes:
            clusters = _volume_scope(Session.objects.select_related("owner", "requested_cluster").get(pk=session.pk), clusters)
        jobs.append(job_of(session=session, policy=policy, clusters=clusters))
    return jobs


def job_of(*, session, policy, clusters: frozenset[int] | None, key: int | None = None) -> Job:
    """One queued session's (a ``QueuedRow``) or unsaved request's (a ``Session``) ``Job``."""
    hours = session.runtime_hours if session.runtime_hours is not None else (policy.max_runtime_hours or None)
    return Job(key=session.pk if key is None else key, public_id=session.public_id if session.pk else "", gpus=session.gpus,
               memory_mib=session.gpu_memory_mib, cores=session.gpu_cores, models=frozenset(session.gpu_models or ()),
               clusters=clusters, duration=None if hours is None else runtime.hours_delta(Decimal(hours)),
               policy_clusters=policy.allowed_clusters)


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
