"""The queue's passes: admitting the queued sessions the plan starts now, dropping those that waited too long, and
writing every queued session's position, estimate, reason and alternatives (``queue_pass``).

A pass runs after each change that may free capacity (a session's GPUs released, a cluster's inventory applied, a
queued session cancelled: ``publish_after_commit``) and on the beat (``sessions.queue_tick``, every 30 s, the safety
net for a publish that was lost). Passes run one at a time (a PostgreSQL advisory lock), so two passes never admit
the same session twice; each admission then takes the locks any placement takes (the owner's credit account, the
chosen cluster's row, the volumes) and reserves exactly the GPUs the plan chose, checking their fit again under the
cluster's lock (``placement.reserve``). A release, an inventory or a new session racing with it is therefore
serialised by the cluster's lock: nothing is placed twice on one slot.

Admission re-checks the owner's policy and credits (``billing.admission``): a session whose owner can no longer pay
is dropped (``stop_reason`` ``credits``); one over its owner's session or GPU quota waits for their sessions to end.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import Action, audit_record, audit_record_many
from billing import admission
from billing.exceptions import ClusterNotAllowed, InsufficientCredits, QuotaExceeded
from clusters.models import Cluster
from core.collector import collector_paused
from sessions import placement, runtime
from sessions.lifecycle import outbox
from sessions.models import Session
from sessions.queue import estimates, leave
from sessions.queue.plan import Outcome, plan
from sessions.queue.reserve import planned_reserve, priced_cores
from sessions.queue.snapshot import fleet_read, jobs_of, queued_sessions
from sessions.volume_claims import PlacementRaced, volumes_lock
from storage.models import Volume

logger = logging.getLogger(__name__)

#: The advisory lock key of a pass (``pg_advisory_lock``): one pass at a time, fleet-wide.
_PASS_LOCK = 0x6753_5155  # "gSQU"


def queue_pass(*, now: datetime | None = None) -> dict[str, int]:
    """One pass of the queue: drop the sessions past their ``queue_expires_at``, plan, admit what the plan starts now,
    write the others' estimates.

    Args:
        now: the pass's time (aware UTC); None: ``timezone.now()``.

    Returns:
        ``{"queued", "admitted", "expired", "dropped"}`` counts.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [_PASS_LOCK])
    try:
        with collector_paused():  # the fleet's picture: one object per GPU, thrown away at the end (core.collector)
            return _pass(now=now)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_PASS_LOCK])


def _pass(*, now: datetime | None) -> dict[str, int]:
    now = now or timezone.now()
    sessions = queued_sessions(now=now)
    due = [s.pk for s in sessions if s.due]
    expired = queue_expire(now=now, pks=due) if due else 0
    sessions = [s for s in sessions if not s.due]
    result = {"queued": len(sessions), "admitted": 0, "expired": expired, "dropped": 0}
    if not sessions:
        return result
    jobs = jobs_of(sessions)
    fleet = fleet_read(now=now, by_cluster=any(j.clusters is not None or j.policy_clusters is not None for j in jobs))
    outcomes = plan(fleet, jobs)
    by_pk = {s.pk: s for s in sessions}
    verdicts = _admit_many(_batch(by_pk, outcomes), now=now)
    waiting, held_back = [], {}
    for outcome in outcomes:
        if outcome.now:
            verdict = verdicts.get(outcome.job.key) or _admit(by_pk[outcome.job.key], outcome, now=now)
            if verdict in ("admitted", "dropped"):
                result[verdict] += 1
                continue
            if verdict != "waits":
                held_back[outcome.job.key] = verdict
        waiting.append(outcome)
    shown = {s.pk: (s.queue_position, s.estimated_start, s.waiting_for, s.alternatives) for s in sessions}
    estimates.estimates_write(fleet=fleet, outcomes=waiting, now=now, held_back=held_back, shown=shown)
    if result["admitted"] or result["dropped"] or expired:
        logger.info("queue pass: %s", result)
    return result


def _admit(session: Session, outcome: Outcome, *, now: datetime) -> str:
    """Start one queued session on the node and GPUs the plan chose. Returns ``"admitted"``, ``"dropped"`` (its owner
    can no longer pay), ``"waits"`` (the GPUs were taken, or it left the queue, meanwhile: the next pass plans again),
    or why its owner's policy holds it back (over its session or GPU quota; a sentence for its ``waiting_for``)."""
    try:
        with transaction.atomic():
            return _admit_locked(session, outcome, now=now)
    except PlacementRaced:
        return "waits"


