"""A session's first apply: its GShareSession server-side applied to the cluster it was placed on (``sessions.apply``),
and the give-up when the apiserver kept failing."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from kube import KubeRefused, KubeUnavailable
from sessions.lifecycle.end import session_fail
from sessions.lifecycle.reapply import routing_changed_since
from sessions.lifecycle.remote import ENDED_PHASES, TransientApplyError, gshare_session_apply, gshare_session_delete, session_for_apply
from sessions.models import Session

logger = logging.getLogger(__name__)


def session_apply(*, session: Session) -> Session:
    """Apply the session's GShareSession to its cluster (server-side apply) and mark it Starting.

    Transient failures (apiserver unreachable, 5xx, 429) raise ``TransientApplyError`` so the Celery
    task retries with backoff; anything else fails the session with a message naming the cause.
    Does nothing for a session that is no longer Scheduled. A session stopped while the PATCH was in flight
    (Stopping, Terminated or Failed after it) gets its GShareSession deleted again at once, since the stop's
    delete may have come first and found nothing; if that delete fails, ``sessions_reconcile`` re-issues it. When the
    cluster's routing changed while the apply was in flight, the session is marked for a re-apply
    (``sessions.reapply``), also when the operator reported it Starting or Running before this function could.
    """
    session = session_for_apply(session.pk)
    if session.phase != Session.Phase.SCHEDULED:
        return session
    try:
        applied = gshare_session_apply(session)
    except KubeUnavailable as exc:
        if exc.status:
            raise TransientApplyError(f"the apiserver of {session.cluster.name} answered {exc.status} ({exc.reason})") from None
        raise TransientApplyError(f"the apiserver of {session.cluster.name} did not answer ({exc.cause_name})") from None
    except KubeRefused as exc:
        hint = {
            404: f"the GShareSession CRD or the namespace {settings.GSHARE_SESSION_NAMESPACE} is missing: install charts/gshare-operator",
            403: "the control plane's ServiceAccount may not apply GShareSessions: grant it the ClusterRole in docs/attach-a-cluster.md",
            401: "the cluster refused the control plane's credentials: register a fresh kubeconfig",
        }.get(exc.status, f"the apiserver refused the GShareSession ({exc.status} {exc.reason})")
        return session_fail(session=session, message=f"Could not apply the session to {session.cluster.name}: {hint}.")
    updated = Session.objects.filter(pk=session.pk, phase=Session.Phase.SCHEDULED).update(phase=Session.Phase.STARTING)
    if updated:
        session.phase = Session.Phase.STARTING
        # The cluster's routing changed while the apply was in flight (its re-apply found the session still Scheduled).
        routing_changed_since(session, applied)
        return session
    session.phase = Session.objects.filter(pk=session.pk).values_list("phase", flat=True).get()
    if session.phase not in ENDED_PHASES:
        # The operator reported it (Starting, Running) before this update: the routing check is still this apply's,
        # since a re-apply marked meanwhile found the session Scheduled and only cleared its mark.
        routing_changed_since(session, applied)
        return session
    # Stopped while the PATCH was in flight: the stop's delete may have found nothing (404) and counted it done, and
    # the object exists now. Delete it again; if the apiserver does not answer, sessions_reconcile re-issues it.
    try:
        gshare_session_delete(session)
    except TransientApplyError as exc:
        logger.warning("session %s ended during its apply; its GShareSession is deleted later by sessions.reconcile: %s",
                       session.public_id, exc)
    return session


@transaction.atomic
def session_apply_gave_up(*, session: Session, reason: str) -> Session:
    """Fail a session whose apply kept failing after the bounded retries, if it is still Scheduled.

    The last attempt can take ``GSHARE_PROBE_TIMEOUT`` seconds: a session stopped by its owner meanwhile (Stopping, its
    delete under way) or reported by the operator (an earlier attempt reached the apiserver) is left as it is.
    """
    session = Session.objects.select_for_update().get(pk=session.pk)
    if session.phase != Session.Phase.SCHEDULED:
        return session
    return session_fail(session=session, message=f"Could not apply the session to its cluster after several attempts: {reason}.")
