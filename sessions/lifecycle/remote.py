"""A session's GShareSession on its cluster: built, applied (server-side apply) and deleted through ``kube``, each call
bounded by ``GSHARE_PROBE_TIMEOUT`` and made with no row lock held."""

from __future__ import annotations

from django.conf import settings
from django.db.models import Prefetch

import contract
from clusters.models import Cluster
from clusters.routing_mode import routing_key
from kube import KubeGateway, KubeRefused, KubeUnavailable
from kube.gateway import GSHARE_SESSIONS
from sessions.gpu_models import hami_gpu_uuids
from sessions.manifests import gshare_session_manifest
from sessions.models import Session
from storage.models import Volume

#: Phases of a session whose GShareSession must not stay on its cluster.
ENDED_PHASES = (Session.Phase.STOPPING, Session.Phase.TERMINATED, Session.Phase.FAILED)


class TransientApplyError(Exception):
    """The cluster's apiserver could not be reached or was overloaded; the task retries."""


def _gateway(cluster: Cluster) -> KubeGateway:
    """A gateway to ``cluster``'s apiserver, each call bounded by ``GSHARE_PROBE_TIMEOUT`` (raises ``KubeconfigError``)."""
    return KubeGateway.for_cluster(cluster, call_timeout=settings.GSHARE_PROBE_TIMEOUT)


def session_for_apply(pk: int) -> Session:
    """The session ``pk`` with what its GShareSession is built from (cluster, owner, volumes and their pools)."""
    return (
        Session.objects.select_related("cluster", "owner")
        .prefetch_related(Prefetch("volumes", queryset=Volume.objects.select_related("pool")))
        .get(pk=pk)
    )


def gshare_session_apply(session: Session) -> tuple[str, str, str]:
    """Server-side apply ``session``'s GShareSession (``sessions.manifests``) to its cluster, with no row lock held.

    Returns:
        The ``clusters.routing_mode.routing_key`` the manifest was built from, for ``sessions.lifecycle.reapply.routing_changed_since``.

    Raises:
        KubeUnavailable: the apiserver did not answer, or answered 5xx/429. KubeRefused: it refused the object.
        KubeconfigError: the cluster's stored kubeconfig is unusable.
    """
    applied = routing_key(session.cluster)
    manifest = gshare_session_manifest(session, gpu_uuids=hami_gpu_uuids(cluster_id=session.cluster_id, models=session.gpu_models))
    with _gateway(session.cluster) as kube:
        kube.apply(manifest)
    return applied


def gshare_session_delete(session: Session) -> None:
    """Delete the session's GShareSession (404 counts as done; nothing to do on a deregistered cluster or none).

    Raises:
        TransientApplyError: the apiserver did not answer or refused.
    """
    cluster = session.cluster
    if cluster is None or cluster.status == Cluster.Status.DEREGISTERED:
        return
    try:
        with _gateway(cluster) as kube:
            kube.delete(GSHARE_SESSIONS, contract.session_object_name(session.public_id), namespace=settings.GSHARE_SESSION_NAMESPACE,
                        propagation_policy="Foreground")
    except KubeUnavailable as exc:
        if exc.status:
            raise TransientApplyError(f"deleting the GShareSession answered {exc.status} ({exc.reason})") from None
        raise TransientApplyError(f"the apiserver did not answer ({exc.cause_name})") from None
    except KubeRefused as exc:
        raise TransientApplyError(f"deleting the GShareSession answered {exc.status} ({exc.reason})") from None