def _admit_locked(session, outcome: Outcome, *, now: datetime) -> str:
    account = admission.account_lock(user=get_user_model()(pk=session.owner_id))
    session = (Session.objects.select_for_update(of=("self",)).select_related("owner", "requested_cluster")
               .filter(pk=session.pk, phase=Session.Phase.QUEUED).first())
    if session is None:  # cancelled, or admitted by an earlier pass, meanwhile
        return "waits"
    cluster_id = outcome.node.cluster_id
    state = admission.admission_read(user=session.owner, scope=[cluster_id], ended_phases=Session.HOLDING_EXCLUDED_PHASES)
    verdict = _judge(session, outcome, state=state, account=account)
    if verdict is not None:
        return verdict
    locked = _clusters_lock([cluster_id])[cluster_id]
    volumes = list(Volume.objects.filter(sessions=session).select_related("cluster")) if outcome.job.has_volumes else []
    claims = volumes_lock(volumes=volumes, cluster_id=cluster_id, pinned=session.requested_cluster) if volumes else []
    _started(session, outcome, state=state, now=now)
    session.save(update_fields=_STARTED_FIELDS)
    node_name = _reserve(session, outcome)
    if claims:
        for claim in claims:
            claim.cluster_id = cluster_id
        Volume.objects.bulk_update(claims, ["cluster", "claim_name"])
    audit_record(**_admit_audit(session, cluster=locked, node_name=node_name, now=now))
    outbox.publish_after_commit(outbox.APPLY, session.pk)
    return "admitted"


def _batch(by_pk: dict, outcomes: list[Outcome]) -> list[tuple]:
    """The sessions the plan starts now that ``_admit_many`` takes together: each owner's first in the queue's order
    only (an owner's second session must see the first in its admission read), none with volumes (their claims are
    locked one session at a time). ``[(QueuedRow, Outcome)]``; empty when fewer than two."""
    owners, batch = set(), []
    for outcome in outcomes:
        row = by_pk[outcome.job.key]
        if not outcome.now or row.owner_id in owners:
            continue
        # An owner whose first session mounts volumes is left out whole: the batch, admitted before the one-by-one
        # path, would otherwise start their next session first, and their quota then holds back the one ahead of it.
        owners.add(row.owner_id)
        if not outcome.job.has_volumes:
            batch.append((row, outcome))
    return batch if len(batch) > 1 else []


def _admit_many(items: list[tuple], *, now: datetime) -> dict[int, str]:
    """Admit several queued sessions (``_batch``) in one transaction: what ``_admit`` does for one, each step one
    statement for all of them: the owners' accounts, the sessions, the admission reads, the clusters' locks, the
    sessions' rows, the audit rows; the reservation is three (``sessions.queue.reserve``). Returns ``{session pk: verdict}``
    (``_admit``'s verdicts); ``{}`` when a reservation raced (all rolled back: the caller admits them one by one)."""
    if not items:
        return {}
    try:
        with transaction.atomic():
            return _admit_many_locked(items, now=now)
    except PlacementRaced:
        return {}


def _admit_many_locked(items: list[tuple], *, now: datetime) -> dict[int, str]:
    accounts = admission.accounts_lock(user_ids=[row.owner_id for row, _ in items])
    locked = {s.pk: s for s in Session.objects.select_for_update(of=("self",)).select_related("owner")
              .filter(pk__in=[row.pk for row, _ in items], phase=Session.Phase.QUEUED).order_by("pk")}
    verdicts = {row.pk: "waits" for row, _ in items if row.pk not in locked}  # cancelled, or admitted, meanwhile
    live = [(locked[row.pk], outcome) for row, outcome in items if row.pk in locked]
    states = admission.admission_read_many(requests=[(s.owner_id, [o.node.cluster_id]) for s, o in live],
                                           ended_phases=Session.HOLDING_EXCLUDED_PHASES)
    starting = []
    for (session, outcome), state in zip(live, states, strict=True):
        verdict = _judge(session, outcome, state=state, account=accounts[session.owner_id])
        if verdict is None:
            starting.append((session, outcome, state))
        else:
            verdicts[session.pk] = verdict
    if not starting:
        return verdicts
    clusters = _clusters_lock({o.node.cluster_id for _, o, _ in starting})
    reserved = planned_reserve([(session, outcome) for session, outcome, _ in starting])
    for session, outcome, state in starting:
        _started(session, outcome, state=state, now=now)
        session.node = reserved[session.pk].node_name
        if reserved[session.pk].cores is not None:
            session.gpu_cores = reserved[session.pk].cores
    with connection.cursor() as cursor:
        cursor.execute(_STARTED_SQL, {"ids": [s.pk for s, _, _ in starting], "clusters": [s.cluster_id for s, _, _ in starting],
                                      "ends": [s.ends_at for s, _, _ in starting], "nodes": [s.node for s, _, _ in starting],
                                      "cores": [s.gpu_cores for s, _, _ in starting], "phase": Session.Phase.SCHEDULED, "now": now})
    audits = []
    for session, outcome, _ in starting:
        audits.append(_admit_audit(session, cluster=clusters[outcome.node.cluster_id], node_name=session.node, now=now))
        verdicts[session.pk] = "admitted"
    audit_record_many(audits)
    outbox.publish_after_commit(outbox.APPLY, *(s.pk for s, _, _ in starting))
    return verdicts


