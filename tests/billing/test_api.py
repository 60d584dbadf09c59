"""Billing API over HTTP: the account (balance, holds, available, burn rate), the ledger (own entries, filters,
paging, constant queries) and staff grants (Idempotency-Key, 201 then 200, 409, amounts never through floats)."""

import threading
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing import services
from billing.models import CreditAccount, LedgerEntry, Policy, Price
from identity.tokens import api_token_create
from sessions.models import Allocation
from tests.clock import period_text
from tests.factories import SessionFactory
from tests.helpers import T0, Http, device, run_threads

pytestmark = pytest.mark.django_db


def grant(http: Http, body: dict | str, key: str | None = "key-1"):
    """POST a grant; a ``str`` body is sent as raw JSON text (numbers exactly as written)."""
    headers = {"Idempotency-Key": key} if key is not None else {}
    if isinstance(body, str):
        return http.post("/api/v1/billing/grants", data=body.encode(), headers={**headers, "Content-Type": "application/json"})
    return http.post("/api/v1/billing/grants", json=body, headers=headers)


def test_account_of_a_user_without_one_is_zero_and_creates_nothing(http_user):
    body = http_user.get("/api/v1/billing/account").json()
    assert body == {"user": "alice", "balance": "0.000000", "accrued": "0.000000", "holds": "0.000000", "available": "0.000000",
                    "burn_rate_per_hour": "0.000000", "credits_last_until": None, "below_zero_since": None}
    assert not CreditAccount.objects.exists()


def test_account_balance_holds_available_and_burn_rate(http_user, plain_user, lab_c1):
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1.2"))
    Price.objects.create(gpu_model="NVIDIA H100 80GB HBM3", credits_per_gpu_hour=Decimal("2.5"))
    Policy.objects.create(user=plain_user, min_balance_hours=Decimal(2))
    h100s = list(lab_c1.devices.filter(model="NVIDIA H100 80GB HBM3").order_by("index")[:2])
    whole = SessionFactory(cluster=lab_c1, owner=plain_user)
    Allocation.objects.create(session=whole, device=h100s[0], memory_mib=h100s[0].memory_mib, cores=100, exclusive=True)
    shared = SessionFactory(cluster=lab_c1, owner=plain_user, gpu_memory_mib=20000, gpu_cores=10)
    Allocation.objects.create(session=shared, device=h100s[1], memory_mib=20000, cores=10)
    SessionFactory(cluster=lab_c1, owner=plain_user, phase="Scheduled", gpu_memory_mib=8192)  # live, nothing reserved
    SessionFactory(cluster=lab_c1, owner=plain_user, phase="Terminated")  # ended: neither holds nor burns
    SessionFactory(cluster=lab_c1)  # someone else's
    services.credit_grant(user=plain_user, amount="10", reason="t", idempotency_key="k", created_by="test")
    body = http_user.get("/api/v1/billing/account").json()
    # Burn: whole H100 2.5 + share 0.245221 × 2.5 = 0.6130525 -> 0.613052. Holds: (2.5 + 0.613052 + 1 GPU at the
    # default 1.2, its share 1 with no device known) × 2 h.
    assert body["burn_rate_per_hour"] == "3.113052"
    assert body["holds"] == "8.626104"
    assert (body["balance"], body["available"], body["below_zero_since"]) == ("10.000000", "1.373896", None)


def test_staff_reads_another_users_account(http, plain_user, http_user):
    services.credit_grant(user=plain_user, amount="3", reason="t", idempotency_key="k", created_by="test")
    assert http.get("/api/v1/billing/account?user=alice").json()["balance"] == "3.000000"
    assert http.get("/api/v1/billing/account?user=nobody").status_code == 404
    assert http_user.get("/api/v1/billing/account?user=admin").json()["user"] == "alice"  # others: their own


def _entries(user, n: int, *, session=None, start=None):
    start = start or timezone.now() - timedelta(days=1)
    account = services.account_for(user)
    for i in range(n):
        entry, _ = services.ledger_append(account=account, kind="charge" if session else "grant",
                                          amount=Decimal("-1") if session else Decimal("2"),
                                          idempotency_key=f"{user.pk}:{session.pk if session else 'g'}:{i}", session=session)
        LedgerEntry.objects.filter(pk=entry.pk).update(created_at=start + timedelta(hours=i))


