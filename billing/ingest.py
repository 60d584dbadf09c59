"""Usage ingestion (``POST /internal/v1/usage``): a batch of an operator's samples stored and charged exactly once.

``usage_ingest`` is the only writer of ``UsageSample`` rows. It parses with ``billing.usage.parse_samples``, checks the
batch against the database, then writes it in one transaction and a constant number of statements (COPY into
per-connection staging tables, ``INSERT ... SELECT ... ON CONFLICT``): the samples, their sessions' accruals and
their owners' accounts, and a session's period charge when a sample of a later period closes it (``billing.periods``).

Lock order: the batch owners' credit accounts (primary-key order), as every billing writer (``billing.services``);
the deferred foreign-key checks then take key-share locks on the sessions and the cluster at commit.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from billing import periods, pricing
from billing.exceptions import UsageConflict
from billing.models import CREDITS, USAGE_OVERLAP_CONSTRAINT, Accrual, HeldGpu, UsageSample
from billing.usage import (
    CLOCK_SKEW_SECONDS,
    USAGE_DEVICE_NOT_ALLOCATED,
    USAGE_WINDOW_AFTER_SESSION,
    USAGE_WINDOW_BEFORE_SESSION,
    USAGE_WINDOW_OVERLAP,
    Sample,
    invalid_sample,
    parse_samples,
)
from clusters.models import Cluster, GpuDevice
from contract import FORBIDDEN_CLUSTER_SCOPE
from core import instruments
from core.exceptions import ApplicationError, Forbidden

logger = logging.getLogger(__name__)


class _SessionRow(NamedTuple):
    """A session of the batch as ``_SESSIONS`` reads it; ``devices`` are the UUIDs of the GPUs it holds."""

    public_id: str
    pk: int
    cluster_id: int
    owner_id: int
    gpu_memory_mib: int | None
    gpu_cores: int | None
    created_at: datetime
    devices: list[str]
    ended_at: datetime | None
    closed: bool  # its held time was billed in full (billing.held): no later sample is stored


class _DeviceRow(NamedTuple):
    """A GPU named by the batch."""

    uuid: str
    cluster_id: int
    model: str
    memory_mib: int


class _Account(NamedTuple):
    """A locked credit account: its pk, balance, accrued credits and ``below_zero_since``."""

    id: int
    balance: Decimal
    accrued: Decimal
    below_zero_since: datetime | None


class _Pricing(NamedTuple):
    """How one (session, GPU) pair of the batch is priced."""

    session_pk: int
    share: Decimal
    price: Decimal
    model: str


class _Priced(NamedTuple):
    """One new sample with its session's pk, its GPU share, its cost (credits), its length (seconds) and the period
    of its start (epoch seconds of the period's start)."""

    sample: Sample
    session_pk: int
    share: Decimal
    cost: Decimal
    seconds: Decimal
    period: int


class _Window(NamedTuple):
    """A usage window of one session and GPU, stored (``index`` None) or of the batch (``index`` in ``samples``)."""

    start: datetime
    end: datetime
    sample_id: str
    index: int | None


class _Charge(NamedTuple):
    """One period ``charge`` ledger entry to write: the columns of ``_CHARGE_COLUMNS``, in that order."""

    account_id: int
    amount: Decimal
    balance_after: Decimal
    idempotency_key: str
    session_id: int
    window_start: datetime
    window_end: datetime
    gpu_seconds: Decimal
    reason: str
    period_start: datetime
    period_end: datetime
    sample_count: int


#: Per-connection staging tables (temporary, emptied at every commit) the ingestion COPYs into.
_STAGING_DDL = """
    CREATE TEMP TABLE IF NOT EXISTS billing_usage_staging_p (
        sample_id text, session_id bigint, device_uuid text, start timestamptz, finish timestamptz, gpu_util_percent numeric,
        memory_used_mib integer, gpu_model text, share numeric, cost numeric, billing_period bigint
    ) ON COMMIT DELETE ROWS;
    CREATE TEMP TABLE IF NOT EXISTS billing_charge_staging_p (
        account_id bigint, amount numeric, balance_after numeric, idempotency_key text, session_id bigint,
        window_start timestamptz, window_end timestamptz, gpu_seconds numeric, reason text, period_start timestamptz,
        period_end timestamptz, sample_count integer
    ) ON COMMIT DELETE ROWS"""

_USAGE_COLUMNS = ("sample_id", "session_id", "device_uuid", "start", "finish", "gpu_util_percent", "memory_used_mib", "gpu_model",
                  "share", "cost", "billing_period")
_CHARGE_COLUMNS = ("account_id", "amount", "balance_after", "idempotency_key", "session_id", "window_start", "window_end",
                   "gpu_seconds", "reason", "period_start", "period_end", "sample_count")

#: Moves the staged samples into the table, each into the later of its own billing period and its session's open one
#: (the accruals are read in the same statement, under the owners' account locks); returns the samples really inserted
#: (not already stored, and not of a session whose held time was billed in full meanwhile: ``billing.held``) with the
#: period each accrues into, then the sessions' accruals as they were (``sample_id``
#: NULL: ``period`` the open period, ``session_id`` and ``samples``). The conflict target
#: is the unique ``(cluster_id, sample_id)`` only: a row that overlaps another window of its session and GPU raises the
#: exclusion violation of ``usage_sample_no_overlap`` instead of being skipped like a replay. (Without a target,
#: ``DO NOTHING`` would skip those rows too, but PostgreSQL then searches the GiST index once more for every row before
#: inserting it: about twice the constraint's cost per batch.)
_INSERT_SAMPLES = f"""
    WITH staged AS (DELETE FROM billing_usage_staging_p RETURNING *),
    acc AS (
        SELECT session_id, period_start, samples FROM {Accrual._meta.db_table}
         WHERE session_id IN (SELECT DISTINCT session_id FROM staged)
    ),
    closed AS (
        SELECT DISTINCT session_id FROM {HeldGpu._meta.db_table}
         WHERE session_id IN (SELECT DISTINCT session_id FROM staged) AND billed_at IS NOT NULL
    ),
    ins AS (
        INSERT INTO billing_usagesample
            (cluster_id, sample_id, session_id, device_uuid, start, "end", gpu_util_percent, memory_used_mib, gpu_model, share,
             cost, billing_period, received_at)
        SELECT %s, s.sample_id, s.session_id, s.device_uuid, s.start, s.finish, s.gpu_util_percent, s.memory_used_mib,
               s.gpu_model, s.share, s.cost, GREATEST(to_timestamp(s.billing_period), acc.period_start), %s
          FROM staged s LEFT JOIN acc ON acc.session_id = s.session_id
         WHERE s.session_id NOT IN (SELECT session_id FROM closed)
        ON CONFLICT (cluster_id, sample_id) DO NOTHING
        RETURNING sample_id, EXTRACT(EPOCH FROM billing_period)::bigint AS period
    )
    SELECT sample_id, period, NULL::bigint, NULL::integer FROM ins
    UNION ALL
    SELECT NULL, EXTRACT(EPOCH FROM period_start)::bigint, session_id, samples FROM acc"""

#: Period charges (only when a batch closes a period). No ``ON CONFLICT``: under the owners' account locks a period is
#: charged once; a second charge of one (session, period) would be a bug, and the unique constraint makes it fail loudly.
_INSERT_CHARGES = """
    WITH staged AS (DELETE FROM billing_charge_staging_p RETURNING *)
    INSERT INTO billing_ledgerentry
        (account_id, kind, amount, balance_after, idempotency_key, session_id, window_start, window_end, gpu_seconds,
         reason, period_start, period_end, sample_count, created_by, created_at)
    SELECT account_id, 'charge', amount, balance_after, idempotency_key, session_id, window_start, window_end,
           gpu_seconds, reason, period_start, period_end, sample_count, 'usage', %s
      FROM staged"""

#: The whole accruals of the sessions whose open period a batch closes (only then).
_READ_CLOSING = f"""
    SELECT session_id, period_start, amount, gpu_seconds, samples, first_start, last_end FROM {Accrual._meta.db_table}
     WHERE session_id = ANY(%s::bigint[])"""

#: The accruals of the sessions with new samples, one set-based statement whatever their number: each row is what the
#: batch's samples of the session's latest period add up to; it is added to the stored accrual of the same period, and
#: replaces one of an earlier period (that one was charged by this batch, or held nothing).
_UPSERT_ACCRUALS = f"""
    INSERT INTO {Accrual._meta.db_table} AS r
        (session_id, account_id, period_start, amount, gpu_seconds, samples, first_start, last_end, updated_at)
    SELECT v.session_id, a.id, to_timestamp(v.period), v.amount, v.gpu_seconds, v.samples, v.first_start, v.last_end, %s
      FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::numeric[], %s::numeric[], %s::integer[], %s::timestamptz[],
                  %s::timestamptz[]) AS v(session_id, owner_id, period, amount, gpu_seconds, samples, first_start, last_end)
      JOIN billing_creditaccount a ON a.user_id = v.owner_id
    ON CONFLICT (session_id) DO UPDATE SET
        amount = EXCLUDED.amount + CASE WHEN r.period_start = EXCLUDED.period_start THEN r.amount ELSE 0 END,
        gpu_seconds = EXCLUDED.gpu_seconds + CASE WHEN r.period_start = EXCLUDED.period_start THEN r.gpu_seconds ELSE 0 END,
        samples = EXCLUDED.samples + CASE WHEN r.period_start = EXCLUDED.period_start THEN r.samples ELSE 0 END,
        first_start = CASE WHEN r.period_start = EXCLUDED.period_start THEN LEAST(r.first_start, EXCLUDED.first_start)
                           ELSE EXCLUDED.first_start END,
        last_end = CASE WHEN r.period_start = EXCLUDED.period_start THEN GREATEST(r.last_end, EXCLUDED.last_end)
                        ELSE EXCLUDED.last_end END,
        period_start = EXCLUDED.period_start, updated_at = EXCLUDED.updated_at"""

_UPDATE_ACCOUNTS = """
    UPDATE billing_creditaccount a SET balance = v.balance, accrued = v.accrued, below_zero_since = v.below_zero_since
      FROM unnest(%s::bigint[], %s::numeric[], %s::numeric[], %s::timestamptz[]) AS v(id, balance, accrued, below_zero_since)
     WHERE a.id = v.id"""


def _staging_tables(cursor) -> None:
    """Make sure this session's staging tables exist (``CREATE TEMP TABLE IF NOT EXISTS``, silent when they do).

    Run in every batch's transaction rather than remembered per connection: a connection pooler in transaction mode
    may hand each transaction another server session."""
    cursor.execute(_STAGING_DDL)


def _copy(cursor, table: str, columns: tuple[str, ...], rows) -> None:
    """``COPY table (columns) FROM STDIN`` the tuples ``rows`` (psycopg's ``cursor.copy()``)."""
    with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        write = copy.write_row
        for row in rows:
            write(row)


def _lock_accounts(user_ids: list[int]) -> dict[int, _Account]:
    """Lock the credit accounts of ``user_ids`` (primary-key order), creating the missing ones; ``{user_id:
    _Account}``. One query when they all exist, three otherwise."""
    sql = ("SELECT user_id, id, balance, accrued, below_zero_since FROM billing_creditaccount WHERE user_id = ANY(%s) "
           "ORDER BY id FOR UPDATE")
    with connection.cursor() as cursor:
        cursor.execute(sql, [user_ids])
        rows = cursor.fetchall()
        if len(rows) < len(user_ids):
            cursor.execute(
                "INSERT INTO billing_creditaccount (user_id, balance, accrued, created_at) SELECT u, 0, 0, %s FROM unnest(%s::bigint[]) AS u "
                "ON CONFLICT (user_id) DO NOTHING",
                [timezone.now(), user_ids],
            )
            cursor.execute(sql, [user_ids])
            rows = cursor.fetchall()
    return {user_id: _Account(pk, balance, accrued, since) for user_id, pk, balance, accrued, since in rows}


def _text_array(values) -> str:
    """A PostgreSQL ``text[]`` literal of ``values`` (each quoted; backslashes and double quotes escaped)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def _array(values) -> str:
    """A PostgreSQL array literal of ints, ``Decimal``s and datetimes (None as NULL), cast by the query."""
    values = list(values)
    kinds = {type(v) for v in values}
    if kinds <= {int}:  # the usual columns of ids: one join, no per-value tests
        return "{" + ",".join(map(str, values)) + "}"
    return "{" + ",".join("NULL" if v is None else f'"{v.isoformat()}"' if isinstance(v, datetime) else format(v, "f") if isinstance(v, Decimal)
                          else str(v) for v in values) + "}"


def _update_accounts(cursor, changed: list[_Account]) -> None:
    """Write the accounts' balances, accrued credits and ``below_zero_since`` in one ``UPDATE``."""
    cursor.execute(_UPDATE_ACCOUNTS, [_array(c.id for c in changed), _array(c.balance for c in changed),
                                      _array(c.accrued for c in changed), _array(c.below_zero_since for c in changed)])


#: The sessions' tables (the sessions and their GPU reservations), reached through billing's own relation
#: ``UsageSample.session`` (sessions sits above billing).
_SESSION_TABLE = UsageSample._meta.get_field("session").related_model._meta.db_table
_ALLOCATION_TABLE = UsageSample._meta.get_field("session").related_model._meta.get_field("allocations").related_model._meta.db_table

#: The batch's sessions, each with the GPUs it holds: those placement reserved for it (``Allocation``, released when
#: it ends) and those HAMi gave its Pod as the operator reported them (``Session.devices``, kept after it ends). Set-based
#: (one join and one aggregate for all of them), not a subquery per session: its cost must not depend on the planner
#: choosing an index for each of a thousand sessions.
_SESSIONS = f"""
    WITH s AS MATERIALIZED (
        SELECT id, public_id, cluster_id, owner_id, gpu_memory_mib, gpu_cores, created_at, ended_at, devices
          FROM {_SESSION_TABLE} WHERE public_id = ANY(%s::text[])
    ), held AS (
        SELECT session_id, array_agg(DISTINCT uuid) AS uuids
          FROM (SELECT a.session_id, d.uuid FROM {_ALLOCATION_TABLE} a JOIN {GpuDevice._meta.db_table} d ON d.id = a.device_id
                 WHERE a.session_id IN (SELECT id FROM s)
                UNION ALL
                SELECT s.id, jsonb_array_elements_text(CASE jsonb_typeof(s.devices) WHEN 'array' THEN s.devices ELSE '[]' END) FROM s) h
         GROUP BY session_id
    )
    SELECT s.public_id, s.id, s.cluster_id, s.owner_id, s.gpu_memory_mib, s.gpu_cores, s.created_at, COALESCE(held.uuids, '{{}}'),
           s.ended_at, EXISTS (SELECT 1 FROM {HeldGpu._meta.db_table} h WHERE h.session_id = s.id AND h.billed_at IS NOT NULL)
      FROM s LEFT JOIN held ON held.session_id = s.id"""


def _scope_and_sessions(*, cluster: Cluster, parsed: list[Sample], samples: list) -> tuple[dict, dict]:
    """Look up the batch's sessions and GPUs (two queries); refuse foreign ones (403), then (400, in index order)
    unknown sessions, GPUs the session does not hold and windows that begin before the session or after it ended.

    A session holds the GPUs placement reserved for it and those the operator reported HAMi allocated to its Pod
    (HAMi may pick other GPUs of the node than placement did; late samples of an ended session still count). A
    window may begin at most ``CLOCK_SKEW_SECONDS`` before the session was created (``created_at``: its Pod cannot
    run earlier; ``started_at``, the operator's first Running report, comes after the containers' start, where the
    operator's first window begins, and is empty until that report arrives); the allowance is the clock skew between
    the node and the control plane the endpoint already grants ahead of its clock. Likewise a window may begin at most
    ``CLOCK_SKEW_SECONDS`` after the session ended (``ended_at``): late samples of a window that began while it ran
    still count, usage reported for later (the GPU may be another session's by then) is refused.

    Returns:
        ``({session public id: _SessionRow}, {uuid: _DeviceRow})``.

    Raises:
        Forbidden: ``forbidden_cluster_scope`` (403, ``index``).
        InvalidUsageSample: ``invalid_usage_sample`` (400, ``index``; ``reason`` ``usage_device_not_allocated``,
            ``usage_window_before_session`` or ``usage_window_after_session`` for those three).
    """
    with connection.cursor() as cursor:
        # One text[] literal per look-up: a thousand ids as one parameter, not a thousand parameters to quote.
        cursor.execute(_SESSIONS, [_text_array({s.session_id for s in parsed})])
        found = [_SessionRow(*row) for row in cursor.fetchall()]
        sessions = {row.public_id: row for row in found}
        cursor.execute(f"SELECT uuid, cluster_id, model, memory_mib FROM {GpuDevice._meta.db_table} WHERE uuid = ANY(%s::text[])",
                       [_text_array({s.device_uuid for s in parsed})])
        devices = {row[0]: _DeviceRow(*row) for row in cursor.fetchall()}
    own = cluster.pk
    for sample in parsed:
        session = sessions.get(sample.session_id)
        device = devices.get(sample.device_uuid)
        if session is not None and session.cluster_id != own:
            what = f"session {sample.session_id}, which is not a session"
        elif device is None or device.cluster_id != own:
            what = f"GPU {sample.device_uuid}, which is not a GPU"
        else:
            continue
        raise Forbidden(
            f"Usage sample samples[{sample.index}] names {what} of cluster {cluster.name} ({cluster.public_id}); an operator may "
            "only report its own cluster's usage. Nothing of this batch was stored. Check that this operator runs with its "
            "own cluster's token, and that its inventory (PUT /internal/v1/inventory) lists the GPU.",
            code=FORBIDDEN_CLUSTER_SCOPE, extra={"index": sample.index},
        )
    held = {row.public_id: set(row.devices) for row in found}
    earliest = {row.public_id: row.created_at - timedelta(seconds=CLOCK_SKEW_SECONDS) for row in found}
    latest = {row.public_id: row.ended_at + timedelta(seconds=CLOCK_SKEW_SECONDS) for row in found if row.ended_at is not None}
    for sample in parsed:
        if sample.session_id not in sessions:
            raise invalid_sample(
                sample.index, samples[sample.index],
                f"no session {sample.session_id!r} exists (session_id must be the GShareSession's gshare.io/session-id)",
            )
        if sample.device_uuid not in held[sample.session_id]:
            raise invalid_sample(
                sample.index, samples[sample.index],
                f"GPU {sample.device_uuid} is not allocated to session {sample.session_id} (neither reserved for it nor reported "
                "by the operator as HAMi's allocation to its Pod): only a GPU the session holds is charged to it",
                reason=USAGE_DEVICE_NOT_ALLOCATED,
            )
        if sample.start < earliest[sample.session_id]:
            created = earliest[sample.session_id] + timedelta(seconds=CLOCK_SKEW_SECONDS)
            raise invalid_sample(
                sample.index, samples[sample.index],
                f"its window begins at {sample.start.isoformat()}, before the session {sample.session_id} was created "
                f"({created:%Y-%m-%dT%H:%M:%SZ}, allowing {CLOCK_SKEW_SECONDS} s of clock skew): check the operator node's clock",
                reason=USAGE_WINDOW_BEFORE_SESSION,
            )
        last = latest.get(sample.session_id)
        if last is not None and sample.start > last:
            ended = last - timedelta(seconds=CLOCK_SKEW_SECONDS)
            raise invalid_sample(
                sample.index, samples[sample.index],
                f"its window begins at {sample.start.isoformat()}, after the session {sample.session_id} ended "
                f"({ended:%Y-%m-%dT%H:%M:%SZ}, allowing {CLOCK_SKEW_SECONDS} s of clock skew): an ended session is not charged "
                "for later usage; check the operator node's clock",
                reason=USAGE_WINDOW_AFTER_SESSION,
            )
    return sessions, devices


def usage_ingest(*, cluster: Cluster, samples: list[dict]) -> dict:
    """Store a batch of an operator's usage samples and accrue them, exactly once per ``(cluster, sample_id)``.

    Every sample is checked first (``billing.usage.parse_samples``), then against the database: its session must be
    a session of ``cluster`` and its device a GPU of ``cluster`` (403), a GPU the session holds, and its window may
    not begin before the session or after it ended (400, ``_scope_and_sessions``). Refusals store nothing. Then, in
    one transaction and a constant number of statements whatever the batch size:

    1. the samples, each priced (share of its device, price of the device's model, window: ``billing.pricing``) with
       the billing period of its start, are COPYed into a temporary staging table (before any lock);
    2. the accounts of the batch's session owners are locked (primary-key order; created when missing), and under
       those locks a new sample overlapping another of the same session and GPU is refused (``_refuse_overlaps``);
    3. the staged samples are moved with one ``INSERT ... SELECT ... ON CONFLICT (cluster_id, sample_id) DO NOTHING
       RETURNING``, each into the later of its own period and its session's open one (the accruals are read in the
       same statement): only the rows this batch really inserted come back, so replayed, duplicated (also within the
       batch) and reordered samples are never accrued twice, even when two deliveries of one batch run at the same
       time (the unique index makes the second wait for the first, then skip). A row the exclusion constraint
       ``usage_sample_no_overlap`` refuses (an overlap the check did not see: only a writer that does not take the
       account locks can cause one) rolls the whole batch back; the check then runs again and names the sample
       (400), or the batch is refused as a conflict (409);
    4. the new samples' costs are added to their sessions' accruals (one set-based upsert) and the owners' ``accrued``,
       a period a sample of a later one closes is charged (``billing.periods``: one ``charge`` per session and
       period), and the accounts' new balances are written (one ``UPDATE``).

    Args:
        cluster: the cluster named in the operator token.
        samples: the body's ``samples`` (see ``parse_samples``).

    Returns:
        ``{"accepted": new samples, "duplicates": samples already stored or repeated, "charged": {session id:
        credits the new samples cost (accrued, charged with their period), as a string}}``.

    Raises:
        BatchTooLarge: ``batch_too_large`` (400).
        InvalidUsageSample: ``invalid_usage_sample`` (400, ``index``): malformed, or an unknown session; with
            ``reason`` ``usage_device_not_allocated``, ``usage_window_before_session``, ``usage_window_after_session`` or
            ``usage_window_overlap``.
        Forbidden: ``forbidden_cluster_scope`` (403, ``index``): a session or a GPU that is not this cluster's.
        UsageConflict: ``usage_conflict`` (409): the constraint refused a window the check did not find again; retry.
    """
    try:
        result = _ingest(cluster=cluster, samples=samples)
    except ApplicationError:
        instruments.USAGE_SAMPLES.labels(cluster=cluster.name, outcome="refused").inc(len(samples) if isinstance(samples, list) else 0)
        raise
    instruments.USAGE_SAMPLES.labels(cluster=cluster.name, outcome="accepted").inc(result["accepted"])
    instruments.USAGE_SAMPLES.labels(cluster=cluster.name, outcome="duplicate").inc(result["duplicates"])
    return result


def _ingest(*, cluster: Cluster, samples: list[dict]) -> dict:
    """``usage_ingest`` without its counters (``gshare_usage_samples_total``)."""
    parsed = parse_samples(samples, max_window_seconds=settings.GSHARE_USAGE_MAX_WINDOW_SECONDS,
                           max_age_seconds=settings.GSHARE_USAGE_MAX_AGE_SECONDS)
    if not parsed:
        return {"accepted": 0, "duplicates": 0, "charged": {}}
    sessions, devices = _scope_and_sessions(cluster=cluster, parsed=parsed, samples=samples)

    # The first of each sample_id counts; price each (session, device) pair once.
    unique: dict[str, Sample] = {}
    for sample in parsed:
        unique.setdefault(sample.sample_id, sample)
    rows = _held_part(unique.values(), sessions)
    if not rows:
        return {"accepted": 0, "duplicates": len(parsed), "charged": {}}
    prices = pricing.prices_by_model()
    pairs: dict[tuple[str, str], _Pricing] = {}
    staged: list[tuple] = []
    priced_rows: list[_Priced] = []
    million = Decimal(1_000_000)
    length = periods.period_length()
    length_seconds = settings.GSHARE_BILLING_PERIOD_SECONDS
    epoch = periods.EPOCH
    period_of_start: dict[datetime, int] = {}  # a batch's samples share a few starts (sampling ticks)
    for sample in rows:
        pair = (sample.session_id, sample.device_uuid)
        priced = pairs.get(pair)
        if priced is None:
            session, device = sessions[sample.session_id], devices[sample.device_uuid]
            share = pricing.gpu_share(device_memory_mib=device.memory_mib, gpu_memory_mib=session.gpu_memory_mib,
                                      gpu_cores=session.gpu_cores)
            priced = pairs[pair] = _Pricing(session.pk, share, pricing.price_for_model(device.model, prices), device.model)
        session_pk, share, price, model = priced
        seconds = Decimal(sample.micros) / million
        cost = pricing.window_cost(price=price, share=share, seconds=seconds)
        period = period_of_start.get(sample.start)
        if period is None:
            period = period_of_start[sample.start] = (sample.start - epoch) // length * length_seconds
        priced_rows.append(_Priced(sample, session_pk, share, cost, seconds, period))
        # Text for times and decimals: psycopg formats strings for COPY several times faster than datetimes/Decimals.
        # The columns of _USAGE_COLUMNS; billing_period is the sample's own period unless the session's open one is
        # later (known under the locks).
        staged.append((sample.sample_id, session_pk, sample.device_uuid, sample.start.isoformat(), sample.end.isoformat(),
                       sample.gpu_util_percent, sample.memory_used_mib, model, str(share), str(cost), period))
    # Grouped now, outside the account locks, for the usual batch (every sample new, none of a period already charged);
    # regrouped under the locks otherwise.
    grouped, added = _group(priced_rows, None)
    upsert = _accrual_rows(grouped, owners={row.pk: row.owner_id for row in sessions.values()})
    in_batch = _overlap_in_batch(rows, sessions)

    batch_sessions = sorted({row.session_pk for row in priced_rows})
    owners = {row.pk: row.owner_id for row in sessions.values()}
    public_ids = {row.pk: row.public_id for row in sessions.values()}
    clusters = {row.pk: cluster.name for row in sessions.values()}
    now = timezone.now()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # Staged before the locks (a temporary table of this connection): the locks are held for less.
            _staging_tables(cursor)
            _copy(cursor, "billing_usage_staging_p", _USAGE_COLUMNS, staged)
            accounts = _lock_accounts(sorted({owners[pk] for pk in batch_sessions}))
            # Under the owners' account locks: every batch with samples of a session locks its owner's account, so no
            # other batch of these sessions is between this check and the commit (the check before these locks let two
            # concurrent batches both pass and both store one window under two ids).
            _refuse_overlaps(cluster=cluster, rows=rows, sessions=sessions, samples=samples, in_batch=in_batch)
            # A sample accrues into the later of its own period and its session's open one (a period already charged
            # is never charged again: its late samples go with the next): the INSERT says which, under the locks.
            cursor.execute(_INSERT_SAMPLES, [cluster.pk, now])
            inserted: dict[str, int] = {}
            opened: dict[int, tuple[int, int]] = {}
            for sample_id, period, session_pk, count in cursor.fetchall():
                if sample_id is None:
                    opened[session_pk] = (period, count)
                else:
                    inserted[sample_id] = period
            late = any(floor > min(grouped[pk]) for pk, (floor, _) in opened.items() if pk in grouped)
            if late or len(inserted) < len(rows):
                grouped, added = _group(priced_rows, inserted)
                upsert = _accrual_rows(grouped, owners=owners)
            charged = _accrue(cursor, grouped=grouped, added=added, upsert=upsert, opened=opened, owners=owners, accounts=accounts,
                              public_ids=public_ids, clusters=clusters, length=length, now=now)
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) != USAGE_OVERLAP_CONSTRAINT:
            raise
        # The database's last word: a window of these sessions and GPUs was stored past the check (by a writer that
        # does not take the account locks). Nothing of the batch was committed; the check now sees that window.
        logger.warning("usage batch of cluster %s refused by %s past the overlap check", cluster.public_id, USAGE_OVERLAP_CONSTRAINT)
        _refuse_overlaps(cluster=cluster, rows=rows, sessions=sessions, samples=samples)
        raise UsageConflict(
            "Another writer stored usage of this batch's sessions and GPUs while it was being written; nothing of this "
            "batch was stored. Send it again.",
        ) from exc
    return {
        "accepted": len(inserted),
        "duplicates": len(parsed) - len(inserted),
        "charged": {public_ids[pk]: str(amount) for pk, amount in charged.items()},
    }