def _clusters_lock(ids) -> dict[int, Cluster]:
    """Lock the rows of the clusters ``ids`` (pk order) that still take sessions; ``{pk: Cluster}`` (pk, public id, name).

    Raises:
        PlacementRaced: one of them no longer takes sessions (disconnected, deregistered, no session domain).
    """
    clusters = {c.pk: c for c in Cluster.objects.select_for_update(no_key=True).filter(
        pk__in=sorted(ids), status=Cluster.Status.CONNECTED).exclude(session_domain="").only("pk", "public_id", "name").order_by("pk")}
    if len(clusters) != len(set(ids)):
        raise PlacementRaced
    return clusters


def _judge(session: Session, outcome: Outcome, *, state, account) -> str | None:
    """Whether a locked queued session may start on the plan's GPUs: None when it may, else its verdict (``_admit``'s):
    ``"dropped"`` (ended here: its owner was deactivated or can no longer pay) or why its owner's policy holds it back."""
    if not session.owner.is_active:  # deactivated while it waited: nobody could open it
        leave.queued_end(session=session, stop_reason="", message="Left the queue unstarted: its owner's account was deactivated.")
        return "dropped"
    try:
        admission.admission_clusters(policy=state.policy, pinned=None, volume_clusters=frozenset({outcome.node.cluster_id}))
        # Priced at what it will hold: a share takes at least one split slot of cores on the GPUs the plan chose (the
        # reservation refuses to take more: ``_reserve``, ``planned_reserve``).
        cores = priced_cores(session, outcome)
        admission.admission_check(user=session.owner, gpus=session.gpus, gpu_memory_mib=session.gpu_memory_mib, gpu_cores=cores,
                                  clusters=(), locked_account=account, state=state)
    except InsufficientCredits as exc:
        leave.queued_end(session=session, stop_reason=Session.StopReason.CREDITS,
                         message=f"Left the queue unstarted: its GPUs were free, but {exc.detail}")
        return "dropped"
    except (QuotaExceeded, ClusterNotAllowed) as exc:
        return f"Its GPUs are free, but your policy holds it back: {exc.detail}"[:2000]
    return None


#: The columns ``_started`` sets.
_STARTED_FIELDS = ["cluster", "phase", "ends_at", "admitted_at", "queue_position", "estimated_start", "waiting_for", "alternatives",
                   "message"]


#: ``_STARTED_FIELDS`` of several sessions in one statement, with the node and (for a share) the cores ``planned_reserve``
#: reserved (Django's ``bulk_update`` builds a CASE per column and row,
#: which costs more than the statement).
_STARTED_SQL = """
UPDATE gpu_sessions_session s
   SET cluster_id = v.cluster, phase = %(phase)s, ends_at = v.ends_at, admitted_at = %(now)s, queue_position = NULL,
       estimated_start = NULL, waiting_for = '', alternatives = '[]'::jsonb, message = '', node = v.node, gpu_cores = v.cores
  FROM unnest(%(ids)s::bigint[], %(clusters)s::bigint[], %(ends)s::timestamptz[], %(nodes)s::text[], %(cores)s::int[])
       AS v(id, cluster, ends_at, node, cores)
 WHERE s.id = v.id
"""


