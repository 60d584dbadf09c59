"""The books of billing, checked from the tables: what every billing test that moves credits asserts at its end."""

from __future__ import annotations

from decimal import Decimal

from django.db.models import Count, Sum

from billing.models import Accrual, CreditAccount, LedgerEntry, UsageSample

ZERO = Decimal(0)


def assert_books() -> None:
    """Every balance equals its ledger's sum and every ``accrued`` its accruals'; every period charge and every open
    accrual equals the costs of exactly the samples it covers (the session's samples of that ``billing_period``);
    at most one charge per session and period; charges plus accrued equal the samples' costs to the last decimal."""
    for account in CreditAccount.objects.all():
        assert account.balance == (LedgerEntry.objects.filter(account=account).aggregate(s=Sum("amount"))["s"] or ZERO), account
        assert account.accrued == (Accrual.objects.filter(account=account).aggregate(s=Sum("amount"))["s"] or ZERO), account
        assert (account.below_zero_since is not None) == (account.balance - account.accrued < 0), account
    covered = {
        (row["session_id"], row["billing_period"]): (row["cost"], row["n"])
        for row in UsageSample.objects.filter(billing_period__isnull=False).values("session_id", "billing_period")
        .annotate(cost=Sum("cost"), n=Count("id")).order_by()
    }
    seen = set()
    for entry in LedgerEntry.objects.filter(kind="charge"):
        if entry.period_start is None:  # a charge of a usage batch, from before billing periods
            assert entry.amount == -(entry.samples.aggregate(s=Sum("cost"))["s"] or ZERO)
            continue
        key = (entry.session_id, entry.period_start)
        assert key not in seen, f"two charges for {key}"
        seen.add(key)
        assert (-entry.amount, entry.sample_count) == covered.pop(key), entry
    for accrual in Accrual.objects.filter(samples__gt=0):
        key = (accrual.session_id, accrual.period_start)
        assert key not in seen, f"{key} is charged and open"
        assert (accrual.amount, accrual.samples) == covered.pop(key), accrual
    assert not covered, f"samples neither charged nor accrued: {covered}"
    assert not UsageSample.objects.filter(entry__isnull=True, billing_period__isnull=True).exists()
    charged = LedgerEntry.objects.filter(kind="charge").aggregate(s=Sum("amount"))["s"] or ZERO
    accrued = Accrual.objects.aggregate(s=Sum("amount"))["s"] or ZERO
    assert accrued - charged == (UsageSample.objects.aggregate(s=Sum("cost"))["s"] or ZERO)


def billed(session) -> Decimal:
    """What ``session`` has cost so far: its charges plus its accrual (credits, positive)."""
    charged = LedgerEntry.objects.filter(session=session, kind="charge").aggregate(s=Sum("amount"))["s"] or ZERO
    accrual = Accrual.objects.filter(session=session).first()
    return (accrual.amount if accrual else ZERO) - charged