def test_ledger_lists_own_entries_newest_first_with_filters(http_user, plain_user, staff_user, lab_c1):
    session = SessionFactory(cluster=lab_c1, owner=plain_user)
    start = timezone.now() - timedelta(days=1)
    _entries(plain_user, 3, start=start)
    _entries(plain_user, 2, session=session, start=start + timedelta(minutes=30))
    _entries(staff_user, 4)
    body = http_user.get("/api/v1/billing/ledger").json()
    assert body["count"] == 5 and [e["user"] for e in body["results"]] == ["alice"] * 5
    assert [e["id"] for e in body["results"]] == sorted((e["id"] for e in body["results"]), reverse=True)
    charge = body["results"][0]
    assert set(charge) == {"id", "user", "kind", "amount", "balance_after", "session", "volume", "period_start", "period_end", "sample_count",
                           "window_start", "window_end", "gpu_seconds", "idle_credits", "reason", "created_by", "idempotency_key",
                           "created_at"}
    assert (charge["kind"], charge["amount"], charge["session"], charge["balance_after"]) == ("charge", "-1.000000", session.public_id, "4.000000")
    only = http_user.get(f"/api/v1/billing/ledger?session={session.public_id}").json()
    assert only["count"] == 2 and {e["session"] for e in only["results"]} == {session.public_id}
    since = (start + timedelta(hours=1)).isoformat()
    until = (start + timedelta(hours=2)).isoformat()
    window = http_user.get("/api/v1/billing/ledger", params={"since": since, "until": until}).json()
    # Grants at +0 h, +1 h, +2 h and charges at +0.5 h, +1.5 h: [+1 h, +2 h) holds the +1 h grant and the +1.5 h charge.
    assert window["count"] == 2
    paged = http_user.get("/api/v1/billing/ledger?limit=2&offset=2").json()
    assert paged["count"] == 5 and len(paged["results"]) == 2 and paged["next"] and paged["previous"] is not None


def test_ledger_staff_see_their_own_by_default_and_filter_by_user(http, plain_user, staff_user, http_user):
    _entries(plain_user, 2)
    _entries(staff_user, 3)
    own = http.get("/api/v1/billing/ledger").json()
    assert own["count"] == 3 and {e["user"] for e in own["results"]} == {"admin"}
    assert http.get("/api/v1/billing/ledger?user=alice").json()["count"] == 2
    assert http_user.get("/api/v1/billing/ledger?user=admin").json()["count"] == 2  # ignored for non-staff


@pytest.mark.parametrize("value", ["yesterday", "2026-11-29T16:00:00"])
def test_ledger_times_need_a_zone(http_user, value):
    response = http_user.get("/api/v1/billing/ledger", params={"since": value})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request" and "since" in response.json()["detail"]


def test_ledger_queries_do_not_grow_with_the_page(plain_user, staff_user, lab_c1, client):
    _entries(plain_user, 40, session=SessionFactory(cluster=lab_c1, owner=plain_user))
    _entries(staff_user, 5)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(username=staff_user.username)[1]}"}
    client.get("/api/v1/billing/ledger?limit=1", **auth)  # the token's first use is recorded once
    seen = []
    for limit in (2, 40):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(f"/api/v1/billing/ledger?limit={limit}&user=alice", **auth)
        assert response.status_code == 200 and len(response.json()["results"]) == limit
        seen.append(len(queries))
    assert seen[0] == seen[1], seen


def test_grants_are_staff_only(http_user, plain_user):
    response = grant(http_user, {"user": "alice", "amount": "5", "reason": "me"})
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    assert not LedgerEntry.objects.exists()


def test_grant_needs_an_idempotency_key(http, plain_user):
    for key in (None, ""):
        response = grant(http, {"user": "alice", "amount": "5", "reason": "x"}, key=key)
        assert response.status_code == 400 and response.json()["code"] == "idempotency_key_missing"
    assert not LedgerEntry.objects.exists()


