"""Storage charges: a volume's quota costs credits per GiB-month, charged through the ledger once per volume and period.

Units:
    price: ``GSHARE_STORAGE_PRICE_PER_GB_MONTH`` credits per GiB-month (default 0.05); GiB = 2^30 bytes.
    month: exactly 30 days (``MONTH_SECONDS`` = 2,592,000 s), whatever the calendar month.
    cost: credits, 6 decimal places, rounded once per charge (``ROUND_HALF_EVEN``).

What is charged is the quota held, not the bytes written: the storage services (``storage.services``) record each
stretch of time a volume holds one quota as a ``StorageHolding`` (opened when the volume is created, closed and
reopened when its quota is raised, closed when it is deleted). A billing period (``billing.periods``: the same
``GSHARE_BILLING_PERIOD_SECONDS`` periods as session usage) is charged once it ended ``GSHARE_BILLING_SETTLE_SECONDS``
ago, by ``storage_charges_close`` (called by the beat task ``billing.close_billing_periods``): one ``storage`` ledger
entry per volume and period, for ``price × Σ(quota_gb × seconds held inside the period) / MONTH_SECONDS`` (a quota
raised mid-period counts each quota for the seconds it was held). The charge lowers the balance at once, like a session's
period charge; a period whose cost rounds to 0 writes no entry.

Idempotent: holdings carry ``charged_until`` (how far their time was charged) and the ledger holds at most one storage
charge per volume and period (``ledger_one_storage_charge_per_volume_period``), so no period is charged twice however
often or concurrently the close runs. Writers hold the owner's ``CreditAccount`` row lock (lock order: credit account →
pools → volumes → holdings).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Context, Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from billing.models import CREDITS, CreditAccount, LedgerEntry, StorageHolding
from billing.periods import EPOCH, period_length

logger = logging.getLogger(__name__)

#: A month, for prices per GiB-month: exactly 30 days.
MONTH_SECONDS = 30 * 86400
#: ``created_by`` of storage charges.
CHARGED_BY = "storage-period"
_EXACT = Context(prec=60, rounding=ROUND_HALF_EVEN)
_MICROSECOND = timedelta(microseconds=1)


def storage_price() -> Decimal:
    """Credits per GiB-month (30 days): the setting ``GSHARE_STORAGE_PRICE_PER_GB_MONTH``."""
    return Decimal(settings.GSHARE_STORAGE_PRICE_PER_GB_MONTH)


def monthly_cost(*, quota_gb: int, price: Decimal | None = None) -> Decimal:
    """Credits ``quota_gb`` GiB cost for a month (30 days) at ``price`` (default ``storage_price()``), to 0.000001."""
    price = storage_price() if price is None else price
    return _EXACT.multiply(price, Decimal(quota_gb)).quantize(CREDITS, rounding=ROUND_HALF_EVEN)


def storage_pricing(*, quota_gb: int) -> dict:
    """``{"credits_per_gb_month": Decimal, "monthly_credits": Decimal, "month_days": 30}`` for a quota of ``quota_gb`` GiB
    (what the API and the console show where volumes are created)."""
    price = storage_price().quantize(CREDITS)
    return {"credits_per_gb_month": price, "monthly_credits": monthly_cost(quota_gb=quota_gb, price=price),
            "month_days": MONTH_SECONDS // 86400}


def storage_cost(*, gib_seconds: Decimal, price: Decimal) -> Decimal:
    """Credits for ``gib_seconds`` (GiB × seconds held) at ``price`` credits per GiB-month, rounded to 0.000001
    (``ROUND_HALF_EVEN``)."""
    return _EXACT.divide(_EXACT.multiply(price, gib_seconds), Decimal(MONTH_SECONDS)).quantize(CREDITS, rounding=ROUND_HALF_EVEN)


# --------------------------------------------------------------------------- holdings (called by storage.services)


def holding_open(*, volume, account: CreditAccount, quota_gb: int, at: datetime) -> StorageHolding:
    """Start charging ``volume`` (just created) for ``quota_gb`` GiB from ``at``. Call under the owner's account lock."""
    return StorageHolding.objects.create(volume=volume, account=account, quota_gb=quota_gb, start=at, charged_until=at)


def holding_close(*, volume, at: datetime) -> None:
    """Stop charging ``volume`` at ``at`` (its deletion, or a quota change): its open holding ends then. A holding that
    began at ``at`` or later held nothing and is removed. Call under the owner's account lock."""
    held = StorageHolding.objects.select_for_update().filter(volume=volume, end__isnull=True).first()
    if held is None:
        return
    if held.start >= at:
        held.delete()
        return
    held.end = at
    held.save(update_fields=["end"])


def holding_change(*, volume, account: CreditAccount, quota_gb: int, at: datetime) -> StorageHolding:
    """``volume``'s quota is ``quota_gb`` GiB from ``at`` on: the open holding ends, a new one begins. Call under the
    owner's account lock."""
    holding_close(volume=volume, at=at)
    return holding_open(volume=volume, account=account, quota_gb=quota_gb, at=at)


def uncharged_until(*, volume_ids) -> datetime | None:
    """The latest end of the volumes' holdings whose time is not all charged yet (an open holding counts as now), or
    None when everything they held was charged: a volume's row must outlive its last charge."""
    rows = StorageHolding.objects.filter(_uncharged(), volume_id__in=list(volume_ids)).values_list("end", flat=True)
    ends = list(rows)
    if not ends:
        return None
    return timezone.now() if None in ends else max(ends)


# --------------------------------------------------------------------------- the periodic charge


