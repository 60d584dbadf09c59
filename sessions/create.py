"""Session creation: validation, admission, placement on the fleet, the reservation, volumes, the audit row.

``session_create`` (and ``session_create_idempotent``, its retry-safe form) are the only functions that create
sessions; the API and the console call them. Everything after creation (the apply to the cluster, stop, status
reports) is ``sessions.lifecycle``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit.services import Action, audit_record, created
from billing import admission
from billing.exceptions import ClusterNotAllowed, InsufficientCredits, QuotaExceeded
from billing.services import MAX_IDEMPOTENCY_KEY, IdempotencyKeyReused
from clusters.errors import CLUSTER_UNAVAILABLE
from clusters.models import Cluster
from clusters.refs import cluster_by_ref
from core import instruments
from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError, Conflict
from core.prepared import statement_cursor
from sessions import gpu_models as models_of_request
from sessions import placement, resources, runtime, selectors, volume_claims
from sessions.errors import NO_CAPACITY, PLACEMENT_CONTENDED
from sessions.lifecycle import outbox
from sessions.models import Session
from sessions.queue import enqueue as queue_enqueue
from storage.models import Volume

logger = logging.getLogger(__name__)

MAX_GPUS = 16
#: The largest ``gpu_memory_mib`` the session row holds (PostgreSQL ``integer``); no GPU comes near it.
MAX_GPU_MEMORY_MIB = 2**31 - 1

class InvalidSessionRequest(ApplicationError):
    """400: the request's numbers or image are out of range."""

    code = INVALID_REQUEST
    status = 400


