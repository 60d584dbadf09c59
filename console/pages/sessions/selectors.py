"""Read queries of the console's session pages (the Sessions / My sessions list, the Start session form).

The cost so far (``with_cost_so_far``, ``cost_so_far``) is ``sessions.selectors``'s, named here for the list."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet

from audit.models import AuditRecord
from billing import pricing
from clusters.models import Cluster
from clusters.selectors import gpu_model_availability, gpu_model_memory
from sessions.models import Session, SuggestedImage
from sessions.selectors import cost_so_far as cost_so_far  # re-exported: the list reads it from here
from sessions.selectors import idle_sessions
from sessions.selectors import with_cost_so_far as with_cost_so_far  # re-exported, as cost_so_far
from storage.models import Volume
from storage.selectors import volume_list

#: The list's Activity filter: its values and labels.
ACTIVITY_CHOICES = (("idle", "idle"), ("busy", "busy"), ("unknown", "unknown"))


def with_activity(qs: QuerySet[Session], *, now: datetime) -> QuerySet[Session]:
    """``qs`` with each session's ``activity`` joined and ``is_idle`` annotated: whether it is one of
    ``sessions.selectors.idle_sessions(now=now)`` (one ``EXISTS`` in the list's own query, no query per row)."""
    return qs.select_related("activity").annotate(is_idle=Exists(idle_sessions(now=now).filter(pk=OuterRef("pk"))))


def _known(now: datetime) -> Q:
    """Running sessions whose GPU activity counts at ``now``: an ``ok`` reading younger than
    ``GSHARE_ACTIVITY_STALE_SECONDS`` (``sessions.idle.activity_unknown``'s rule, as ``idle_sessions`` reads it)."""
    fresh = now - timedelta(seconds=settings.GSHARE_ACTIVITY_STALE_SECONDS)
    return Q(phase=Session.Phase.RUNNING, activity__state="ok", activity__sampled_at__gte=fresh)


def filter_activity(qs: QuerySet[Session], value: str, *, now: datetime) -> QuerySet[Session]:
    """The sessions of ``qs`` the list's Activity filter keeps.

    Args:
        value: ``idle`` (``idle_sessions``: known, fresh, quiet for ``IDLE_DISPLAY_MINUTES`` policy minutes), ``busy``
            (Running, known and fresh, not idle) or ``unknown`` (Running, no fresh ``ok`` reading); anything else keeps all.
    """
    idle = Q(pk__in=idle_sessions(now=now).values("pk"))
    if value == "idle":
        return qs.filter(idle)
    if value == "busy":
        return qs.filter(_known(now)).exclude(idle)
    if value == "unknown":
        return qs.filter(phase=Session.Phase.RUNNING).exclude(_known(now))
    return qs


def suggested_images() -> list[SuggestedImage]:
    """The images staff suggest on the Start session form, in their order (one query)."""
    return list(SuggestedImage.objects.all())


def start_clusters() -> list[Cluster]:
    """Clusters a session may be pinned to on the Start session form: every cluster not deregistered, by name
    (an unreachable or pending one is listed with its status, and the service refuses it with ``cluster_unavailable``)."""
    return list(Cluster.objects.exclude(status=Cluster.Status.DEREGISTERED).order_by("name").only("public_id", "name", "status"))


def gpu_memory_text(memory: tuple[int, int] | None) -> str:
    """``(least, most)`` MiB per GPU as GiB for the picker (``"79.6 GiB"``, ``"40–80 GiB"``), or "" when unknown."""
    if memory is None:
        return ""
    least, most = (f"{Decimal(mib) / 1024:.1f}".removesuffix(".0") for mib in memory)
    return f"{least} GiB" if least == most else f"{least}–{most} GiB"


def start_gpu_memory() -> dict[str, str]:
    """The memory per GPU of each model the Start session form offers, in words (``gpu_memory_text``). One query."""
    return {model: gpu_memory_text(memory) for model, memory in gpu_model_memory().items()}


def start_gpu_models() -> list[tuple[str, int, int, Decimal]]:
    """The GPU models the Start session form offers: per model of the clusters that take sessions, ``(model, free,
    total, credits per GPU-hour)`` (``clusters.selectors.gpu_model_availability``: healthy GPUs on ready nodes, and
    those with nothing reserved), by model. Two queries."""
    prices = pricing.prices_by_model()
    return [(model, free, total, pricing.price_for_model(model, prices)) for model, free, total in gpu_model_availability()]


def start_volumes(*, owner) -> list[Volume]:
    """``owner``'s own live volumes (not deleted), by name, with the cluster holding each: what the Start session
    form offers to mount (staff too see only their own: a session mounts its owner's volumes)."""
    return list(volume_list(user=owner).filter(owner=owner).order_by("name", "id"))


def stopped_by(session: Session) -> str:
    """Who asked ``session`` to stop: the actor of its first ``session_stop`` audit row (``console:alice``,
    ``api:bob``, ``beat:sessions.idle``...), or "" when nobody did (it ended by itself, or is live). One query."""
    return (AuditRecord.objects.filter(object_type="session", object_id=session.public_id, action=AuditRecord.Action.SESSION_STOP)
            .order_by("at", "pk").values_list("actor", flat=True).first() or "")