def _started(session: Session, outcome: Outcome, *, state, now: datetime) -> None:
    """Set ``session``'s fields (``_STARTED_FIELDS``, not saved) as admitted at ``now`` on the plan's cluster."""
    try:
        ends_at = runtime.runtime_ends_at(policy=state.policy, start=now, hours=session.runtime_hours)
    except runtime.RuntimeOverLimit:  # the policy's maximum was lowered while it waited: it gets the new maximum
        ends_at = runtime.runtime_ends_at(policy=state.policy, start=now, hours=None)
    session.cluster_id, session.phase, session.ends_at, session.admitted_at = (outcome.node.cluster_id, Session.Phase.SCHEDULED,
                                                                               ends_at, now)
    session.queue_position, session.estimated_start, session.waiting_for, session.alternatives = None, None, "", []
    session.message = ""


def _reserve(session: Session, outcome: Outcome) -> str:
    """Reserve exactly the plan's GPUs for ``session`` (under its cluster's lock); returns the node's name.

    Raises:
        PlacementRaced: they were taken since the plan read the fleet, or a share would take more cores than ``_judge``
            priced it at (their split count was lowered since): the caller rolls back; the next pass plans again.
    """
    request = placement.Request(gpus=session.gpus, memory_mib=session.gpu_memory_mib, cores=session.gpu_cores,
                                models=tuple(session.gpu_models or ()), cpu=session.cpu, memory_gib=session.memory_gib)
    reserved = placement.reserve(session_id=session.pk, request=request, cluster_id=outcome.node.cluster_id,
                                 node_id=outcome.node.pk, device_ids=[d.pk for d in outcome.devices])
    if reserved is None or set(reserved.device_ids) & set(reserved.over):
        raise PlacementRaced
    if reserved.cores is not None and reserved.cores > priced_cores(session, outcome):
        raise PlacementRaced  # admitted at fewer cores than it would be billed at: priced again on the next pass
    return reserved.node_name


def _admit_audit(session: Session, *, cluster: Cluster, node_name: str, now: datetime) -> dict:
    """The audit row of an admission (``audit_record``'s arguments)."""
    return {"action": Action.SESSION_ADMIT, "obj": session, "cluster": cluster,
            "changes": {"phase": (Session.Phase.QUEUED, Session.Phase.SCHEDULED), "node": ("", node_name),
                        "ends_at": (None, session.ends_at)},
            "details": {"owner": session.owner.get_username(), "waited_seconds": int((now - session.queued_at).total_seconds())}}


def queue_expire(*, now: datetime, pks: list[int] | None = None) -> int:
    """Drop the queued sessions that can no longer start: those past their ``queue_expires_at`` (``stop_reason``
    ``queue_timeout``) and those pinned to a cluster that was deregistered. One query when there are none; returns how
    many were dropped.

    Args:
        now: the time judged at.
        pks: the sessions found due (``QueuedRow.due``), each checked again under its lock; None: looked up here.
    """
    if pks is None:
        pks = list(Session.objects.queued()
                   .filter(Q(queue_expires_at__lte=now) | Q(requested_cluster__status=Cluster.Status.DEREGISTERED))
                   .order_by("pk").values_list("pk", flat=True)[:500])
    due = sorted(pks)
    dropped = 0
    for pk in due:
        with transaction.atomic():
            session = (Session.objects.select_for_update(of=("self",)).select_related("owner", "requested_cluster")
                       .filter(pk=pk, phase=Session.Phase.QUEUED).first())
            deregistered = session is not None and session.requested_cluster is not None and (
                session.requested_cluster.status == Cluster.Status.DEREGISTERED)
            if session is None or not (deregistered or (session.queue_expires_at is not None and session.queue_expires_at <= now)):
                continue  # started, cancelled or no longer due meanwhile
            if deregistered:
                leave.queued_end(session=session, stop_reason="", message=(
                    f"Left the queue unstarted: cluster {session.requested_cluster.name}, which it was pinned to, was "
                    "deregistered. Start it again on another cluster, or without one."))
            else:
                hours = round((now - session.queued_at).total_seconds() / 3600, 1)
                leave.queued_end(session=session, stop_reason=Session.StopReason.QUEUE_TIMEOUT, message=(
                    f"Left the queue unstarted after {hours} hours (its owner's policy's queue_timeout_hours): nothing it "
                    "accepts freed in time. Start it again, or accept more GPU models, fewer GPUs or a share."))
            dropped += 1
    return dropped
