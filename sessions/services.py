"""Session services: create (with placement), apply to the cluster, stop, status reports, connect.

These are the only functions that change sessions and their GPU reservations; the API, the console,
the Celery tasks and the operator-facing views call them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Prefetch, Q
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from audit.services import Action, audit_record, created
from billing import admission
from billing.exceptions import ClusterNotAllowed, InsufficientCredits, QuotaExceeded
from billing.services import MAX_IDEMPOTENCY_KEY, IdempotencyKeyReused
from clusters.kube import KubeGateway, KubeRefused, KubeUnavailable
from clusters.kube.gateway import GSHARE_SESSIONS
from clusters.models import Cluster
from clusters.refs import cluster_by_ref
from clusters.routing import routing_key
from gshare.exceptions import ApplicationError, Conflict, Forbidden, NotFound
from gshare.metrics import instruments
from operator_agent import contract
from sessions import connect, placement, reapply, selectors
from sessions.manifests import gshare_session_manifest, session_url
from sessions.models import Session
from sessions.permissions import may_open_session
from storage.models import Volume
from storage.services import volume_claim_name

logger = logging.getLogger(__name__)

MAX_GPUS = 16

#: Operator phases (``operator_agent.contract``) -> control-plane phases.
_REPORTED = {
    contract.PHASE_PENDING: Session.Phase.STARTING,
    contract.PHASE_RUNNING: Session.Phase.RUNNING,
    contract.PHASE_SUCCEEDED: Session.Phase.TERMINATED,
    contract.PHASE_TERMINATED: Session.Phase.TERMINATED,
    contract.PHASE_FAILED: Session.Phase.FAILED,
}


class InvalidSessionRequest(ApplicationError):
    """400: the request's numbers or image are out of range."""

    code = "invalid_request"
    status = 400


def _forget(session: Session) -> None:
    # After the commit (connect.facts_forget never raises: the change is committed whatever Redis does).
    transaction.on_commit(lambda: connect.facts_forget(connect.connect_cache_key(session.public_id)))


def _validate(*, image: str, gpus: int, gpu_memory_mib: int | None, gpu_cores: int | None, volumes: list[str]) -> None:
    problems = []
    if not isinstance(image, str) or not image.strip():
        problems.append("image must be a container image reference, e.g. quay.io/jupyter/base-notebook")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= MAX_GPUS:
        problems.append(f"gpus must be a whole number from 1 to {MAX_GPUS}")
    if gpu_memory_mib is not None and (not isinstance(gpu_memory_mib, int) or isinstance(gpu_memory_mib, bool) or gpu_memory_mib < 1):
        problems.append("gpu_memory_mib must be a positive number of MiB per GPU (omit it for whole GPUs)")
    if gpu_cores is not None and (not isinstance(gpu_cores, int) or isinstance(gpu_cores, bool) or not 1 <= gpu_cores <= 100):
        problems.append("gpu_cores must be a percentage of one GPU from 1 to 100 (omit it for whole GPUs)")
    if not isinstance(volumes, list | tuple) or not all(isinstance(v, str) and v for v in volumes):
        problems.append("volumes must be a list of volume ids (vol_...)")
    elif len(volumes) > placement.MAX_VOLUMES:
        problems.append(f"volumes may name at most {placement.MAX_VOLUMES} volumes per session")
    elif len(set(volumes)) != len(volumes):
        problems.append("volumes must not name a volume twice")
    if problems:
        raise InvalidSessionRequest("; ".join(problems) + ".")


def _pinned_cluster(cluster_ref: str) -> Cluster:
    cluster = cluster_by_ref(cluster_ref)
    # Only a connected cluster takes sessions (the lock's statement, _LOCK_AND_INSERT_SQL, says so too): any other
    # status refused here, or a pinned request would retry a lock it can never get and answer placement_contended.
    if cluster.status != Cluster.Status.CONNECTED or not cluster.session_domain:
        why = "has no session_domain" if not cluster.session_domain else f"is {cluster.status}"
        raise Conflict(
            f"Cluster {cluster.name} {why} and cannot take sessions now: pick another cluster or leave `cluster` out.",
            code="cluster_unavailable",
        )
    return cluster