def _validate(*, image: str, gpus: int, gpu_memory_mib: int | None, gpu_cores: int | None, volumes: list[str],
              gpu_models: list[str]) -> None:
    problems = []
    if not isinstance(image, str) or not image.strip():
        problems.append("image must be a container image reference, e.g. quay.io/jupyter/base-notebook")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= MAX_GPUS:
        problems.append(f"gpus must be a whole number from 1 to {MAX_GPUS}")
    if gpu_memory_mib is not None and (not isinstance(gpu_memory_mib, int) or isinstance(gpu_memory_mib, bool)
                                       or not 1 <= gpu_memory_mib <= MAX_GPU_MEMORY_MIB):
        problems.append(f"gpu_memory_mib must be a positive number of MiB per GPU, at most {MAX_GPU_MEMORY_MIB} "
                        "(omit it for whole GPUs)")
    if gpu_cores is not None and (not isinstance(gpu_cores, int) or isinstance(gpu_cores, bool) or not 1 <= gpu_cores <= 100):
        problems.append("gpu_cores must be a percentage of one GPU from 1 to 100 (omit it for whole GPUs)")
    if not isinstance(volumes, list | tuple) or not all(isinstance(v, str) and v for v in volumes):
        problems.append("volumes must be a list of volume ids (vol_...)")
    elif len(volumes) > placement.MAX_VOLUMES:
        problems.append(f"volumes may name at most {placement.MAX_VOLUMES} volumes per session")
    elif len(set(volumes)) != len(volumes):
        problems.append("volumes must not name a volume twice")
    models_problem = models_of_request.gpu_models_problem(gpu_models)
    if models_problem:
        problems.append(models_problem)
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
            code=CLUSTER_UNAVAILABLE,
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
    gpu_models: list[str] | None = None,
    runtime_hours=None,
    cpu=None,
    memory_gib=None,
    queue: bool = False,
) -> Session:
    """Place a session on the fleet, reserve its GPUs, mount its volumes, and schedule its GShareSession apply.

    Admission first (``billing.admission``): the owner's credit account row is locked (created if missing),
    then one query reads the policy, the live sessions, the prices and the candidates' GPU models
    (``admission_read``), the policy's allowed clusters narrow the candidates, and under that lock the live sessions, their
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
    Queries: 8 for a request without volumes or idempotency key, whatever the fleet's size (BEGIN and
    COMMIT included; ``bench/placement.py``).

    Args:
        owner: the requesting user.
        image: container image.
        gpus: GPUs (1-16).
        gpu_memory_mib: MiB per GPU (HAMi ``nvidia.com/gpumem``), or None.
        gpu_cores: percent of one GPU (HAMi ``nvidia.com/gpucores``, 1-100), or None. A share that leaves a dimension
            out reserves, and is priced at, all of it; its cores are at least one HAMi split slot, and the session's
            ``gpu_cores`` holds the cores reserved (``billing.pricing.share_cores``, docs/billing.md).
        cluster: pin to this cluster (id ``clu_...`` or name), or None for any.
        name: free label.
        volumes: ids (``vol_...``) of the owner's volumes to mount at ``/data/<volume name>`` (at most
            ``placement.MAX_VOLUMES``, each once).
        gpu_models: the GPU models accepted (at most ``gpu_models.MAX_GPU_MODELS`` names, each a fleet model or
            whole words of one, ignoring case: ``sessions.gpu_models``), or None/empty for any model. The session
            stores the fleet models they resolve to, and is placed only on GPUs of those.
        runtime_hours: how long the session may hold its GPUs, decimal hours from now (``sessions.runtime.hours_parse``),
            at most the policy's ``max_runtime_hours``; None: that maximum (no limit when it is 0). Sets ``ends_at``.
        cpu: CPU cores (decimal, more than 0, at most 3 decimal places: ``sessions.resources``), at most the policy's
            ``max_cpu_per_gpu`` × ``gpus``; None: its ``default_cpu_per_gpu`` × ``gpus``. The pod's request and limit.
        memory_gib: memory in GiB (the same rules, ``max_memory_gib_per_gpu``, ``default_memory_gib_per_gpu``); the
            pod's request and limit, and half of it its ``/dev/shm``. Placement fits both on the node.
        queue: when nothing can host it now, keep it as a ``Queued`` session (``sessions.queue``) instead of refusing
            it with ``no_capacity``. Whenever sessions wait in the queue, a new request is placed behind them (it
            starts now only where it delays none of those ahead of it in the queue's order), queue or not.

    Returns:
        The session, phase ``Scheduled``, with cluster, node, allocations and volumes; or ``Queued`` (``queue``), with
        its ``queue_position``, ``estimated_start``, ``waiting_for`` and ``alternatives``.

    Raises:
        InvalidSessionRequest: 400 ``invalid_request``.
        GpuModelUnknown: 400 ``gpu_model_unknown``: a ``gpu_models`` name matches no model of the fleet.
        RuntimeOverLimit: 400 ``runtime_over_limit``: ``runtime_hours`` over the policy's ``max_runtime_hours``.
        CpuOverLimit, MemoryOverLimit: 400 ``cpu_over_limit``, ``memory_over_limit``: over the policy's maximum per GPU.
        InsufficientCredits: 402 ``insufficient_credits`` (``billing.admission.admission_check``).
        QuotaExceeded: 403 ``quota_exceeded``: over the policy's ``max_sessions`` or ``max_gpus``.
        ClusterNotAllowed: 403 ``cluster_not_allowed``: the pinned cluster (or every cluster the volumes
            allow) is not in the policy's allowed clusters.
        NotFound: 404 ``cluster_not_found`` for an unknown pinned cluster; 404 ``volume_not_found``
            for a volume that is not a live volume of ``owner``.
        NeverFits: 409 ``never_fits`` (``queue``): no node it may use could ever host it; it is not queued.
        QueueLimitReached: 403 ``queue_limit_reached`` (``queue``): the owner has ``max_queued_sessions`` queued.
        Conflict: 409 ``cluster_unavailable`` (pinned cluster not connected: degraded, unreachable, pending, deregistered;
            or without session_domain); 409 ``no_capacity`` (detail says what is short);
            409 ``volume_moving``; 409 ``volume_on_another_cluster``, ``volumes_on_different_clusters``,
            ``volume_pool_not_shared`` (see ``placement.volume_clusters``).
        PlacementContended: 409 ``placement_contended``: concurrent requests took the chosen capacity on every
            attempt; nothing was reserved, and the request may be sent again as it is.
    """
    return _create(owner=owner, image=image, gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores, cluster=cluster,
                   name=name, volumes=volumes, gpu_models=gpu_models, runtime_hours=runtime_hours, cpu=cpu, memory_gib=memory_gib,
                   queue=queue)[0]


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
    if request.get("queue"):  # only when asked: the fingerprints of requests that do not queue stay as they were
        canonical["queue"] = True
    if request.get("runtime_hours") is not None:  # only when asked: the fingerprints of requests without it stay as they were
        canonical["runtime_hours"] = _hours_text(request["runtime_hours"])
    if isinstance(canonical["volumes"], list | tuple):
        canonical["volumes"] = sorted(map(str, canonical["volumes"]))
    # Only when given: a request without models fingerprints like one from a client that does not send the field, so
    # the keys already stored for such requests keep matching their retries.
    models = request.get("gpu_models")
    if models:
        canonical["gpu_models"] = sorted(map(str, models)) if isinstance(models, list | tuple) else models
    for field in ("cpu", "memory_gib"):  # only when given, as gpu_models
        if request.get(field) is not None:
            canonical[field] = resources.amount_text(request[field])
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, default=str).encode()).hexdigest()


