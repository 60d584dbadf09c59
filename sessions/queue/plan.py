"""The queue's plan: which queued sessions start now, and when the others are expected to (pure Python, no database).

The plan walks the queue in its order (``sessions.queue.order``) over a picture of the fleet's GPUs (``Device``) in
which every GPU knows when what holds it ends (``free_at``: the latest end of the sessions on it, and of the
sessions the plan put on it) and, when a session ahead in the queue is planned on it later, when that one starts
(``hole_until``). For each queued session, in order:

1. **Now**: a node with enough GPUs of an accepted model that fit the request now (HAMi's fit rules, as placement
   applies them: ``fits_now``) and that it would leave before any session ahead of it is planned on them (its end,
   now + its runtime, at most ``hole_until``; a session without a time limit only takes GPUs nobody ahead is
   planned on). Such a session starts now. This is backfill: a later, smaller session starts ahead of a blocked one
   only where it delays no estimate ahead of it (as Slurm's backfill scheduler does).
2. **Later**: otherwise its estimated start is the earliest time a node has enough GPUs of an accepted model with
   nothing on them (the ``gpus``-th smallest ``free_at`` among them; the earliest such node), and the plan holds
   those GPUs for it from then until its end, so nobody behind it may delay it. A share is estimated at the time
   its GPUs are wholly free (conservative: it may start sooner, when part of a GPU frees).
3. **Unknown**: when no node ever frees in the picture (the GPUs it could use are held by sessions with no known
   end: no time limit, no idle stop coming, credits that do not run out), it has no estimate and holds nothing.

Ends are estimates: a session may be stopped sooner (by its owner), a node may fail or be added, a session ahead
may be cancelled, a new session with a higher priority may arrive. The plan is made again after each such change
(``sessions.queue.admit``), so the estimates follow.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from billing.pricing import share_cores

#: "Not known": later than any real time.
NEVER = datetime.max.replace(tzinfo=UTC)


@dataclass(slots=True)
class Device:
    """One healthy GPU of a ready node, as the plan sees it.

    Attributes:
        pk: ``GpuDevice.pk``; model: its model; memory_mib, cores, split_count: its HAMi capacity.
        used_count, used_memory_mib, used_cores, used_exclusive: what is reserved on it now (and, as the plan goes,
            what the sessions it starts now take).
        node_pk: its ``Node``'s pk (set by ``Fleet``); index: its index on the node (nvidia-smi's), the order a node's
            GPUs are taken in.
        free_at: when nothing holds it any more (``NEVER``: not known); ``freed_by``: ``(session id, why)`` of what
            ends last on it (why: ``"reaches its time limit"``, ``"is stopped as idle"``, ``"runs out of credits"``,
            ``"is planned to end"``).
        hole_until: the earliest planned start on it of a session ahead in the queue (None: none).
    """

    pk: int
    model: str
    memory_mib: int
    cores: int
    split_count: int
    used_count: int = 0
    used_memory_mib: int = 0
    used_cores: int = 0
    used_exclusive: bool = False
    node_pk: int = 0
    index: int = 0
    free_at: datetime | None = None
    freed_by: tuple[str, str] | None = None
    hole_until: datetime | None = None


@dataclass
class Node:
    """A ready node of a cluster that takes sessions, with its healthy GPUs (placement order: ``rank``, lower first) and
    the CPU (millicores) and memory (MiB) left on it for sessions (None: not reported, no limit)."""

    pk: int
    name: str
    cluster_id: int
    cluster_name: str
    devices: list[Device]
    rank: int = 0
    cpu_free: int | None = None
    memory_free: int | None = None


@dataclass(frozen=True)
class Job:
    """One queued session (or a new request) as the plan sees it.

    Attributes:
        key: the session's pk (0 for a request not saved yet); public_id: its ``ses_`` id ("" for one not saved).
        gpus: GPUs; memory_mib / cores: its share per GPU (both None: whole GPUs).
        models: accepted GPU models (empty: any).
        clusters: the cluster pks it may go to (None: any).
        duration: how long it holds its GPUs once started (None: no time limit).
        policy_clusters: the clusters its owner's policy allows (None: any), for an unpinned alternative.
        has_volumes: whether it mounts volumes (claimed for its cluster when it starts).
        cpu_milli, ram_mib: the CPU (millicores) and memory (MiB) its pod requests (None: none asked).
    """

    key: int
    public_id: str
    gpus: int
    memory_mib: int | None = None
    cores: int | None = None
    models: frozenset[str] = frozenset()
    clusters: frozenset[int] | None = None
    duration: timedelta | None = None
    policy_clusters: frozenset[int] | None = None
    has_volumes: bool = False
    cpu_milli: int | None = None
    ram_mib: int | None = None

    @property
    def whole(self) -> bool:
        """True for whole GPUs."""
        return self.memory_mib is None and self.cores is None


@dataclass
class Outcome:
    """What the plan decided for one job.

    Attributes:
        job: the job.
        now: True when it starts now, on ``node`` and ``devices``.
        start: its (estimated) start; None when not known.
        node, devices: where it starts, or is planned to (None/empty when not known).
        position: its 1-based place among the queued jobs that accept any of the same GPU models.
        blocker: ``(session id, why)`` of what frees its last GPU at ``start``, when known.
    """

    job: Job
    now: bool = False
    start: datetime | None = None
    node: Node | None = None
    devices: list[Device] = field(default_factory=list)
    position: int = 0
    blocker: tuple[str, str] | None = None


def fits_now(device: Device, job: Job) -> bool:
    """Whether ``job`` takes one of its GPUs on ``device`` now (HAMi's fit rules, ``sessions.placement``): a whole GPU
    needs nothing on it; a share needs a free split, room for its memory (none asked: all of it) and its cores (at
    least one split slot)."""
    if job.whole:
        return device.used_count == 0
    if device.used_exclusive or device.used_count >= device.split_count:
        return False
    memory = device.memory_mib if job.memory_mib is None else job.memory_mib
    cores = share_cores(gpu_cores=job.cores, split_count=device.split_count)
    return device.used_memory_mib + memory <= device.memory_mib and device.used_cores + cores <= device.cores


class Fleet:
    """The plan's picture of the fleet, indexed so that a job looks only at the nodes that can matter to it.

    For each GPU model, fleet-wide and per cluster, and each count k of GPUs, a heap orders the nodes by the time their
    k-th GPU of that model frees: a job's earliest node is the top of the heap of its size, for each model it accepts
    (and each cluster it is limited to), not a walk over the fleet. When the plan moves a node's k-th free time, a new
    entry is pushed for that k only; the old one is stale (its time is no longer the node's k-th) and dropped when it
    surfaces. Nodes with a GPU free now but held later for a session ahead (``hole_until``: where backfill may fit) and
    nodes with a GPU a share may still join are kept apart, so the searches for "now" in those cases look at them
    alone. A node's GPUs of one model are counted together; a
    job accepting several models takes GPUs of one of them on its node (the common case: one model per node).
    """

    def __init__(self, nodes: Iterable[Node], *, now: datetime, by_cluster: bool = True):
        self.now = now
        #: Whether the per-cluster heaps are kept (a queue whose jobs are all unrestricted needs only the fleet-wide ones).
        self.by_cluster = by_cluster
        #: ``billing.pricing.prices_by_model()`` as read with the fleet (None: not read; the alternatives read them).
        self.prices = None
        self.nodes = sorted(nodes, key=lambda n: (n.rank, n.cluster_name, n.name))
        self._heaps: dict[tuple[int | None, str, int], list] = {}
        #: Each node's GPUs of each model: their free times in order, as last indexed (a heap entry is current while the
        #: k-th of them is still its time).
        self._times: dict[tuple[int, str], list[datetime]] = {}
        self._order = {node.pk: i for i, node in enumerate(self.nodes)}
        self._by_pk = {node.pk: node for node in self.nodes}
        self._holes: dict[str, set[int]] = {}
        self._open: dict[str, set[int]] = {}
        self._of_model: dict[tuple[int, str], list[Device]] = {}
        for node in self.nodes:
            pk = node.pk
            for device in node.devices:
                device.node_pk = pk
                if device.free_at is None or device.free_at < now:
                    device.free_at = now
            models = {device.model for device in node.devices}
            if len(models) == 1:  # (the common case: one model per node)
                self._of_model[(pk, models.pop())] = list(node.devices)
                continue
            for device in node.devices:
                self._of_model.setdefault((pk, device.model), []).append(device)
        for (pk, model), devices in self._of_model.items():
            self._index_first(self._by_pk[pk], model, devices)
        for heap in self._heaps.values():
            heapq.heapify(heap)
        self.models = frozenset(model for _, model in self._of_model)

    # ----------------------------------------------------------------- the indexes

    def _devices(self, node: Node, model: str) -> list[Device]:
        return self._of_model[(node.pk, model)]

    def _index(self, node: Node, model: str) -> None:
        """Index ``node``'s GPUs of ``model`` again: a heap entry for each count k whose k-th free time changed (the
        old entries go stale), and its hole and open marks."""
        key = (node.pk, model)
        devices = self._of_model[key]
        order = self._order[node.pk]
        heaps = self._heaps
        times = sorted([d.free_at for d in devices])
        for k, (at, before) in enumerate(zip(times, self._times[key], strict=True), start=1):
            if at != before and at < NEVER:
                entry = (at, order, node.pk)
                heapq.heappush(heaps.setdefault((None, model, k), []), entry)
                if self.by_cluster:
                    heapq.heappush(heaps.setdefault((node.cluster_id, model, k), []), entry)
        self._times[key] = times
        self._mark(node, model, devices)

    def _index_first(self, node: Node, model: str, devices: list[Device]) -> None:
        """``_index`` when the fleet is built: an entry for every count, appended unordered (``__init__`` heapifies each
        heap once)."""
        order = self._order[node.pk]
        heaps = self._heaps
        times = self._times[(node.pk, model)] = sorted([d.free_at for d in devices])
        for k, at in enumerate(times, start=1):
            if at < NEVER:
                entry = (at, order, node.pk)
                heaps.setdefault((None, model, k), []).append(entry)
                if self.by_cluster:
                    heaps.setdefault((node.cluster_id, model, k), []).append(entry)
        self._mark(node, model, devices)

    def _mark(self, node: Node, model: str, devices: list[Device]) -> None:
        """Mark ``node`` in ``_holes`` (a GPU of ``model`` free now but planned later for a session ahead) and in
        ``_open`` (one a job may take now: free, or a share with a split left), or unmark it."""
        hole = opened = False
        for d in devices:
            if d.used_count == 0:
                opened = True
                hole = hole or d.hole_until is not None
            elif not d.used_exclusive and d.used_count < d.split_count:
                opened = True
        holes, opens = self._holes.setdefault(model, set()), self._open.setdefault(model, set())
        (holes.add if hole else holes.discard)(node.pk)
        (opens.add if opened else opens.discard)(node.pk)

    def _top(self, key: tuple[int | None, str, int]) -> tuple[datetime, Node] | None:
        """The current top of a heap: ``(kth free time, node)``; stale entries (the node's k-th time changed since) are
        dropped."""
        heap = self._heaps.get(key)
        model, k = key[1], key[2] - 1
        while heap:
            at, _, pk = heap[0]
            if self._times[(pk, model)][k] == at:
                return at, self._by_pk[pk]
            heapq.heappop(heap)
        return None

    def _models(self, job: Job) -> list[str]:
        return sorted(job.models & self.models) if job.models else sorted(self.models)

    def _allowed(self, job: Job, node: Node) -> bool:
        return job.clusters is None or node.cluster_id in job.clusters

    @staticmethod
    def _room(job: Job, node: Node) -> bool:
        """Whether ``node`` has room now for ``job``'s CPU and memory (placement's rule, ``sessions.placement``'s
        ``_RESOURCE_FIT``: a job asking either needs room for both, 0 for the one it does not ask, so a node already
        over its CPU takes no memory-only job; one asking neither is not checked)."""
        if job.cpu_milli is None and job.ram_mib is None:
            return True
        return ((node.cpu_free is None or node.cpu_free >= (job.cpu_milli or 0))
                and (node.memory_free is None or node.memory_free >= (job.ram_mib or 0)))

    # ----------------------------------------------------------------- the searches

    def start_now(self, job: Job, found=False) -> tuple[Node, list[Device]] | None:
        """A node and GPUs where ``job`` fits now without delaying any planned start (see the module), or None.
        ``found``: ``earliest(job)`` when the caller has it already."""
        if found is False:
            found = self.earliest(job)
        if (found is not None and found[0] <= self.now and job.whole and self._room(job, found[1])
                and all(fits_now(d, job) for d in found[2])):
            return found[1], found[2]
        end = None if job.duration is None else self.now + job.duration
        # Free GPUs that a session ahead is planned on later (backfill), and, for a share, GPUs with room left.
        pools = [self._holes, self._open]
        for model in self._models(job):
            pks = set().union(*(pool.get(model, set()) for pool in pools))
            for pk in sorted(pks, key=self._order.__getitem__):
                node = self._by_pk[pk]
                if not self._allowed(job, node) or not self._room(job, node):
                    continue
                chosen = []
                for device in self._devices(node, model):
                    if device.hole_until is not None and (end is None or end > device.hole_until):
                        continue
                    if fits_now(device, job):
                        chosen.append(device)
                        if len(chosen) == job.gpus:
                            return node, chosen
        return None

    def earliest(self, job: Job) -> tuple[datetime, Node, list[Device]] | None:
        """The earliest time a node has ``job.gpus`` GPUs of an accepted model with nothing on them, that node and those
        GPUs (the earliest to free first); None when none ever does (``NEVER``)."""
        best = None
        if job.clusters is not None and not self.by_cluster:
            raise ValueError("a job limited to clusters needs a Fleet made with by_cluster=True")
        scopes = [None] if job.clusters is None else sorted(job.clusters)
        for model in self._models(job):
            for scope in scopes:
                top = self._top((scope, model, job.gpus))
                if top is not None and (best is None or (top[0], self._order[top[1].pk]) < (best[0], self._order[best[1].pk])):
                    best = (top[0], top[1], model)
        if best is None:
            return None
        at, node, model = best
        devices = sorted(self._devices(node, model), key=_BY_FREE_AT)[: job.gpus]
        return at, node, devices

    # ----------------------------------------------------------------- the plan's changes

    def take_now(self, job: Job, devices: list[Device]) -> None:
        """Put ``job`` on ``devices`` from now (what placement will reserve), and its CPU and memory on their node."""
        end = NEVER if job.duration is None else self.now + job.duration
        node = self._by_pk[devices[0].node_pk]
        if node.cpu_free is not None and job.cpu_milli is not None:
            node.cpu_free -= job.cpu_milli
        if node.memory_free is not None and job.ram_mib is not None:
            node.memory_free -= job.ram_mib
        for device in devices:
            device.used_count += 1
            if job.whole:
                device.used_exclusive = True
                device.used_memory_mib, device.used_cores = device.memory_mib, device.cores
            else:
                device.used_memory_mib += device.memory_mib if job.memory_mib is None else job.memory_mib
                device.used_cores += share_cores(gpu_cores=job.cores, split_count=device.split_count)
            if end > device.free_at:
                device.free_at, device.freed_by = end, (job.public_id, _PLANNED_END)
        self._reindex(devices)

    def hold_later(self, job: Job, start: datetime, devices: list[Device]) -> None:
        """Hold ``devices`` for ``job`` from ``start`` to its end: nobody behind it may use them past ``start``."""
        end = NEVER if job.duration is None else start + job.duration
        for device in devices:
            device.hole_until = start if device.hole_until is None else min(device.hole_until, start)
            device.free_at, device.freed_by = end, (job.public_id, _PLANNED_END)
        self._reindex(devices)

    def _reindex(self, devices: list[Device]) -> None:
        touched = {(d.node_pk, d.model) for d in devices}
        for pk, model in sorted(touched):
            self._index(self._by_pk[pk], model)


_PLANNED_END = "is planned to end"
_BY_FREE_AT = operator.attrgetter("free_at", "pk")


def plan(fleet: Fleet, jobs: list[Job]) -> list[Outcome]:
    """Plan ``jobs`` (in queue order) on ``fleet`` (changed in place). Returns one ``Outcome`` per job, in order."""
    outcomes = []
    ahead = _Ahead()
    for job in jobs:
        outcome = Outcome(job=job, position=1 + ahead.add(job.models))
        found = fleet.earliest(job)
        placed = fleet.start_now(job, found)
        if placed is not None:
            outcome.now, outcome.start, (outcome.node, outcome.devices) = True, fleet.now, placed
            fleet.take_now(job, outcome.devices)
        else:
            if found is not None:
                outcome.start, outcome.node, outcome.devices = found
                last = max(outcome.devices, key=lambda d: (d.free_at, d.pk))
                outcome.blocker = last.freed_by if last.free_at > fleet.now else None
                fleet.hold_later(job, outcome.start, outcome.devices)
        outcomes.append(outcome)
    return outcomes


class _Ahead:
    """How many jobs already planned accept a GPU model a job's ``models`` accept (an empty set accepts every model),
    kept per distinct set of models as jobs are added (a queue has few distinct sets, and 10,000 jobs)."""

    def __init__(self):
        self._jobs: dict[frozenset[str], int] = {}  # jobs added, per exact set
        self._ahead: dict[frozenset[str], int] = {}  # the answer, per set seen
        self._overlapping: dict[frozenset[str], list[frozenset[str]]] = {}  # the sets seen that overlap it, itself too

    def add(self, models: frozenset[str]) -> int:
        """The count for ``models`` before this job; then this job is counted."""
        if models not in self._jobs:
            overlapping = [other for other in self._jobs if _overlap(other, models)]
            for other in overlapping:
                self._overlapping[other].append(models)
            self._ahead[models] = sum(self._jobs[other] for other in overlapping)
            self._overlapping[models] = [*overlapping, models]
            self._jobs[models] = 0
        before = self._ahead[models]
        self._jobs[models] += 1
        for other in self._overlapping[models]:
            self._ahead[other] += 1
        return before


def _overlap(one: frozenset[str], other: frozenset[str]) -> bool:
    return not one or not other or bool(one & other)
