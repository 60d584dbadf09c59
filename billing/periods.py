"""Billing periods: usage is charged once per session and period; what it cost since the last charge is accrued.

A period is ``GSHARE_BILLING_PERIOD_SECONDS`` long (default 3600) and aligned to the Unix epoch (with 3600: whole UTC
hours). Usage ingestion (``billing.ingest``) stores every sample as before and adds its cost to its session's
``Accrual`` and its owner's ``CreditAccount.accrued``; the ledger gets one ``charge`` per session and period,
written when the period closes:

* by ingestion, when a new sample of a later period of the session arrives (the open period is charged in the same
  transaction; so is every period of the batch but the session's last, when a batch catches up on several);
* by the periodic task ``billing.close_billing_periods`` (:func:`periods_close`), once a period ended
  ``GSHARE_BILLING_SETTLE_SECONDS`` ago (default 120: late samples of its last minutes still make it), or its session
  ended that long ago (the session's last charge: it does not wait for the period's end), after the held time no
  sample covered was added to it (``billing.held``).

A sample accrues into ``max(the period of its start, the session's open period)``: a late sample of a period that
was already charged is charged with the next one (its ``billing_period`` says which), so a charge never changes and
there is at most one per session and period (``ledger_one_charge_per_session_period``). A charge names its period,
the number of samples it covers and their first start and last end; its amount is the exact sum of their costs.

``balance − accrued`` is exact to the sample at every moment: admission (``billing.admission``), the stop at zero
(``sessions.overdrawn``) and ``below_zero_since`` judge it. Every writer of accruals and period charges holds the
owner's account row lock (``SELECT ... FOR UPDATE``), so the accrual and the balance move together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing import held
from billing.models import Accrual, CreditAccount, LedgerEntry

logger = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: ``created_by`` of charges the periodic close writes (ingestion's are ``usage``).
CLOSED_BY_TASK = "billing-period"


def period_length() -> timedelta:
    """``GSHARE_BILLING_PERIOD_SECONDS`` as a ``timedelta``."""
    return timedelta(seconds=settings.GSHARE_BILLING_PERIOD_SECONDS)


def charge_key(session_public_id: str, period_start: datetime) -> str:
    """``period:<session id>:<period start, ISO 8601 UTC>``: the idempotency key of a session's charge for a period."""
    return f"period:{session_public_id}:{period_start.astimezone(UTC).isoformat()}"


def charge_reason(*, samples: int, cluster: str, period_start: datetime, period_end: datetime, ended: bool = False) -> str:
    """What a period's charge says, e.g. ``Usage 2026-11-29 15:00–16:00 UTC: 60 sample(s) on lab-c1``."""
    end = f"{period_end:%H:%M}" if period_end.date() == period_start.date() else f"{period_end:%Y-%m-%d %H:%M}"
    text = f"Usage {period_start.astimezone(UTC):%Y-%m-%d %H:%M}–{end} UTC: {samples} sample(s) on {cluster}"
    return text + " (session ended)" if ended else text


@dataclass(slots=True)
class Open:
    """A session's accrued usage: the open period and what its samples add up to (``Accrual``'s columns)."""

    period_start: datetime
    amount: Decimal
    gpu_seconds: Decimal
    samples: int
    first_start: datetime | None
    last_end: datetime | None

    def add(self, *, amount: Decimal, gpu_seconds: Decimal, samples: int, first_start: datetime, last_end: datetime) -> None:
        """Add samples to it (credits, GPU-seconds, a count, their first start and last end)."""
        self.amount += amount
        self.gpu_seconds += gpu_seconds
        self.samples += samples
        self.first_start = first_start if self.first_start is None or first_start < self.first_start else self.first_start
        self.last_end = last_end if self.last_end is None or last_end > self.last_end else self.last_end


def _due(now: datetime) -> Q:
    """Open accruals the periodic close charges at ``now``: the period ended, or the session did, a settle time ago."""
    settle = timedelta(seconds=settings.GSHARE_BILLING_SETTLE_SECONDS)
    return Q(samples__gt=0) & (Q(period_start__lte=now - period_length() - settle) | Q(session__ended_at__lte=now - settle))