def _hours_text(value) -> str:
    """``runtime_hours`` as one text for every way of writing the same hours (``2``, ``"2.0"``, ``2.00``); a value
    ``session_create`` will refuse keeps its own text."""
    try:
        return format(runtime.hours_parse(value).normalize(), "f")
    except runtime.InvalidRuntime:
        return repr(value)


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

    code = PLACEMENT_CONTENDED




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
    gpu_models: list[str] | None = None,
    runtime_hours=None,
    cpu=None,
    memory_gib=None,
    idempotency: tuple[str, str] | None = None,
    queue: bool = False,
) -> tuple[Session, bool]:
    """``session_create``; with ``idempotency`` ``(key, request fingerprint)`` a session of that key is returned instead."""
    volumes = list(volumes or [])
    gpu_models = [] if gpu_models is None else gpu_models
    _validate(image=image, gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores, volumes=volumes, gpu_models=gpu_models)
    accepted = models_of_request.gpu_models_resolve(gpu_models)
    hours = None if runtime_hours is None else runtime.hours_parse(runtime_hours)
    # Parsed here; the policy's defaults and maxima apply under the account's lock (_attempt), as its other limits do.
    cpu = None if cpu is None else resources.cpu_parse(cpu)
    memory_gib = None if memory_gib is None else resources.memory_parse(memory_gib)
    pinned = _pinned_cluster(cluster) if cluster else None
    request = placement.Request(gpus=gpus, memory_mib=gpu_memory_mib, cores=gpu_cores, models=tuple(accepted), cpu=cpu,
                                memory_gib=memory_gib)
    for _ in range(PLACEMENT_ATTEMPTS):
        mounted = selectors.session_volumes(owner=owner, volume_ids=volumes)
        volume_claims.refuse_moving([v for v in mounted if v.status in volume_claims.BUSY_VOLUME])
        allowed = placement.volume_clusters(volumes=mounted, pinned=pinned)
        try:
            # A transaction per attempt (a savepoint inside a caller's): rolling it back releases the cluster's
            # row lock, so the next attempt may lock another cluster without holding two (no deadlock).
            with transaction.atomic():
                session, created = _attempt(owner=owner, image=image, request=request, pinned=pinned, name=name, mounted=mounted,
                                            allowed=allowed, idempotency=idempotency, hours=hours, queue=queue)
        except volume_claims.PlacementRaced:
            continue
        except _WaitInQueue as wait:
            with transaction.atomic():
                session, created = _enqueue(wait, owner=owner, idempotency=idempotency)
        if created and session.phase != Session.Phase.QUEUED:
            logger.info("session %s placed on cluster %s node %s", session.public_id, session.cluster_id, session.node)
        return session, created
    instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.CONTENDED).inc()
    raise PlacementContended(
        f"Concurrent requests took the capacity chosen for this session {PLACEMENT_ATTEMPTS} times in a row: send the "
        "request again (nothing was reserved).",
    )