def session_create(
    *,
    owner,
    image: str,
    gpus: int,
    gpu_memory_mib: int | None = None,
    gpu_cores: int | None = None,
    cluster: str | None = None,
    name: str = "",
    volumes: list[str] | None = None,
) -> Session:
    """Place a session on the fleet, reserve its GPUs, mount its volumes, and schedule its GShareSession apply.

    Admission first (``billing.admission``): the owner's credit account row is locked (created if missing),
    then the policy's allowed clusters narrow the candidates, and under that lock the live sessions, their
    holds and the balance are checked, so parallel requests of one user cannot overdraw or pass a limit.
    Then placement, locking only the cluster the session lands on, so decisions on different clusters run
    in parallel: ``placement.choose`` picks a node without any lock; that cluster's row is locked (``FOR NO
    KEY UPDATE``, in the statement that inserts the session, refused if it no longer takes sessions), and
    ``placement.reserve`` checks the fit again under the lock (the chosen node, else any node of that
    cluster), inserts the allocations and recounts the node, in one statement. If the cluster filled up
    between the choice and the lock, the attempt is rolled back (which releases the lock) and made again,
    at most ``PLACEMENT_ATTEMPTS`` times. A pinned request skips the unlocked choice: the fit runs once,
    under the lock. Two concurrent requests therefore never both take the last capacity.
    Lock order: credit account → the chosen cluster (one) → volumes (pk order); a retry holds no cluster lock.
    Volumes narrow the candidates first (``placement.volume_clusters``: a volume's PVC keeps its
    sessions on its cluster; a pool is used only by the clusters it is shared with). Under the cluster
    lock the volume rows are locked too (primary-key order) and checked again; a volume mounted for
    the first time is given the chosen cluster, so two sessions cannot claim it for two clusters (a volume
    claimed meanwhile for another cluster makes the attempt choose again, there).
    Queries: 10 for a request without volumes or idempotency key, whatever the fleet's size (BEGIN and
    COMMIT included; ``bench/placement.py``).

    Args:
        owner: the requesting user.
        image: container image.
        gpus: GPUs (1-16).
        gpu_memory_mib: MiB per GPU (HAMi ``nvidia.com/gpumem``), or None.
        gpu_cores: percent of one GPU (HAMi ``nvidia.com/gpucores``, 1-100), or None.
        cluster: pin to this cluster (id ``clu_...`` or name), or None for any.
        name: free label.
        volumes: ids (``vol_...``) of the owner's volumes to mount at ``/data/<volume name>`` (at most
            ``placement.MAX_VOLUMES``, each once).

    Returns:
        The session, phase ``Scheduled``, with cluster, node, allocations and volumes.

    Raises:
        InvalidSessionRequest: 400 ``invalid_request``.
        InsufficientCredits: 402 ``insufficient_credits`` (``billing.admission.admission_check``).
        QuotaExceeded: 403 ``quota_exceeded``: over the policy's ``max_sessions`` or ``max_gpus``.
        ClusterNotAllowed: 403 ``cluster_not_allowed``: the pinned cluster (or every cluster the volumes
            allow) is not in the policy's allowed clusters.
        NotFound: 404 ``cluster_not_found`` for an unknown pinned cluster; 404 ``volume_not_found``
            for a volume that is not a live volume of ``owner``.
        Conflict: 409 ``cluster_unavailable`` (pinned cluster not connected: degraded, unreachable, pending, deregistered;
            or without session_domain); 409 ``no_capacity`` (detail says what is short);
            409 ``volume_moving``; 409 ``volume_on_another_cluster``, ``volumes_on_different_clusters``,
            ``volume_pool_not_shared`` (see ``placement.volume_clusters``).
        PlacementContended: 409 ``placement_contended``: concurrent requests took the chosen capacity on every
            attempt; nothing was reserved, and the request may be sent again as it is.
    """
    return _create(owner=owner, image=image, gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores, cluster=cluster,
                   name=name, volumes=volumes)[0]


def session_create_idempotent(*, owner, idempotency_key: str, **request) -> tuple[Session, bool]:
    """``session_create`` once per ``(owner, idempotency_key)``: a retry gets the first session back.

    The key is checked under the owner's credit account lock (the lock every ``session_create`` of that owner
    takes first), so concurrent requests with one key create one session and the others return it; the
    unique constraint ``session_idempotency_key_once_per_owner`` is the database's last word. A request that was
    refused (e.g. 409 ``no_capacity``) stored nothing, so its retry is tried again.

    Args:
        owner: the requesting user.
        idempotency_key: the caller's key (1 to 150 printable characters, e.g. a UUID).
        **request: the keyword arguments of ``session_create`` (``image``, ``gpus``, ...).

    Returns:
        ``(session, created)``: ``created`` is False when the key named an existing session of the same request.

    Raises:
        InvalidSessionRequest: 400 ``invalid_request`` for a malformed key; and everything ``session_create`` raises.
        IdempotencyKeyReused: 409 ``idempotency_key_reused`` when the key names a session of another request
            (the body adds ``session``, its id).
    """
    key = idempotency_key.strip() if isinstance(idempotency_key, str) else ""
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise InvalidSessionRequest(f"The Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters (e.g. a UUID).")
    idempotency = (key, _fingerprint(request))
    replayed = _replayed(owner=owner, idempotency=idempotency)
    if replayed is not None:
        return replayed, False
    try:
        return _create(owner=owner, idempotency=idempotency, **request)
    except IntegrityError:
        replayed = _replayed(owner=owner, idempotency=idempotency)  # written by a request that did not wait for our lock
        if replayed is None:
            raise
        return replayed, False


def _fingerprint(request: dict) -> str:
    """SHA-256 of the request as ``session_create`` reads it (volumes as a set), to tell a retry from a new request."""
    canonical = {field: request.get(field, default) for field, default in _REQUEST_DEFAULTS.items()}
    if isinstance(canonical["volumes"], list | tuple):
        canonical["volumes"] = sorted(map(str, canonical["volumes"]))
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, default=str).encode()).hexdigest()


_REQUEST_DEFAULTS = {"image": None, "gpus": None, "gpu_memory_mib": None, "gpu_cores": None, "cluster": None, "name": "", "volumes": []}


def _replayed(*, owner, idempotency: tuple[str, str]) -> Session | None:
    """The session ``owner`` created with this key, or None; refused when it was created for another request."""
    key, fingerprint = idempotency
    session = Session.objects.filter(owner=owner, idempotency_key=key).only("pk", "public_id", "request_fingerprint").first()
    if session is None:
        return None
    if session.request_fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            f"The Idempotency-Key {key!r} was already used for session {session.public_id} with another request: send a new "
            "key for a new session, or the same request again to get that session back.",
            extra={"session": session.public_id},
        )
    return session


