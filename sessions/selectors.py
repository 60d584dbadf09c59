"""Read queries for sessions."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Case, F, Func, IntegerField, Prefetch, QuerySet, When
from django.db.models.functions import Greatest

from billing.pricing import SHARE, gpu_share
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
