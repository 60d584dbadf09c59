"""Re-applying the GShareSessions of a cluster whose routing changed (``PATCH /api/v1/clusters/{id}`` with ``routing``,
``gateway_name`` or ``gateway_namespace``), so each session's routing objects (Ingress, or HTTPRoute + SecurityPolicy)
follow ``spec.routing`` and ``spec.gateway``.

``Session.reapply_due_at`` is the outbox: the cluster's change marks its live sessions in its own transaction (the
sessions app answers ``clusters.signals.cluster_routing_changed``), the publishes of ``sessions.reapply`` follow the
commit, and ``sessions.reconcile`` (``sessions.lifecycle.reconcile``) publishes again any mark left older than
``GSHARE_SESSION_RECONCILE_AFTER`` (a lost publish, a task that gave up). The task applies with no row lock held,
then checks the cluster's routing again: an apply that read the routing before a newer change leaves the mark set
(and publishes again), so the last change wins whatever order the applies land in.
"""

from __future__ import annotations

import logging

from django.utils import timezone

from clusters.models import Cluster
from clusters.routing_mode import routing_key
from kube import KubeRefused, KubeUnavailable
from sessions.lifecycle import outbox
from sessions.lifecycle.remote import ENDED_PHASES, TransientApplyError, gshare_session_apply, gshare_session_delete, session_for_apply
from sessions.models import Session

logger = logging.getLogger(__name__)

#: The phases whose GShareSession is (or is about to be) on the cluster and stays: re-applied on a routing change.
REAPPLY_PHASES = (Session.Phase.SCHEDULED, Session.Phase.STARTING, Session.Phase.RUNNING)


def sessions_reapply_mark(*, cluster: Cluster) -> int:
    """Mark every live session of ``cluster`` (Scheduled, Starting, Running) due for a re-apply, in the caller's
    transaction (which holds the cluster's row lock: no session is placed there meanwhile), and publish
    ``sessions.reapply`` for each after the commit.

    Returns:
        How many sessions were marked.
    """
    pks = list(Session.objects.filter(cluster=cluster, phase__in=REAPPLY_PHASES).order_by("pk").values_list("pk", flat=True))
    if pks:
        Session.objects.filter(pk__in=pks).update(reapply_due_at=timezone.now())
        outbox.publish_after_commit(outbox.REAPPLY, *pks)
    return len(pks)


def routing_changed_since(session: Session, applied: tuple[str, str, str]) -> bool:
    """Whether the routing of ``session``'s cluster now differs from ``applied`` (``clusters.routing_mode.routing_key`` of
    the manifest just applied); if so the session is marked due again and ``sessions.reapply`` is published (after the
    commit of the caller's transaction, if any)."""
    current = Cluster.objects.filter(pk=session.cluster_id).first()
    if current is None or routing_key(current) == applied:
        return False
    Session.objects.filter(pk=session.pk).update(reapply_due_at=timezone.now())
    outbox.publish_after_commit(outbox.REAPPLY, session.pk)
    return True


def session_reapply(*, session: Session) -> Session:
    """Apply the session's GShareSession again (server-side apply) if it is marked due; then clear the mark.

    A Scheduled session is not applied (its first apply, ``sessions.apply``, is still due) and keeps its mark, so
    ``sessions.reconcile`` publishes it again once it is Starting: that apply may have read the routing before the
    change and lost its answer, leaving no check of its own. A session that ended (or is stopping) is not
    applied: its GShareSession is deleted again, as an apply of this task may have landed after the stop's delete.
    A live session's phase is not changed.

    Raises:
        TransientApplyError: the apiserver did not answer or was overloaded (the task retries; when it gives up the mark
            stays for ``sessions.reconcile``).
    """
    session = session_for_apply(session.pk)
    due = session.reapply_due_at
    if due is None or session.cluster is None:
        return session
    if session.phase == Session.Phase.SCHEDULED:
        # The mark stays: the first apply may have read the old routing, and its own check after it does not run when
        # its answer is lost and the operator reports the session Starting before the retry (which then does nothing).
        return session
    if session.phase in ENDED_PHASES:
        gshare_session_delete(session)
    elif session.phase in (Session.Phase.STARTING, Session.Phase.RUNNING):
        try:
            applied = gshare_session_apply(session)
        except KubeUnavailable as exc:
            raise TransientApplyError(f"re-applying to {session.cluster.name}: the apiserver {exc}") from None
        except KubeRefused as exc:
            # Retrying will not help until someone acts; the session keeps running on its old routing objects.
            logger.error("session %s: its GShareSession could not be re-applied on %s after a routing change: %s %s",
                         session.public_id, session.cluster.name, exc.status, exc.summary)
        else:
            phase = Session.objects.filter(pk=session.pk).values_list("phase", flat=True).get()
            if phase in ENDED_PHASES:  # stopped while the apply was in flight: its delete may have come first
                session.phase = phase
                gshare_session_delete(session)
            elif routing_changed_since(session, applied):
                return session
    # Only the mark this run saw: a newer change marked it again and its own task applies that.
    Session.objects.filter(pk=session.pk, reapply_due_at=due).update(reapply_due_at=None)
    session.reapply_due_at = None
    return session


def sessions_reapply_due(*, cutoff, limit: int) -> list[int]:
    """Pks of the sessions marked due for a re-apply before ``cutoff`` (oldest first, at most ``limit``), for
    ``sessions.reconcile``."""
    return list(
        Session.objects.filter(reapply_due_at__lt=cutoff).order_by("reapply_due_at", "pk").values_list("pk", flat=True)[:limit]
    )