def test_a_retried_grant_returns_the_same_entry(http, plain_user):
    body = {"user": "alice", "amount": "10.5", "reason": "course credits"}
    first = grant(http, body, key="retry-me")
    assert first.status_code == 201, first.text
    entry = first.json()
    assert (entry["user"], entry["kind"], entry["amount"], entry["balance_after"], entry["created_by"]) == (
        "alice", "grant", "10.500000", "10.500000", "api:admin")
    again = grant(http, body, key="retry-me")
    assert again.status_code == 200 and again.json() == entry
    assert CreditAccount.objects.get(user=plain_user).balance == Decimal("10.5") and LedgerEntry.objects.count() == 1
    reused = grant(http, {**body, "amount": "11"}, key="retry-me")
    assert reused.status_code == 409 and reused.json()["code"] == "idempotency_key_reused" and reused.json()["entry"] == entry["id"]
    assert LedgerEntry.objects.count() == 1


@pytest.mark.parametrize(
    ("amount", "status", "stored"),
    [
        ("10.1", 201, "10.100000"),
        ("12345678901.123456", 201, "12345678901.123456"),  # through a float it would be 12345678901.123455
        ("7", 201, "7.000000"),
        ('"0.000001"', 201, "0.000001"),
        ('"12345678901.123456"', 201, "12345678901.123456"),
        ('"1.0000001"', 400, None),
        ("1.0000001", 400, None),
        ("0", 400, None),
        ('"-3"', 400, None),
        ('"ten"', 400, None),
        ("true", 400, None),
        ("null", 400, None),
        ("1e400", 400, None),
    ],
)
def test_grant_amounts(http, plain_user, amount, status, stored):
    """``amount`` as the JSON text of the body (numbers or strings)."""
    response = grant(http, f'{{"user": "alice", "amount": {amount}, "reason": "x"}}', key=str(uuid.uuid4()))
    assert response.status_code == status, response.text
    if stored:
        assert response.json()["amount"] == stored
        assert CreditAccount.objects.get(user=plain_user).balance == Decimal(stored)
    else:
        assert response.json()["code"] in ("invalid_amount", "invalid_request")
        assert not LedgerEntry.objects.exists()