def _held_part(samples, sessions: dict) -> list[Sample]:
    """The samples cut to the time their session held its GPUs: from its creation (placement reserved them in that
    transaction) to its end when it ended (``billing.held`` bills that interval exactly, sampled or not). A sample
    left with nothing, and every sample of a session whose held time was billed in full already, is left out: not
    stored, counted in ``duplicates`` (its seconds, if any, are billed already)."""
    rows = []
    for sample in samples:
        session = sessions[sample.session_id]
        if session.closed:
            continue
        start = max(sample.start, session.created_at)
        end = sample.end if session.ended_at is None else min(sample.end, session.ended_at)
        if end <= start:
            continue
        if start != sample.start or end != sample.end:
            delta = end - start
            sample = sample._replace(start=start, end=end, micros=(delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)
        rows.append(sample)
    return rows


def _overlap_in_batch(rows: list[Sample], sessions: dict) -> bool:
    """Whether two samples of the batch (distinct ids) overlap on one session and GPU: then ``_refuse_overlaps``
    judges them too (checked outside the locks; the usual batch has none, and its check under the locks only compares
    the stored windows it finds)."""
    spans: dict[tuple[int, str], list[tuple[datetime, datetime]]] = {}
    for sample in rows:
        spans.setdefault((sessions[sample.session_id].pk, sample.device_uuid), []).append((sample.start, sample.end))
    for windows in spans.values():
        if len(windows) < 2:
            continue
        windows.sort()
        reach = windows[0][1]
        for start, end in windows[1:]:
            if start < reach:
                return True
            reach = max(reach, end)
    return False


def _refuse_overlaps(*, cluster: Cluster, rows: list[Sample], sessions: dict, samples: list, in_batch: bool = True) -> None:
    """Refuse (400, with the index) a new sample whose window overlaps another sample of the same session and GPU.

    Idempotency is by ``sample_id``; this closes the other way to charge a GPU-second twice: two samples with
    different ids for the same time (an operator that lost its state and re-sampled). Samples whose id is already
    stored are replays and are not checked. Windows that touch (one's end is the next one's start) do not overlap.
    One query: the stored samples of the batch's sessions within the batch's time span (per session, through the
    GiST index of ``usage_sample_no_overlap``, whatever the session's history), under the same condition as that
    constraint. Run it under the sessions' owners' account locks, so no concurrent batch of these sessions can store
    a window after it looked; the constraint holds regardless. ``in_batch`` False (``_overlap_in_batch`` found none)
    skips the comparison when no stored window is near.

    Raises:
        InvalidUsageSample: ``invalid_usage_sample`` (400, ``index``, ``reason`` ``usage_window_overlap``).
    """
    if not rows:
        return
    first, last = min(r.start for r in rows), max(r.end for r in rows)
    session_pks = sorted({sessions[r.session_id].pk for r in rows})
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT u.cluster_id, u.sample_id, u.session_id, u.device_uuid, u.start, u."end" FROM unnest(%s::bigint[]) AS k(session_id) '
            f"JOIN {UsageSample._meta.db_table} u ON u.session_id = k.session_id "
            "AND tstzrange(u.start, u.\"end\", '[)') && tstzrange(%s, %s, '[)') "
            # A session whose held time was billed meanwhile stores none of these samples (_INSERT_SAMPLES): no refusal.
            f"WHERE NOT EXISTS (SELECT 1 FROM {HeldGpu._meta.db_table} h WHERE h.session_id = k.session_id AND h.billed_at IS NOT NULL)",
            [_array(session_pks), first, last],
        )
        stored = cursor.fetchall()
    if not stored and not in_batch:
        return
    stored_ids = {sample_id for cluster_id, sample_id, *_ in stored if cluster_id == cluster.pk}
    windows: dict[tuple[int, str], list[_Window]] = {}
    for _, sample_id, session_pk, device_uuid, start, end in stored:
        windows.setdefault((session_pk, device_uuid), []).append(_Window(start, end, sample_id, None))
    for sample in rows:
        if sample.sample_id not in stored_ids:
            windows.setdefault((sessions[sample.session_id].pk, sample.device_uuid), []).append(
                _Window(sample.start, sample.end, sample.sample_id, sample.index))
    for intervals in windows.values():
        intervals.sort(key=lambda w: (w.start, w.end))
        reach = intervals[0]
        for window in intervals[1:]:
            if window.start < reach.end and (window.index is not None or reach.index is not None):
                new, other = (window, reach) if window.index is not None else (reach, window)
                raise invalid_sample(
                    new.index, samples[new.index],
                    f"its window {new.start.isoformat()} .. {new.end.isoformat()} overlaps sample {other.sample_id!r} of the same "
                    "session and GPU: a GPU-second is charged once; resend with the original sample_id, or drop the overlapping sample",
                    reason=USAGE_WINDOW_OVERLAP,
                )
            if window.end > reach.end:
                reach = window


