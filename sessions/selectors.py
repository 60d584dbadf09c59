"""Read queries for sessions."""

from __future__ import annotations

from django.db.models import QuerySet

from gshare.exceptions import NotFound
from sessions.models import Session


def session_list(*, user, cluster: str | None = None, phase: str | None = None) -> QuerySet[Session]:
    """Sessions visible to ``user`` (their own; staff see all), with cluster and owner joined.

    Args:
        cluster: filter by cluster id (``clu_...``) or name.
        phase: filter by phase (``Running``...).
    """
    qs = Session.objects.select_related("cluster", "owner").order_by("-created_at", "-id")
    if not user.is_staff:
        qs = qs.filter(owner=user)
    if cluster:
        qs = qs.filter(cluster__public_id=cluster) if cluster.startswith("clu_") else qs.filter(cluster__name=cluster)
    if phase:
        qs = qs.filter(phase=phase)
    return qs


def session_get(*, user, public_id: str) -> Session:
    """One session visible to ``user``.

    Raises:
        NotFound: 404 ``session_not_found`` (also for another user's session).
    """
    session = session_list(user=user).filter(public_id=public_id).first()
    if session is None:
        raise NotFound(f"No session {public_id!r} of yours: list yours with `GET /api/v1/sessions`.", code="session_not_found")
    return session