class _WaitInQueue(Exception):
    """Nothing hosts the request now and it asked to queue: ``_attempt`` rolls back, ``_enqueue`` keeps it queued."""

    def __init__(self, *, session: Session, request: placement.Request, scope: list[int] | None, where: str, mounted: list[Volume],
                 planned=None):
        super().__init__("wait in the queue")
        self.session, self.request, self.scope, self.where, self.mounted = session, request, scope, where, mounted
        self.planned = planned  # (outcome, fleet) of place_behind_queue, when the request was planned behind the queue


def _enqueue(wait: _WaitInQueue, *, owner, idempotency: tuple[str, str] | None) -> tuple[Session, bool]:
    """Keep ``wait``'s request as a queued session (``sessions.queue.enqueue``), under its owner's lock, unless it
    could never fit (409 ``never_fits``)."""
    admission.account_lock(user=owner)
    if idempotency is not None:
        replayed = _replayed(owner=owner, idempotency=idempotency)
        if replayed is not None:
            return replayed, False
    reason = queue_enqueue.never_fits_reason(request=wait.request, clusters=wait.scope, where=wait.where)
    if reason is not None:
        instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.NO_CAPACITY).inc()
        raise queue_enqueue.NeverFits(f"This request can never start: {reason}. Ask for fewer GPUs, a smaller share or other "
                                      "gpu_models (GET /api/v1/gpus lists the fleet's).")
    policy = admission.policy_for(owner)
    session = queue_enqueue.session_enqueue(
        session=wait.session, policy=policy, clusters=None if wait.scope is None else frozenset(wait.scope), volumes=wait.mounted,
        account_queued=queue_enqueue.queued_count(owner=owner), planned=wait.planned)
    logger.info("session %s queued at position %s", session.public_id, session.queue_position)
    return session, True