def test_grant_to_an_unknown_user_or_without_reason(http, plain_user):
    unknown = grant(http, {"user": "nobody", "amount": "1", "reason": "x"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "user_not_found"
    missing = grant(http, {"user": "alice", "amount": "1"})
    assert missing.status_code == 400 and missing.json()["code"] == "invalid_request" and "reason" in missing.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_grants_over_http_keep_the_books(live_server, staff_token, plain_user):
    """Twelve requests at once, two per key: six grants, and the balance is the ledger's sum."""
    results, errors = [], []
    barrier = threading.Barrier(12)

    def send(n: int) -> None:
        try:
            barrier.wait()
            results.append(grant(Http(live_server.url, staff_token), {"user": "alice", "amount": "1.5", "reason": "x"}, key=f"k{n % 6}"))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    run_threads(send, [(n,) for n in range(12)], timeout=120)
    assert not errors and sorted(r.status_code for r in results) == [200] * 6 + [201] * 6, [r.text for r in results]
    account = CreditAccount.objects.get(user=plain_user)
    assert account.balance == Decimal(9) == LedgerEntry.objects.filter(account=account).aggregate(s=Sum("amount"))["s"]


def test_usage_charges_show_in_the_ledger(http_user, plain_user, lab_c1, http_for):
    from clusters.operator_token.tokens import operator_token_mint
    from tests.helpers import metered_session, sample

    session = metered_session(lab_c1, owner=plain_user)
    operator = http_for(operator_token_mint(cluster_id=lab_c1.public_id))
    h100 = device(lab_c1, "NVIDIA H100")
    # Two samples of T0's hour: accrued, not charged yet (the period is open), held against the balance.
    minutes = [sample(session, h100, start=T0 + timedelta(minutes=m)) for m in (0, 59)]
    assert operator.post("/internal/v1/usage", json={"samples": minutes}).status_code == 200
    assert http_user.get(f"/api/v1/billing/ledger?session={session.public_id}").json()["count"] == 0
    account = http_user.get("/api/v1/billing/account").json()
    assert (account["balance"], account["accrued"], account["available"]) == ("0.000000", "0.033334", "-0.033334")
    assert account["below_zero_since"] is not None
    [accrual] = http_user.get("/api/v1/billing/accruals").json()["results"]
    assert accrual == {"session": session.public_id, "period_start": iso_z(T0), "period_end": iso_z(T0 + timedelta(hours=1)),
                       "amount": "0.033334", "gpu_seconds": "120.000000", "sample_count": 2, "window_start": iso_z(T0),
                       "window_end": iso_z(T0 + timedelta(hours=1))}
    # A sample of the next hour closes T0's: one charge naming its period and its two samples.
    nxt = sample(session, h100, start=T0 + timedelta(hours=1))
    assert operator.post("/internal/v1/usage", json={"samples": [nxt]}).status_code == 200
    [entry] = http_user.get(f"/api/v1/billing/ledger?session={session.public_id}").json()["results"]
    assert (entry["kind"], entry["amount"], entry["created_by"], entry["gpu_seconds"]) == ("charge", "-0.033334", "usage", "120.000000")
    assert (entry["period_start"], entry["period_end"], entry["sample_count"]) == (iso_z(T0), iso_z(T0 + timedelta(hours=1)), 2)
    assert (entry["window_start"], entry["window_end"]) == (iso_z(T0), iso_z(T0 + timedelta(hours=1)))
    assert entry["reason"] == f"Usage {period_text(T0, T0 + timedelta(hours=1))} UTC: 2 sample(s) on lab-c1"
    account = http_user.get("/api/v1/billing/account").json()
    assert (account["balance"], account["accrued"], account["available"]) == ("-0.033334", "0.016667", "-0.050001")
    assert http_user.get("/api/v1/billing/accruals").json()["results"][0]["sample_count"] == 1


def iso_z(when) -> str:
    """A time as the API renders it (DRF: ISO 8601, UTC as ``Z``)."""
    return when.isoformat().replace("+00:00", "Z")


def test_accruals_of_others_are_for_staff_only(http_user, http, plain_user, staff_user, lab_c1, http_for):
    from clusters.operator_token.tokens import operator_token_mint
    from tests.helpers import metered_session, sample

    session = metered_session(lab_c1, owner=staff_user)
    operator = http_for(operator_token_mint(cluster_id=lab_c1.public_id))
    assert operator.post("/internal/v1/usage", json={"samples": [sample(session, device(lab_c1, "NVIDIA H100"))]}).status_code == 200
    assert http_user.get("/api/v1/billing/accruals", params={"user": staff_user.username}).json()["count"] == 0
    assert http.get("/api/v1/billing/accruals").json()["count"] == 1
    assert http.get("/api/v1/billing/accruals", params={"user": "alice"}).json()["count"] == 0
    assert http.get("/api/v1/billing/account", params={"user": staff_user.username}).json()["accrued"] == "0.016667"


def test_account_queries_do_not_grow_with_the_sessions(plain_user, lab_c1, client):
    Policy.objects.create(user=plain_user, min_balance_hours=Decimal(1))
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_token_create(username=plain_user.username)[1]}"}
    client.get("/api/v1/billing/account", **auth)  # the token's first use is recorded once
    gpus = iter(lab_c1.devices.order_by("pk"))
    counts = []
    for n in (1, 6):
        for _ in range(n):
            session = SessionFactory(cluster=lab_c1, owner=plain_user, gpus=1)
            gpu = next(gpus)
            Allocation.objects.create(session=session, device=gpu, memory_mib=gpu.memory_mib, cores=100, exclusive=True)
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/v1/billing/account", **auth).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_ledger_filters_outside_utc_are_refused_not_500(http_user, value):
    response = http_user.get("/api/v1/billing/ledger", params={"since": value})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"


@pytest.mark.parametrize("amount", ["١", "١٢.5", "１０", "5\u0660"])
def test_credit_amounts_take_ascii_digits_only(http, plain_user, amount):
    response = http.post("/api/v1/billing/grants", json={"user": "alice", "amount": amount, "reason": "digits"},
                         headers={"Idempotency-Key": f"k-{amount.encode().hex()}"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_amount", response.text
    assert not LedgerEntry.objects.exists()