#: Attempts of a placement whose chosen cluster filled up, or stopped taking sessions, between the choice (no
#: lock) and its row lock; each attempt chooses again from what is committed by then.
PLACEMENT_ATTEMPTS = 3


class PlacementContended(Conflict):
    """409: every attempt lost its chosen capacity to concurrent requests; the request may simply be retried."""

    code = "placement_contended"


class _Raced(Exception):
    """The capacity chosen without a lock was gone once the cluster was locked: roll back and choose again."""


def _create(
    *,
    owner,
    image: str,
    gpus: int,
    gpu_memory_mib: int | None = None,
    gpu_cores: int | None = None,
    cluster: str | None = None,
    name: str = "",
    volumes: list[str] | None = None,
    idempotency: tuple[str, str] | None = None,
) -> tuple[Session, bool]:
    """``session_create``; with ``idempotency`` ``(key, request fingerprint)`` a session of that key is returned instead."""
    volumes = list(volumes or [])
    _validate(image=image, gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores, volumes=volumes)
    pinned = _pinned_cluster(cluster) if cluster else None
    request = placement.Request(gpus=gpus, memory_mib=gpu_memory_mib, cores=gpu_cores)
    for _ in range(PLACEMENT_ATTEMPTS):
        mounted = selectors.session_volumes(owner=owner, volume_ids=volumes)
        _refuse_moving([v for v in mounted if v.status in _BUSY_VOLUME])
        allowed = placement.volume_clusters(volumes=mounted, pinned=pinned)
        try:
            # A transaction per attempt (a savepoint inside a caller's): rolling it back releases the cluster's
            # row lock, so the next attempt may lock another cluster without holding two (no deadlock).
            with transaction.atomic():
                session, created = _attempt(owner=owner, image=image, request=request, pinned=pinned, name=name, mounted=mounted,
                                            allowed=allowed, idempotency=idempotency)
        except _Raced:
            continue
        if created:
            logger.info("session %s placed on cluster %s node %s", session.public_id, session.cluster_id, session.node)
        return session, created
    instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.NO_CAPACITY).inc()
    raise PlacementContended(
        f"Concurrent requests took the capacity chosen for this session {PLACEMENT_ATTEMPTS} times in a row: send the "
        "request again (nothing was reserved).",
    )


def _attempt(*, owner, image: str, request: placement.Request, pinned: Cluster | None, name: str, mounted: list[Volume],
             allowed: frozenset[int] | None, idempotency: tuple[str, str] | None) -> tuple[Session, bool]:
    """One try of ``_create``, in the caller's transaction, for the volumes ``mounted``, which may go to the clusters
    ``allowed`` (``placement.volume_clusters``; None: any). Raises ``_Raced`` when the chosen capacity was taken meanwhile."""
    gpus, gpu_memory_mib, gpu_cores = request.gpus, request.memory_mib, request.cores
    # Lock order: credit account, then the chosen cluster, then volumes (billing.admission).
    account = admission.account_lock(user=owner)
    if idempotency is not None:
        # Under the owner's lock: a request with the same key that held it before us has committed by now.
        replayed = _replayed(owner=owner, idempotency=idempotency)
        if replayed is not None:
            return replayed, False
    policy = admission.policy_for(owner)
    try:
        permitted = admission.admission_clusters(policy=policy, pinned=pinned, volume_clusters=allowed)
    except ClusterNotAllowed:
        instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.REFUSED_BY_POLICY).inc()
        raise
    scope = _candidate_ids(pinned=pinned, allowed=allowed, permitted=permitted)
    # Priced as a subquery of the admission's own query (no query of its own).
    candidates = Cluster.objects.filter(status=Cluster.Status.CONNECTED).exclude(session_domain="").order_by()
    if scope is not None:
        candidates = candidates.filter(pk__in=scope)
    try:
        admission.admission_check(user=owner, gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores, clusters=candidates,
                                  locked_account=account, policy=policy)
    except (InsufficientCredits, QuotaExceeded, ClusterNotAllowed):
        instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.REFUSED_BY_POLICY).inc()
        raise
    policy_name = settings.GSHARE_PLACEMENT_POLICY

    def no_capacity() -> Conflict:
        instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.NO_CAPACITY).inc()
        where, fix = _scope(pinned=pinned, volumes=mounted, restricted=allowed is not None, by_policy=permitted is not None)
        ask = f"{gpus} whole GPU(s)" if request.whole else f"{gpus} GPU share(s) of {gpu_memory_mib or 'all'} MiB and {gpu_cores or 0}% cores"
        looked = list(candidates.values_list("pk", flat=True))
        return Conflict(
            f"Nothing in {where} can host {ask} now ({placement.shortfall(request=request, cluster_ids=looked)}): "
            f"ask for fewer GPUs or smaller shares, or try again when sessions end{fix}.",
            code="no_capacity",
        )

    started = time.perf_counter()
    node_id = None
    if pinned is not None:
        cluster_id = pinned.pk  # one candidate: the fit runs once, under its lock (reserve)
    else:
        choice = placement.choose(request=request, cluster_ids=scope, policy=policy_name)
        if choice is None:
            instruments.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
            raise no_capacity()
        cluster_id, node_id = choice.cluster_id, choice.node_id
    session = Session(
        owner=owner,
        name=name,
        image=image.strip(),
        gpus=gpus,
        gpu_memory_mib=gpu_memory_mib,
        gpu_cores=gpu_cores,
        requested_cluster=pinned,
        cluster_id=cluster_id,
        node=choice.node_name if node_id is not None else "",
        phase=Session.Phase.SCHEDULED,
        idempotency_key=idempotency[0] if idempotency else "",
        request_fingerprint=idempotency[1] if idempotency else "",
    )
    # Field checks only: ranges were validated above, and the database enforces the constraints.
    session.full_clean(exclude=["owner", "cluster", "requested_cluster"], validate_unique=False, validate_constraints=False)
    locked = _insert_on_locked_cluster(session)
    if locked is None:
        if pinned is not None:
            _pinned_cluster(pinned.public_id)  # raises cluster_unavailable, saying why
        raise _Raced
    claims: list[Volume] = []
    if mounted:
        claims = _lock_volumes(volumes=mounted, cluster_id=cluster_id, pinned=pinned)
    # Under the cluster's lock: the chosen node first, else any node of the cluster (the fit again, now exact).
    reserved = placement.reserve(session_id=session.pk, request=request, cluster_id=cluster_id, node_id=node_id, policy=policy_name)
    if reserved is None and node_id is not None:
        reserved = placement.reserve(session_id=session.pk, request=request, cluster_id=cluster_id, policy=policy_name)
    instruments.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
    if reserved is None:
        if pinned is not None:
            raise no_capacity()
        raise _Raced  # the cluster filled up since the choice: choose again
    # The recount of the node after the INSERT: refuse to commit a reservation that leaves one of its GPUs over
    # capacity (cannot happen while every change of a cluster's allocations holds its row lock; the database's
    # last word if that ever breaks).
    over = set(reserved.device_ids).intersection(reserved.over)
    if over:
        raise IntegrityError(f"placement would over-commit GPU(s) {sorted(over)}; nothing was reserved")
    session.node = reserved.node_name
    if mounted:
        _mount(session=session, volumes=mounted, claims=claims, cluster_id=cluster_id)
    audit_record(action=Action.SESSION_CREATE, obj=session, cluster=locked, changes=created({
        "name": name, "image": session.image, "gpus": gpus, "gpu_memory_mib": gpu_memory_mib, "gpu_cores": gpu_cores, "node": session.node,
        "volumes": [v.public_id for v in mounted],
    }), details={"owner": owner.get_username()})
    transaction.on_commit(lambda: _enqueue("sessions.apply", session.pk))
    transaction.on_commit(instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.PLACED).inc)
    return session, True