def _floor(moment: datetime, length: timedelta) -> datetime:
    return EPOCH + ((moment - EPOCH) // length) * length


def _seconds(delta: timedelta) -> Decimal:
    """A duration as exact seconds (microseconds kept)."""
    return Decimal(delta // _MICROSECOND).scaleb(-6)


def _uncharged() -> Q:
    """Holdings with time not charged yet."""
    return Q(end__isnull=True) | Q(charged_until__lt=F("end"))


def _due(limit: datetime) -> Q:
    """Holdings with time before ``limit`` (a period boundary) not charged yet."""
    return Q(charged_until__lt=limit) & _uncharged()


def storage_charges_close(*, now: datetime | None = None, accounts_per_transaction: int = 500, max_transactions: int = 100) -> int:
    """Charge every volume for the billing periods that ended ``GSHARE_BILLING_SETTLE_SECONDS`` before ``now`` and are not
    charged yet (see the module docstring for the price).

    Per transaction, up to ``accounts_per_transaction`` accounts are locked (primary-key order) and their due holdings
    read again under the locks; per volume and period one ``storage`` entry (amount −cost, ``balance_after``, the
    period, the volume) is written, the balance lowered (``below_zero_since`` set when ``balance − accrued`` goes
    below zero), and the holdings' ``charged_until`` moved to the last charged period's end. Idempotent: a second run
    finds nothing due.

    Args:
        now: the time to judge by (default: now).
        accounts_per_transaction: accounts locked per transaction.
        max_transactions: bound on transactions per call (the next run goes on).

    Returns:
        How many storage charges were written.
    """
    now = now or timezone.now()
    length = period_length()
    limit = _floor(now - timedelta(seconds=settings.GSHARE_BILLING_SETTLE_SECONDS), length)
    price = storage_price()
    written, after = 0, 0
    for _ in range(max_transactions):
        account_ids = list(
            StorageHolding.objects.filter(_due(limit), account_id__gt=after).order_by("account_id")
            .values_list("account_id", flat=True).distinct()[:accounts_per_transaction]
        )
        if not account_ids:
            break
        after = account_ids[-1]
        with transaction.atomic():
            written += _charge_accounts(account_ids, limit=limit, length=length, price=price, now=now)
    if written:
        logger.info("storage: %d period charge(s) written", written)
    return written


def _charge_accounts(account_ids: list[int], *, limit: datetime, length: timedelta, price: Decimal, now: datetime) -> int:
    """``storage_charges_close`` for one batch of accounts, in the caller's transaction."""
    accounts = {a.pk: a for a in CreditAccount.objects.select_for_update().filter(pk__in=account_ids).order_by("pk")}
    holdings = list(StorageHolding.objects.select_for_update().filter(_due(limit), account_id__in=account_ids)
                    .select_related("volume").order_by("account_id", "volume_id", "start"))
    by_volume: dict[int, list[StorageHolding]] = defaultdict(list)
    for held in holdings:
        by_volume[held.volume_id].append(held)
    first = {vid: _floor(min(h.charged_until for h in rows), length) for vid, rows in by_volume.items()}
    charged = set(
        LedgerEntry.objects.filter(kind=LedgerEntry.Kind.STORAGE, volume__in=[rows[0].volume.public_id for rows in by_volume.values()],
                                   period_start__gte=min(first.values(), default=limit))
        .values_list("volume", "period_start")
    ) if by_volume else set()
    entries = []
    for volume_id, rows in by_volume.items():
        account = accounts[rows[0].account_id]
        volume = rows[0].volume
        start = first[volume_id]
        while start < limit:
            end = start + length
            gib_seconds, quotas = Decimal(0), set()
            for held in rows:
                overlap = min(held.end or end, end) - max(held.start, held.charged_until, start)
                if overlap > timedelta(0):
                    gib_seconds += held.quota_gb * _seconds(overlap)
                    quotas.add(held.quota_gb)
            cost = storage_cost(gib_seconds=gib_seconds, price=price)
            if cost and (volume.public_id, start) not in charged:
                account.balance -= cost
                if account.balance - account.accrued < 0:
                    account.below_zero_since = account.below_zero_since or now
                entries.append(LedgerEntry(
                    account=account, kind=LedgerEntry.Kind.STORAGE, amount=-cost, balance_after=account.balance,
                    idempotency_key=f"storage:{volume.public_id}:{start.astimezone(UTC).isoformat()}", volume=volume.public_id,
                    period_start=start, period_end=end, reason=_reason(volume, start, end, quotas, gib_seconds, price),
                    created_by=CHARGED_BY,
                ))
            start = end
        for held in rows:
            held.charged_until = limit
    if entries:
        LedgerEntry.objects.bulk_create(entries)
        CreditAccount.objects.bulk_update(sorted({e.account.pk: e.account for e in entries}.values(), key=lambda a: a.pk),
                                          ["balance", "below_zero_since"])
    StorageHolding.objects.bulk_update(holdings, ["charged_until"])
    return len(entries)


def _reason(volume, start: datetime, end: datetime, quotas: set[int], gib_seconds: Decimal, price: Decimal) -> str:
    """E.g. ``Storage 2026-11-29 15:00–16:00 UTC: volume datasets (vol_...), 100 GiB, 100.000000 GiB-hours at 0.05/GiB-month``."""
    until = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
    sizes = " then ".join(f"{gb} GiB" for gb in sorted(quotas))
    hours = (gib_seconds / 3600).quantize(CREDITS)
    return (f"Storage {start.astimezone(UTC):%Y-%m-%d %H:%M}–{until} UTC: volume {volume.name} ({volume.public_id}), {sizes}, "
            f"{hours} GiB-hours at {price}/GiB-month (30 days)")[:500]
