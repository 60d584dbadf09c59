"""Billing services: accounts, the ledger, grants, prices and policies (usage ingestion is ``billing.ingest``; the
errors raised are ``billing.exceptions``).

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

import logging
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.services import Action, audit_record, created, diff, snapshot
from billing.exceptions import BalanceOutOfRange, IdempotencyKeyMissing, IdempotencyKeyReused, InvalidAmount
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
    MAX_CAPACITY_GB,
    CreditAccount,
    LedgerEntry,
    Policy,
    Price,
    UsageSample,
)
from clusters.models import Cluster
from core.errors import INVALID_REQUEST
from core.exceptions import ApplicationError, NotFound
from identity.errors import USER_NOT_FOUND

logger = logging.getLogger(__name__)

#: Largest amount of one entry (``numeric(18, 6)``: 12 digits before the point).
MAX_AMOUNT = Decimal(10) ** 12 - CREDITS
#: The largest balance (either sign) a numeric(18, 6) column holds.
MAX_BALANCE = Decimal(10) ** 12 - CREDITS
#: Longest caller-chosen idempotency key (the stored key adds a ``grant:`` prefix; the column holds 200).
MAX_IDEMPOTENCY_KEY = 150
#: Longest idle timeout or warning of a policy, in minutes (a year).
MAX_IDLE_MINUTES = 525_600
#: Longest time limit of a policy (``max_runtime_hours``), in hours (a year); 0 is no limit.
MAX_RUNTIME_HOURS = Decimal(8760)
#: ``max_runtime_hours`` is kept to this many decimal places (its column's), 0.01 h = 36 s.
RUNTIME_HOURS_PLACES = 2
#: The most a policy may give per GPU (``max_cpu_per_gpu`` cores, ``max_memory_gib_per_gpu`` GiB): × 16 GPUs, what one
#: session may ask at most (``sessions.resources.MAX_CPU``, ``MAX_MEMORY_GIB``). Kept to 2 decimal places (the columns').
MAX_CPU_PER_GPU = Decimal(256)
MAX_MEMORY_GIB_PER_GPU = Decimal(4096)
RESOURCE_PER_GPU_PLACES = 2
#: The policy's CPU and memory fields: (default field, maximum field, most, unit).
_RESOURCE_FIELDS = (("default_cpu_per_gpu", "max_cpu_per_gpu", MAX_CPU_PER_GPU, "CPU cores"),
                    ("default_memory_gib_per_gpu", "max_memory_gib_per_gpu", MAX_MEMORY_GIB_PER_GPU, "GiB"))


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
    """``below_zero_since`` once the balance is ``balance``: judged on ``balance - accrued`` (the usage not charged yet
    counts, so the stop at zero is exact to the sample)."""
    if balance - account.accrued < 0:
        return account.below_zero_since or now
    return None


def _check_kind_and_sign(kind: str, amount: Decimal) -> None:
    if kind not in LedgerEntry.Kind.values:
        raise ApplicationError(f"kind must be one of {', '.join(LedgerEntry.Kind.values)}; got {kind!r}.", code=INVALID_REQUEST)
    if kind == LedgerEntry.Kind.CHARGE and amount > 0:
        raise InvalidAmount("A charge takes credits away: its amount must be 0 or less.")
    if kind in (LedgerEntry.Kind.GRANT, LedgerEntry.Kind.REFUND) and amount < 0:
        raise InvalidAmount(f"A {kind} adds credits: its amount must be 0 or more.")
    if kind == LedgerEntry.Kind.END and amount != 0:
        raise InvalidAmount("A session's end entry moves no credits: its amount must be 0.")


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
    idle_credits: Decimal | None = None,
) -> tuple[LedgerEntry, bool]:
    """Append one entry to ``account``'s ledger and move its balance, once per ``idempotency_key``.

    Under the account's row lock: when an entry with ``idempotency_key`` exists, it is returned (``created``
    False) if it is the same movement (account, kind, amount), and refused otherwise; else the entry is written
    with ``balance_after``, and the account's ``balance`` and ``below_zero_since`` (set when ``balance - accrued`` goes
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
        idle_credits: end entries: credits the session burned while idle.

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
        gpu_seconds=gpu_seconds, reason=reason[:500], created_by=created_by[:150], idle_credits=idle_credits,
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


