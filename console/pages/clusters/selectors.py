"""Read side of the console's Resources pages: GPU cards (GPU management), node rows (Node management) and the
filters they use. No writes here; the admin classes in ``console/pages/clusters/admin.py`` render what these return.

Every selector keeps the page's queries bounded: one query for the page's GPUs (node and cluster joined), one for
their live allocations with session and owner, whatever the number of cards; node rows carry their sums as
annotations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cached_property

from django.conf import settings
from django.db.models import BooleanField, Count, Exists, ExpressionWrapper, OuterRef, Prefetch, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from clusters.models import GpuDevice, Node
from sessions.models import Allocation, Session, SessionActivity

#: An allocation that still holds its GPU: its session has not ended (Terminated/Failed release it).
LIVE_ALLOCATION = ~Q(session__phase__in=Session.TERMINAL_PHASES) & Q(session__ended_at__isnull=True)


def live_allocations() -> QuerySet[Allocation]:
    """Allocations of sessions not ended, with session and owner joined, oldest session first."""
    return (
        Allocation.objects.filter(LIVE_ALLOCATION)
        .select_related("session__owner")
        .only(
            "id", "device_id", "memory_mib", "cores", "exclusive",
            "session__id", "session__public_id", "session__name", "session__phase", "session__owner__username",
        )
        .order_by("session__created_at", "session__id")
    )


def gpu_card_queryset(qs: QuerySet[GpuDevice]) -> QuerySet[GpuDevice]:
    """``qs`` with what a GPU card reads: node and cluster joined, the live allocations prefetched as
    ``live_allocations`` (a list on each GPU, with session and owner), ordered by cluster, node, index. The
    cluster's kubeconfig is not read: never shown, and decrypting it per card was a third of the page's time."""
    return qs.select_related("node", "cluster").defer("cluster__kubeconfig").prefetch_related(
        Prefetch("allocations", queryset=live_allocations(), to_attr="live_allocations")
    )


def gpus_in_use(qs: QuerySet[GpuDevice], in_use: bool) -> QuerySet[GpuDevice]:
    """GPUs of ``qs`` with (``in_use``) or without a live allocation."""
    held = Exists(Allocation.objects.filter(LIVE_ALLOCATION, device=OuterRef("pk")))
    return qs.filter(held) if in_use else qs.exclude(held)


def gpu_summary(qs: QuerySet[GpuDevice]) -> dict[str, int]:
    """Totals over the GPUs of ``qs`` (the whole filtered list, not a page), in one query.

    Returns:
        ``{"gpus", "healthy", "in_use", "free"}``; ``free`` counts healthy GPUs no live session holds.
    """
    return gpu_summary_and_models(qs)[0]


def gpu_summary_and_models(qs: QuerySet[GpuDevice]) -> tuple[dict[str, int], list[str]]:
    """:func:`gpu_summary` and the GPU models of ``qs`` (sorted), from the same query.

    Returns:
        ``(summary, models)``.
    """
    # Counted by (model, health, held): ``IN (live allocations' GPUs)`` is one hashed subplan, evaluated once per
    # GPU as a group key. An EXISTS per GPU ran one index probe per GPU (8,000 on a big fleet) and its cost estimate
    # made PostgreSQL JIT-compile the query; a FILTER per count repeated the subplan.
    held = ExpressionWrapper(Q(pk__in=Allocation.objects.filter(LIVE_ALLOCATION).values("device_id")), output_field=BooleanField())
    totals = {"gpus": 0, "healthy": 0, "in_use": 0, "free": 0}
    models = set()
    for row in qs.order_by().annotate(_held=held).values("model", "health", "_held").annotate(n=Count("pk")):
        models.add(row["model"])
        totals["gpus"] += row["n"]
        totals["healthy"] += row["n"] if row["health"] else 0
        totals["in_use"] += row["n"] if row["_held"] else 0
        totals["free"] += row["n"] if row["health"] and not row["_held"] else 0
    return totals, sorted(models)


@dataclass(frozen=True)
class Holder:
    """A session holding a GPU: ``share`` is ``"whole"`` or e.g. ``"20,480 MiB · 30 %"``."""

    session_pk: int
    public_id: str
    name: str
    phase: str
    owner: str
    whole: bool
    memory_mib: int
    cores: int

    @property
    def share(self) -> str:
        """What the session holds of the GPU, as shown on the card."""
        if self.whole:
            return "whole"
        return f"{self.memory_mib:,} MiB · {self.cores} %"


@dataclass(frozen=True)
class Meter:
    """One bar of a card: ``used`` of ``total`` in ``unit`` (``percent`` 0-100, capped, for the bar's width)."""

    label: str
    used: int
    total: int
    unit: str = ""

    @cached_property
    def percent(self) -> int:
        """Share of the total in use, 0-100 (100 when over capacity)."""
        if self.total <= 0:
            return 100 if self.used else 0
        return min(100, round(100 * self.used / self.total))

    @cached_property
    def level(self) -> str:
        """``low`` / ``mid`` / ``high`` / ``full``: the bar's colour."""
        p = self.percent
        return "full" if p >= 100 else "high" if p >= 80 else "mid" if p >= 50 else "low"

    @cached_property
    def text(self) -> str:
        """``40,000 / 81,559 MiB``: used of total, with thousands separators."""
        return f"{self.used:,} / {self.total:,}" + (f" {self.unit}" if self.unit else "")

    @property
    def over(self) -> bool:
        """More reserved than the GPU now registers (the operator lowered its capacity)."""
        return self.used > self.total


#: GPU feature discovery's labels of a node's GPUs: the NVML product name (spaces as ``-``) and its physical memory
#: in MiB, as NVML reports it, before HAMi's ``deviceMemoryScaling``.
GFD_PRODUCT, GFD_MEMORY = "nvidia.com/gpu.product", "nvidia.com/gpu.memory"


def _letters(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


@dataclass(frozen=True)
class Physical:
    """A GPU's physical figures next to HAMi's (:func:`physical_figures`).

    Attributes:
        memory_mib: physical memory in MiB (GPU feature discovery's ``nvidia.com/gpu.memory`` of the GPU's node, for
            a GPU of the product it names), or None when the node does not report it.
        memory_scaling: HAMi's registered memory / the physical memory (its ``deviceMemoryScaling``, e.g. 1.8), or
            None when it is 1 or unknown.
        core_scaling: HAMi's registered cores / 100 % (HAMi's core scaling, e.g. 5 for ``devcore`` 500), or None
            when it is 1. A GPU's physical cores are always 100 % of itself.
    """

    memory_mib: int | None
    memory_scaling: Decimal | None
    core_scaling: Decimal | None

    @property
    def scaled(self) -> bool:
        """Whether HAMi's figures differ from the physical ones."""
        return self.memory_scaling is not None or self.core_scaling is not None


def _ratio(value: int, of: int) -> Decimal | None:
    ratio = (Decimal(value) / Decimal(of)).quantize(Decimal("0.01")).normalize()
    return None if ratio == 1 else ratio


def physical_figures(device: GpuDevice) -> Physical:
    """The physical memory and cores of ``device`` and HAMi's scaling of them.

    HAMi registers ``devmem`` (``GpuDevice.memory_mib``) already multiplied by ``deviceMemoryScaling`` and ``devcore``
    (``GpuDevice.cores``) by its core scaling, so an H20 (143,771 MiB) shows as 258,787 MiB and 500 %. The physical
    memory is GPU feature discovery's label on the node (``device.node.labels``, no query when the node is joined),
    trusted only when the label's product is the device's model (a node of mixed GPUs carries one product's labels).

    Returns:
        :class:`Physical`.
    """
    labels = getattr(device.node, "labels", None) or {}
    product, memory = str(labels.get(GFD_PRODUCT) or ""), str(labels.get(GFD_MEMORY) or "")
    physical = None
    if memory.isdigit() and int(memory) > 0 and product and _letters(product) in _letters(device.model):
        physical = int(memory)
    return Physical(
        memory_mib=physical,
        memory_scaling=_ratio(device.memory_mib, physical) if physical else None,
        core_scaling=_ratio(device.cores, 100) if device.cores > 0 else None,
    )


@dataclass
class GpuCard:
    """What one GPU card shows (see :func:`gpu_card`)."""

    device: GpuDevice
    memory: Meter
    cores: Meter
    slots: Meter
    holders: list[Holder] = field(default_factory=list)
    #: SM utilization (percent, 0-100) its Running sessions report for it, or None (no fresh known reading):
    #: :func:`gpu_utilization`.
    utilization: int | None = None
    #: The physical figures and HAMi's scaling (:func:`physical_figures`).
    physical: Physical | None = None

    @property
    def meters(self) -> tuple[Meter, Meter, Meter]:
        """The card's bars in their order: memory, cores, slots."""
        return (self.memory, self.cores, self.slots)

    @cached_property
    def state(self) -> str:
        """``unhealthy``, ``whole`` (held by one session alone), ``shared``, ``full`` (no split left) or ``free``."""
        if not self.device.health:
            return "unhealthy"
        if any(h.whole for h in self.holders):
            return "whole"
        if self.holders:
            return "full" if self.slots.used >= self.slots.total else "shared"
        return "free"

    @property
    def short_uuid(self) -> str:
        """``GPU-1a2b3c4d``: the UUID's first group (the whole one goes in the title and the copy button)."""
        uuid = self.device.uuid
        head, _, rest = uuid.partition("-")
        if head.upper() == "GPU" and rest:
            return f"{head}-{rest.split('-', 1)[0]}"
        return uuid[:12]


def live_holders(device_ids: list[int]) -> dict[int, list[Holder]]:
    """The sessions holding each of ``device_ids`` (live allocations, oldest session first), by GPU id: one query of
    plain rows, for a page of cards (no model instances to build).

    Returns:
        ``{device_id: [Holder, ...]}``; a GPU no live session holds is absent.
    """
    rows = (
        Allocation.objects.filter(LIVE_ALLOCATION, device_id__in=device_ids).order_by("session__created_at", "session__id")
        .values_list("device_id", "session_id", "session__public_id", "session__name", "session__phase", "session__owner__username",
                     "exclusive", "memory_mib", "cores")
    )
    holders: dict[int, list[Holder]] = {}
    for device_id, *holder in rows:
        holders.setdefault(device_id, []).append(Holder(*holder))
    return holders


def gpu_utilization(devices: list[GpuDevice], holders: dict[int, list[Holder]], *, now: datetime) -> dict[int, int]:
    """The SM utilization the sessions on each of ``devices`` report for it, by GPU id: one query whatever the number
    of GPUs and sessions.

    For each GPU, the sum over its Running holders (:func:`live_holders`) whose last activity reading is ``ok`` and
    fresh (younger than ``GSHARE_ACTIVITY_STALE_SECONDS``: ``sessions.idle.activity_unknown``'s rule) of that reading's
    ``utilization_percent`` for the GPU's UUID (HAMi's vGPU monitor measures each container's own slice), capped at 100.

    Returns:
        ``{device_id: percent}``; a GPU without such a reading is absent (the card shows "—").
    """
    running = {h.session_pk for hs in holders.values() for h in hs if h.phase == Session.Phase.RUNNING}
    if not running:
        return {}
    fresh = now - timedelta(seconds=settings.GSHARE_ACTIVITY_STALE_SECONDS)
    readings = {
        session_id: {g.get("device_uuid"): g.get("utilization_percent") for g in gpus or [] if isinstance(g, dict)}
        for session_id, gpus in SessionActivity.objects.filter(session_id__in=running, state=SessionActivity.State.OK,
                                                              sampled_at__gte=fresh).values_list("session_id", "gpus")
    }
    found: dict[int, int] = {}
    for device in devices:
        values = [readings[h.session_pk][device.uuid] for h in holders.get(device.pk, [])
                  if h.session_pk in readings and readings[h.session_pk].get(device.uuid) is not None]
        if values:
            found[device.pk] = min(100, round(sum(values)))
    return found


def gpu_card(device: GpuDevice, holders: list[Holder] | None = None) -> GpuCard:
    """The card of ``device``: its ``holders`` when given (:func:`live_holders`), else from its prefetched
    ``live_allocations`` (:func:`gpu_card_queryset`, no query), else one query.

    Memory and cores reserved are the sums of the live allocations (a whole-GPU allocation reserves the GPU's
    memory and its 100 % of cores); slots used is their number, of HAMi's ``split_count``. The bars are in HAMi's
    registered units, labelled "HAMi ... (scaled)" when HAMi scales them; ``physical`` holds the physical figures.
    """
    if holders is None:
        allocations = getattr(device, "live_allocations", None)
        if allocations is None:
            allocations = list(live_allocations().filter(device=device))
        holders = [
            Holder(
                session_pk=a.session.pk, public_id=a.session.public_id, name=a.session.name, phase=a.session.phase,
                owner=a.session.owner.username, whole=a.exclusive, memory_mib=a.memory_mib, cores=a.cores,
            )
            for a in allocations
        ]
    physical = physical_figures(device)
    # The bars count in HAMi's units (what placement reserves); named so when HAMi scales them.
    return GpuCard(
        device=device,
        memory=Meter("HAMi memory (scaled)" if physical.memory_scaling else "Memory", sum(h.memory_mib for h in holders),
                     device.memory_mib, "MiB"),
        cores=Meter("HAMi cores (scaled)" if physical.core_scaling else "Cores", sum(h.cores for h in holders), device.cores, "%"),
        slots=Meter("Slots", len(holders), device.split_count),
        holders=holders,
        physical=physical,
    )


def node_rows(qs: QuerySet[Node]) -> QuerySet[Node]:
    """``qs`` annotated for Node management: ``gpu_total``, ``memory_total_mib``, ``memory_reserved_mib``,
    ``cores_total``, ``cores_reserved`` (sums over the node's GPUs, one join), cluster joined.

    Free and open GPUs are the node's placement summary (``Node.free_devices``, ``Node.open_devices``), which
    ``sessions.placement.usage_recompute`` keeps equal to its allocations.
    """
    return qs.select_related("cluster").annotate(
        gpu_total=Count("devices"),
        memory_total_mib=Coalesce(Sum("devices__memory_mib"), 0),
        memory_reserved_mib=Coalesce(Sum("devices__used_memory_mib"), 0),
        cores_total=Coalesce(Sum("devices__cores"), 0),
        cores_reserved=Coalesce(Sum("devices__used_cores"), 0),
    )


def node_load(node: Node) -> Meter:
    """The busier of memory and cores reserved on ``node`` (annotated by :func:`node_rows`), as one bar."""
    memory = Meter("Memory", int(node.memory_reserved_mib), int(node.memory_total_mib), "MiB")
    cores = Meter("Cores", int(node.cores_reserved), int(node.cores_total), "%")
    return memory if memory.percent >= cores.percent else cores


#: Labels shown first on a node, in this order: what an operator picks a node by (HAMi mode, GPU product, count and
#: memory from GPU feature discovery, instance type, zone). Then other gShare and HAMi labels, then the rest by key.
PREFERRED_LABELS = (
    "gshare.io/gpu-mode", "nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory",
    "node.kubernetes.io/instance-type", "topology.kubernetes.io/zone", "gpu",
)
PRIORITY_LABEL_PREFIXES = ("gshare.io/", "hami.io/")

#: Labels that repeat what the row already says (the node's name), shown last.
LAST_LABELS = frozenset({"kubernetes.io/hostname"})


def node_labels(labels: dict | None) -> list[tuple[str, str]]:
    """``labels`` as ``(key, value)`` pairs: :data:`PREFERRED_LABELS` first in their order, then other gShare and
    HAMi labels, then the rest by key (the hostname last)."""
    items = [(str(k), "" if v is None else str(v)) for k, v in (labels or {}).items()]
    rank = {key: n for n, key in enumerate(PREFERRED_LABELS)}

    def order(kv: tuple[str, str]):
        key = kv[0]
        if key in rank:
            return (0, rank[key], key)
        return (1 if key.startswith(PRIORITY_LABEL_PREFIXES) else 3 if key in LAST_LABELS else 2, 0, key)

    return sorted(items, key=order)