def periods_close(*, now: datetime | None = None, accounts_per_transaction: int = 500, max_transactions: int = 100) -> int:
    """Charge every open accrual whose period ended, or whose session ended, ``GSHARE_BILLING_SETTLE_SECONDS`` ago.

    First, the held time of sessions that ended that long ago and that no usage sample covered is accrued
    (``billing.held.held_gaps_bill``), so an ended session's last charge bills every second it held its GPUs.

    The beat task ``billing.close_billing_periods`` (every 60 s) calls it; ingestion closes a period itself when a
    sample of a later one arrives, so this covers sessions that went quiet or ended. Per transaction, up to
    ``accounts_per_transaction`` accounts are locked (primary-key order), their due accruals read again under the
    locks and charged: one ``charge`` entry each (amount −accrued, ``balance_after``, the period, the samples'
    count, first start and last end), the accrual emptied and moved to the next period, ``balance`` and ``accrued``
    lowered by the same amount (``balance − accrued`` and ``below_zero_since`` do not change). Idempotent: a second
    run finds nothing due. Queries per transaction: a constant number, whatever the number of accruals.

    Args:
        now: the time to judge by (default: now).
        accounts_per_transaction: accounts locked per transaction.
        max_transactions: bound on transactions per call (the next run goes on).

    Returns:
        How many charges were written.
    """
    now = now or timezone.now()
    # An ended session's held time no sample covered joins its open period first, so its last charge includes it.
    held.held_gaps_bill(now=now, max_transactions=max_transactions)
    length = period_length()
    settle = timedelta(seconds=settings.GSHARE_BILLING_SETTLE_SECONDS)
    written = 0
    after = 0
    for _ in range(max_transactions):
        account_ids = list(
            Accrual.objects.filter(_due(now), account_id__gt=after).order_by("account_id").values_list("account_id", flat=True)
            .distinct()[:accounts_per_transaction]
        )
        if not account_ids:
            break
        after = account_ids[-1]
        with transaction.atomic():
            accounts = {a.pk: a for a in CreditAccount.objects.select_for_update().filter(pk__in=account_ids).order_by("pk")}
            rows = list(Accrual.objects.filter(_due(now), account_id__in=account_ids).select_related("session__cluster")
                        .order_by("account_id", "session_id"))
            entries = []
            for row in rows:
                account = accounts[row.account_id]
                account.balance -= row.amount
                account.accrued -= row.amount
                session = row.session
                period_end = row.period_start + length
                ended = session.ended_at is not None and session.ended_at <= now - settle and period_end + settle > now
                entries.append(LedgerEntry(
                    account=account, kind=LedgerEntry.Kind.CHARGE, amount=-row.amount, balance_after=account.balance,
                    idempotency_key=charge_key(session.public_id, row.period_start), session_id=row.session_id,
                    window_start=row.first_start, window_end=row.last_end, gpu_seconds=row.gpu_seconds,
                    period_start=row.period_start, period_end=period_end, sample_count=row.samples,
                    reason=charge_reason(samples=row.samples, cluster=session.cluster.name if session.cluster_id else "",
                                         period_start=row.period_start, period_end=period_end, ended=ended),
                    created_by=CLOSED_BY_TASK,
                ))
                row.period_start = period_end
                row.amount, row.gpu_seconds, row.samples, row.first_start, row.last_end = Decimal(0), Decimal(0), 0, None, None
                row.updated_at = now
            if not rows:
                continue
            LedgerEntry.objects.bulk_create(entries)
            Accrual.objects.bulk_update(rows, ["period_start", "amount", "gpu_seconds", "samples", "first_start", "last_end", "updated_at"])
            CreditAccount.objects.bulk_update([accounts[pk] for pk in sorted({r.account_id for r in rows})], ["balance", "accrued"])
            written += len(entries)
    if written:
        logger.info("billing periods: %d charge(s) written", written)
    return written