def _group(priced_rows: list[_Priced], inserted: dict[str, int] | None) -> tuple[dict, dict]:
    """The samples by session and the period they accrue into: those of ``inserted`` (``{sample_id: period, epoch
    seconds}``) into its period, or (None) all of them into their own: ``({session pk: {period: [credits,
    GPU-seconds, samples, first start, last end]}}, {session pk: credits})``."""
    grouped: dict[int, dict[int, list]] = {}
    added: dict[int, Decimal] = {}
    for priced in priced_rows:
        sample = priced.sample
        if inserted is None:
            target = priced.period
        else:
            target = inserted.get(sample.sample_id)
            if target is None:
                continue
        session_pk = priced.session_pk
        by_period = grouped.get(session_pk)
        if by_period is None:
            by_period = grouped[session_pk] = {}
        group = by_period.get(target)
        if group is None:
            by_period[target] = [priced.cost, priced.share * priced.seconds, 1, sample.start, sample.end]
        else:
            group[0] += priced.cost
            group[1] += priced.share * priced.seconds
            group[2] += 1
            if sample.start < group[3]:
                group[3] = sample.start
            if sample.end > group[4]:
                group[4] = sample.end
        added[session_pk] = added.get(session_pk, Decimal(0)) + priced.cost
    return grouped, added