def _candidate_ids(*, pinned: Cluster | None, allowed: frozenset[int] | None, permitted: frozenset[int] | None) -> list[int] | None:
    """The cluster pks the request may go to (pinned, volumes, policy), or None for any; placement and admission
    further keep those that take sessions (connected, with a session domain)."""
    scope: frozenset[int] | None = frozenset({pinned.pk}) if pinned is not None else None
    for narrower in (allowed, permitted):
        if narrower is not None:
            scope = narrower if scope is None else scope & narrower
    return None if scope is None else sorted(scope)


#: ``_insert_on_locked_cluster``: lock the cluster's row, if it still takes sessions, and insert the session in
#: the same statement (the INSERT reads nothing, so the statement's snapshot does not matter to it). ``FOR NO KEY
#: UPDATE``: conflicts with every other placement and release on the cluster and with its inventory, not with
#: the inserts of rows that merely reference it (usage samples).
_LOCK_AND_INSERT_SQL = """
WITH c AS (
    SELECT id, public_id, name FROM clusters_cluster WHERE id = %s AND status = %s AND session_domain <> '' FOR NO KEY UPDATE
)
INSERT INTO {table} ({columns}) SELECT {values} FROM c
RETURNING {pk}, (SELECT public_id FROM c), (SELECT name FROM c)
"""


def _insert_on_locked_cluster(session: Session) -> Cluster | None:
    """Lock ``session.cluster_id``'s row and save ``session`` (new), in one statement.

    Returns:
        The cluster (only ``pk``, ``public_id`` and ``name`` loaded), or None when it no longer takes sessions
        (not connected, or no session domain): nothing was saved then.
    """
    meta = Session._meta
    fields = [f for f in meta.local_concrete_fields if not f.primary_key]
    values = [f.get_db_prep_save(f.pre_save(session, True), connection) for f in fields]
    sql = _LOCK_AND_INSERT_SQL.format(
        table=connection.ops.quote_name(meta.db_table), columns=", ".join(connection.ops.quote_name(f.column) for f in fields),
        values=", ".join(["%s"] * len(fields)), pk=connection.ops.quote_name(meta.pk.column),
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [session.cluster_id, Cluster.Status.CONNECTED, *values])
        row = cursor.fetchone()
    if row is None:
        return None
    session.pk, public_id, cluster_name = row
    session._state.adding, session._state.db = False, connection.alias
    return Cluster.from_db(connection.alias, ["id", "public_id", "name"], (session.cluster_id, public_id, cluster_name))


