"""Storage charges (billing.storage_charges): a volume's quota is charged per GiB-month through the ledger, once per
volume and billing period, prorated by the seconds each quota was held. Times come from a fixed clock (``T0``)."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from billing import storage_charges, tasks
from billing.models import CreditAccount, LedgerEntry, StorageHolding
from billing.services import account_for
from tests.factories import UserFactory, VolumeFactory
from tests.helpers import run_threads

pytestmark = pytest.mark.django_db

#: A period boundary (hours are aligned to the Unix epoch).
T0 = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
SETTLE = timedelta(seconds=120)


@pytest.fixture(autouse=True)
def _price(settings):
    # 2.592 credits per GiB-month (30 days = 2,592,000 s) is 0.000001 credits per GiB-second: amounts read as GiB-seconds.
    settings.GSHARE_STORAGE_PRICE_PER_GB_MONTH = Decimal("2.592")
    settings.GSHARE_BILLING_PERIOD_SECONDS = 3600
    settings.GSHARE_BILLING_SETTLE_SECONDS = 120


def storage_entries(volume):
    return list(LedgerEntry.objects.filter(kind=LedgerEntry.Kind.STORAGE, volume=volume.public_id).order_by("period_start"))


def test_the_quota_held_is_charged_per_period_prorated_across_a_quota_change():
    volume = VolumeFactory(quota_gb=100)
    account = account_for(volume.owner)
    storage_charges.holding_open(volume=volume, account=account, quota_gb=100, at=T0 + timedelta(minutes=30))
    storage_charges.holding_change(volume=volume, account=account, quota_gb=300, at=T0 + HOUR + timedelta(minutes=10))

    # Before the first period settled: nothing.
    assert storage_charges.storage_charges_close(now=T0 + HOUR + SETTLE - timedelta(seconds=1)) == 0
    assert storage_charges.storage_charges_close(now=T0 + 2 * HOUR + SETTLE) == 2
    first, second = storage_entries(volume)
    assert (first.period_start, first.period_end, first.amount) == (T0, T0 + HOUR, Decimal("-0.180000"))  # 100 GiB × 1800 s
    # 100 GiB × 600 s, then 300 GiB × 3000 s.
    assert (second.period_start, second.amount) == (T0 + HOUR, Decimal("-0.960000"))
    assert "100 GiB then 300 GiB" in second.reason and volume.public_id in second.reason
    assert second.balance_after == Decimal("-1.140000") and second.account_id == account.pk
    account.refresh_from_db()
    assert account.balance == Decimal("-1.140000") and account.below_zero_since is not None

    # Idempotent: the same close again, or an earlier one, writes nothing.
    assert storage_charges.storage_charges_close(now=T0 + 2 * HOUR + SETTLE) == 0
    assert storage_charges.storage_charges_close(now=T0 + HOUR + SETTLE) == 0

    # Deleted half-way through the fourth period: charged until then, and never again.
    storage_charges.holding_close(volume=volume, at=T0 + 3 * HOUR + timedelta(minutes=30))
    assert storage_charges.storage_charges_close(now=T0 + 10 * HOUR) == 2
    amounts = [e.amount for e in storage_entries(volume)]
    assert amounts == [Decimal("-0.180000"), Decimal("-0.960000"), Decimal("-1.080000"), Decimal("-0.540000")]
    assert storage_charges.storage_charges_close(now=T0 + 20 * HOUR) == 0
    account.refresh_from_db()
    assert account.balance == sum(amounts) == LedgerEntry.objects.filter(account=account).latest("id").balance_after


def test_one_storage_charge_per_volume_and_period_is_a_database_rule():
    volume = VolumeFactory()
    account = account_for(volume.owner)
    row = {"account": account, "kind": LedgerEntry.Kind.STORAGE, "amount": Decimal("-1"), "balance_after": Decimal("-1"),
           "volume": volume.public_id, "period_start": T0, "period_end": T0 + HOUR}
    LedgerEntry.objects.create(idempotency_key="storage-a", **row)
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(idempotency_key="storage-b", **row)
    with pytest.raises(IntegrityError), transaction.atomic():  # a storage charge that adds credits
        LedgerEntry.objects.create(idempotency_key="storage-c", **{**row, "amount": Decimal("1"), "period_start": T0 + HOUR})


def test_a_quota_changed_twice_at_one_instant_holds_no_empty_stretch():
    volume = VolumeFactory()
    account = account_for(volume.owner)
    storage_charges.holding_open(volume=volume, account=account, quota_gb=10, at=T0)
    storage_charges.holding_change(volume=volume, account=account, quota_gb=20, at=T0 + HOUR)
    storage_charges.holding_change(volume=volume, account=account, quota_gb=30, at=T0 + HOUR)
    assert list(StorageHolding.objects.filter(volume=volume).values_list("quota_gb", "start", "end")) == [
        (10, T0, T0 + HOUR), (30, T0 + HOUR, None)]
    assert storage_charges.storage_charges_close(now=T0 + 2 * HOUR + SETTLE) == 2
    assert [e.amount for e in storage_entries(volume)] == [Decimal("-0.036000"), Decimal("-0.108000")]


def test_a_price_of_zero_writes_no_entries_and_charges_nothing_later(settings):
    settings.GSHARE_STORAGE_PRICE_PER_GB_MONTH = Decimal(0)
    volume = VolumeFactory()
    storage_charges.holding_open(volume=volume, account=account_for(volume.owner), quota_gb=10, at=T0)
    assert storage_charges.storage_charges_close(now=T0 + 3 * HOUR + SETTLE) == 0
    settings.GSHARE_STORAGE_PRICE_PER_GB_MONTH = Decimal("2.592")
    assert storage_charges.storage_charges_close(now=T0 + 4 * HOUR + SETTLE) == 1  # only the period after: no back-charge
    assert [e.period_start for e in storage_entries(volume)] == [T0 + 3 * HOUR]


def test_monthly_cost_is_exact_decimal():
    assert storage_charges.monthly_cost(quota_gb=100, price=Decimal("0.05")) == Decimal("5.000000")
    assert storage_charges.storage_pricing(quota_gb=3) == {
        "credits_per_gb_month": Decimal("2.592"), "monthly_credits": Decimal("7.776000"), "month_days": 30}


@pytest.mark.django_db(transaction=True)
def test_concurrent_closes_charge_each_period_once():
    assert connection.vendor == "postgresql"
    volumes = [VolumeFactory(quota_gb=10) for _ in range(3)]
    for volume in volumes:
        storage_charges.holding_open(volume=volume, account=account_for(volume.owner), quota_gb=10, at=T0)
    results = []

    def close():
        try:
            results.append(storage_charges.storage_charges_close(now=T0 + 5 * HOUR + SETTLE))
        finally:
            connection.close()

    run_threads(close, [(), (), ()], timeout=60)
    assert sum(results) == 15
    assert LedgerEntry.objects.filter(kind=LedgerEntry.Kind.STORAGE).count() == 15
    for volume in volumes:
        assert CreditAccount.objects.get(user=volume.owner).balance == Decimal("-0.180000")  # 10 GiB × 5 h


def test_the_beat_task_writes_storage_charges():
    now = timezone.now()
    start = now.replace(minute=0, second=0, microsecond=0) - 3 * HOUR  # a period boundary three periods back
    volume = VolumeFactory()
    storage_charges.holding_open(volume=volume, account=account_for(volume.owner), quota_gb=10, at=start)
    assert tasks.close_billing_periods() >= 2
    written = storage_entries(volume)
    assert written[0].period_start == start and len(written) >= 2
    assert all(e.amount == Decimal("-0.036000") and e.period_end <= timezone.now() - SETTLE for e in written)  # 10 GiB × 1 h
    assert tasks.close_billing_periods() == 0


def test_a_pool_outlives_the_charges_of_its_deleted_volumes():
    """A pool's deletion removes its deleted volumes' rows: refused until their storage is charged; the charges stay."""
    from storage import services
    from tests.storage.kube import pool_cluster

    pool = services.pool_create(name="p", cluster=pool_cluster(), storage_class="nfs-a", manual_capacity_gb=100)
    volume = services.volume_create(owner=UserFactory(), name="v", quota_gb=10)
    services.volume_delete(volume=volume)
    with pytest.raises(services.PoolInUse) as refused:
        services.pool_delete(pool=pool)
    assert "not charged yet" in refused.value.detail
    held = StorageHolding.objects.get(volume=volume)
    StorageHolding.objects.filter(pk=held.pk).update(start=held.end - HOUR, charged_until=held.end - HOUR)  # held for an hour
    storage_charges.storage_charges_close(now=held.end + 2 * HOUR + SETTLE)
    services.pool_delete(pool=pool)
    assert not StorageHolding.objects.exists()
    kept = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.STORAGE, volume=volume.public_id)
    assert sum(e.amount for e in kept) == Decimal("-0.036000")  # 10 GiB × 3600 s, the rows outlive the volume's
