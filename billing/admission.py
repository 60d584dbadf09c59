"""Admission: who may start a session (credits, quota, clusters). Stopping the sessions of accounts that ran out
of credits is ``sessions.overdrawn`` (sessions sits above billing: it calls this module, never the other way).

Admission (``sessions.create.session_create`` calls it, inside its transaction):

* ``account_lock(user=...)`` locks the user's ``CreditAccount`` row first (creating it, race-safely, with a zero
  balance if the user has none). Every admission of that user waits for it, so counting the live sessions,
  their holds and the balance, checking and placing happen one request at a time per user: parallel requests
  cannot overdraw or pass a limit together.
* ``admission_read(...)`` reads, under that lock, in one query, the policy, the user's live sessions, the prices and
  the GPU models of the candidate clusters (what the two checks below decide on).
* ``admission_clusters(...)`` applies the policy's allowed clusters: a pinned cluster outside them is refused
  (403 ``cluster_not_allowed``); an unpinned request gets the allowed set, which placement's candidates are
  filtered with.
* ``admission_check(...)`` refuses 403 ``quota_exceeded`` (concurrent sessions or GPUs over the policy) and 402
  ``insufficient_credits`` (available balance below ``min_balance_hours`` of the request).

Lock order (every path that takes more than one of these takes them in this order, so none deadlocks):
credit account → the chosen cluster → volumes (primary-key order) in ``session_create``; credit
accounts (primary-key order) → session rows in ``sessions.overdrawn.overdrawn_sessions_stop`` and in the queue's
admissions together (``accounts_lock``, ``sessions.queue.admit``).

Money:
    hourly cost of a request (``request_hourly_cost``): ``gpus × share × price``, before placement, so
        conservative: the price is the HIGHEST among the GPU models present on the candidate clusters, and a
        shared request's share is computed against the SMALLEST device memory among them (both may come from
        different models: an upper bound). A whole GPU's share is 1. The cores asked may be below the split slot
        placement reserves (``pricing.share_cores``): ``sessions.create`` then admits the request again at the
        cores reserved, before it commits.
    hourly cost of a live session: the sum over its reserved GPUs of ``share × price`` of that GPU's model
        (what usage will charge, ``billing.pricing``); a live session without reservations counts
        ``gpus × share × the default price``.
    holds (``session_holds``): the hourly costs of the user's live (not Terminated or Failed) sessions ×
        the policy's ``min_balance_hours``. Available = balance − accrued − holds, where accrued is the usage of
        open billing periods not charged yet (``CreditAccount.accrued``, ``billing.periods``): exact to the sample.
    required: the request's hourly cost × ``min_balance_hours``; admitted when available ≥ required (with
        ``min_balance_hours`` 0: any non-negative balance).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from billing import pricing
from billing.exceptions import ClusterNotAllowed, InsufficientCredits, QuotaExceeded
from billing.models import (
    CREDITS,
    DEFAULT_CPU_PER_GPU,
    DEFAULT_MAX_CPU_PER_GPU,
    DEFAULT_MAX_MEMORY_GIB_PER_GPU,
    DEFAULT_MAX_QUEUED_SESSIONS,
    DEFAULT_MAX_RUNTIME_HOURS,
    DEFAULT_MAX_VOLUME_GB,
    DEFAULT_MEMORY_GIB_PER_GPU,
    DEFAULT_QUEUE_TIMEOUT_HOURS,
    DEFAULT_RUNTIME_WARNING_MINUTES,
    CreditAccount,
    Policy,
)
from clusters.models import Cluster
from core.prepared import statement_cursor

#: How a console user stops a session (the console shows ``console_detail``; the API's sentence names the call).
CONSOLE_STOP = "the Stop button on its page under My sessions"


@dataclass(frozen=True)
class EffectivePolicy:
    """The limits that apply to one user (``policy_for``).

    Attributes:
        max_sessions: concurrent live sessions, or None (unlimited).
        max_gpus: GPUs across live sessions, or None (unlimited).
        allowed_clusters: ``Cluster`` pks sessions may run on, or None (all).
        min_balance_hours: hours of the requested resources the available balance must cover (0: any
            non-negative balance).
        grace_seconds: how long an account may stay below zero before its sessions are stopped.
        source: ``"user"`` (the user's ``Policy``), ``"default"`` (the default ``Policy`` row) or
            ``"settings"`` (no row: ``GSHARE_BILLING_DEFAULT_*``).
        idle_timeout_minutes: minutes without a GPU kernel before a session is stopped (0: never; ``sessions.idle``).
        idle_warning_minutes: minutes before that stop when the session starts showing it.
        max_volume_gb: GiB the user's volumes (not deleted) may hold in all, or None (unlimited).
        max_runtime_hours: the longest a session may run, hours from its reservation (0: unlimited; ``sessions.runtime``).
        runtime_warning_minutes: minutes before its time limit when a session starts showing the coming stop.
        default_cpu_per_gpu, default_memory_gib_per_gpu: cores and GiB per GPU of a request that asks for none.
        max_cpu_per_gpu, max_memory_gib_per_gpu: the most cores and GiB per GPU a request may ask for.
        priority: the queue order of the user's sessions (higher first; ``sessions.queue``).
        max_queued_sessions: sessions the user may have waiting in the queue at once.
        queue_timeout_hours: hours a session may wait in the queue before it is dropped.
    """

    max_sessions: int | None
    max_gpus: int | None
    allowed_clusters: frozenset[int] | None
    min_balance_hours: Decimal
    grace_seconds: int
    source: str
    idle_timeout_minutes: int = 60
    idle_warning_minutes: int = 15
    max_volume_gb: int | None = None
    max_runtime_hours: Decimal = DEFAULT_MAX_RUNTIME_HOURS
    runtime_warning_minutes: int = DEFAULT_RUNTIME_WARNING_MINUTES
    default_cpu_per_gpu: Decimal = DEFAULT_CPU_PER_GPU
    default_memory_gib_per_gpu: Decimal = DEFAULT_MEMORY_GIB_PER_GPU
    max_cpu_per_gpu: Decimal = DEFAULT_MAX_CPU_PER_GPU
    max_memory_gib_per_gpu: Decimal = DEFAULT_MAX_MEMORY_GIB_PER_GPU
    priority: int = 0
    max_queued_sessions: int = DEFAULT_MAX_QUEUED_SESSIONS
    queue_timeout_hours: Decimal = DEFAULT_QUEUE_TIMEOUT_HOURS


#: The ``Policy`` columns after ``runtime_warning_minutes`` that ``EffectivePolicy`` takes as they are, in its field order
#: (``policies_for`` and ``admission_read`` read them; their defaults without a row are the model's).
_LATER_COLUMNS = ("default_cpu_per_gpu", "default_memory_gib_per_gpu", "max_cpu_per_gpu", "max_memory_gib_per_gpu", "priority",
                  "max_queued_sessions", "queue_timeout_hours")


def settings_policy() -> EffectivePolicy:
    """The policy when no ``Policy`` row applies: unlimited sessions and GPUs, all clusters, and
    ``GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS`` (default 1), ``GSHARE_BILLING_DEFAULT_GRACE_SECONDS`` (default 900) and
    ``GSHARE_BILLING_DEFAULT_IDLE_TIMEOUT_MINUTES``/``_IDLE_WARNING_MINUTES`` (60/15) and
    ``GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB`` (default 500 GiB; 0: no limit) and
    ``GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS``/``_RUNTIME_WARNING_MINUTES`` (24/15; 0 hours: no time limit)."""
    return EffectivePolicy(
        max_sessions=None,
        max_gpus=None,
        allowed_clusters=None,
        min_balance_hours=Decimal(str(getattr(settings, "GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS", 1))),
        grace_seconds=int(getattr(settings, "GSHARE_BILLING_DEFAULT_GRACE_SECONDS", 900)),
        source="settings",
        idle_timeout_minutes=int(getattr(settings, "GSHARE_BILLING_DEFAULT_IDLE_TIMEOUT_MINUTES", 60)),
        idle_warning_minutes=int(getattr(settings, "GSHARE_BILLING_DEFAULT_IDLE_WARNING_MINUTES", 15)),
        max_volume_gb=int(getattr(settings, "GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB", DEFAULT_MAX_VOLUME_GB)) or None,
        max_runtime_hours=Decimal(str(getattr(settings, "GSHARE_BILLING_DEFAULT_MAX_RUNTIME_HOURS", DEFAULT_MAX_RUNTIME_HOURS))),
        runtime_warning_minutes=int(getattr(settings, "GSHARE_BILLING_DEFAULT_RUNTIME_WARNING_MINUTES", DEFAULT_RUNTIME_WARNING_MINUTES)),
    )


def policies_for(*, user_ids) -> dict[int, EffectivePolicy]:
    """The effective policy of each user in ``user_ids``, in one query: the user's ``Policy`` row, else the default
    row (``user`` null), else ``settings_policy()``. A user's row replaces the default whole (its null limits
    mean unlimited, not "as the default")."""
    user_ids = sorted(set(user_ids))
    rows = (
        Policy.objects.filter(Q(user_id__in=user_ids) | Q(user__isnull=True))
        .annotate(cluster_ids=ArrayAgg("allowed_clusters__id", filter=Q(allowed_clusters__isnull=False), distinct=True))
        .values_list("user_id", "max_sessions", "max_gpus", "min_balance_hours", "grace_seconds", "cluster_ids",
                     "idle_timeout_minutes", "idle_warning_minutes", "max_volume_gb", "max_runtime_hours", "runtime_warning_minutes",
                     *_LATER_COLUMNS)
    )
    found: dict[int | None, EffectivePolicy] = {}
    for (user_id, max_sessions, max_gpus, hours, grace, cluster_ids, idle_timeout, idle_warning, max_volume_gb, max_runtime,
         runtime_warning, *later) in rows:
        found[user_id] = EffectivePolicy(
            max_sessions=max_sessions,
            max_gpus=max_gpus,
            allowed_clusters=frozenset(cluster_ids) if cluster_ids else None,
            min_balance_hours=hours,
            grace_seconds=grace,
            source="default" if user_id is None else "user",
            idle_timeout_minutes=idle_timeout,
            idle_warning_minutes=idle_warning,
            max_volume_gb=max_volume_gb,
            max_runtime_hours=max_runtime,
            runtime_warning_minutes=runtime_warning,
            **dict(zip(_LATER_COLUMNS, later, strict=True)),
        )
    fallback = found.get(None) or settings_policy()
    return {user_id: found.get(user_id, fallback) for user_id in user_ids}


def policy_for(user) -> EffectivePolicy:
    """The policy that applies to ``user`` (one query): their ``Policy``, else the default row, else the settings."""
    return policies_for(user_ids=[user.pk])[user.pk]


#: The ``CreditAccount`` columns ``account_lock`` reads (its model's fields).
_ACCOUNT_COLUMNS = ["id", "user_id", "balance", "accrued", "below_zero_since", "created_at"]


def account_lock(*, user) -> CreditAccount:
    """Lock ``user``'s credit account row (``SELECT ... FOR UPDATE``) for the rest of the transaction; create it with
    a zero balance when the user has none.

    One query when the account exists, two when it does not. Creation is race-safe: ``INSERT ... ON CONFLICT DO
    NOTHING``; a concurrent request inserting the same row waits for this transaction, finds the conflict and
    then locks the committed row. Call it inside ``transaction.atomic()``, before any cluster or volume lock.
    """
    table, columns = CreditAccount._meta.db_table, _ACCOUNT_COLUMNS
    with connection.cursor() as cursor:
        # Raw SQL: run on every session start, where the ORM's query building cost more than the query.
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE user_id = %s FOR UPDATE", [user.pk])
        row = cursor.fetchone()
    if row is not None:
        return CreditAccount.from_db(connection.alias, columns, row)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (user_id, balance, accrued, below_zero_since, created_at) VALUES (%s, 0, 0, NULL, %s) "
            f"ON CONFLICT (user_id) DO NOTHING RETURNING {', '.join(columns)}",
            [user.pk, timezone.now()],
        )
        row = cursor.fetchone()
    if row is not None:  # ours, not committed yet: nobody else can see (or lock) it until we commit
        return CreditAccount.from_db(connection.alias, columns, row)
    return CreditAccount.objects.select_for_update().get(user_id=user.pk)


def accounts_lock(*, user_ids) -> dict[int, CreditAccount]:
    """Lock the credit account rows of ``user_ids`` (``SELECT ... FOR UPDATE``) for the rest of the transaction; an
    account missing is created as ``account_lock`` does. One query when all exist.

    In the accounts' primary-key order, as every other path locking several accounts (``sessions.overdrawn``,
    ``billing.periods``, ``billing.held``): in any other order (the users', say) it deadlocks with one of them.

    Returns:
        ``{user pk: CreditAccount}``.
    """
    ids = sorted({int(pk) for pk in user_ids})
    table, columns = CreditAccount._meta.db_table, _ACCOUNT_COLUMNS
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE user_id = ANY(%s) ORDER BY id FOR UPDATE", [ids])
        accounts = {row[1]: CreditAccount.from_db(connection.alias, columns, row) for row in cursor.fetchall()}
    for pk in ids:
        if pk not in accounts:
            accounts[pk] = account_lock(user=get_user_model()(pk=pk))
    return accounts


# --------------------------------------------------------------------------- costs


@dataclass
class _Live:
    """A live session of the user: what it asked for and the GPUs reserved for it (``(model, memory_mib)``)."""

    gpus: int
    gpu_memory_mib: int | None
    gpu_cores: int | None
    devices: list[tuple[str, int]]


def _live_sessions(user) -> list[_Live]:
    """The user's live sessions with the models and memory of their reserved GPUs (one query)."""
    rows = (
        user.gpu_sessions.admitted()
        .values_list("pk", "gpus", "gpu_memory_mib", "gpu_cores", "allocations__device__model", "allocations__device__memory_mib")
        .order_by("pk")
    )
    live: dict[int, _Live] = {}
    for pk, gpus, memory, cores, model, device_memory in rows:
        entry = live.setdefault(pk, _Live(gpus=gpus, gpu_memory_mib=memory, gpu_cores=cores, devices=[]))
        if device_memory is not None:
            entry.devices.append((model, device_memory))
    return list(live.values())


def _session_hourly_cost(session: _Live, prices: dict[str, Decimal]) -> Decimal:
    if not session.devices:  # nothing reserved (yet): its GPUs at the default price
        share = pricing.gpu_share(device_memory_mib=None, gpu_memory_mib=session.gpu_memory_mib, gpu_cores=session.gpu_cores)
        return session.gpus * pricing.hourly_cost(price=pricing.price_for_model("", prices), share=share)
    total = Decimal(0)
    for model, device_memory in session.devices:
        share = pricing.gpu_share(device_memory_mib=device_memory, gpu_memory_mib=session.gpu_memory_mib, gpu_cores=session.gpu_cores)
        total += pricing.hourly_cost(price=pricing.price_for_model(model, prices), share=share)
    return total


def _reserve(amount: Decimal) -> Decimal:
    """An amount to hold or require, rounded UP to the credit quantum (never below what is owed)."""
    return amount.quantize(CREDITS, rounding=ROUND_CEILING)


#: The GPU models on the candidate clusters (``{clusters}``: a query of their ids), each with its smallest device
#: memory: one row per cluster and model from ``clusters_clustergpumodel`` (``clusters.models.ClusterGpuModel``, kept
#: by triggers on the GPU rows in the transactions that change them), not the GPU rows of every candidate.
_MODELS_SQL = """
    SELECT g.cluster_id, g.model, g.memory_mib FROM clusters_clustergpumodel g WHERE g.cluster_id IN (SELECT id FROM candidates)
"""

_PRICES_AND_MODELS_SQL = """
WITH candidates AS ({clusters}),
models AS ({models})
SELECT FALSE, p.gpu_model, p.credits_per_gpu_hour, NULL::integer FROM billing_price p
UNION ALL
SELECT TRUE, m.model, NULL, MIN(m.memory_mib) FROM models m GROUP BY m.model
"""


def _prices_and_models(clusters) -> tuple[dict[str, Decimal], list[tuple[str, int]]]:
    """``(pricing.prices_by_model(), [(model, smallest memory_mib)])`` of the GPUs on ``clusters`` (pks, or a
    queryset of them), in one query."""
    if isinstance(clusters, QuerySet):
        subquery, params = clusters.values("pk").query.sql_with_params()
        candidates = f"SELECT q.id FROM ({subquery}) q(id)"
    else:
        candidates, params = "SELECT unnest(%s::bigint[]) AS id", (sorted({int(pk) for pk in clusters}),)
    prices, models = {}, []
    with connection.cursor() as cursor:
        cursor.execute(_PRICES_AND_MODELS_SQL.format(clusters=candidates, models=_MODELS_SQL), params)
        for is_model, name, price, memory in cursor.fetchall():
            if is_model:
                models.append((name, memory))
            else:
                prices[name] = price
    return prices, models


#: ``admission_read``: the user's policy (their row, else the default row), its allowed clusters, the user's live
#: sessions with their reserved GPUs, every price, and the GPU models of the candidate clusters (those that take
#: sessions, within ``%(scope)s`` when not null and within the policy's allowed clusters) — read only when the
#: policy holds hours — in one statement. Run it after ``account_lock``: its snapshot then sees every session the
#: user's earlier requests committed.
_ADMISSION_SQL = """
WITH own AS (
    SELECT p.id, p.user_id, p.max_sessions, p.max_gpus, p.min_balance_hours, p.grace_seconds, p.idle_timeout_minutes,
           p.idle_warning_minutes, p.max_runtime_hours, p.runtime_warning_minutes,
           p.default_cpu_per_gpu, p.default_memory_gib_per_gpu, p.max_cpu_per_gpu, p.max_memory_gib_per_gpu, p.priority,
           p.max_queued_sessions, p.queue_timeout_hours
    FROM billing_policy p WHERE p.user_id = %(user)s OR p.user_id IS NULL
    ORDER BY p.user_id NULLS LAST, p.id LIMIT 1
),
allowed AS (SELECT pc.cluster_id FROM billing_policy_allowed_clusters pc WHERE pc.policy_id = (SELECT id FROM own)),
candidates AS (
    SELECT c.id FROM clusters_cluster c
    WHERE c.status = 'connected' AND c.session_domain <> ''
      AND (%(scope)s::bigint[] IS NULL OR c.id = ANY(%(scope)s::bigint[]))
      AND (NOT EXISTS (SELECT 1 FROM allowed) OR c.id IN (SELECT cluster_id FROM allowed))
      AND COALESCE((SELECT min_balance_hours FROM own), %(default_hours)s) > 0
),
models AS ({models}),
live AS (
    SELECT s.id, s.gpus, s.gpu_memory_mib, s.gpu_cores, d.model, d.memory_mib, a.id AS allocation
    FROM gpu_sessions_session s
    LEFT JOIN gpu_sessions_allocation a ON a.session_id = s.id
    LEFT JOIN clusters_gpudevice d ON d.id = a.device_id
    WHERE s.owner_id = %(user)s AND s.phase <> ALL(%(ended)s::text[])
)
SELECT o.user_id IS NOT NULL, o.id IS NOT NULL, o.max_sessions, o.max_gpus, o.min_balance_hours, o.grace_seconds,
       o.idle_timeout_minutes, o.idle_warning_minutes, o.max_runtime_hours, o.runtime_warning_minutes,
       ARRAY(SELECT cluster_id FROM allowed ORDER BY 1),
       l.ids, l.gpus, l.memories, l.cores, l.models, l.device_memories,
       ARRAY(SELECT p.gpu_model FROM billing_price p ORDER BY p.gpu_model),
       ARRAY(SELECT p.credits_per_gpu_hour FROM billing_price p ORDER BY p.gpu_model),
       m.models, m.memories,
       {queue_waiting},
       o.default_cpu_per_gpu, o.default_memory_gib_per_gpu, o.max_cpu_per_gpu, o.max_memory_gib_per_gpu, o.priority,
       o.max_queued_sessions, o.queue_timeout_hours
FROM (SELECT 1) one
LEFT JOIN own o ON TRUE
CROSS JOIN (
    SELECT array_agg(id ORDER BY id, allocation) AS ids, array_agg(gpus ORDER BY id, allocation) AS gpus,
           array_agg(gpu_memory_mib ORDER BY id, allocation) AS memories, array_agg(gpu_cores ORDER BY id, allocation) AS cores,
           array_agg(model ORDER BY id, allocation) AS models, array_agg(memory_mib ORDER BY id, allocation) AS device_memories
    FROM live
) l
CROSS JOIN (
    SELECT array_agg(model ORDER BY model) AS models, array_agg(memory ORDER BY model) AS memories
    FROM (SELECT model, MIN(memory_mib) AS memory FROM models GROUP BY model) g
) m
"""


@dataclass(frozen=True)
class AdmissionState:
    """What admission reads about one user and one request (``admission_read``).

    Attributes:
        policy: the user's ``EffectivePolicy``.
        live: the user's live sessions with their reserved GPUs.
        prices: ``pricing.prices_by_model()``.
        models: ``[(model, smallest memory_mib)]`` of the GPUs on the candidate clusters; empty when the policy
            holds no hours (nothing is priced then).
        queue_waiting: whether any session waits in the fleet's queue (``admission_read``'s ``queued_phase``): a new
            request is then placed behind it (``sessions.queue``).
    """

    policy: EffectivePolicy
    live: list[_Live]
    prices: dict[str, Decimal]
    models: list[tuple[str, int]]
    queue_waiting: bool = False


def admission_read(*, user, scope: list[int] | None, ended_phases: tuple[str, ...], queued_phase: str = "") -> AdmissionState:
    """Read in one query what ``admission_clusters`` and ``admission_check`` decide on for ``user``.

    Call it holding the user's ``account_lock`` (the live sessions are read after that lock, so none committed by
    an earlier request of the user is missed).

    Args:
        user: the requesting user.
        scope: the cluster pks the request is limited to before its policy (pinned, volumes), or None (any). The
            candidates priced are those of them that take sessions (connected, with a session domain) and that the
            policy allows: the same as ``admission_clusters`` and ``session_create`` give ``admission_check``.
        ended_phases: the phases of a session that holds nothing (``Session.HOLDING_EXCLUDED_PHASES``: ended, or
            waiting in the queue): the user's sessions in any other phase count against the policy and the
            balance. The caller names them because sessions sits above billing.
        queued_phase: the phase of a session waiting in the queue (``Session.Phase.QUEUED``), to tell whether any
            does (``AdmissionState.queue_waiting``); "" reads nothing of it.

    Returns:
        An ``AdmissionState`` (the same values as ``policy_for``, ``_live_sessions``, ``_prices_and_models``).
    """
    fallback = settings_policy()
    params = {"user": user.pk, "scope": _int_list(scope), "default_hours": fallback.min_balance_hours,
              "ended": list(ended_phases)}
    with statement_cursor() as cursor:
        cursor.execute(admission_query(queued_phase), params)
        return _state_of(cursor.fetchone(), fallback=fallback)


def admission_read_many(*, requests: list[tuple[int, list[int] | None]], ended_phases: tuple[str, ...]) -> list[AdmissionState]:
    """``admission_read`` for several users at once, in one statement (the queue admits several sessions per pass).

    Call it holding each user's account lock (``accounts_lock``).

    Args:
        requests: ``[(user pk, scope)]``, each as ``admission_read``'s ``user`` and ``scope``; a user may appear once.
        ended_phases: as ``admission_read``'s.

    Returns:
        One ``AdmissionState`` per request, in the same order (``queue_waiting`` not read: False).
    """
    if not requests:
        return []
    fallback = settings_policy()
    params = {"users": [int(user_id) for user_id, _ in requests], "scopes": [_int_list(scope) for _, scope in requests],
              "default_hours": fallback.min_balance_hours, "ended": list(ended_phases)}
    with statement_cursor() as cursor:
        cursor.execute(_ADMISSION_MANY_SQL, params)
        rows = sorted(cursor.fetchall(), key=lambda row: row[0])
    return [_state_of(row[1:], fallback=fallback) for row in rows]


def _state_of(row: tuple, *, fallback: EffectivePolicy) -> AdmissionState:
    """An ``AdmissionState`` from one row of ``_ADMISSION_SQL``."""
    (own, found, max_sessions, max_gpus, hours, grace, idle_timeout, idle_warning, max_runtime, runtime_warning, allowed, ids, gpus,
     memories, cores,
     models, device_memories, price_models, price_values, candidate_models, candidate_memories, queue_waiting,
     *later) = row
    if found:
        policy = EffectivePolicy(max_sessions=max_sessions, max_gpus=max_gpus, allowed_clusters=frozenset(allowed) if allowed else None,
                                 min_balance_hours=hours, grace_seconds=grace, source="user" if own else "default",
                                 idle_timeout_minutes=idle_timeout, idle_warning_minutes=idle_warning, max_runtime_hours=max_runtime,
                                 runtime_warning_minutes=runtime_warning, **dict(zip(_LATER_COLUMNS, later, strict=True)))
    else:
        policy = fallback
    live: dict[int, _Live] = {}
    for pk, count, memory, share, model, device_memory in zip(ids or [], gpus or [], memories or [], cores or [], models or [],
                                                              device_memories or [], strict=True):
        entry = live.setdefault(pk, _Live(gpus=count, gpu_memory_mib=memory, gpu_cores=share, devices=[]))
        if device_memory is not None:
            entry.devices.append((model, device_memory))
    return AdmissionState(policy=policy, live=list(live.values()), prices=dict(zip(price_models, price_values, strict=True)),
                          models=list(zip(candidate_models or [], candidate_memories or [], strict=True)),
                          queue_waiting=bool(queue_waiting))


_ADMISSION_QUERIES: dict[str, str] = {}


def admission_query(queued_phase: str) -> str:
    """The admission statement (``_ADMISSION_SQL``) for ``queued_phase`` (``admission_read``), that phase written into the
    statement (not a parameter) so that its EXISTS is answered by the partial index on the queued sessions
    (``session_queue_order_idx``) also in a generic plan."""
    if queued_phase not in _ADMISSION_QUERIES:
        if queued_phase and not queued_phase.isalpha():
            raise ValueError(f"not a phase name: {queued_phase!r}")
        waiting = f"EXISTS (SELECT 1 FROM gpu_sessions_session q WHERE q.phase = '{queued_phase}')" if queued_phase else "FALSE"
        _ADMISSION_QUERIES[queued_phase] = _ADMISSION_SQL.format(models=_MODELS_SQL, queue_waiting=waiting)
    return _ADMISSION_QUERIES[queued_phase]


#: ``admission_read``'s statement for each of several users (``admission_read_many``): one statement, planned once
#: whatever their number (a UNION of the per-user statement costs a plan per user, more than running it).
_ADMISSION_MANY_SQL = f"""
SELECT r.i, q.*
FROM unnest(%(users)s::bigint[], %(scopes)s::text[]) WITH ORDINALITY AS r(user_id, scope, i)
CROSS JOIN LATERAL ({admission_query("").replace("%(user)s", "r.user_id").replace("%(scope)s::bigint[]", "r.scope::bigint[]")}) q
"""


def _int_list(ids) -> str | None:
    return None if ids is None else "{" + ",".join(str(int(i)) for i in ids) + "}"


def request_hourly_cost(*, gpus: int, gpu_memory_mib: int | None, gpu_cores: int | None, clusters, prices: dict[str, Decimal] | None = None) -> Decimal:
    """Credits per hour the requested resources cost at most, before placement (conservative).

    ``gpus × share × price``: the price is the HIGHEST among the GPU models present on ``clusters`` (the
    candidate clusters: placement may pick any of them), and for a shared request the share
    (``billing.pricing.gpu_share``) is computed against the SMALLEST device memory among those models. With no
    GPU on the candidates: the default price, and a share of 1 when memory is asked.

    Args:
        gpus: GPUs asked.
        gpu_memory_mib: MiB per GPU asked, or None.
        gpu_cores: percent of one GPU asked, or None (both None: whole GPUs, share 1).
        clusters: pks of the candidate clusters, or a queryset of them (read as a subquery).
        prices: a ``billing.pricing.prices_by_model()`` result to use instead of the table's.

    Returns:
        Credits per hour, rounded up to 0.000001. One query.
    """
    read, models = _prices_and_models(clusters)
    return _request_cost(gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores, models=models,
                         prices=read if prices is None else prices)


def _request_cost(*, gpus: int, gpu_memory_mib: int | None, gpu_cores: int | None, models: list[tuple[str, int]],
                  prices: dict[str, Decimal]) -> Decimal:
    if models:
        price = max(pricing.price_for_model(model, prices) for model, _ in models)
        device_memory = min(memory for _, memory in models)
    else:
        price, device_memory = pricing.price_for_model("", prices), None
    share = pricing.gpu_share(device_memory_mib=device_memory, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores)
    return _reserve(gpus * price * share)


def session_holds(user, *, policy: EffectivePolicy | None = None, prices: dict[str, Decimal] | None = None) -> Decimal:
    """Credits the user's live (not Terminated or Failed) sessions reserve: the sum of their hourly costs ×
    the policy's ``min_balance_hours``. Available balance = balance − holds."""
    policy = policy or policy_for(user)
    if policy.min_balance_hours == 0:
        return Decimal(0).quantize(CREDITS)
    return _holds(_live_sessions(user), policy=policy, prices=pricing.prices_by_model() if prices is None else prices)


def _holds(live: list[_Live], *, policy: EffectivePolicy, prices: dict[str, Decimal]) -> Decimal:
    return _reserve(sum((_session_hourly_cost(s, prices) for s in live), Decimal(0)) * policy.min_balance_hours)


# --------------------------------------------------------------------------- admission


def credits_text(amount: Decimal) -> str:
    """``amount`` as a plain decimal string without trailing zeros (``-1.23``, ``40``)."""
    text = format(Decimal(amount).quantize(CREDITS), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def admission_clusters(*, policy: EffectivePolicy, pinned: Cluster | None = None, volume_clusters: frozenset[int] | None = None) -> frozenset[int] | None:
    """The clusters the policy lets this request be placed on (None: all); placement filters its candidates with it.

    Args:
        policy: the user's ``EffectivePolicy``.
        pinned: the cluster the request pinned, or None.
        volume_clusters: the clusters the request's volumes allow (``sessions.placement.volume_clusters``), or None.

    Raises:
        ClusterNotAllowed: 403 ``cluster_not_allowed`` when the pinned cluster is not allowed, or none of the
            clusters the volumes allow is; the body adds ``allowed_clusters`` (ids).
    """
    allowed = policy.allowed_clusters
    if allowed is None:
        return None
    if pinned is not None and pinned.pk not in allowed:
        what = f"cluster {pinned.name} ({pinned.public_id})"
    elif volume_clusters is not None and not (volume_clusters & allowed):
        what = "the clusters your volumes are on or shared with"
    else:
        return allowed
    names = list(Cluster.objects.filter(pk__in=allowed).exclude(status=Cluster.Status.DEREGISTERED).order_by("name").values_list("name", "public_id"))
    listed = ", ".join(f"{name} ({public_id})" for name, public_id in names) or "none registered now"
    raise ClusterNotAllowed(
        f"Your policy does not allow sessions on {what}; it allows {listed}. Pin one of those or leave `cluster` out, "
        "or ask an operator to allow the cluster in your policy.",
        extra={"allowed_clusters": [public_id for _, public_id in names]},
    )


def admission_check(
    *,
    user,
    gpus: int,
    gpu_memory_mib: int | None,
    gpu_cores: int | None,
    clusters,
    locked_account: CreditAccount,
    policy: EffectivePolicy | None = None,
    state: AdmissionState | None = None,
) -> None:
    """Refuse a session request the user's policy or credits do not allow; return None when admitted.

    Call it holding ``locked_account`` (``account_lock``), so the live sessions counted here cannot change
    before the caller's transaction commits the new session. Queries: none with ``state``; else none more than
    ``policy_for`` (when not given) with no limits and ``min_balance_hours`` 0; else one for the live sessions, and
    one for prices and the candidate clusters' GPU models when ``min_balance_hours`` > 0: a constant number,
    whatever the number of sessions, clusters or GPUs.

    Args:
        user: the requesting user.
        gpus, gpu_memory_mib, gpu_cores: the request.
        clusters: pks of the candidate clusters (after ``admission_clusters``), or a queryset of them: priced by
            ``request_hourly_cost``.
        locked_account: the user's ``CreditAccount``, locked by ``account_lock``.
        policy: the user's ``EffectivePolicy`` (read when None).
        state: ``admission_read``'s result for this request, read under ``locked_account``'s lock: then no query is
            made (its policy, live sessions, prices and candidates' models are used; ``clusters`` and ``policy`` are ignored).

    Raises:
        QuotaExceeded: 403 ``quota_exceeded``: the live sessions + 1 would pass ``max_sessions``, or their GPUs +
            ``gpus`` would pass ``max_gpus``; the body adds ``limit``, ``allowed``, ``current``, ``requested``.
        InsufficientCredits: 402 ``insufficient_credits``: balance − accrued − holds < hourly cost ×
            ``min_balance_hours``; the body adds ``balance``, ``accrued``, ``holds``, ``available``, ``required``,
            ``hourly_cost`` (decimal strings).
    """
    policy = state.policy if state is not None else policy or policy_for(user)
    hours = policy.min_balance_hours
    if state is not None:
        live = state.live
    else:
        live = _live_sessions(user) if (policy.max_sessions is not None or policy.max_gpus is not None or hours > 0) else []
    if policy.max_sessions is not None and len(live) + 1 > policy.max_sessions:
        raise QuotaExceeded(
            f"You have {len(live)} live session(s) and your policy allows at most {policy.max_sessions} at once (max_sessions): "
            "stop one (`DELETE /api/v1/sessions/{id}`) or ask an operator to raise the limit.",
            console_detail=f"You have {len(live)} live session(s) and your policy allows at most {policy.max_sessions} at once "
                           f"(max_sessions): stop one ({CONSOLE_STOP}) or ask an operator to raise the limit.",
            extra={"limit": "max_sessions", "allowed": policy.max_sessions, "current": len(live), "requested": 1},
        )
    used = sum(s.gpus for s in live)
    if policy.max_gpus is not None and used + gpus > policy.max_gpus:
        raise QuotaExceeded(
            f"Your live sessions use {used} GPU(s); {gpus} more would pass your policy's limit of {policy.max_gpus} GPU(s) "
            "(max_gpus): ask for fewer GPUs, stop a session (`DELETE /api/v1/sessions/{id}`), or ask an operator to raise the limit.",
            console_detail=f"Your live sessions use {used} GPU(s); {gpus} more would pass your policy's limit of {policy.max_gpus} "
                           f"GPU(s) (max_gpus): ask for fewer GPUs, stop a session ({CONSOLE_STOP}), or ask an operator to raise "
                           "the limit.",
            extra={"limit": "max_gpus", "allowed": policy.max_gpus, "current": used, "requested": gpus},
        )
    balance, accrued = locked_account.balance, locked_account.accrued
    zero = Decimal(0).quantize(CREDITS)
    if hours > 0:
        prices, models = (state.prices, state.models) if state is not None else _prices_and_models(clusters)
        hourly = _request_cost(gpus=gpus, gpu_memory_mib=gpu_memory_mib, gpu_cores=gpu_cores, models=models, prices=prices)
        holds, required = _holds(live, policy=policy, prices=prices), _reserve(hourly * hours)
    else:
        hourly, holds, required = zero, zero, zero
    available = balance - accrued - holds
    if available >= required:
        return
    figures = {"balance": credits_text(balance), "accrued": credits_text(accrued), "holds": credits_text(holds),
               "available": credits_text(available), "required": credits_text(required), "hourly_cost": credits_text(hourly)}
    unbilled = f", usage not billed yet comes to {figures['accrued']}" if accrued else ""
    if hours > 0:
        need = (f"Starting this session needs {figures['required']} credits available ({credits_text(hours)} h at up to "
                f"{figures['hourly_cost']} credits/hour for {gpus} GPU(s)); your balance is {figures['balance']}{unbilled} and "
                f"your live sessions hold {figures['holds']}, so {figures['available']} is available.")
    else:
        need = (f"Your balance is {figures['balance']} credits{unbilled}; sessions start only with a balance that is not "
                "negative.")
    raise InsufficientCredits(
        f"{need} Ask an operator for a grant of credits, or stop a session (`DELETE /api/v1/sessions/{{id}}`) to free its hold.",
        console_detail=f"{need} Ask an operator for a grant of credits, or stop a session ({CONSOLE_STOP}) to free its hold.",
        extra=figures,
    )
