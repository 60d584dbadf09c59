"""billing.services: accounts, the ledger (idempotent, balance = sum of entries, below_zero_since), grants, prices and
policies; concurrent grants with threads on PostgreSQL."""

import threading
from decimal import Decimal

import pytest
from django.db import connections
from django.db.models import Sum

from billing import services
from billing.models import CreditAccount, LedgerEntry, Policy, Price
from core.exceptions import ApplicationError
from tests.factories import UserFactory
from tests.helpers import run_threads


def assert_books(account: CreditAccount) -> None:
    """The balance equals the sum of the ledger, and each entry's balance_after is the running sum."""
    account.refresh_from_db()
    entries = list(LedgerEntry.objects.filter(account=account).order_by("id").values_list("amount", "balance_after"))
    running = Decimal(0)
    for amount, after in entries:
        running += amount
        assert after == running
    assert account.balance == running == (LedgerEntry.objects.filter(account=account).aggregate(s=Sum("amount"))["s"] or 0)


@pytest.mark.django_db
class TestLedger:
    def test_account_for_creates_once(self):
        user = UserFactory()
        first = services.account_for(user)
        assert services.account_for(user).pk == first.pk and first.balance == 0
        assert CreditAccount.objects.filter(user=user).count() == 1

    def test_append_moves_the_balance_and_records_it(self):
        account = services.account_for(UserFactory())
        entry, created = services.ledger_append(account=account, kind="grant", amount=Decimal("10.5"), idempotency_key="g1",
                                                reason="start", created_by="test")
        assert created and entry.balance_after == Decimal("10.5") and entry.reason == "start"
        services.ledger_append(account=account, kind="charge", amount=Decimal("-0.000001"), idempotency_key="c1")
        assert_books(account)
        assert account.balance == Decimal("10.499999")

    def test_same_key_returns_the_same_entry_and_changes_nothing(self):
        account = services.account_for(UserFactory())
        first, created = services.ledger_append(account=account, kind="grant", amount=Decimal(5), idempotency_key="same")
        again, created_again = services.ledger_append(account=account, kind="grant", amount=Decimal("5.000000"), idempotency_key="same")
        assert created and not created_again and again.pk == first.pk
        assert LedgerEntry.objects.count() == 1
        assert_books(account)

    @pytest.mark.parametrize("change", [{"amount": Decimal(6)}, {"kind": "refund"}, {"other_account": True}])
    def test_a_reused_key_for_another_movement_is_409(self, change):
        account = services.account_for(UserFactory())
        services.ledger_append(account=account, kind="grant", amount=Decimal(5), idempotency_key="k")
        target = services.account_for(UserFactory()) if change.get("other_account") else account
        with pytest.raises(ApplicationError) as refused:
            services.ledger_append(account=target, kind=change.get("kind", "grant"), amount=change.get("amount", Decimal(5)),
                                   idempotency_key="k")
        assert (refused.value.status, refused.value.code) == (409, "idempotency_key_reused")
        assert LedgerEntry.objects.count() == 1
        assert_books(account)
        assert_books(target)

    def test_below_zero_since_is_set_kept_and_cleared(self):
        account = services.account_for(UserFactory())
        services.ledger_append(account=account, kind="charge", amount=Decimal("-1"), idempotency_key="c1")
        account.refresh_from_db()
        since = account.below_zero_since
        assert account.balance == -1 and since is not None
        services.ledger_append(account=account, kind="charge", amount=Decimal("-1"), idempotency_key="c2")
        account.refresh_from_db()
        assert account.below_zero_since == since  # still below: the grace keeps counting from the first time
        services.ledger_append(account=account, kind="grant", amount=Decimal("1.5"), idempotency_key="g1")
        account.refresh_from_db()
        assert account.balance == Decimal("-0.5") and account.below_zero_since == since
        services.ledger_append(account=account, kind="grant", amount=Decimal("0.5"), idempotency_key="g2")
        account.refresh_from_db()
        assert account.balance == 0 and account.below_zero_since is None  # back at zero: cleared

    @pytest.mark.parametrize(
        ("kind", "amount"),
        [("grant", Decimal("-1")), ("refund", Decimal("-1")), ("charge", Decimal("1")), ("grant", Decimal("0.0000001")),
         ("grant", Decimal("NaN")), ("grant", Decimal("1e12"))],
    )
    def test_wrong_amounts_are_refused(self, kind, amount):
        account = services.account_for(UserFactory())
        with pytest.raises(ApplicationError) as refused:
            services.ledger_append(account=account, kind=kind, amount=amount, idempotency_key="x")
        assert refused.value.code == "invalid_amount"
        assert not LedgerEntry.objects.exists()