def _accrual_rows(grouped: dict, *, owners: dict[int, int]) -> list[str]:
    """The array parameters of ``_UPSERT_ACCRUALS`` (after ``now``) for ``grouped`` (``_group``): per session, its
    owner and what its samples of its latest period add up to."""
    rows = []
    for session_pk in sorted(grouped):
        by_period = grouped[session_pk]
        period = max(by_period)
        amount, gpu_seconds, count, first, last = by_period[period]
        rows.append((session_pk, owners[session_pk], period, amount, gpu_seconds.quantize(CREDITS), count, first, last))
    return [_array(column) for column in zip(*rows, strict=True)]


def _accrue(cursor, *, grouped, added, upsert, opened, owners, accounts, public_ids, clusters, length, now) -> dict:
    """Add the newly inserted samples (``grouped``, ``added``: ``_group``) to their sessions' accruals, charge the
    periods they close, and move the accounts.

    Per session: every period of its new samples but the latest gets its ``charge`` entry, and so does the open
    accrual when a later period arrived (read whole, one query, only then); the latest period's samples go into the
    accrual (``_UPSERT_ACCRUALS``: one set-based statement for all sessions). The accounts move with one ``UPDATE``;
    charges, when a period closes, are a COPY and one ``INSERT``. Nothing is written when no sample was new.

    Returns:
        ``{session pk: credits of the new samples}`` (what this batch added to the session's bill).
    """
    if not grouped:
        return {}
    closing = [pk for pk, by_period in grouped.items() if pk in opened and opened[pk][1] > 0 and max(by_period) > opened[pk][0]]
    states: dict[int, periods.Open] = {}
    if closing:
        cursor.execute(_READ_CLOSING, [_array(sorted(closing))])
        states = {row[0]: periods.Open(*row[1:]) for row in cursor.fetchall()}
    balances = {account.id: account for account in accounts.values()}
    account_of = {pk: accounts[owners[pk]].id for pk in grouped}
    entries: list[_Charge] = []
    for session_pk in sorted(grouped):
        by_period = grouped[session_pk]
        ordered = sorted(by_period)
        account_id = account_of[session_pk]
        bills: list[tuple[datetime, periods.Open]] = [
            (periods.EPOCH + timedelta(seconds=period), periods.Open(periods.EPOCH + timedelta(seconds=period), *by_period[period]))
            for period in ordered[:-1]
        ]
        state = states.get(session_pk)
        if state is not None:  # its open period is charged too, with the batch's samples of it (all periods are later)
            if bills and bills[0][0] == state.period_start:
                group = bills[0][1]
                state.add(amount=group.amount, gpu_seconds=group.gpu_seconds, samples=group.samples, first_start=group.first_start,
                          last_end=group.last_end)
                bills[0] = (state.period_start, state)
            else:
                bills.insert(0, (state.period_start, state))
        for period_start, bill in bills:
            account = balances[account_id]
            balance = account.balance - bill.amount
            balances[account_id] = account._replace(balance=balance, accrued=account.accrued - bill.amount)
            period_end = period_start + length
            entries.append(_Charge(
                account_id, -bill.amount, balance, periods.charge_key(public_ids[session_pk], period_start), session_pk,
                bill.first_start, bill.last_end, bill.gpu_seconds.quantize(CREDITS),
                periods.charge_reason(samples=bill.samples, cluster=clusters[session_pk], period_start=period_start, period_end=period_end),
                period_start, period_end, bill.samples,
            ))
    for session_pk, amount in added.items():
        account = balances[account_of[session_pk]]
        balances[account.id] = account._replace(accrued=account.accrued + amount)
    cursor.execute(_UPSERT_ACCRUALS, [now, *upsert])
    if entries:
        _copy(cursor, "billing_charge_staging_p", _CHARGE_COLUMNS, (  # text for times and decimals, as for the samples
            (e.account_id, format(e.amount, "f"), format(e.balance_after, "f"), e.idempotency_key, e.session_id,
             e.window_start.isoformat(), e.window_end.isoformat(), format(e.gpu_seconds, "f"), e.reason,
             e.period_start.isoformat(), e.period_end.isoformat(), e.sample_count)
            for e in entries
        ))
        cursor.execute(_INSERT_CHARGES, [now])
    changed = []
    for account_id in sorted({account_of[pk] for pk in grouped}):
        account = balances[account_id]
        below = account.balance - account.accrued < 0
        changed.append(account._replace(below_zero_since=(account.below_zero_since or now) if below else None))
    _update_accounts(cursor, changed)
    return added
