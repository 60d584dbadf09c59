"""Read queries for sessions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import Case, DecimalField, F, Func, IntegerField, OuterRef, Prefetch, QuerySet, Subquery, Sum, Value, When
from django.db.models.functions import Coalesce, Greatest

from billing import pricing
from billing.models import CREDIT_PLACES, Accrual, LedgerEntry
from billing.pricing import SHARE, gpu_share
from billing.selectors import session_hourly_cost
from core.exceptions import NotFound
from sessions.errors import SESSION_NOT_FOUND
from sessions.models import Allocation, Session
from sessions.queue.order import QUEUE_ORDER
from storage.errors import VOLUME_NOT_FOUND
from storage.models import Volume


def session_list(*, user) -> QuerySet[Session]:
    """Sessions visible to ``user`` (their own; staff see all), with cluster, owner and activity joined, volumes and
    GPU reservations (with their GPUs: the share and the hourly cost) prefetched (the API's ``?cluster=`` and ``?phase=``:
    ``sessions.api.filters.SessionFilter``)."""
    qs = (
        Session.objects.select_related("cluster", "owner", "activity")
        .prefetch_related(Prefetch("volumes", queryset=Volume.objects.only("id", "public_id", "name").order_by("name", "id")),
                          Prefetch("allocations", queryset=Allocation.objects.select_related("device").order_by("pk")))
        .order_by("-created_at", "-id")
    )
    if not user.is_staff:
        qs = qs.filter(owner=user)
    return qs


#: Policy minutes without a GPU kernel (or, while part of its GPUs is not reported, a connection) after which the
#: console, the dashboard and /metrics call a session idle (the policy's own stop is per user: ``sessions.idle``).
IDLE_DISPLAY_MINUTES = 15


def idle_sessions(*, now: datetime) -> QuerySet[Session]:
    """Running sessions that are idle now: their GPU activity is known and fresh (an ``ok`` reading younger than
    ``GSHARE_ACTIVITY_STALE_SECONDS``) and none of their GPUs ran a kernel, and they did not start, for
    ``IDLE_DISPLAY_MINUTES`` policy minutes, exempt or not. Connections count only while the reading lists fewer GPUs
    than the session holds (``sessions.idle.gpus_unreported``'s rule, by count here; connections noted in Redis but not
    flushed yet are not seen: at most a minute late). What the dashboard and ``gshare_cluster_idle_*`` count."""
    quiet_since = now - IDLE_DISPLAY_MINUTES * timedelta(seconds=settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS)
    fresh_since = now - timedelta(seconds=settings.GSHARE_ACTIVITY_STALE_SECONDS)
    reported = Func(F("activity__gpus"), function="jsonb_array_length", output_field=IntegerField())
    return (
        Session.objects.filter(phase=Session.Phase.RUNNING, activity__state="ok", activity__sampled_at__gte=fresh_since)
        .alias(reported=reported)
        .alias(last_activity=Case(
            When(gpus__gt=F("reported"), then=Greatest("started_at", "activity__last_kernel_at", "activity__last_connected_at")),
            default=Greatest("started_at", "activity__last_kernel_at")))
        .filter(last_activity__lt=quiet_since)
    )


def session_share(session: Session) -> dict | None:
    """What ``session`` holds of each of its GPUs while it holds them: one definition for the reservation, the price
    and HAMi's limits (``billing.pricing``, docs/billing.md "What a share takes").

    Reads ``session.allocations`` with their devices (prefetched by ``session_list``; else one query).

    Returns:
        None when nothing is reserved (before placement, after the release); else ``{"whole": bool, "memory_mib":
        [MiB reserved per GPU], "cores": percent reserved per GPU (100 for whole GPUs), "fraction": the largest
        priced fraction of one of its GPUs as a 6-place decimal string}``.
    """
    allocations = list(session.allocations.all())
    if not allocations:
        return None
    whole = session.whole_gpus
    fraction = max(
        gpu_share(device_memory_mib=a.device.memory_mib, gpu_memory_mib=session.gpu_memory_mib, gpu_cores=session.gpu_cores)
        for a in allocations
    )
    return {"whole": whole, "memory_mib": [a.memory_mib for a in allocations],
            "cores": 100 if whole else max(a.cores for a in allocations), "fraction": str(fraction.quantize(SHARE))}


def session_get(*, user, public_id: str) -> Session:
    """One session visible to ``user``.

    Raises:
        NotFound: 404 ``session_not_found`` (also for another user's session).
    """
    session = session_list(user=user).filter(public_id=public_id).first()
    if session is None:
        raise NotFound(f"No session {public_id!r} of yours: list yours with `GET /api/v1/sessions`.", code=SESSION_NOT_FOUND)
    return session


def session_volumes(*, owner, volume_ids: list[str]) -> list[Volume]:
    """The volumes ``volume_ids`` of ``owner`` a new session would mount, in the order given.

    Two queries whatever their number: the volumes with their holding cluster, pool and pool's cluster,
    and the pools' allowed clusters (what ``placement.volume_clusters`` reads).

    Raises:
        NotFound: 404 ``volume_not_found`` for an id that is not a live volume of ``owner`` (another
            user's volume answers the same, so ids do not leak).
    """
    if not volume_ids:
        return []
    found = {
        v.public_id: v
        for v in Volume.objects.filter(owner=owner, public_id__in=volume_ids)
        .exclude(status=Volume.Status.DELETED)
        .select_related("cluster", "pool__cluster")
        .prefetch_related("pool__allowed_clusters")
    }
    missing = [vid for vid in volume_ids if vid not in found]
    if missing:
        raise NotFound(
            f"No volume {', '.join(repr(m) for m in missing[:5])} of yours: list yours with `GET /api/v1/storage/volumes` "
            "or create one with `POST /api/v1/storage/volumes`.",
            code=VOLUME_NOT_FOUND,
        )
    return [found[vid] for vid in volume_ids]


def queue_list(*, user) -> QuerySet[Session]:
    """The queued sessions visible to ``user`` in queue order (``sessions.queue.order``): the whole queue for staff, their
    own otherwise (each with its fleet-wide ``queue_position``)."""
    qs = Session.objects.queued().select_related("owner", "requested_cluster").order_by(*QUEUE_ORDER)
    if not user.is_staff:
        qs = qs.filter(owner=user)
    return qs


#: ``queue_figures``: the queue's length and, over the sessions the queue admitted since ``%(since)s``, the median and
#: 90th percentile of the first estimate's absolute error (seconds) and of that error as a share of the actual wait.
_QUEUE_FIGURES_SQL = """
WITH admitted AS (
    SELECT ABS(EXTRACT(EPOCH FROM s.admitted_at - s.first_estimated_start)) AS error,
           GREATEST(EXTRACT(EPOCH FROM s.admitted_at - s.queued_at), 1) AS wait
    FROM gpu_sessions_session s
    WHERE s.admitted_at >= %(since)s AND s.first_estimated_start IS NOT NULL AND s.queued_at IS NOT NULL
)
SELECT (SELECT COUNT(*) FROM gpu_sessions_session q WHERE q.phase = 'Queued'),
       (SELECT COUNT(*) FROM admitted),
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY error) FROM admitted),
       (SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY error) FROM admitted),
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY error / wait) FROM admitted),
       (SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY error / wait) FROM admitted)