#: Volume statuses a new session cannot mount: the control plane is changing the volume's PVC.
_BUSY_VOLUME = (Volume.Status.MOVING, Volume.Status.DELETING)


def _refuse_moving(moving: list[Volume]) -> None:
    """Refuse volumes being moved (409 ``volume_moving``) or deleted (409 ``volume_deleting``)."""
    deleting = [v for v in moving if v.status == Volume.Status.DELETING]
    if deleting:
        volume = deleting[0]
        raise Conflict(
            f"Volume {volume.name} ({volume.public_id}) is being deleted: leave it out of `volumes`.", code="volume_deleting",
        )
    if moving:
        volume = moving[0]
        raise Conflict(
            f"Volume {volume.name} ({volume.public_id}) is being moved to another cluster: start the session once the move "
            f"is done (`GET /api/v1/storage/volumes/{volume.public_id}` shows its cluster).",
            code="volume_moving",
        )


def _lock_volumes(*, volumes: list[Volume], cluster_id: int, pinned: Cluster | None) -> list[Volume]:
    """Lock the volumes' rows (primary-key order, after the chosen cluster's row) and check them again.

    Between the first check (``placement.volume_clusters``, no lock) and this one another session may
    have claimed a new volume for a cluster, or a move may have started: the locked rows decide.

    Returns:
        The volumes to claim for the chosen cluster: unsaved ``Volume`` objects carrying only pk and
        ``claim_name`` (what ``_mount`` writes).

    Raises:
        _Raced: a volume is now held by another cluster than ``cluster_id`` (choose again: the next attempt's
            first check keeps the session on that cluster).
    """
    by_pk = {v.pk: v for v in volumes}
    rows = list(
        Volume.objects.filter(pk__in=sorted(by_pk)).order_by("pk").select_for_update()
        .values_list("pk", "cluster_id", "status", "claim_name", named=True)
    )
    gone = [by_pk[pk] for pk in sorted(set(by_pk) - {r.pk for r in rows})] + [by_pk[r.pk] for r in rows if r.status == Volume.Status.DELETED]
    if gone:
        raise NotFound(f"Volume {gone[0].public_id!r} was deleted: leave it out of `volumes`.", code="volume_not_found")
    busy = [r for r in rows if r.status in _BUSY_VOLUME]
    for row in busy:
        by_pk[row.pk].status = row.status
    _refuse_moving([by_pk[r.pk] for r in busy])
    claims = [Volume(pk=r.pk, claim_name=r.claim_name or volume_claim_name(by_pk[r.pk].public_id)) for r in rows if r.cluster_id is None]
    holders = sorted({r.cluster_id for r in rows if r.cluster_id is not None})
    if not holders or holders == [cluster_id]:
        return claims
    if len(holders) > 1:
        raise Conflict(
            "The volumes were just claimed by sessions on different clusters and a session runs on one: move them onto one "
            "cluster first (`POST /api/v1/storage/volumes/{id}/move`), or mount them in separate sessions.",
            code="volumes_on_different_clusters",
        )
    # A volume was claimed by a session on, or moved to, another cluster since the first check.
    (holder,) = holders
    if pinned is None:
        raise _Raced
    held, volume = Cluster.objects.get(pk=holder), next(by_pk[r.pk] for r in rows if r.cluster_id == holder)
    raise Conflict(
        f"Volume {volume.name} ({volume.public_id}) was just mounted by a session on, or moved to, cluster {held.name} "
        f"({held.public_id}), so sessions that mount it run there: pin the session to {held.name} "
        f"(`\"cluster\": \"{held.public_id}\"`) or leave `cluster` out and retry, or move the volume first "
        f"(`POST /api/v1/storage/volumes/{volume.public_id}/move`).",
        code="volume_on_another_cluster",
    )


def _mount(*, session: Session, volumes: list[Volume], claims: list[Volume], cluster_id: int) -> None:
    """Give the new volumes (``claims``) the chosen cluster and record the session's volumes (two queries at most)."""
    if claims:
        for claim in claims:
            claim.cluster_id = cluster_id
        Volume.objects.bulk_update(claims, ["cluster", "claim_name"])
    through = Session.volumes.through
    through.objects.bulk_create([through(session_id=session.pk, volume_id=v.pk) for v in volumes])


def _scope(*, pinned: Cluster | None, volumes: list[Volume], restricted: bool, by_policy: bool = False) -> tuple[str, str]:
    """Where a refused placement looked (for ``no_capacity``) and the volume move hint, if a volume kept it there."""
    held = next((v for v in sorted(volumes, key=lambda v: v.name) if v.cluster_id is not None), None)
    if held is not None:
        return (f"cluster {held.cluster.name} (volume {held.name} is there)",
                f", or move volume {held.name} to a cluster with room (`POST /api/v1/storage/volumes/{held.public_id}/move`)")
    if pinned is not None:
        return f"cluster {pinned.name}", ""
    if restricted:
        return "the clusters your volumes' storage pools are shared with", ""
    if by_policy:
        return "the clusters your policy allows", ""
    return "the fleet", ""


