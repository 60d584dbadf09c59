"""Read queries of the audit trail."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from audit.models import AuditRecord


def audit_list(
    *,
    actor: str | None = None,
    action: str | None = None,
    object_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditRecord]:
    """Audit rows, newest first, filtered (every filter optional; all of them apply together; the API's ``?cluster=``:
    ``audit.api.filters.AuditFilter``).

    Args:
        actor: an actor exactly (``api:alice``), or every actor of a kind when it ends with ``:`` (``beat:``).
        action: an action (``cluster_update``).
        object_id: rows about this object (``ses_...``, ``vol_...``, a signing key's kid ...).
        since: rows written at or after this moment (aware).
        until: rows written before this moment (aware).

    Returns:
        A queryset of ``AuditRecord`` (no joins: a row holds everything it shows).
    """
    qs = AuditRecord.objects.all()
    if actor:
        qs = qs.filter(actor__startswith=actor) if actor.endswith(":") else qs.filter(actor=actor)
    if action:
        qs = qs.filter(action=action)
    if object_id:
        qs = qs.filter(object_id=object_id)
    if since is not None:
        qs = qs.filter(at__gte=since)
    if until is not None:
        qs = qs.filter(at__lt=until)
    return qs.order_by("-at", "-id")