def _attempt(*, owner, image: str, request: placement.Request, pinned: Cluster | None, name: str, mounted: list[Volume],
             allowed: frozenset[int] | None, idempotency: tuple[str, str] | None, hours=None, queue: bool = False) -> tuple[Session, bool]:
    """One try of ``_create``, in the caller's transaction, for the volumes ``mounted``, which may go to the clusters
    ``allowed`` (``placement.volume_clusters``; None: any), for ``hours`` (None: the policy's maximum). Raises ``volume_claims.PlacementRaced``
    when the chosen capacity was taken meanwhile."""
    gpus, gpu_memory_mib, gpu_cores = request.gpus, request.memory_mib, request.cores
    # Lock order: credit account, then the chosen cluster, then volumes (billing.admission).
    account = admission.account_lock(user=owner)
    if idempotency is not None:
        # Under the owner's lock: a request with the same key that held it before us has committed by now.
        replayed = _replayed(owner=owner, idempotency=idempotency)
        if replayed is not None:
            return replayed, False
    # Policy, live sessions, prices and the candidates' GPU models in one query, under the account's lock.
    state = admission.admission_read(user=owner, scope=_candidate_ids(pinned=pinned, allowed=allowed, permitted=None),
                                     ended_phases=Session.HOLDING_EXCLUDED_PHASES, queued_phase=Session.Phase.QUEUED)
    if request.models:
        # Priced at the dearest of the accepted models present (all candidates' models when none is: no_capacity follows).
        acceptable = [m for m in state.models if m[0] in request.models]
        if acceptable:
            state = dataclasses.replace(state, models=acceptable)
    policy = state.policy
    asked = resources.resources_resolve(policy=policy, gpus=gpus, cpu=request.cpu, memory_gib=request.memory_gib)
    request = dataclasses.replace(request, cpu=asked.cpu, memory_gib=asked.memory_gib)
    # The time limit counts from the reservation (now): billing holds the GPUs from then (sessions.runtime).
    reserved_at = timezone.now()
    ends_at = runtime.runtime_ends_at(policy=policy, start=reserved_at, hours=hours)
    try:
        permitted = admission.admission_clusters(policy=policy, pinned=pinned, volume_clusters=allowed)
    except ClusterNotAllowed:
        instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.REFUSED_BY_POLICY).inc()
        raise
    scope = _candidate_ids(pinned=pinned, allowed=allowed, permitted=permitted)
    try:
        # ``state`` has the candidates' GPU models already: ``clusters`` is not read.
        admission.admission_check(user=owner, gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores, clusters=(),
                                  locked_account=account, state=state)
    except (InsufficientCredits, QuotaExceeded, ClusterNotAllowed):
        instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.REFUSED_BY_POLICY).inc()
        raise
    policy_name = settings.GSHARE_PLACEMENT_POLICY

    def no_capacity() -> Conflict:
        instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.NO_CAPACITY).inc()
        where, fix = _scope(pinned=pinned, volumes=mounted, restricted=allowed is not None, by_policy=permitted is not None)
        cores = placement.FULL_CORES if gpu_cores is None else gpu_cores
        ask = f"{gpus} whole GPU(s)" if request.whole else f"{gpus} GPU share(s) of {gpu_memory_mib or 'all'} MiB and {cores}% cores"
        if request.models:
            ask += f" of model {' or '.join(request.models)}"
        # Built only here: the ORM's query building is measurable on every decision.
        candidates = Cluster.objects.filter(status=Cluster.Status.CONNECTED).exclude(session_domain="").order_by()
        if scope is not None:
            candidates = candidates.filter(pk__in=scope)
        looked = list(candidates.values_list("pk", flat=True))
        return Conflict(
            f"Nothing in {where} can host {ask} now ({placement.shortfall(request=request, cluster_ids=looked)}): "
            f"ask for fewer GPUs or smaller shares{', or accept more gpu_models' if request.models else ''}, or try again "
            f"when sessions end{fix}.",
            code=NO_CAPACITY,
        )

    session = Session(
        owner=owner,
        name=name,
        image=image.strip(),
        gpus=gpus,
        gpu_memory_mib=gpu_memory_mib,
        gpu_cores=gpu_cores,
        gpu_models=list(request.models),
        requested_cluster=pinned,
        phase=Session.Phase.SCHEDULED,
        ends_at=ends_at,
        cpu=request.cpu,
        memory_gib=request.memory_gib,
        runtime_hours=hours,
        idempotency_key=idempotency[0] if idempotency else "",
        request_fingerprint=idempotency[1] if idempotency else "",
    )

    def nothing_now(*, behind_queue: bool = False, planned=None) -> Exception:
        if queue:
            return _WaitInQueue(session=session, request=request, scope=scope, mounted=mounted, planned=planned,
                                where=_scope(pinned=pinned, volumes=mounted, restricted=allowed is not None, by_policy=permitted is not None)[0])
        refusal = no_capacity()
        if behind_queue:
            refusal.detail = refusal.console_detail = (
                f"{refusal.detail} Sessions are waiting in the queue for these GPUs, and a new request starts only where it "
                "delays none of them: send \"queue\": true to wait in line.")
        return refusal

    started = time.perf_counter()
    node_id, device_ids, node_name = None, None, ""
    elsewhere, whole_scope = queue_enqueue.uncontested_clusters(scope=scope, pinned=pinned) if state.queue_waiting else (None, False)
    # Queued sessions may want what this request could take (when none may use its clusters, the queue is not in its way).
    contested = state.queue_waiting and not whole_scope
    choice = placement.choose(request=request, cluster_ids=elsewhere, policy=policy_name) if elsewhere and pinned is None else None
    if choice is not None:
        # On a cluster no queued session may use: placed as usual, it delays nobody in the queue.
        cluster_id, node_id, node_name = choice.cluster_id, choice.node_id, choice.node_name
    elif whole_scope and pinned is None:
        instruments.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
        raise nothing_now()  # the usual refusal: nothing free where it may go, and nobody queued for those clusters
    elif contested and placement.choose(request=request, cluster_ids=scope, policy=policy_name) is None:
        # Nothing fits now even before the queue's claims (the fit query is the plan's rules in SQL): the plan could
        # not start it either, so the whole queue is not planned for a refusal (a queued request plans for its estimate).
        instruments.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
        raise nothing_now()
    elif contested:
        # Others wait: the queue's order decides, backfill included (sessions.queue.plan).
        outcome, fleet = queue_enqueue.place_behind_queue(session=session, policy=policy, now=reserved_at, has_volumes=bool(mounted),
                                                          clusters=None if scope is None else frozenset(scope))
        if not outcome.now:
            instruments.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
            raise nothing_now(behind_queue=True, planned=(outcome, fleet))
        cluster_id, node_id, node_name = outcome.node.cluster_id, outcome.node.pk, outcome.node.name
        device_ids = [d.pk for d in outcome.devices]
    elif pinned is not None:
        cluster_id = pinned.pk  # one candidate: the fit runs once, under its lock (reserve)
    else:
        choice = placement.choose(request=request, cluster_ids=scope, policy=policy_name)
        if choice is None:
            instruments.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
            raise nothing_now()
        cluster_id, node_id, node_name = choice.cluster_id, choice.node_id, choice.node_name
    session.cluster_id, session.node = cluster_id, node_name
    # Field checks only: ranges were validated above, and the database enforces the constraints.
    session.full_clean(exclude=["owner", "cluster", "requested_cluster"], validate_unique=False, validate_constraints=False)
    locked = _insert_on_locked_cluster(session)
    if locked is None:
        if pinned is not None:
            _pinned_cluster(pinned.public_id)  # raises cluster_unavailable, saying why
        raise volume_claims.PlacementRaced
    claims: list[Volume] = []
    if mounted:
        claims = volume_claims.volumes_lock(volumes=mounted, cluster_id=cluster_id, pinned=pinned)
    # Under the cluster's lock: the chosen node first, else any node of the cluster (the fit again, now exact).
    reserved = placement.reserve(session_id=session.pk, request=request, cluster_id=cluster_id, node_id=node_id, policy=policy_name,
                                 device_ids=device_ids)
    if reserved is None and node_id is not None and device_ids is None:
        reserved = placement.reserve(session_id=session.pk, request=request, cluster_id=cluster_id, policy=policy_name)
    instruments.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
    if reserved is None:
        if pinned is not None and device_ids is None:
            raise nothing_now()
        raise volume_claims.PlacementRaced  # the cluster filled up since the choice: choose again
    # The recount of the node after the INSERT: refuse to commit a reservation that leaves one of its GPUs over
    # capacity (cannot happen while every change of a cluster's allocations holds its row lock; the database's
    # last word if that ever breaks).
    over = set(reserved.device_ids).intersection(reserved.over)
    if over:
        raise IntegrityError(f"placement would over-commit GPU(s) {sorted(over)}; nothing was reserved")
    session.node = reserved.node_name
    if reserved.cores is not None:
        session.gpu_cores = reserved.cores  # the statement stored it: what HAMi is asked to enforce and what is priced
        if gpu_cores is not None and reserved.cores > gpu_cores:
            # The share took a whole split slot, more cores than it asked: admitted at what it will be billed. A
            # refusal here rolls the reservation back with the rest of the transaction.
            try:
                admission.admission_check(user=owner, gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=reserved.cores,
                                          clusters=(), locked_account=account, state=state)
            except InsufficientCredits:
                instruments.PLACEMENT_DECISIONS.labels(outcome=instruments.REFUSED_BY_POLICY).inc()
                raise
    if mounted:
        volume_claims.volumes_mount(session=session, volumes=mounted, claims=claims, cluster_id=cluster_id)
    audit_record(action=Action.SESSION_CREATE, obj=session, cluster=locked, changes=created({
        "name": name, "image": session.image, "gpus": gpus, "gpu_memory_mib": gpu_memory_mib, "gpu_cores": session.gpu_cores, "node": session.node,
        "volumes": [v.public_id for v in mounted], "ends_at": ends_at,
        **({"gpu_models": session.gpu_models} if session.gpu_models else {}),
        "cpu": session.cpu, "memory_gib": session.memory_gib,
    }), details={"owner": owner.get_username()})
    outbox.publish_after_commit(outbox.APPLY, session.pk)
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
    with statement_cursor() as cursor:
        cursor.execute(sql, [session.cluster_id, str(Cluster.Status.CONNECTED), *values])
        row = cursor.fetchone()
    if row is None:
        return None
    session.pk, public_id, cluster_name = row
    session._state.adding, session._state.db = False, connection.alias
    return Cluster.from_db(connection.alias, ["id", "public_id", "name"], (session.cluster_id, public_id, cluster_name))


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