def _enqueue(task_name: str, session_pk: int) -> bool:
    """Publish ``sessions.apply``, ``sessions.delete`` or ``sessions.reapply`` for a session (called after the commit).

    The publish is bounded (``GSHARE_REDIS_TIMEOUT``, gshare/settings/celery.py). When the broker is down or does
    not answer, the failure is logged, not raised: the row is committed, its phase says the work is still due,
    and ``sessions_reconcile`` publishes it again.

    Returns:
        True when the task was published (or, in eager mode, ran).
    """
    from sessions import tasks  # tasks import this module

    task = {"sessions.apply": tasks.session_apply_task, "sessions.delete": tasks.session_delete_task,
            "sessions.reapply": tasks.session_reapply_task}[task_name]
    try:
        task.delay(session_pk)
    except BrokerError as exc:
        logger.warning("session #%s: could not publish %s (%s); sessions.reconcile publishes it again", session_pk, task_name, exc)
        return False
    return True


def _release(session: Session) -> None:
    _release_allocations(cluster_id=session.cluster_id, session_ids=[session.pk])


def _release_allocations(*, cluster_id: int | None, session_ids: list[int]) -> None:
    """Delete the GPU reservations of sessions of one cluster and recount the GPUs they were on.

    The cluster's row is locked first (``FOR NO KEY UPDATE``: it waits for a placement or an
    inventory on that cluster, and they wait for it), so every change of a cluster's allocations
    and its recount happen one at a time and the counters match the allocations (see
    ``placement.usage_recompute``). Locking before deleting also keeps the order placement and
    inventory use (cluster row, then allocation rows), so they cannot deadlock with a release.
    """
    if cluster_id is not None:
        list(Cluster.objects.select_for_update(no_key=True).filter(pk=cluster_id).values_list("pk", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM gpu_sessions_allocation a USING clusters_gpudevice d WHERE d.id = a.device_id AND a.session_id = ANY(%s) RETURNING d.node_id",
            [list(session_ids)],
        )
        nodes = {row[0] for row in cursor.fetchall()}
    placement.usage_recompute(node_ids=nodes)


def session_fail(*, session: Session, message: str) -> Session:
    """Mark a session Failed (unless it already ended), release its GPUs, record why."""
    return _end(session=session, phase=Session.Phase.FAILED, message=message[:2000], keep_message=False)


def _terminate(*, session: Session, message: str) -> Session:
    """Mark a live session Terminated (keeping a message already recorded), release its GPUs."""
    return _end(session=session, phase=Session.Phase.TERMINATED, message=message, keep_message=True)


@transaction.atomic
def _end(*, session: Session, phase: str, message: str, keep_message: bool) -> Session:
    """Move a live session to a terminal ``phase`` now, release its GPUs and drop its cached facts.

    ``keep_message`` keeps a message already recorded (e.g. the operator's) instead of ``message``.
    Does nothing for a session that already ended.
    """
    session = Session.objects.select_for_update().get(pk=session.pk)
    if not session.is_live:
        return session
    session.phase = phase
    session.ended_at = timezone.now()
    session.message = (session.message if keep_message else "") or message
    session.save(update_fields=["phase", "ended_at", "message"])
    _release(session)
    _forget(session)
    return session


def _gateway(cluster: Cluster) -> KubeGateway:
    """A gateway to ``cluster``'s apiserver, each call bounded by ``GSHARE_PROBE_TIMEOUT`` (raises ``KubeconfigError``)."""
    return KubeGateway.for_cluster(cluster, call_timeout=settings.GSHARE_PROBE_TIMEOUT)


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
    session = (
        Session.objects.select_related("cluster", "owner")
        .prefetch_related(Prefetch("volumes", queryset=Volume.objects.select_related("pool")))
        .get(pk=session.pk)
    )
    if session.phase != Session.Phase.SCHEDULED:
        return session
    applied = routing_key(session.cluster)
    manifest = gshare_session_manifest(session)
    try:
        with _gateway(session.cluster) as kube:
            kube.apply(manifest)
    except KubeUnavailable as exc:
        if exc.status:
            raise TransientApplyError(f"the apiserver of {session.cluster.name} answered {exc.status} ({exc.reason})") from None
        raise TransientApplyError(f"the apiserver of {session.cluster.name} did not answer ({exc.cause_name})") from None
    except KubeRefused as exc:
        hint = {
            404: f"the GShareSession CRD or the namespace {manifest['metadata']['namespace']} is missing: install charts/gshare-operator",
            403: "the control plane's ServiceAccount may not apply GShareSessions: grant it the ClusterRole in docs/attach-a-cluster.md",
            401: "the cluster refused the control plane's credentials: register a fresh kubeconfig",
        }.get(exc.status, f"the apiserver refused the GShareSession ({exc.status} {exc.reason})")
        return session_fail(session=session, message=f"Could not apply the session to {session.cluster.name}: {hint}.")
    updated = Session.objects.filter(pk=session.pk, phase=Session.Phase.SCHEDULED).update(phase=Session.Phase.STARTING)
    if updated:
        session.phase = Session.Phase.STARTING
        # The cluster's routing changed while the apply was in flight (its re-apply found the session still Scheduled).
        reapply.routing_changed_since(session, applied)
        return session
    session.phase = Session.objects.filter(pk=session.pk).values_list("phase", flat=True).get()
    if session.phase not in _ENDED:
        # The operator reported it (Starting, Running) before this update: the routing check is still this apply's,
        # since a re-apply marked meanwhile found the session Scheduled and only cleared its mark.
        reapply.routing_changed_since(session, applied)
        return session
    # Stopped while the PATCH was in flight: the stop's delete may have found nothing (404) and counted it done, and
    # the object exists now. Delete it again; if the apiserver does not answer, sessions_reconcile re-issues it.
    try:
        _delete_object(session)
    except TransientApplyError as exc:
        logger.warning("session %s ended during its apply; its GShareSession is deleted later by sessions.reconcile: %s",
                       session.public_id, exc)
    return session


#: Phases of a session whose GShareSession must not stay on its cluster.
_ENDED = (Session.Phase.STOPPING, Session.Phase.TERMINATED, Session.Phase.FAILED)

#: How long after its end a session stopped before it ran keeps getting its GShareSession deleted again by
#: ``sessions_reconcile`` (an apply in flight at the stop lands within its retry chain, ``sessions.tasks.RETRY``).
REDELETE_WINDOW = timedelta(minutes=10)


class TransientApplyError(Exception):
    """The cluster's apiserver could not be reached or was overloaded; the task retries."""


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


@transaction.atomic
def session_stop(*, session: Session, reason: str = "Stopped on request.", stop_reason: str = Session.StopReason.REQUESTED) -> Session:
    """Stop a session: Stopping now, its GShareSession is deleted by a task, then Terminated. Idempotent.

    Args:
        session: the session.
        reason: why it is stopped, written as its ``message`` and kept through Terminated (status reports do not
            replace the message of a Stopping session): "Stopped on request." by default; the credits task
            (``billing.overdrawn.overdrawn_sessions_stop``) says the credits ran out, the idle policy
            (``sessions.idle``) names itself and the last activity.
        stop_reason: ``Session.StopReason`` (``requested``, ``credits``, ``idle``), kept as ``stop_reason``.

    Returns:
        The session (unchanged when it already ended or is stopping).
    """
    session = Session.objects.select_for_update().get(pk=session.pk)
    if not session.is_live or session.phase == Session.Phase.STOPPING:
        return session
    previous = session.phase
    session.phase = Session.Phase.STOPPING
    session.message = reason[:2000]
    session.stop_requested_at = timezone.now()
    session.stop_reason = stop_reason
    session.save(update_fields=["phase", "message", "stop_requested_at", "stop_reason"])
    audit_record(action=Action.SESSION_STOP, obj=session, changes={"phase": (previous, session.phase)},
                 details={"owner": session.owner.get_username(), "reason": session.message, "stop_reason": stop_reason})
    _forget(session)
    transaction.on_commit(lambda: _enqueue("sessions.delete", session.pk))
    return session


def session_delete_remote(*, session: Session) -> Session:
    """Delete the session's GShareSession from its cluster (404 counts as done) and mark it Terminated.

    Raises:
        TransientApplyError: the apiserver did not answer; the task retries.
    """
    session = Session.objects.select_related("cluster").get(pk=session.pk)
    _delete_object(session)
    return _terminate(session=session, message="Stopped on request.")


def _delete_object(session: Session) -> None:
    """Delete the session's GShareSession (bounded by ``GSHARE_PROBE_TIMEOUT``; 404 counts as done; no row lock held).

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


def sessions_reconcile(*, older_than: float, limit: int = 200) -> dict[str, int]:
    """Publish again the applies and deletes whose first publish was lost (the outbox relay; beat: every 30 s).

    Due: sessions ``Scheduled`` (not applied to their cluster yet) created more than ``older_than`` seconds ago,
    and sessions ``Stopping`` (GShareSession not deleted yet) asked to stop more than ``older_than`` seconds ago,
    and (deleted again, counted in ``delete``) sessions stopped before they ran that ended more than ``older_than``
    seconds but less than ``REDELETE_WINDOW`` ago (an apply in flight at the stop may have re-created the object),
    and (``reapply``) sessions marked for a re-apply after a routing change more than ``older_than`` seconds ago
    (``Session.reapply_due_at``, ``sessions.reapply``), oldest first, at most ``limit`` of each. ``older_than`` should exceed a task's usual retry chain
    (``sessions.tasks.RETRY``), so a task still retrying is rarely doubled. Idempotent: both tasks do nothing for
    a session that moved on (a doubled task is harmless), and a run that finds nothing due publishes nothing. The first publish that fails
    (broker still down) ends the run; the next run starts over.

    Args:
        older_than: seconds a session must have been due before it is published again.
        limit: most sessions of each kind per run.

    Returns:
        ``{"apply": n, "delete": m, "reapply": r, "unpublished": k}``: tasks published, and due sessions left for
        the next run.
    """
    cutoff = timezone.now() - timedelta(seconds=older_than)
    scheduled = Session.objects.filter(phase=Session.Phase.SCHEDULED, created_at__lt=cutoff).order_by("created_at", "pk")
    # Rows stopped before stop_requested_at existed have none: they are due too.
    stopping = Session.objects.filter(phase=Session.Phase.STOPPING).filter(
        Q(stop_requested_at__lt=cutoff) | Q(stop_requested_at__isnull=True)
    ).order_by(F("stop_requested_at").asc(nulls_first=True), "pk")
    # Stopped before they ran: an apply in flight at the stop may have created the GShareSession after the stop's
    # delete (session_apply deletes it again; this covers that delete failing). Deleting again is harmless (404).
    ended = Session.objects.filter(
        phase__in=Session.TERMINAL_PHASES, stop_requested_at__isnull=False, started_at__isnull=True,
        ended_at__lt=cutoff, ended_at__gte=cutoff - REDELETE_WINDOW,
    ).order_by("ended_at", "pk")
    due = [("sessions.apply", pk) for pk in scheduled.values_list("pk", flat=True)[:limit]]
    due += [("sessions.delete", pk) for pk in stopping.values_list("pk", flat=True)[:limit]]
    due += [("sessions.delete", pk) for pk in ended.values_list("pk", flat=True)[:limit]]
    due += [("sessions.reapply", pk) for pk in reapply.sessions_reapply_due(cutoff=cutoff, limit=limit)]
    published = {"apply": 0, "delete": 0, "reapply": 0}
    for done, (task_name, pk) in enumerate(due):
        if not _enqueue(task_name, pk):
            return {**published, "unpublished": len(due) - done}
        published[task_name.removeprefix("sessions.")] += 1
    return {**published, "unpublished": 0}


#: How far ahead of the control plane's clock an operator's ``observed_at`` is taken as it is (clocks drift).
STATUS_CLOCK_SKEW = timedelta(seconds=300)


@transaction.atomic
def session_status_apply(*, cluster: Cluster, reports: list[dict]) -> dict:
    """Apply a batch of the operator's phase reports for sessions of ``cluster``.

    Idempotent and order-tolerant: a report whose ``observed_at`` is not newer than the last one
    applied is ignored, and a session that ended (Terminated, Failed) never goes back. An ``observed_at`` more
    than ``STATUS_CLOCK_SKEW`` ahead of the control plane's clock counts as that far ahead.

    Args:
        cluster: the cluster named in the operator token.
        reports: validated reports ``{"session", "phase", "node", "devices", "message", "observed_at": datetime}``.

    Returns:
        ``{"applied": n, "ignored": m}``.

    Raises:
        Forbidden: 403 ``forbidden_cluster_scope`` when a report names a session that is not on
            ``cluster`` (unknown sessions count as foreign); nothing is applied.
    """
    ids = sorted({report["session"] for report in reports})
    sessions = {s.public_id: s for s in Session.objects.select_for_update().filter(public_id__in=ids).order_by("pk")}
    foreign = [sid for sid in ids if sid not in sessions or sessions[sid].cluster_id != cluster.pk]
    if foreign:
        raise Forbidden(
            f"Session(s) {', '.join(foreign[:5])} are not sessions of this cluster; an operator may only report its own "
            "cluster's sessions. Nothing was applied.",
            code=contract.FORBIDDEN_CLUSTER_SCOPE,
        )
    applied, ignored, changed, ended = 0, 0, {}, []
    latest = timezone.now() + STATUS_CLOCK_SKEW
    for report in sorted(reports, key=lambda r: r["observed_at"]):
        session = sessions[report["session"]]
        # One report from a clock years ahead would make every later, honest report look older and be ignored forever.
        observed: datetime = min(report["observed_at"], latest)
        if not session.is_live or (session.last_status_at is not None and observed <= session.last_status_at):
            ignored += 1
            continue
        phase = _REPORTED[report["phase"]]
        stopping = session.phase == Session.Phase.STOPPING
        if stopping and phase in (Session.Phase.STARTING, Session.Phase.RUNNING):
            phase = Session.Phase.STOPPING  # a late Running never revives a session being stopped
        session.phase = phase
        session.last_status_at = observed
        if report.get("node"):
            session.node = report["node"]
        if report.get("devices"):
            session.devices = list(report["devices"])
        if report.get("message") is not None and not (stopping and session.message):
            session.message = report["message"][:2000]  # a Stopping session keeps why it was stopped
        if phase == Session.Phase.RUNNING and session.started_at is None:
            session.started_at = observed
        if phase in Session.TERMINAL_PHASES:
            session.ended_at = observed
            ended.append(session.pk)
        changed[session.pk] = session
        applied += 1
    if changed:
        Session.objects.bulk_update(
            list(changed.values()), ["phase", "last_status_at", "node", "devices", "message", "started_at", "ended_at"]
        )
        for session in changed.values():
            _forget(session)
    if ended:
        _release_allocations(cluster_id=cluster.pk, session_ids=ended)
    return {"applied": applied, "ignored": ignored}


def session_connect(*, session: Session, user) -> str:
    """Mint a connect link for ``session``: its URL with a short-lived connect token.

    The token (RS256, audience ``gshare-connect``, ``use: "link"``, ``GSHARE_CONNECT_TOKEN_TTL`` seconds) names
    the session (``sid``), the user (``sub`` = ``user:<pk>``, ``name``) and the host it is valid on
    (``sessions.connect.link_token_sign``).

    Raises:
        Forbidden: 403 ``forbidden`` when ``user`` is neither the owner nor allowed to open any session
            (``sessions.permissions.may_open_any_session``: staff with ``gpu_sessions.change_session``, superusers).
        Conflict: 409 ``session_not_running`` when the session has ended or has no URL yet.
    """
    if not may_open_session(user, session):
        raise Forbidden("Only the session's owner (or staff allowed to change sessions) may connect to it.", code="forbidden")
    url = session_url(session)
    if not session.is_live or url is None:
        raise Conflict(f"Session {session.public_id} is {session.phase}: start a new session.", code="session_not_running")
    token = connect.link_token_sign(user=user, session_id=session.public_id, host=session.cluster.session_domain)
    return f"{url}?token={token}"
