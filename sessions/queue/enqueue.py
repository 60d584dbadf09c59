"""New requests and the queue: placing a request behind the sessions already waiting (``place_behind_queue``), refusing
one that can never fit (``never_fits_reason``), and keeping one as a ``Queued`` session (``session_enqueue``)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from django.utils import timezone

from audit.services import Action, audit_record, created
from clusters.models import Cluster
from core.collector import collector_paused
from core.exceptions import ApplicationError, Conflict
from core.prepared import statement_cursor
from sessions import placement, resources
from sessions.errors import NEVER_FITS, QUEUE_LIMIT_REACHED
from sessions.models import Session
from sessions.queue import estimates, leave
from sessions.queue.order import order_key
from sessions.queue.plan import Fleet, Outcome, plan
from sessions.queue.snapshot import fleet_read, job_of, jobs_of, queued_sessions


class NeverFits(Conflict):
    """409: no node the request may use could ever host it, however many sessions end."""

    code = NEVER_FITS


class QueueLimitReached(ApplicationError):
    """403: the owner already has their policy's ``max_queued_sessions`` waiting."""

    code = QUEUE_LIMIT_REACHED
    status = 403


#: The most GPUs of the accepted models on one node, and the most memory of one of them, over the nodes of the clusters
#: that take sessions or may again (any status but deregistered; ready or not, healthy or not: all may come back).
_LARGEST_SQL = """
SELECT COALESCE(MAX(g.gpus), 0), COUNT(*),
       COALESCE(MAX(g.gpus) FILTER (WHERE (g.cpu IS NULL OR %(cpu)s::bigint IS NULL OR g.cpu >= %(cpu)s)
                                    AND (g.ram IS NULL OR %(ram)s::bigint IS NULL OR g.ram >= %(ram)s)), 0)
FROM (
    SELECT COUNT(*) AS gpus, MIN(n.cpu_allocatable_millicores - n.cpu_requested_millicores) AS cpu,
           MIN(n.memory_allocatable_mib - n.memory_requested_mib) AS ram
    FROM clusters_gpudevice d
    JOIN clusters_cluster c ON c.id = d.cluster_id
    JOIN clusters_node n ON n.id = d.node_id
    WHERE c.status <> 'deregistered' AND c.session_domain <> ''
      AND (%(clusters)s::bigint[] IS NULL OR d.cluster_id = ANY(%(clusters)s::bigint[]))
      AND (%(models)s::text[] IS NULL OR d.model = ANY(%(models)s::text[]))
      AND (%(memory)s::bigint IS NULL OR d.memory_mib >= %(memory)s)
    GROUP BY d.node_id
) g
"""


def never_fits_reason(*, request: placement.Request, clusters: list[int] | None, where: str) -> str | None:
    """Why ``request`` could never be placed on the clusters ``clusters`` (None: the fleet), or None when it could once
    enough sessions end: no GPU of the accepted models there, more GPUs than any one node has of them (a session's GPUs
    are on one node), a share larger than any of their GPUs, or more CPU or memory than any such node has room for with
    no session on it. One query.

    Args:
        request: the request.
        clusters: the cluster pks it may use (pinned, volumes, policy), or None.
        where: the place in words, for the sentence ("the fleet", "cluster lab-a").
    """
    params = {"clusters": None if clusters is None else "{" + ",".join(str(int(c)) for c in clusters) + "}",
              "models": list(request.models) or None, "memory": request.memory_mib,
              "cpu": resources.cpu_millicores(request.cpu), "ram": resources.memory_mib(request.memory_gib)}
    with statement_cursor() as cursor:
        cursor.execute(_LARGEST_SQL, params)
        most_gpus, nodes, most_sized = cursor.fetchone()
    models = f" of model {' or '.join(request.models)}" if request.models else ""
    if not nodes:
        if request.memory_mib is not None:
            return f"no GPU{models} in {where} has {request.memory_mib} MiB of memory"
        return f"{where} has no GPU{models}"
    if most_gpus < request.gpus:
        return f"a session's GPUs are on one node, and no node in {where} has more than {most_gpus} GPU(s){models}"
    if most_sized < request.gpus:
        asked = " and ".join(part for part in (
            f"{request.cpu.normalize():f} CPU core(s)" if request.cpu is not None else "",
            f"{request.memory_gib.normalize():f} GiB of memory" if request.memory_gib is not None else "") if part)
        return (f"no node in {where} with {request.gpus} GPU(s){models} has room for {asked}, even empty (its allocatable CPU and "
                "memory less what its other pods request)")
    return None


