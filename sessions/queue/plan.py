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

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from billing.pricing import share_cores

#: "Not known": later than any real time.
NEVER = datetime.max.replace(tzinfo=UTC)


@dataclass
class Device:
    """One healthy GPU of a ready node, as the plan sees it.

    Attributes:
        pk: ``GpuDevice.pk``; model: its model; memory_mib, cores, split_count: its HAMi capacity.
        used_count, used_memory_mib, used_cores, used_exclusive: what is reserved on it now (and, as the plan goes,
            what the sessions it starts now take).
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
    free_at: datetime | None = None
    freed_by: tuple[str, str] | None = None
    hole_until: datetime | None = None


@dataclass
class Node:
    """A ready node of a cluster that takes sessions, with its healthy GPUs (placement order: ``rank``, lower first)."""

    pk: int
    name: str
    cluster_id: int
    cluster_name: str
    devices: list[Device]
    rank: int = 0


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
    """The plan's picture of the fleet: nodes by cluster and GPU model, so a job looks only at the nodes it may use."""

    def __init__(self, nodes: Iterable[Node], *, now: datetime):
        self.now = now
        self.nodes = sorted(nodes, key=lambda n: (n.rank, n.cluster_name, n.name))
        self._by_model: dict[str, list[Node]] = {}
        for node in self.nodes:
            for model in sorted({d.model for d in node.devices}):
                self._by_model.setdefault(model, []).append(node)
            for device in node.devices:
                if device.free_at is None or device.free_at < now:
                    device.free_at = now
        self.models = frozenset(self._by_model)

    def candidates(self, job: Job) -> list[Node]:
        """The nodes ``job`` may use (accepted models, allowed clusters), in placement order."""
        if job.models:
            seen: dict[int, Node] = {}
            for model in sorted(job.models):
                for node in self._by_model.get(model, ()):
                    seen.setdefault(node.pk, node)
            nodes = sorted(seen.values(), key=lambda n: (n.rank, n.cluster_name, n.name)) if len(job.models) > 1 else list(seen.values())
        else:
            nodes = self.nodes
        if job.clusters is not None:
            nodes = [n for n in nodes if n.cluster_id in job.clusters]
        return nodes

    def start_now(self, job: Job, nodes: list[Node] | None = None) -> tuple[Node, list[Device]] | None:
        """A node and GPUs where ``job`` fits now without delaying any planned start (see the module), or None."""
        end = None if job.duration is None else self.now + job.duration
        for node in self.candidates(job) if nodes is None else nodes:
            chosen = []
            for device in node.devices:
                if job.models and device.model not in job.models:
                    continue
                if device.hole_until is not None and (end is None or end > device.hole_until):
                    continue
                if fits_now(device, job):
                    chosen.append(device)
                    if len(chosen) == job.gpus:
                        return node, chosen
        return None

    def earliest(self, job: Job, nodes: list[Node] | None = None) -> tuple[datetime, Node, list[Device]] | None:
        """The earliest time a node has ``job.gpus`` GPUs of an accepted model with nothing on them, that node and those
        GPUs (the earliest to free first); None when none ever does (``NEVER``)."""
        best = None
        for node in self.candidates(job) if nodes is None else nodes:
            devices = [d for d in node.devices if not job.models or d.model in job.models]
            if len(devices) < job.gpus:
                continue
            devices.sort(key=lambda d: (d.free_at, d.pk))
            at = devices[job.gpus - 1].free_at
            if at < NEVER and (best is None or at < best[0]):
                best = (at, node, devices[: job.gpus])
        return best

    def take_now(self, job: Job, devices: list[Device]) -> None:
        """Put ``job`` on ``devices`` from now (what placement will reserve)."""
        end = NEVER if job.duration is None else self.now + job.duration
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
        if job.duration is None:
            for device in devices:
                device.free_at = NEVER

    def hold_later(self, job: Job, start: datetime, devices: list[Device]) -> None:
        """Hold ``devices`` for ``job`` from ``start`` to its end: nobody behind it may use them past ``start``."""
        end = NEVER if job.duration is None else start + job.duration
        for device in devices:
            device.hole_until = start if device.hole_until is None else min(device.hole_until, start)
            device.free_at, device.freed_by = end, (job.public_id, _PLANNED_END)


_PLANNED_END = "is planned to end"


def plan(fleet: Fleet, jobs: list[Job]) -> list[Outcome]:
    """Plan ``jobs`` (in queue order) on ``fleet`` (changed in place). Returns one ``Outcome`` per job, in order."""
    outcomes = []
    seen_models: dict[frozenset[str], int] = {}
    for job in jobs:
        outcome = Outcome(job=job, position=1 + _ahead(seen_models, job.models))
        seen_models[job.models] = seen_models.get(job.models, 0) + 1
        nodes = fleet.candidates(job)
        placed = fleet.start_now(job, nodes)
        if placed is not None:
            outcome.now, outcome.start, (outcome.node, outcome.devices) = True, fleet.now, placed
            fleet.take_now(job, outcome.devices)
        else:
            found = fleet.earliest(job, nodes)
            if found is not None:
                outcome.start, outcome.node, outcome.devices = found
                last = max(outcome.devices, key=lambda d: (d.free_at, d.pk))
                outcome.blocker = last.freed_by if last.free_at > fleet.now else None
                fleet.hold_later(job, outcome.start, outcome.devices)
        outcomes.append(outcome)
    return outcomes


def _ahead(seen: dict[frozenset[str], int], models: frozenset[str]) -> int:
    """How many jobs already planned accept a GPU model ``models`` accepts (an empty set accepts every model)."""
    return sum(count for accepted, count in seen.items() if not accepted or not models or accepted & models)
