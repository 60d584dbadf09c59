"""The sessions' answers to what clusters announce (``clusters.signals``), connected by ``sessions.apps``."""

from __future__ import annotations

from clusters.models import Cluster
from sessions.lifecycle.reapply import sessions_reapply_mark
from sessions.models import Session
from sessions.queue import leave


def on_cluster_routing_changed(sender, *, cluster: Cluster, **kwargs) -> int:
    """Mark the cluster's live sessions due for a re-apply (``reapply.sessions_reapply_mark``); returns how many."""
    return sessions_reapply_mark(cluster=cluster)


def on_session_domain_changing(sender, *, cluster: Cluster, **kwargs) -> list[str]:
    """Ids (``ses_...``) of the cluster's sessions not in a final phase, oldest first: their URL, Ingress host and
    connect check all use the cluster's current ``session_domain``."""
    return list(
        Session.objects.filter(cluster=cluster).exclude(phase__in=Session.TERMINAL_PHASES)
        .order_by("created_at", "id").values_list("public_id", flat=True)
    )


def on_cluster_deregistering(sender, *, cluster: Cluster, **kwargs) -> int:
    """How many live sessions are on the cluster (each holds its GPU reservations until it ends)."""
    return Session.live_on_cluster(cluster)


def on_capacity_changed(sender, *, cluster: Cluster, **kwargs) -> None:
    """A cluster's inventory changed: a pass of the queue after the commit (GPUs may have been added or healed)."""
    leave.publish_after_commit()