def uncontested_clusters(*, scope: list[int] | None, pinned) -> tuple[list[int] | None, bool]:
    """The clusters among ``scope`` (None: all that take sessions) that no queued session may use, so that a new request
    placed there delays nobody in the queue, and whether they are the whole scope (then the queue is not in the
    request's way at all). ``(None, False)`` when there are none or when any queued session may use any cluster (it is
    not pinned). One query (two when some are pinned and nothing is pinned by the request).

    Args:
        scope: the cluster pks the request may use, or None.
        pinned: the request's pinned ``Cluster``, or None.
    """
    pins = set(Session.objects.queued().order_by().values_list("requested_cluster_id", flat=True).distinct())
    if not pins or None in pins:
        return None, False
    if pinned is not None:
        return (None, False) if pinned.pk in pins else ([pinned.pk], True)
    if scope is None:
        scope = list(Cluster.objects.filter(status=Cluster.Status.CONNECTED).exclude(session_domain="").values_list("pk", flat=True))
    free = sorted(set(scope) - pins)
    return (free or None), len(free) == len(set(scope))


def place_behind_queue(*, session: Session, policy, clusters: frozenset[int] | None, now: datetime,
                       has_volumes: bool = False) -> tuple[Outcome, Fleet]:
    """Where a new request (``session``, not saved) would start, planned behind the sessions already queued ahead of it
    in the queue's order (its owner's priority, arriving now): a request that fits now only where it would delay one of
    them is not placed now. Reads the fleet and the queue (``sessions.queue.snapshot``).

    Returns:
        ``(outcome, fleet)``: its ``Outcome`` (``now`` True with the node and GPUs to reserve, else its estimated start)
        and the fleet as planned with it (what its alternatives are searched on).
    """
    waiting = queued_sessions()
    new_key = order_key(priority=policy.priority, queued_at=now, pk=0)
    ahead = [s for s in waiting if order_key(priority=s.priority, queued_at=s.queued_at, pk=s.pk) < new_key]
    jobs = jobs_of(ahead)
    job = job_of(session=session, policy=policy, clusters=clusters, key=0, has_volumes=has_volumes)
    jobs.append(job)
    with collector_paused():  # the fleet's picture: one object per GPU (core.collector)
        fleet = fleet_read(now=now, by_cluster=any(j.clusters is not None or j.policy_clusters is not None for j in jobs))
        return plan(fleet, jobs)[-1], fleet


def session_enqueue(*, session: Session, policy, clusters: frozenset[int] | None, volumes: list, account_queued: int,
                    planned: tuple[Outcome, Fleet] | None = None) -> Session:
    """Save ``session`` (built by ``sessions.create``, not saved) as ``Queued``, with its position, estimate and
    alternatives, in the caller's transaction (which holds its owner's credit account lock); a pass of the queue runs
    after the commit.

    Args:
        session: the request, not saved.
        policy: its owner's ``EffectivePolicy``.
        clusters: the clusters it may use (None: any).
        volumes: its volumes (mounted at admission; claimed for a cluster then).
        account_queued: how many sessions the owner has queued already (read under the lock).
        planned: ``place_behind_queue``'s answer for this request, when the caller has just planned it (not planned again).

    Raises:
        QueueLimitReached: 403 ``queue_limit_reached``.
    """
    if account_queued >= policy.max_queued_sessions:
        raise QueueLimitReached(
            f"You already have {account_queued} session(s) waiting in the queue, your policy's max_queued_sessions "
            f"({policy.max_queued_sessions}): stop one (DELETE /api/v1/sessions/{{id}}), or wait for one to start.",
            extra={"max_queued_sessions": policy.max_queued_sessions},
        )
    now = timezone.now()
    session.phase, session.cluster, session.node, session.ends_at = Session.Phase.QUEUED, None, "", None
    session.priority, session.queued_at = policy.priority, now
    session.queue_expires_at = now + timedelta(hours=float(policy.queue_timeout_hours))
    outcome, fleet = planned or place_behind_queue(session=session, policy=policy, clusters=clusters, now=now,
                                                   has_volumes=bool(volumes))
    session.save()
    if volumes:
        through = Session.volumes.through
        through.objects.bulk_create([through(session_id=session.pk, volume_id=v.pk) for v in volumes])
    outcome = dataclasses.replace(outcome, job=dataclasses.replace(outcome.job, key=session.pk, public_id=session.public_id))
    estimates.estimates_write(fleet=fleet, outcomes=[outcome], now=now)
    session.refresh_from_db(fields=["queue_position", "estimated_start", "first_estimated_start", "waiting_for", "alternatives"])
    audit_record(action=Action.SESSION_CREATE, obj=session, changes=created({
        "name": session.name, "image": session.image, "gpus": session.gpus, "gpu_memory_mib": session.gpu_memory_mib,
        "gpu_cores": session.gpu_cores, "phase": session.phase, "volumes": [v.public_id for v in volumes],
        "estimated_start": session.estimated_start, **({"gpu_models": session.gpu_models} if session.gpu_models else {}),
    }), details={"owner": session.owner.get_username()})
    leave.publish_after_commit()
    return session


def queued_count(*, owner) -> int:
    """How many sessions ``owner`` has waiting in the queue (call it under their credit account lock)."""
    return Session.objects.queued().filter(owner=owner).count()
