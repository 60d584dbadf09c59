"""Billing services: accounts, the ledger, grants, prices and policies, and usage ingestion.

These are the only functions that change credit accounts, ledger entries, usage samples, prices and policies; the
API, the console, the tasks and the operator-facing view call them.

Money is ``Decimal`` with 6 places (``billing.models.CREDITS``), never float. Every ledger entry is written under
its account's row lock (``SELECT ... FOR UPDATE``) together with the new balance, in one transaction, so the balance
always equals the sum of the account's entries and ``balance_after`` is exact.

Lock order (keep it everywhere, or transactions can deadlock): credit accounts first, several in primary-key
order; then sessions and clusters. Usage ingestion holds its accounts' locks when its deferred foreign-key checks
take their key-share locks on the sessions and the cluster at commit, so code that locks a session or a cluster
row and then an account would deadlock with it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit.services import Action, audit_record, created, diff, snapshot
from billing import pricing
from billing.models import CREDITS, USAGE_OVERLAP_CONSTRAINT, CreditAccount, LedgerEntry, Policy, Price, UsageSample
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
from gshare.exceptions import ApplicationError, Conflict, Forbidden, NotFound
from operator_agent.contract import FORBIDDEN_CLUSTER_SCOPE
from sessions.models import Allocation, Session

logger = logging.getLogger(__name__)

#: Largest amount of one entry (``numeric(18, 6)``: 12 digits before the point).
MAX_AMOUNT = Decimal(10) ** 12 - CREDITS
#: The largest balance (either sign) a numeric(18, 6) column holds.
MAX_BALANCE = Decimal(10) ** 12 - CREDITS
#: Longest caller-chosen idempotency key (the stored key adds a ``grant:`` prefix; the column holds 200).
MAX_IDEMPOTENCY_KEY = 150


# --------------------------------------------------------------------------- exceptions


class BalanceOutOfRange(ApplicationError):
    """409: the entry would move the balance beyond what ``numeric(18, 6)`` holds."""

    code = "balance_out_of_range"
    status = 409


class UsageConflict(ApplicationError):
    """409: a window of the batch was stored by another writer while the batch was being written; nothing was stored."""

    code = "usage_conflict"
    status = 409


class InvalidAmount(ApplicationError):
    """400: an amount that is not a positive decimal number of credits with at most 6 places."""

    code = "invalid_amount"
    status = 400


class IdempotencyKeyReused(Conflict):
    """409: the idempotency key already names an entry with another account, kind or amount."""

    code = "idempotency_key_reused"


class IdempotencyKeyMissing(ApplicationError):
    """400: a write that must be retry-safe came without an idempotency key."""

    code = "idempotency_key_missing"
    status = 400


# --------------------------------------------------------------------------- amounts


def parse_amount(value, *, field: str = "amount", allow_zero: bool = False, allow_negative: bool = False) -> Decimal:
    """A credits amount from a ``Decimal``, an int or a decimal string (a float only through ``str``, never its
    binary value), checked: finite, at most 6 decimal places, at most 12 digits before the point, and positive
    (or as allowed).

    Raises:
        InvalidAmount: ``invalid_amount`` (400).
    """
    if isinstance(value, bool) or not isinstance(value, (Decimal, int, float, str)):
        raise InvalidAmount(f"{field} must be a decimal number of credits, e.g. \"10.5\"; got {type(value).__name__}.")
    text = None if isinstance(value, Decimal) else str(value).strip()
    # Decimal() also reads other scripts' digits ("١٢" is 12); credits are written in ASCII digits only.
    if text is not None and not text.isascii():
        raise InvalidAmount(f"{field} must be written with ASCII digits, e.g. \"10.5\"; got {text[:40]!r}.")
    try:
        amount = value if text is None else Decimal(text)
    except InvalidOperation:
        raise InvalidAmount(f"{field} must be a decimal number of credits, e.g. \"10.5\"; got {str(value)[:40]!r}.") from None
    if not amount.is_finite():
        raise InvalidAmount(f"{field} must be a finite decimal number of credits, e.g. \"10.5\".")
    if abs(amount) > MAX_AMOUNT:
        raise InvalidAmount(f"{field} must be below 1,000,000,000,000 credits.")
    if amount != amount.quantize(CREDITS):
        raise InvalidAmount(f"{field} has more than 6 decimal places: credits are counted to 0.000001.")
    if (amount < 0 and not allow_negative) or (amount == 0 and not allow_zero):
        raise InvalidAmount(f"{field} must be {'at least 0' if allow_zero else 'greater than 0'}; got {amount}.")
    return amount.quantize(CREDITS)


# --------------------------------------------------------------------------- accounts and the ledger


def account_for(user) -> CreditAccount:
    """The credit account of ``user``, created (balance 0) when it does not exist yet. Race-safe: two concurrent
    first calls get the same row (the unique ``user`` column decides, Django's ``get_or_create`` re-reads)."""
    account, _ = CreditAccount.objects.get_or_create(user=user)
    return account


def _below_zero_since(account: CreditAccount, balance: Decimal, now: datetime) -> datetime | None:
    if balance < 0:
        return account.below_zero_since or now
    return None


def _check_kind_and_sign(kind: str, amount: Decimal) -> None:
    if kind not in LedgerEntry.Kind.values:
        raise ApplicationError(f"kind must be one of {', '.join(LedgerEntry.Kind.values)}; got {kind!r}.", code="invalid_request")
    if kind == LedgerEntry.Kind.CHARGE and amount > 0:
        raise InvalidAmount("A charge takes credits away: its amount must be 0 or less.")
    if kind in (LedgerEntry.Kind.GRANT, LedgerEntry.Kind.REFUND) and amount < 0:
        raise InvalidAmount(f"A {kind} adds credits: its amount must be 0 or more.")


def _same_entry_or_conflict(existing: LedgerEntry, *, account: CreditAccount, kind: str, amount: Decimal) -> tuple[LedgerEntry, bool]:
    if existing.account_id != account.pk or existing.kind != kind or existing.amount != amount:
        raise IdempotencyKeyReused(
            f"The idempotency key {existing.idempotency_key!r} was already used for entry {existing.pk} ({existing.kind} of "
            f"{existing.amount} credits on another request): send a new key for a new request, or the same request again "
            "to get that entry back.",
            extra={"entry": existing.pk},
        )
    return existing, False


@transaction.atomic
def ledger_append(
    *,
    account: CreditAccount,
    kind: str,
    amount: Decimal,
    idempotency_key: str,
    session=None,
    window: tuple[datetime, datetime] | None = None,
    gpu_seconds: Decimal | None = None,
    reason: str = "",
    created_by: str = "",
) -> tuple[LedgerEntry, bool]:
    """Append one entry to ``account``'s ledger and move its balance, once per ``idempotency_key``.

    Under the account's row lock: when an entry with ``idempotency_key`` exists, it is returned (``created``
    False) if it is the same movement (account, kind, amount), and refused otherwise; else the entry is written
    with ``balance_after``, and the account's ``balance`` and ``below_zero_since`` (set when the balance goes
    below zero, kept while it stays there, cleared once it is back at 0 or more) change with it.

    Args:
        account: the account.
        kind: ``LedgerEntry.Kind`` (charges are <= 0, grants and refunds >= 0).
        amount: signed credits, a ``Decimal`` with at most 6 places.
        idempotency_key: unique key of this movement (at most 200 characters).
        session: the session a charge or refund is for.
        window: ``(start, end)`` of the usage a charge prices (aware datetimes).
        gpu_seconds: GPU-seconds a charge prices (share × seconds).
        reason: free text (at most 500 characters).
        created_by: who wrote it (``api:<user>``, ``console:<user>``, ``usage``).

    Returns:
        ``(entry, created)``.

    Raises:
        InvalidAmount: ``invalid_amount`` (400) for an amount that is not a 6-place decimal or has the wrong sign.
        IdempotencyKeyReused: ``idempotency_key_reused`` (409) when the key names another movement.
    """
    amount = parse_amount(amount, allow_zero=True, allow_negative=True)
    _check_kind_and_sign(kind, amount)
    if not idempotency_key or len(idempotency_key) > 200:
        raise IdempotencyKeyMissing("Every ledger entry needs an idempotency key of 1 to 200 characters.")
    account = CreditAccount.objects.select_for_update().get(pk=account.pk)
    existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return _same_entry_or_conflict(existing, account=account, kind=kind, amount=amount)
    now = timezone.now()
    balance = account.balance + amount
    if abs(balance) > MAX_BALANCE:
        raise BalanceOutOfRange(
            f"This entry would take the balance of {account.user} to {balance} credits, beyond what an account holds "
            f"(±{MAX_BALANCE}); nothing was written. Fix: grant less, or correct the account with an adjustment first."
        )
    entry = LedgerEntry(
        account=account, kind=kind, amount=amount, balance_after=balance, idempotency_key=idempotency_key, session=session,
        window_start=window[0] if window else None, window_end=window[1] if window else None,
        gpu_seconds=gpu_seconds, reason=reason[:500], created_by=created_by[:150],
    )
    try:
        with transaction.atomic():
            entry.save(force_insert=True)
    except IntegrityError:
        # The same key written for another account at the same moment (this account's lock does not cover it).
        existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return _same_entry_or_conflict(existing, account=account, kind=kind, amount=amount)
    account.balance = balance
    account.below_zero_since = _below_zero_since(account, balance, now)
    account.save(update_fields=["balance", "below_zero_since"])
    return entry, True


def credit_grant(*, user, amount, reason: str, idempotency_key: str, created_by: str) -> tuple[LedgerEntry, bool]:
    """Give ``user`` credits (a ``grant`` entry), once per ``idempotency_key``.

    Args:
        user: the receiving user (their account is created when missing).
        amount: credits > 0 with at most 6 decimal places (``Decimal``, int or decimal string).
        reason: why (shown in the ledger).
        idempotency_key: the caller's key for this grant (1 to 150 characters); stored as ``grant:<key>``, so a
            retry with the same key returns the first entry.
        created_by: ``api:<staff user>`` or ``console:<staff user>``.

    Returns:
        ``(entry, created)``: ``created`` is False for a retry.

    Raises:
        InvalidAmount: ``invalid_amount`` (400).
        IdempotencyKeyMissing: ``idempotency_key_missing`` (400) for an empty key; ``invalid_request`` (400) for one
            longer than 150 characters.
        IdempotencyKeyReused: ``idempotency_key_reused`` (409) when the key was used for another user or amount.
    """
    amount = parse_amount(amount)
    key = (idempotency_key or "").strip()
    if not key:
        raise IdempotencyKeyMissing("Send an `Idempotency-Key` header (e.g. a UUID) so that a retried grant is applied once.")
    if len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise ApplicationError(f"The idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters (e.g. a UUID).",
                               code="invalid_request")
    with transaction.atomic():
        entry, created = ledger_append(
            account=account_for(user), kind=LedgerEntry.Kind.GRANT, amount=amount, idempotency_key=f"grant:{key}",
            reason=(reason or "")[:500], created_by=created_by,
        )
        if created:
            audit_record(action=Action.CREDIT_GRANT, obj=entry, object_repr=f"grant to {user.get_username()}", actor=created_by,
                         changes={"balance": (entry.balance_after - entry.amount, entry.balance_after)},
                         details={"user": user.get_username(), "amount": entry.amount, "reason": entry.reason, "idempotency_key": key})
    if created:
        logger.info("credits granted: %s to %s by %s (entry %s)", amount, user, created_by, entry.pk)
    return entry, created


def user_by_username(username) -> object:
    """The user named ``username``.

    Raises:
        NotFound: ``user_not_found`` (404).
    """
    user = get_user_model().objects.filter(username=username).first() if isinstance(username, str) and username else None
    if user is None:
        raise NotFound(f"No user is named {str(username)[:150]!r}: check the username.", code="user_not_found")
    return user


# --------------------------------------------------------------------------- prices and policies
# The console's price and policy pages call these (there is no prices/policies API): each check runs in the
# ``*_validate`` function, which the console's form calls first and the writing function calls again.


@transaction.atomic
def price_set(*, gpu_model: str, credits_per_gpu_hour) -> Price:
    """Set the price of a GPU model (``""``: the default price), creating its row when missing.

    Args:
        gpu_model: the device model exactly as inventory reports it (``GET /api/v1/gpus``), or "" for the default.
        credits_per_gpu_hour: credits >= 0, at most 6 decimal places.

    Raises:
        As ``price_validate``.
    """
    price = Price.objects.select_for_update().filter(gpu_model=gpu_model or "").first() or Price(gpu_model=gpu_model or "")
    adding, before = price._state.adding, price.credits_per_gpu_hour
    price.credits_per_gpu_hour = credits_per_gpu_hour
    price_validate(price=price)
    price.save()
    if adding or price.credits_per_gpu_hour != before:
        audit_record(action=Action.PRICE_CREATE if adding else Action.PRICE_UPDATE, obj=price, object_repr=price.gpu_model or "(default)",
                     changes={"credits_per_gpu_hour": (None if adding else before, price.credits_per_gpu_hour)})
    logger.info("price set: %s", price)
    return price


def price_validate(*, price: Price) -> Price:
    """Check a price row's fields (``price_set`` and the console form): the amount rules, then the model's field
    checks (not uniqueness: ``price_set`` updates the model's row). Normalises ``credits_per_gpu_hour`` to a Decimal.

    Raises:
        InvalidAmount: ``invalid_amount`` (400).
        django.core.exceptions.ValidationError: a field is malformed (400 ``invalid_request``).
    """
    price.credits_per_gpu_hour = parse_amount(price.credits_per_gpu_hour, field="credits_per_gpu_hour", allow_zero=True)
    price.full_clean(validate_unique=False)
    return price


@transaction.atomic
def price_delete(*, price: Price) -> None:
    """Delete a price: its model is charged the default price from now on (the default row's removal falls back to
    ``GSHARE_BILLING_DEFAULT_PRICE``). Charges already in the ledger keep their price."""
    audit_record(action=Action.PRICE_DELETE, obj=price, object_repr=price.gpu_model or "(default)",
                 changes={"credits_per_gpu_hour": (price.credits_per_gpu_hour, None)})
    Price.objects.filter(pk=price.pk).delete()
    logger.info("price deleted: %s", price)


def policy_validate(*, policy: Policy) -> Policy:
    """Check a policy's fields (``policy_set`` and the console form): ``max_sessions`` and ``max_gpus`` at least 1
    when set (empty: no limit), ``min_balance_hours`` at least 0, then the model's field checks (not uniqueness:
    ``policy_set`` updates the user's row). ``allowed_clusters`` is not checked (any cluster may be named).

    Raises:
        ApplicationError: ``invalid_request`` (400).
        django.core.exceptions.ValidationError: a field is malformed (400 ``invalid_request``).
    """
    for name in ("max_sessions", "max_gpus"):
        value = getattr(policy, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ApplicationError(f"{name} must be at least 1, or empty for no limit.", code="invalid_request")
    hours = policy.min_balance_hours
    if not isinstance(hours, (int, Decimal)) or isinstance(hours, bool) or not Decimal(hours).is_finite() or hours < 0:
        raise ApplicationError("min_balance_hours must be at least 0.", code="invalid_request")
    policy.full_clean(validate_unique=False, validate_constraints=False)
    return policy


@transaction.atomic
def policy_set(
    *,
    user=None,
    max_sessions: int | None = None,
    max_gpus: int | None = None,
    allowed_clusters: Iterable[Cluster] = (),
    min_balance_hours: Decimal = Decimal(1),
    grace_seconds: int = 900,
) -> Policy:
    """Set the policy of ``user`` (None: the default policy for users without their own), creating its row when
    missing; every field is replaced.

    Args:
        user: the user, or None for the default policy.
        max_sessions: concurrent live sessions (None: unlimited).
        max_gpus: GPUs across live sessions (None: unlimited).
        allowed_clusters: clusters sessions may run on (empty: all).
        min_balance_hours: hours of the requested resources the available balance must cover at admission.
        grace_seconds: how long an account may stay below zero before its sessions are stopped.

    Raises:
        As ``policy_validate``.
    """
    rows = Policy.objects.select_for_update()
    policy = (rows.filter(user__isnull=True) if user is None else rows.filter(user=user)).first() or Policy(user=user)
    before = None if policy._state.adding else _policy_audit(policy)
    policy.max_sessions, policy.max_gpus = max_sessions, max_gpus
    policy.min_balance_hours, policy.grace_seconds = min_balance_hours, grace_seconds
    policy_validate(policy=policy)
    policy.save()
    policy.allowed_clusters.set(list(allowed_clusters))
    after = _policy_audit(policy)
    if before is None or (after_changes := diff(before, after)):
        audit_record(action=Action.POLICY_CREATE if before is None else Action.POLICY_UPDATE, obj=policy, object_repr=_policy_name(policy),
                     changes=created(after) if before is None else after_changes)
    logger.info("policy set: %s (max_sessions=%s, max_gpus=%s, min_balance_hours=%s, grace_seconds=%s)",
                policy, max_sessions, max_gpus, policy.min_balance_hours, grace_seconds)
    return policy


def _policy_audit(policy: Policy) -> dict:
    """A policy's limits as its audit rows show them (the allowed clusters by id)."""
    return {**snapshot(policy, ("max_sessions", "max_gpus", "min_balance_hours", "grace_seconds")),
            "allowed_clusters": sorted(c.public_id for c in policy.allowed_clusters.all())}


def _policy_name(policy: Policy) -> str:
    return f"policy of {policy.user.get_username()}" if policy.user_id else "(default)"


@transaction.atomic
def policy_delete(*, policy: Policy) -> None:
    """Delete a policy: its user falls back to the default policy (the default's removal falls back to the settings'
    limits, ``billing.admission.settings_policy``)."""
    audit_record(action=Action.POLICY_DELETE, obj=policy, object_repr=_policy_name(policy),
                 changes={name: (value, None) for name, value in _policy_audit(policy).items()})
    Policy.objects.filter(pk=policy.pk).delete()
    logger.info("policy deleted: %s", policy)


# --------------------------------------------------------------------------- usage ingestion

#: Per-connection staging tables (temporary, emptied at every commit) the ingestion COPYs into.
_STAGING_DDL = """
    CREATE TEMP TABLE IF NOT EXISTS billing_usage_staging (
        sample_id text, session_id bigint, device_uuid text, start timestamptz, finish timestamptz, gpu_util_percent numeric,
        memory_used_mib integer, gpu_model text, share numeric, cost numeric, entry_id bigint
    ) ON COMMIT DELETE ROWS;
    CREATE TEMP TABLE IF NOT EXISTS billing_charge_staging (
        id bigint, account_id bigint, amount numeric, balance_after numeric, idempotency_key text, session_id bigint,
        window_start timestamptz, window_end timestamptz, gpu_seconds numeric, reason text
    ) ON COMMIT DELETE ROWS"""

_USAGE_COLUMNS = ("sample_id", "session_id", "device_uuid", "start", "finish", "gpu_util_percent", "memory_used_mib", "gpu_model",
                  "share", "cost", "entry_id")
_CHARGE_COLUMNS = ("id", "account_id", "amount", "balance_after", "idempotency_key", "session_id", "window_start", "window_end",
                   "gpu_seconds", "reason")

#: Moves the staged samples into the table; returns the ones really inserted (not already stored). The conflict target
#: is the unique ``(cluster_id, sample_id)`` only: a row that overlaps another window of its session and GPU raises the
#: exclusion violation of ``usage_sample_no_overlap`` instead of being skipped like a replay. (Without a target,
#: ``DO NOTHING`` would skip those rows too, but PostgreSQL then searches the GiST index once more for every row before
#: inserting it: about twice the constraint's cost per batch.)
_INSERT_SAMPLES = """
    WITH staged AS (DELETE FROM billing_usage_staging RETURNING *)
    INSERT INTO billing_usagesample
        (cluster_id, sample_id, session_id, device_uuid, start, "end", gpu_util_percent, memory_used_mib, gpu_model, share,
         cost, entry_id, received_at)
    SELECT %s, sample_id, session_id, device_uuid, start, finish, gpu_util_percent, memory_used_mib, gpu_model, share, cost,
           entry_id, %s
      FROM staged
    ON CONFLICT (cluster_id, sample_id) DO NOTHING
    RETURNING sample_id"""

_INSERT_CHARGES = """
    WITH staged AS (DELETE FROM billing_charge_staging RETURNING *)
    INSERT INTO billing_ledgerentry
        (id, account_id, kind, amount, balance_after, idempotency_key, session_id, window_start, window_end, gpu_seconds,
         reason, created_by, created_at)
    SELECT id, account_id, 'charge', amount, balance_after, idempotency_key, session_id, window_start, window_end,
           gpu_seconds, reason, 'usage', %s
      FROM staged
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id"""

_UPDATE_ACCOUNTS = """
    UPDATE billing_creditaccount a SET balance = v.balance, below_zero_since = v.below_zero_since
      FROM unnest(%s::bigint[], %s::numeric[], %s::timestamptz[]) AS v(id, balance, below_zero_since)
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


def _lock_accounts(user_ids: list[int]) -> dict[int, tuple[int, Decimal, datetime | None]]:
    """Lock the credit accounts of ``user_ids`` (primary-key order), creating the missing ones; ``{user_id: (account
    id, balance, below_zero_since)}``. One query when they all exist, three otherwise."""
    sql = ("SELECT user_id, id, balance, below_zero_since FROM billing_creditaccount WHERE user_id = ANY(%s) "
           "ORDER BY id FOR UPDATE")
    with connection.cursor() as cursor:
        cursor.execute(sql, [user_ids])
        rows = cursor.fetchall()
        if len(rows) < len(user_ids):
            cursor.execute(
                "INSERT INTO billing_creditaccount (user_id, balance, created_at) SELECT u, 0, %s FROM unnest(%s::bigint[]) AS u "
                "ON CONFLICT (user_id) DO NOTHING",
                [timezone.now(), user_ids],
            )
            cursor.execute(sql, [user_ids])
            rows = cursor.fetchall()
    return {user_id: (pk, balance, since) for user_id, pk, balance, since in rows}


def _charge_key(cluster: Cluster, sample_ids: list[str]) -> str:
    """``usage:<cluster id>:<sha256 of the sorted sample ids, one per line>``: the same new samples, the same key."""
    digest = hashlib.sha256("\n".join(sorted(sample_ids)).encode()).hexdigest()
    return f"usage:{cluster.public_id}:{digest}"


def _text_array(values) -> str:
    """A PostgreSQL ``text[]`` literal of ``values`` (each quoted; backslashes and double quotes escaped)."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def _array(values) -> str:
    """A PostgreSQL array literal of ints, ``Decimal``s and datetimes (None as NULL), cast by the query."""
    return "{" + ",".join("NULL" if v is None else f'"{v.isoformat()}"' if isinstance(v, datetime) else format(v, "f") if isinstance(v, Decimal)
                          else str(v) for v in values) + "}"


def _update_accounts(cursor, changed: list[tuple[int, Decimal, datetime | None]]) -> None:
    """Write ``(account id, balance, below_zero_since)`` rows in one ``UPDATE``."""
    cursor.execute(_UPDATE_ACCOUNTS, [_array(c[0] for c in changed), _array(c[1] for c in changed), _array(c[2] for c in changed)])


#: The batch's sessions, each with the GPUs it holds: those placement reserved for it (``Allocation``, released when
#: it ends) and those HAMi gave its Pod as the operator reported them (``Session.devices``, kept after it ends).
_SESSIONS = f"""
    SELECT s.public_id, s.id, s.cluster_id, s.owner_id, s.gpu_memory_mib, s.gpu_cores, s.created_at,
           ARRAY(SELECT d.uuid FROM {Allocation._meta.db_table} a JOIN {GpuDevice._meta.db_table} d ON d.id = a.device_id
                  WHERE a.session_id = s.id
                 UNION
                 SELECT jsonb_array_elements_text(CASE jsonb_typeof(s.devices) WHEN 'array' THEN s.devices ELSE '[]' END)),
           s.ended_at
      FROM {Session._meta.db_table} s
     WHERE s.public_id = ANY(%s::text[])"""


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
        ``({session public id: (public id, pk, cluster pk, owner pk, gpu_memory_mib, gpu_cores)}, {uuid: (uuid,
        cluster pk, model, memory_mib)})``.

    Raises:
        Forbidden: ``forbidden_cluster_scope`` (403, ``index``).
        InvalidUsageSample: ``invalid_usage_sample`` (400, ``index``; ``reason`` ``usage_device_not_allocated``,
            ``usage_window_before_session`` or ``usage_window_after_session`` for those three).
    """
    with connection.cursor() as cursor:
        # One text[] literal per look-up: a thousand ids as one parameter, not a thousand parameters to quote.
        cursor.execute(_SESSIONS, [_text_array({s.session_id for s in parsed})])
        found = cursor.fetchall()
        sessions = {row[0]: row[:6] for row in found}
        cursor.execute(f"SELECT uuid, cluster_id, model, memory_mib FROM {GpuDevice._meta.db_table} WHERE uuid = ANY(%s::text[])",
                       [_text_array({s.device_uuid for s in parsed})])
        devices = {row[0]: row for row in cursor.fetchall()}
    own = cluster.pk
    for sample in parsed:
        session = sessions.get(sample.session_id)
        device = devices.get(sample.device_uuid)
        if session is not None and session[2] != own:
            what = f"session {sample.session_id}, which is not a session"
        elif device is None or device[1] != own:
            what = f"GPU {sample.device_uuid}, which is not a GPU"
        else:
            continue
        raise Forbidden(
            f"Usage sample samples[{sample.index}] names {what} of cluster {cluster.name} ({cluster.public_id}); an operator may "
            "only report its own cluster's usage. Nothing of this batch was stored. Check that this operator runs with its "
            "own cluster's token, and that its inventory (PUT /internal/v1/inventory) lists the GPU.",
            code=FORBIDDEN_CLUSTER_SCOPE, extra={"index": sample.index},
        )
    held = {row[0]: set(row[7]) for row in found}
    earliest = {row[0]: row[6] - timedelta(seconds=CLOCK_SKEW_SECONDS) for row in found}
    latest = {row[0]: row[8] + timedelta(seconds=CLOCK_SKEW_SECONDS) for row in found if row[8] is not None}
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
    """Store a batch of an operator's usage samples and charge them, exactly once per ``(cluster, sample_id)``.

    Every sample is checked first (``billing.usage.parse_samples``), then against the database: its session must be
    a session of ``cluster`` and its device a GPU of ``cluster`` (403), a GPU the session holds, and its window may
    not begin before the session or after it ended (400, ``_scope_and_sessions``). Refusals store nothing. Then, in
    one transaction and a constant number of statements whatever the batch size:

    1. the accounts of the batch's session owners are locked (primary-key order; created when missing), and under
       those locks a new sample overlapping another of the same session and GPU is refused (``_refuse_overlaps``);
    2. one ledger entry id per session is drawn from the entries' sequence;
    3. the samples, each priced (share of its device, price of the device's model, window: ``billing.pricing``) and
       pointing at its session's entry id, are COPYed into a temporary staging table and moved with one ``INSERT
       ... SELECT ... ON CONFLICT (cluster_id, sample_id) DO NOTHING RETURNING sample_id``: only the rows this batch
       really inserted come back, so replayed, duplicated (also within the batch) and reordered samples are never
       charged twice, even when two deliveries of one batch run at the same time (the unique index makes the second
       wait for the first, then skip). A row the exclusion constraint ``usage_sample_no_overlap`` refuses (an overlap
       the check did not see: only a writer that does not take the account locks can cause one) rolls the whole
       batch back; the check then runs again and names the sample (400), or the batch is refused as a conflict (409);
    4. one ``charge`` entry per session with new samples (window min(start)..max(end) of them, ``gpu_seconds`` =
       Σ share × seconds, amount = -Σ cost, idempotency key ``usage:<cluster>:<sha256 of the sorted new sample
       ids>``), COPYed and inserted the same way, and the accounts' new balances (the samples' foreign keys to their
       entries are deferred: checked at commit).

    Args:
        cluster: the cluster named in the operator token.
        samples: the body's ``samples`` (see ``parse_samples``).

    Returns:
        ``{"accepted": new samples, "duplicates": samples already stored or repeated, "charged": {session id:
        credits charged, as a string}}``.

    Raises:
        BatchTooLarge: ``batch_too_large`` (400).
        InvalidUsageSample: ``invalid_usage_sample`` (400, ``index``): malformed, or an unknown session; with
            ``reason`` ``usage_device_not_allocated``, ``usage_window_before_session``, ``usage_window_after_session`` or
            ``usage_window_overlap``.
        Forbidden: ``forbidden_cluster_scope`` (403, ``index``): a session or a GPU that is not this cluster's.
        UsageConflict: ``usage_conflict`` (409): the constraint refused a window the check did not find again; retry.
    """
    parsed = parse_samples(samples, max_window_seconds=settings.GSHARE_USAGE_MAX_WINDOW_SECONDS,
                           max_age_seconds=settings.GSHARE_USAGE_MAX_AGE_SECONDS)
    if not parsed:
        return {"accepted": 0, "duplicates": 0, "charged": {}}
    sessions, devices = _scope_and_sessions(cluster=cluster, parsed=parsed, samples=samples)

    # The first of each sample_id counts; price each (session, device) pair once.
    unique: dict[str, Sample] = {}
    for sample in parsed:
        unique.setdefault(sample.sample_id, sample)
    rows = list(unique.values())
    prices = pricing.prices_by_model()
    pairs: dict[tuple[str, str], tuple[int, Decimal, Decimal, str]] = {}
    staged, priced_rows = [], []
    million = Decimal(1_000_000)
    for sample in rows:
        pair = (sample.session_id, sample.device_uuid)
        priced = pairs.get(pair)
        if priced is None:
            session, device = sessions[sample.session_id], devices[sample.device_uuid]
            share = pricing.gpu_share(device_memory_mib=device[3], gpu_memory_mib=session[4], gpu_cores=session[5])
            priced = pairs[pair] = (session[1], share, pricing.price_for_model(device[2], prices), device[2])
        session_pk, share, price, model = priced
        seconds = Decimal(sample.micros) / million
        cost = pricing.window_cost(price=price, share=share, seconds=seconds)
        priced_rows.append((sample, session_pk, share, cost, seconds))
        # Text for times and decimals: psycopg formats strings for COPY several times faster than datetimes/Decimals.
        staged.append([sample.sample_id, session_pk, sample.device_uuid, sample.start.isoformat(), sample.end.isoformat(),
                       sample.gpu_util_percent, sample.memory_used_mib, model, str(share), str(cost), None])

    batch_sessions = sorted({row[1] for row in priced_rows})
    owners = {row[1]: row[3] for row in sessions.values()}
    public_ids = {row[1]: row[0] for row in sessions.values()}
    now = timezone.now()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            accounts = _lock_accounts(sorted({owners[pk] for pk in batch_sessions}))
            # Under the owners' account locks: every batch with samples of a session locks its owner's account, so no
            # other batch of these sessions is between this check and the commit (the check before these locks let two
            # concurrent batches both pass and both store one window under two ids).
            _refuse_overlaps(cluster=cluster, rows=rows, sessions=sessions, samples=samples)
            _staging_tables(cursor)
            cursor.execute("SELECT nextval(q.seq) FROM (SELECT pg_get_serial_sequence('billing_ledgerentry', 'id')::regclass AS seq) q, "
                           "generate_series(1, %s)", [len(batch_sessions)])
            entry_ids = dict(zip(batch_sessions, sorted(row[0] for row in cursor.fetchall()), strict=True))
            for row, (_, session_pk, *_rest) in zip(staged, priced_rows, strict=True):
                row[10] = entry_ids[session_pk]
            _copy(cursor, "billing_usage_staging", _USAGE_COLUMNS, staged)
            cursor.execute(_INSERT_SAMPLES, [cluster.pk, now])
            inserted = {row[0] for row in cursor.fetchall()}
            charged = _charge_new_samples(cursor, cluster=cluster, priced_rows=priced_rows, inserted=inserted, entry_ids=entry_ids,
                                          owners=owners, accounts=accounts, now=now)
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


def _refuse_overlaps(*, cluster: Cluster, rows: list[Sample], sessions: dict, samples: list) -> None:
    """Refuse (400, with the index) a new sample whose window overlaps another sample of the same session and GPU.

    Idempotency is by ``sample_id``; this closes the other way to charge a GPU-second twice: two samples with
    different ids for the same time (an operator that lost its state and re-sampled). Samples whose id is already
    stored are replays and are not checked. Windows that touch (one's end is the next one's start) do not overlap.
    One query: the stored samples of the batch's sessions within the batch's time span (per session, through the
    GiST index of ``usage_sample_no_overlap``, whatever the session's history), under the same condition as that
    constraint. Run it under the sessions' owners' account locks, so no concurrent batch of these sessions can store
    a window after it looked; the constraint holds regardless.

    Raises:
        InvalidUsageSample: ``invalid_usage_sample`` (400, ``index``, ``reason`` ``usage_window_overlap``).
    """
    if not rows:
        return
    first, last = min(r.start for r in rows), max(r.end for r in rows)
    session_pks = sorted({sessions[r.session_id][1] for r in rows})
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT u.cluster_id, u.sample_id, u.session_id, u.device_uuid, u.start, u."end" FROM unnest(%s::bigint[]) AS k(session_id) '
            f"JOIN {UsageSample._meta.db_table} u ON u.session_id = k.session_id "
            "AND tstzrange(u.start, u.\"end\", '[)') && tstzrange(%s, %s, '[)')",
            [_array(session_pks), first, last],
        )
        stored = cursor.fetchall()
    stored_ids = {row[1] for row in stored if row[0] == cluster.pk}
    windows: dict[tuple[int, str], list[tuple]] = {}
    for _, sample_id, session_pk, device_uuid, start, end in stored:
        windows.setdefault((session_pk, device_uuid), []).append((start, end, sample_id, None))
    for sample in rows:
        if sample.sample_id not in stored_ids:
            windows.setdefault((sessions[sample.session_id][1], sample.device_uuid), []).append(
                (sample.start, sample.end, sample.sample_id, sample.index))
    for intervals in windows.values():
        intervals.sort(key=lambda w: (w[0], w[1]))
        reach = intervals[0]
        for window in intervals[1:]:
            if window[0] < reach[1] and (window[3] is not None or reach[3] is not None):
                new, other = (window, reach) if window[3] is not None else (reach, window)
                raise invalid_sample(
                    new[3], samples[new[3]],
                    f"its window {new[0].isoformat()} .. {new[1].isoformat()} overlaps sample {other[2]!r} of the same session "
                    "and GPU: a GPU-second is charged once; resend with the original sample_id, or drop the overlapping sample",
                    reason=USAGE_WINDOW_OVERLAP,
                )
            if window[1] > reach[1]:
                reach = window


def _charge_new_samples(cursor, *, cluster, priced_rows, inserted, entry_ids, owners, accounts, now) -> dict:
    """Write one charge per session with newly inserted samples and the accounts' balances (a COPY and two statements,
    nothing when no sample was new). Returns ``{session pk: credits charged}``."""
    if not inserted:
        return {}
    per_session: dict[int, list] = {}
    for sample, session_pk, share, cost, seconds in priced_rows:
        if sample.sample_id not in inserted:
            continue
        charge = per_session.get(session_pk)
        if charge is None:
            per_session[session_pk] = [cost, share * seconds, [sample.sample_id], sample.start, sample.end]
            continue
        charge[0] += cost
        charge[1] += share * seconds
        charge[2].append(sample.sample_id)
        if sample.start < charge[3]:
            charge[3] = sample.start
        if sample.end > charge[4]:
            charge[4] = sample.end
    balances = dict(accounts)
    entries = []
    for session_pk in sorted(per_session, key=entry_ids.__getitem__):
        cost, gpu_seconds, ids, start, end = per_session[session_pk]
        account_id, balance, since = balances[owners[session_pk]]
        balance -= cost
        balances[owners[session_pk]] = (account_id, balance, (since or now) if balance < 0 else None)
        entries.append((entry_ids[session_pk], account_id, -cost, balance, _charge_key(cluster, ids), session_pk, start, end,
                        gpu_seconds.quantize(CREDITS), f"{len(ids)} usage sample(s) on {cluster.name}"))
    _copy(cursor, "billing_charge_staging", _CHARGE_COLUMNS, (  # text for times and decimals, as for the samples
        (e[0], e[1], format(e[2], "f"), format(e[3], "f"), e[4], e[5], e[6].isoformat(), e[7].isoformat(), format(e[8], "f"), e[9])
        for e in entries
    ))
    cursor.execute(_INSERT_CHARGES, [now])
    written = {row[0] for row in cursor.fetchall()}
    if len(written) < len(entries):
        # A key already in the ledger: these exact samples were charged before (their rows since deleted). Point the
        # samples at that entry and leave the balance alone (cannot happen while samples are kept).
        return _reuse_existing_charges(cursor, entries=entries, written=written, accounts=accounts, now=now)
    touched = {owners[pk] for pk in per_session}
    changed = [balances[user_id] for user_id in sorted(touched)]
    _update_accounts(cursor, changed)
    return {entry[5]: -entry[2] for entry in entries}


def _reuse_existing_charges(cursor, *, entries, written, accounts, now) -> dict:
    """The rare path of ``_charge_new_samples``: some charge keys exist already. Re-point their samples, and recompute
    the balances from the entries really written (a few more statements, only on this path)."""
    missing = [e for e in entries if e[0] not in written]
    existing = dict(LedgerEntry.objects.filter(idempotency_key__in=[e[4] for e in missing]).values_list("idempotency_key", "pk"))
    for entry in missing:
        cursor.execute("UPDATE billing_usagesample SET entry_id = %s WHERE entry_id = %s", [existing[entry[4]], entry[0]])
    balances = {pk: (balance, since) for pk, balance, since in accounts.values()}
    charged = {}
    for entry_id, account_id, amount, _, _, session_pk, *_ in entries:
        if entry_id not in written:
            continue
        balance, since = balances[account_id]
        balance += amount
        balances[account_id] = (balance, (since or now) if balance < 0 else None)
        cursor.execute("UPDATE billing_ledgerentry SET balance_after = %s WHERE id = %s", [balance, entry_id])
        charged[session_pk] = -amount
    _update_accounts(cursor, [(pk, balance, since) for pk, (balance, since) in balances.items()])
    return charged