def idle_cost(*, session, since: datetime, until: datetime) -> tuple[Decimal, Decimal]:
    """What the usage samples of ``session`` cost between ``since`` and ``until`` (one query).

    A sample straddling a bound counts for the part of its window inside, pro rata of its ``cost`` and GPU-seconds.

    Returns:
        ``(credits, gpu_seconds)``, both ``Decimal`` rounded to 6 places (``CREDITS``); zeros when ``until`` is not after
        ``since`` or no sample falls between.
    """
    if until <= since:
        return Decimal(0).quantize(CREDITS), Decimal(0).quantize(CREDITS)
    credits = Decimal(0)
    gpu_seconds = Decimal(0)
    rows = UsageSample.objects.filter(session=session, end__gt=since, start__lt=until).values_list("start", "end", "cost", "share")
    for start, end, cost, share in rows:
        whole = Decimal(str((end - start).total_seconds()))
        inside = Decimal(str((min(end, until) - max(start, since)).total_seconds()))
        if whole <= 0 or inside <= 0:
            continue
        credits += cost * inside / whole
        gpu_seconds += share * inside
    return credits.quantize(CREDITS), gpu_seconds.quantize(CREDITS)


def ledger_session_end(*, session, idle_since: datetime, until: datetime, reason: str, created_by: str) -> tuple[LedgerEntry, bool]:
    """Write the ``end`` entry of a session the idle policy stopped: amount 0, its window the idle time, ``idle_credits``
    and ``gpu_seconds`` what its usage samples in that window cost (``idle_cost``). Once per session (idempotency key
    ``end:<session id>``); the owner's account is made if missing.

    Returns:
        ``(entry, created)`` as ``ledger_append``.
    """
    credits, gpu_seconds = idle_cost(session=session, since=idle_since, until=until)
    return ledger_append(
        account=account_for(session.owner), kind=LedgerEntry.Kind.END, amount=Decimal(0), idempotency_key=f"end:{session.public_id}",
        session=session, window=(idle_since, until), gpu_seconds=gpu_seconds, idle_credits=credits,
        reason=f"{reason} Burned {credits} credits while idle.", created_by=created_by,
    )


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
                               code=INVALID_REQUEST)
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
        raise NotFound(f"No user is named {str(username)[:150]!r}: check the username.", code=USER_NOT_FOUND)
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
    ``policy_set`` updates the user's row). ``idle_timeout_minutes`` and ``idle_warning_minutes`` from 0 to
    ``MAX_IDLE_MINUTES``, the warning no longer than a non-zero timeout. ``max_runtime_hours`` from 0 (no limit) to
    ``MAX_RUNTIME_HOURS`` with at most 2 decimal places, ``runtime_warning_minutes`` from 0 to ``MAX_IDLE_MINUTES``.
    ``default_cpu_per_gpu`` and ``max_cpu_per_gpu`` from 0 to ``MAX_CPU_PER_GPU``, ``default_memory_gib_per_gpu`` and
    ``max_memory_gib_per_gpu`` from 0 to ``MAX_MEMORY_GIB_PER_GPU``, each with at most 2 decimal places, a default no more
    than its maximum (a default of 0: sessions that ask none get no request for it).
    ``allowed_clusters`` is not checked (any cluster may be named).

    Raises:
        ApplicationError: ``invalid_request`` (400).
        django.core.exceptions.ValidationError: a field is malformed (400 ``invalid_request``).
    """
    for name in ("max_sessions", "max_gpus", "max_volume_gb"):
        value = getattr(policy, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ApplicationError(f"{name} must be at least 1, or empty for no limit.", code=INVALID_REQUEST)
    if policy.max_volume_gb is not None and policy.max_volume_gb > MAX_CAPACITY_GB:
        raise ApplicationError(f"max_volume_gb must be at most {MAX_CAPACITY_GB} GiB, or empty for no limit.", code=INVALID_REQUEST)
    hours = policy.min_balance_hours
    if not isinstance(hours, (int, Decimal)) or isinstance(hours, bool) or not Decimal(hours).is_finite() or hours < 0:
        raise ApplicationError("min_balance_hours must be at least 0.", code=INVALID_REQUEST)
    for name in ("idle_timeout_minutes", "idle_warning_minutes"):
        value = getattr(policy, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_IDLE_MINUTES:
            raise ApplicationError(f"{name} must be a whole number of minutes from 0 to {MAX_IDLE_MINUTES}.", code=INVALID_REQUEST)
    if policy.idle_timeout_minutes and policy.idle_warning_minutes > policy.idle_timeout_minutes:
        raise ApplicationError("idle_warning_minutes must not exceed idle_timeout_minutes: the warning runs inside the idle time.",
                               code=INVALID_REQUEST)
    runtime = policy.max_runtime_hours
    if (isinstance(runtime, bool) or not isinstance(runtime, (int, Decimal)) or not Decimal(runtime).is_finite()
            or not 0 <= runtime <= MAX_RUNTIME_HOURS or Decimal(runtime).as_tuple().exponent < -RUNTIME_HOURS_PLACES):
        raise ApplicationError(f"max_runtime_hours must be a number of hours from 0 (no limit) to {MAX_RUNTIME_HOURS}, with at most "
                               f"{RUNTIME_HOURS_PLACES} decimal places.", code=INVALID_REQUEST)
    warning = policy.runtime_warning_minutes
    if isinstance(warning, bool) or not isinstance(warning, int) or not 0 <= warning <= MAX_IDLE_MINUTES:
        raise ApplicationError(f"runtime_warning_minutes must be a whole number of minutes from 0 to {MAX_IDLE_MINUTES}.",
                               code=INVALID_REQUEST)
    for default_name, max_name, most, unit in _RESOURCE_FIELDS:
        for name in (default_name, max_name):
            value = getattr(policy, name)
            if (isinstance(value, bool) or not isinstance(value, (int, Decimal)) or not Decimal(value).is_finite()
                    or not 0 <= value <= most or Decimal(value).as_tuple().exponent < -RESOURCE_PER_GPU_PLACES):
                raise ApplicationError(f"{name} must be a number of {unit} per GPU from 0 to {most}, with at most "
                                       f"{RESOURCE_PER_GPU_PLACES} decimal places.", code=INVALID_REQUEST)
        if getattr(policy, default_name) > getattr(policy, max_name):
            raise ApplicationError(f"{default_name} must not exceed {max_name}: a session that asks nothing gets the default.",
                                   code=INVALID_REQUEST)
    _queue_validate(policy)
    policy.full_clean(validate_unique=False, validate_constraints=False)
    return policy


#: The queue's policy fields' ranges: ``priority`` (higher starts first), ``max_queued_sessions``, ``queue_timeout_hours``
#: (at most a year, 2 decimal places).
MAX_PRIORITY = 1000
MAX_QUEUED_SESSIONS = 1000


def _queue_validate(policy: Policy) -> None:
    priority = policy.priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise ApplicationError(f"priority must be a whole number from {-MAX_PRIORITY} to {MAX_PRIORITY}.", code=INVALID_REQUEST)
    queued = policy.max_queued_sessions
    if isinstance(queued, bool) or not isinstance(queued, int) or not 0 <= queued <= MAX_QUEUED_SESSIONS:
        raise ApplicationError(f"max_queued_sessions must be a whole number from 0 (none may queue) to {MAX_QUEUED_SESSIONS}.",
                               code=INVALID_REQUEST)
    timeout = policy.queue_timeout_hours
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, Decimal)) or not Decimal(timeout).is_finite()
            or not 0 < timeout <= MAX_RUNTIME_HOURS or Decimal(timeout).as_tuple().exponent < -RUNTIME_HOURS_PLACES):
        raise ApplicationError(f"queue_timeout_hours must be a number of hours more than 0 and at most {MAX_RUNTIME_HOURS}, with at "
                               f"most {RUNTIME_HOURS_PLACES} decimal places.", code=INVALID_REQUEST)


@transaction.atomic
def policy_set(
    *,
    user=None,
    max_sessions: int | None = None,
    max_gpus: int | None = None,
    max_volume_gb: int | None = DEFAULT_MAX_VOLUME_GB,
    allowed_clusters: Iterable[Cluster] = (),
    min_balance_hours: Decimal = Decimal(1),
    grace_seconds: int = 900,
    idle_timeout_minutes: int = 60,
    idle_warning_minutes: int = 15,
    max_runtime_hours: Decimal | int = DEFAULT_MAX_RUNTIME_HOURS,
    runtime_warning_minutes: int = DEFAULT_RUNTIME_WARNING_MINUTES,
    default_cpu_per_gpu: Decimal | int = DEFAULT_CPU_PER_GPU,
    default_memory_gib_per_gpu: Decimal | int = DEFAULT_MEMORY_GIB_PER_GPU,
    max_cpu_per_gpu: Decimal | int = DEFAULT_MAX_CPU_PER_GPU,
    max_memory_gib_per_gpu: Decimal | int = DEFAULT_MAX_MEMORY_GIB_PER_GPU,
    priority: int = 0,
    max_queued_sessions: int = DEFAULT_MAX_QUEUED_SESSIONS,
    queue_timeout_hours: Decimal | int = DEFAULT_QUEUE_TIMEOUT_HOURS,
) -> Policy:
    """Set the policy of ``user`` (None: the default policy for users without their own), creating its row when
    missing; every field is replaced.

    Args:
        user: the user, or None for the default policy.
        max_sessions: concurrent live sessions (None: unlimited).
        max_gpus: GPUs across live sessions (None: unlimited).
        max_volume_gb: GiB the user's volumes may hold in all (None: unlimited; default ``DEFAULT_MAX_VOLUME_GB``).
        allowed_clusters: clusters sessions may run on (empty: all).
        min_balance_hours: hours of the requested resources the available balance must cover at admission.
        grace_seconds: how long an account may stay below zero before its sessions are stopped.
        idle_timeout_minutes: minutes without a GPU kernel before a session is stopped (0: never; ``sessions.idle``).
        idle_warning_minutes: minutes before that stop when the session shows it.
        max_runtime_hours: the longest a session may run, hours from its reservation (0: unlimited; ``sessions.runtime``).
        runtime_warning_minutes: minutes before a session's time limit when it shows the coming stop.
        default_cpu_per_gpu, default_memory_gib_per_gpu: CPU cores and GiB per GPU of a session that asks none
            (``sessions.resources``; 0: no request).
        max_cpu_per_gpu, max_memory_gib_per_gpu: the most CPU cores and GiB per GPU a session may ask.
        priority: the queue order of the user's sessions (higher first, -1000 to 1000; ``sessions.queue``).
        max_queued_sessions: sessions the user may have waiting in the queue at once (0: none may queue).
        queue_timeout_hours: hours a session may wait in the queue before it is dropped.

    Raises:
        As ``policy_validate``.
    """
    rows = Policy.objects.select_for_update()
    policy = (rows.filter(user__isnull=True) if user is None else rows.filter(user=user)).first() or Policy(user=user)
    before = None if policy._state.adding else _policy_audit(policy)
    policy.max_sessions, policy.max_gpus, policy.max_volume_gb = max_sessions, max_gpus, max_volume_gb
    policy.min_balance_hours, policy.grace_seconds = min_balance_hours, grace_seconds
    policy.idle_timeout_minutes, policy.idle_warning_minutes = idle_timeout_minutes, idle_warning_minutes
    policy.max_runtime_hours, policy.runtime_warning_minutes = max_runtime_hours, runtime_warning_minutes
    policy.default_cpu_per_gpu, policy.default_memory_gib_per_gpu = default_cpu_per_gpu, default_memory_gib_per_gpu
    policy.max_cpu_per_gpu, policy.max_memory_gib_per_gpu = max_cpu_per_gpu, max_memory_gib_per_gpu
    policy.priority, policy.max_queued_sessions, policy.queue_timeout_hours = priority, max_queued_sessions, queue_timeout_hours
    policy_validate(policy=policy)
    policy.save()
    policy.allowed_clusters.set(list(allowed_clusters))
    after = _policy_audit(policy)
    if before is None or (after_changes := diff(before, after)):
        audit_record(action=Action.POLICY_CREATE if before is None else Action.POLICY_UPDATE, obj=policy, object_repr=_policy_name(policy),
                     changes=created(after) if before is None else after_changes)
    logger.info("policy set: %s (max_sessions=%s, max_gpus=%s, min_balance_hours=%s, grace_seconds=%s, idle_timeout_minutes=%s, "
                "idle_warning_minutes=%s, max_runtime_hours=%s, runtime_warning_minutes=%s)", policy, max_sessions, max_gpus,
                policy.min_balance_hours, grace_seconds, idle_timeout_minutes, idle_warning_minutes, policy.max_runtime_hours,
                runtime_warning_minutes)
    return policy


def _policy_audit(policy: Policy) -> dict:
    """A policy's limits as its audit rows show them (the allowed clusters by id)."""
    return {**snapshot(policy, ("max_sessions", "max_gpus", "max_volume_gb", "min_balance_hours", "grace_seconds", "idle_timeout_minutes",
                                "idle_warning_minutes", "max_runtime_hours", "runtime_warning_minutes", "default_cpu_per_gpu",
                                "default_memory_gib_per_gpu", "max_cpu_per_gpu", "max_memory_gib_per_gpu", "priority",
                                "max_queued_sessions", "queue_timeout_hours")),
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