"""


def queue_figures(*, since) -> dict:
    """The queue's product figures in one query: ``{"queued", "admitted", "error_p50_seconds", "error_p90_seconds",
    "error_p50_share", "error_p90_share"}``: how many sessions wait now; over the sessions admitted from the queue since
    ``since`` (aware), how far each one's first estimate (``first_estimated_start``) was from its actual start
    (``admitted_at``), as seconds and as a share of its wait (``admitted_at - queued_at``). Figures are None with no
    admission in the window."""
    with connection.cursor() as cursor:
        cursor.execute(_QUEUE_FIGURES_SQL, {"since": since})
        queued, admitted, p50, p90, share50, share90 = cursor.fetchone()
    return {"queued": queued, "admitted": admitted, "error_p50_seconds": p50, "error_p90_seconds": p90,
            "error_p50_share": share50, "error_p90_share": share90}


_CREDITS = DecimalField(max_digits=18, decimal_places=CREDIT_PLACES)


def with_cost_so_far(qs: QuerySet[Session]) -> QuerySet[Session]:
    """``qs`` annotated with ``cost_so_far``: credits charged to each session so far (``Decimal``, 0 when none).

    It is minus the sum of the ledger entries naming the session (charges are negative; a refund or adjustment
    of the session counts against them) plus its usage not charged yet (its ``Accrual``: the open billing period),
    two correlated subqueries in the list's own query (the ``ledger_session`` index and the accrual's key serve them),
    so the number of queries does not grow with the rows. The console's session list and the researcher's home page
    show this figure.
    """
    charged = (
        LedgerEntry.objects.filter(session=OuterRef("pk")).order_by().values("session")
        .annotate(total=Sum("amount")).values("total")
    )
    accrued = Accrual.objects.filter(session=OuterRef("pk")).values("amount")
    zero = Value(Decimal(0), output_field=_CREDITS)
    return qs.annotate(cost_so_far=Coalesce(Subquery(accrued, output_field=_CREDITS), zero)
                       - Coalesce(Subquery(charged, output_field=_CREDITS), zero))


def cost_so_far(session: Session) -> Decimal:
    """Credits charged to ``session`` so far (one query): see :func:`with_cost_so_far`."""
    return with_cost_so_far(Session.objects.filter(pk=session.pk)).values_list("cost_so_far", flat=True).get()


@dataclass(frozen=True)
class LiveSession:
    """One of a user's live sessions as their home page shows it (:func:`live_sessions_of`).

    Attributes:
        session: the ``Session`` (cluster joined; ``allocations`` with their devices prefetched).
        cost_so_far: credits charged so far (:func:`with_cost_so_far`).
        credits_per_hour: what it costs per hour (``billing.selectors.session_hourly_cost``: the session page's rate).
        gpu_models: the models of the GPUs it holds, sorted; before placement (queued, pending) the models it accepts
            (``Session.gpu_models``; empty: any model).
        holds_gpus: whether ``gpu_models`` are the GPUs it holds (True) or the ones it asked for (False).
    """

    session: Session
    cost_so_far: Decimal
    credits_per_hour: Decimal
    gpu_models: tuple[str, ...]
    holds_gpus: bool


def live_sessions_of(*, user, limit: int, prices: dict[str, Decimal] | None = None) -> tuple[list[LiveSession], int]:
    """``user``'s own live sessions (queued ones too; staff too see only theirs): the admitted ones newest first, then
    the queued ones in queue order (``sessions.queue.order.QUEUE_ORDER``).

    Four queries whatever the number of sessions: the count, the sessions (cluster joined, cost so far annotated),
    their reservations with their GPUs, and the prices (none when ``prices`` is given).

    Args:
        limit: at most this many sessions are returned.
        prices: a ``billing.pricing.prices_by_model()`` result to reuse; None reads it.

    Returns:
        ``(sessions, total)``: at most ``limit`` :class:`LiveSession` and how many live sessions the user has in all.
    """
    if prices is None:
        prices = pricing.prices_by_model()
    live = Session.objects.filter(owner_id=user.pk).live()
    total = live.count()
    # Admitted sessions by creation, newest first (queued ones have none here: they sort after), then the queue's order.
    admitted_created = Case(When(phase=Session.Phase.QUEUED, then=Value(None)), default=F("created_at"))
    rows = (
        with_cost_so_far(live.select_related("cluster").with_devices())
        .alias(admitted_created=admitted_created)
        .order_by(F("admitted_created").desc(nulls_last=True), *QUEUE_ORDER)[:limit]
    )
    found = []
    for session in rows:
        held = sorted({a.device.model for a in session.allocations.all()})
        found.append(LiveSession(
            session=session, cost_so_far=session.cost_so_far, credits_per_hour=session_hourly_cost(session, prices),
            gpu_models=tuple(held or session.gpu_models or ()), holds_gpus=bool(held),
        ))
    return found, total