@pytest.mark.django_db
class TestGrants:
    def test_grant_creates_the_account_and_is_idempotent(self):
        user = UserFactory()
        entry, created = services.credit_grant(user=user, amount="10.5", reason="welcome", idempotency_key="abc", created_by="api:admin")
        assert created and entry.kind == "grant" and entry.amount == Decimal("10.5") and entry.idempotency_key == "grant:abc"
        assert entry.created_by == "api:admin"
        again, created = services.credit_grant(user=user, amount=Decimal("10.500000"), reason="welcome", idempotency_key="abc",
                                               created_by="api:admin")
        assert not created and again.pk == entry.pk
        assert_books(user.credit_account)
        assert user.credit_account.balance == Decimal("10.5")

    @pytest.mark.parametrize("amount", ["0", "-1", "1.0000001", "abc", "", True, None, "Infinity", [1], "1e13"])
    def test_invalid_amounts(self, amount):
        with pytest.raises(ApplicationError) as refused:
            services.credit_grant(user=UserFactory(), amount=amount, reason="x", idempotency_key="k", created_by="t")
        assert (refused.value.status, refused.value.code) == (400, "invalid_amount")
        assert not LedgerEntry.objects.exists()

    def test_amounts_never_go_through_binary_floats(self):
        user = UserFactory()
        entry, _ = services.credit_grant(user=user, amount=0.1, reason="x", idempotency_key="f", created_by="t")
        assert entry.amount == Decimal("0.1")  # Decimal(str(0.1)), not Decimal(0.1) = 0.1000000000000000055...
        entry, _ = services.credit_grant(user=user, amount=123456789012, reason="x", idempotency_key="i", created_by="t")
        assert entry.amount == Decimal("123456789012")

    @pytest.mark.parametrize(("key", "code"), [("", "idempotency_key_missing"), ("   ", "idempotency_key_missing"),
                                               ("x" * 151, "invalid_request"), ("a\nb", "invalid_request")])
    def test_keys(self, key, code):
        with pytest.raises(ApplicationError) as refused:
            services.credit_grant(user=UserFactory(), amount="1", reason="x", idempotency_key=key, created_by="t")
        assert (refused.value.status, refused.value.code) == (400, code)


@pytest.mark.django_db
class TestPricesAndPolicies:
    def test_price_set_upserts(self):
        price = services.price_set(gpu_model="Tesla T4", credits_per_gpu_hour="0.35")
        assert services.price_set(gpu_model="Tesla T4", credits_per_gpu_hour=Decimal("0.4")).pk == price.pk
        assert Price.objects.get(gpu_model="Tesla T4").credits_per_gpu_hour == Decimal("0.4")
        assert services.price_set(gpu_model="", credits_per_gpu_hour=0).gpu_model == ""
        with pytest.raises(ApplicationError) as refused:
            services.price_set(gpu_model="Tesla T4", credits_per_gpu_hour="-1")
        assert refused.value.code == "invalid_amount"

    def test_policy_validate(self):
        services.policy_validate(policy=Policy(max_sessions=1, max_gpus=None, min_balance_hours=Decimal(0)))
        for bad in (Policy(max_sessions=0), Policy(max_gpus=0), Policy(min_balance_hours=Decimal(-1))):
            with pytest.raises(ApplicationError):
                services.policy_validate(policy=bad)


@pytest.mark.django_db(transaction=True)
def test_concurrent_grants_and_charges_keep_the_balance_equal_to_the_ledger():
    """Eight threads append to one account at once (some with the same keys): every distinct key once, and the
    balance is the ledger's sum with exact running balances."""
    user = UserFactory()
    account = services.account_for(user)
    errors = []
    barrier = threading.Barrier(8)

    def work(n: int) -> None:
        try:
            barrier.wait()
            for i in range(15):
                key = f"g{(n * 15 + i) % 60}"  # threads n and n+4 use the same keys: each applied once
                services.credit_grant(user=user, amount=Decimal("1.000001"), reason="t", idempotency_key=key, created_by="test")
                services.ledger_append(account=account, kind="charge", amount=Decimal("-0.25"), idempotency_key=f"c{n}:{i}")
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(work, [(n,) for n in range(8)], timeout=120)
    assert not errors, errors
    assert LedgerEntry.objects.filter(kind="grant").count() == 60
    assert LedgerEntry.objects.filter(kind="charge").count() == 120
    assert_books(account)
    assert account.balance == Decimal("60.000060") - 30


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_grants_create_one_account():
    user = UserFactory()
    errors = []
    barrier = threading.Barrier(6)

    def work(n: int) -> None:
        try:
            barrier.wait()
            services.credit_grant(user=user, amount="1", reason="t", idempotency_key=f"first-{n}", created_by="test")
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(work, [(n,) for n in range(6)], timeout=60)
    assert not errors, errors
    assert CreditAccount.objects.filter(user=user).count() == 1
    assert_books(CreditAccount.objects.get(user=user))
    assert CreditAccount.objects.get(user=user).balance == 6


@pytest.mark.django_db
def test_a_balance_beyond_the_column_is_refused_with_nothing_written():
    from billing.services import MAX_BALANCE, BalanceOutOfRange, account_for, credit_grant

    user = UserFactory()
    credit_grant(user=user, amount=Decimal("999999999999"), reason="big", idempotency_key="big-1", created_by="test")
    with pytest.raises(BalanceOutOfRange):
        credit_grant(user=user, amount=Decimal("999999999999"), reason="bigger", idempotency_key="big-2", created_by="test")
    account = account_for(user)
    assert account.balance == Decimal("999999999999") <= MAX_BALANCE
    assert account.entries.count() == 1
