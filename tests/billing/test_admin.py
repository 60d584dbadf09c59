"""Console pages for credits: constant queries, read-only balances and ledger, the "Grant credits" action (through
credit_grant, once per form), prices and policies validated by the services."""

import logging
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditRecord
from billing import ingest, services
from billing.models import CreditAccount, LedgerEntry, Policy, Price, UsageSample
from core.exceptions import ApplicationError
from tests.clock import period_text
from tests.console_checks import assert_read_only, page_text
from tests.factories import ClusterFactory, UserFactory
from tests.helpers import T0, device, metered_session, sample

pytestmark = pytest.mark.django_db

#: The idle policy fields of the policy form, at their defaults.
IDLE = {"idle_timeout_minutes": "60", "idle_warning_minutes": "15", "max_runtime_hours": "24", "runtime_warning_minutes": "15"}


def _grow(lab_c1=None):
    """More of everything each page lists: a user with a policy, a grant, usage charges, a price."""
    user = UserFactory()
    services.credit_grant(user=user, amount="5", reason="grow", idempotency_key=f"grow-{user.pk}", created_by="test")
    Policy.objects.create(user=user, max_sessions=2).allowed_clusters.set([ClusterFactory()])
    Price.objects.create(gpu_model=f"model-{user.pk}", credits_per_gpu_hour=Decimal(1))
    if lab_c1 is not None:
        session = metered_session(lab_c1, owner=user)
        ingest.usage_ingest(cluster=lab_c1, samples=[sample(session, device(lab_c1, "NVIDIA H100"), start=T0 + timedelta(minutes=i))
                                                       for i in range(3)])


@pytest.mark.parametrize("path", ["/billing/creditaccount/", "/billing/ledgerentry/", "/billing/price/", "/billing/policy/",
                                  "/billing/usagesample/"])
def test_list_pages_have_constant_queries(console, lab_c1, path):
    counts = []
    for _ in range(2):
        _grow(lab_c1)
        with CaptureQueriesContext(connection) as queries:
            response = console.get(path)
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_the_index_lists_billing(console):
    html = console.get("/").content.decode()
    for path in ("/billing/creditaccount/", "/billing/ledgerentry/", "/billing/price/", "/billing/policy/"):
        assert path in html


def test_ledger_is_read_only(console):
    _grow()
    entry = LedgerEntry.objects.get()
    assert console.get("/billing/ledgerentry/add/").status_code == 403
    page = console.get(f"/billing/ledgerentry/{entry.pk}/change/")
    assert page.status_code == 200 and 'name="amount"' not in page.content.decode()
    assert console.post(f"/billing/ledgerentry/{entry.pk}/change/", {"amount": "100"}).status_code == 403
    assert console.post(f"/billing/ledgerentry/{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    entry.refresh_from_db()
    assert entry.amount == Decimal(5)


def test_account_balance_is_read_only(console):
    _grow()
    account = CreditAccount.objects.get()
    page = console.get(f"/billing/creditaccount/{account.pk}/change/").content.decode()
    assert 'name="balance"' not in page and "5.000000" in page
    assert console.post(f"/billing/creditaccount/{account.pk}/change/", {"balance": "1000"}).status_code == 403
    account.refresh_from_db()
    assert account.balance == 5


def test_add_account_goes_through_account_for(console):
    user = UserFactory()
    response = console.post("/billing/creditaccount/add/", {"user": user.pk})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert CreditAccount.objects.get(user=user).balance == 0


def test_grant_action_with_an_intermediate_form(console, staff_user):
    users = [UserFactory(), UserFactory()]
    accounts = [services.account_for(u) for u in users]
    selected = [a.pk for a in accounts]
    page = console.post("/billing/creditaccount/", {"action": "grant_credits", "_selected_action": selected})
    assert page.status_code == 200
    html = page.content.decode()
    assert "Grant credits" in html and users[0].username in html and 'name="amount"' in html
    key = page.context["form"].initial["idempotency_key"]
    form = {"action": "grant_credits", "_selected_action": selected, "apply": "1", "amount": "12.5", "reason": "course",
            "idempotency_key": key}
    done = console.post("/billing/creditaccount/", form, follow=True)
    assert done.status_code == 200 and "12.500000 credits granted" in done.content.decode()
    for account in accounts:
        account.refresh_from_db()
        assert account.balance == Decimal("12.5")
    entry = LedgerEntry.objects.filter(account=accounts[0]).get()
    assert (entry.kind, entry.reason, entry.created_by) == ("grant", "course", f"console:{staff_user.username}")
    # The same page submitted again (a double click, a browser retry): nothing more.
    again = console.post("/billing/creditaccount/", form, follow=True)
    assert "already granted" in again.content.decode()
    assert LedgerEntry.objects.count() == 2
    # A wrong amount shows the form again with the services' message; nothing is written.
    bad = console.post("/billing/creditaccount/", {**form, "amount": "-1", "idempotency_key": "other"})
    assert bad.status_code == 200 and "greater than 0" in bad.content.decode()
    assert LedgerEntry.objects.count() == 2


def test_grant_action_needs_the_permission_to_add_ledger_entries(client, django_user_model):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename__in=["view_creditaccount", "view_ledgerentry"]))
    client.force_login(viewer)
    account = services.account_for(UserFactory())
    page = client.get("/billing/creditaccount/")
    assert page.status_code == 200 and "grant_credits" not in page.content.decode()
    client.post("/billing/creditaccount/", {"action": "grant_credits", "_selected_action": [account.pk], "apply": "1", "amount": "1",
                                            "reason": "x", "idempotency_key": "k"})
    assert not LedgerEntry.objects.exists()


def test_price_form_uses_the_services_rules(console):
    ok = console.post("/billing/price/add/", {"gpu_model": "Tesla T4", "credits_per_gpu_hour": "0.35"})
    assert ok.status_code == 302
    bad = console.post("/billing/price/add/", {"gpu_model": "NVIDIA L4", "credits_per_gpu_hour": "-1"})
    assert bad.status_code == 200 and "at least 0" in bad.content.decode()
    default = console.post("/billing/price/add/", {"gpu_model": "", "credits_per_gpu_hour": "1"})
    assert default.status_code == 302 and Price.objects.filter(gpu_model="").exists()
    assert "(default" in console.get("/billing/price/").content.decode()


def test_policy_form_uses_the_services_rules(console):
    user = UserFactory()
    bad = console.post("/billing/policy/add/", {"user": user.pk, "max_sessions": "0", "min_balance_hours": "1", "grace_seconds": "900", **IDLE})
    assert bad.status_code == 200 and "max_sessions must be at least 1" in bad.content.decode()
    ok = console.post("/billing/policy/add/", {"user": user.pk, "max_sessions": "2", "min_balance_hours": "1.5", "grace_seconds": "600", **IDLE})
    assert ok.status_code == 302
    assert Policy.objects.get(user=user).min_balance_hours == Decimal("1.5")
    default = console.post("/billing/policy/add/", {"min_balance_hours": "0", "grace_seconds": "900", **IDLE})
    assert default.status_code == 302
    second_default = console.post("/billing/policy/add/", {"min_balance_hours": "1", "grace_seconds": "900", **IDLE})
    assert second_default.status_code == 200 and Policy.objects.filter(user__isnull=True).count() == 1


# --------------------------------------------------------------------------- read-only records, forms through the services


def test_ledger_entries_usage_samples_and_accounts_cannot_be_changed_or_deleted(console, lab_c1):
    _grow(lab_c1)
    assert_read_only(console, "/billing/ledgerentry/", LedgerEntry.objects.first())
    assert_read_only(console, "/billing/usagesample/", UsageSample.objects.first())
    account = CreditAccount.objects.get()
    assert console.post(f"/billing/creditaccount/{account.pk}/delete/", {"post": "yes"}).status_code == 403
    action = console.post("/billing/creditaccount/", {"action": "delete_selected", "_selected_action": [account.pk], "post": "yes", "index": 0})
    assert action.status_code == 403
    assert CreditAccount.objects.filter(pk=account.pk).exists()


@pytest.mark.django_db
def test_grant_form_refuses_what_the_grants_api_refuses(console, http):
    user = UserFactory()
    account = services.account_for(user)
    for amount in ("0.0000001", "-1", "ten", "1000000000000"):
        api = http.post("/api/v1/billing/grants", json={"user": user.username, "amount": amount, "reason": "x"},
                        headers={"Idempotency-Key": f"api-{amount}"})
        assert api.status_code == 400 and api.json()["code"] == "invalid_amount", api.text
        page = console.post("/billing/creditaccount/", {"action": "grant_credits", "_selected_action": [account.pk], "apply": "1",
                                                        "amount": amount, "reason": "x", "idempotency_key": f"console-{amount}"})
        assert page.status_code == 200 and api.json()["detail"] in page_text(page)
    assert not LedgerEntry.objects.exists()
    done = console.post("/billing/creditaccount/", {"action": "grant_credits", "_selected_action": [account.pk], "apply": "1",
                                                    "amount": "2.5", "reason": "course", "idempotency_key": "ok"}, follow=True)
    assert "2.500000 credits granted" in page_text(done)
    assert LedgerEntry.objects.get().idempotency_key == f"grant:console:ok:{user.pk}"


def _refusal(call) -> str:
    """The detail of the ApplicationError ``call()`` raises (the service's own words)."""
    with pytest.raises(ApplicationError) as refused:
        call()
    return refused.value.detail


def test_price_form_refuses_what_price_set_refuses_and_saves_and_deletes_through_it(console, caplog):
    caplog.set_level(logging.INFO, logger="billing.services")
    for value in ("-1", "0.0000001", "cheap", "1000000000000"):
        detail = _refusal(lambda value=value: services.price_set(gpu_model="NVIDIA L4", credits_per_gpu_hour=value))
        page = console.post("/billing/price/add/", {"gpu_model": "NVIDIA L4", "credits_per_gpu_hour": value})
        assert page.status_code == 200 and detail in page_text(page), value
    assert not Price.objects.exists()

    assert console.post("/billing/price/add/", {"gpu_model": "NVIDIA L4", "credits_per_gpu_hour": "0.35"}).status_code == 302
    price = Price.objects.get(gpu_model="NVIDIA L4")
    assert price.credits_per_gpu_hour == Decimal("0.35") and "price set: NVIDIA L4" in caplog.text
    page = console.get(f"/billing/price/{price.pk}/change/").content.decode()
    assert 'name="gpu_model"' not in page  # a price belongs to its model
    refused = console.post(f"/billing/price/{price.pk}/change/", {"credits_per_gpu_hour": "-2"})
    assert refused.status_code == 200 and Price.objects.get(pk=price.pk).credits_per_gpu_hour == Decimal("0.35")
    assert console.post(f"/billing/price/{price.pk}/change/", {"credits_per_gpu_hour": "0.5"}).status_code == 302
    assert Price.objects.get(pk=price.pk).credits_per_gpu_hour == Decimal("0.5")

    assert console.post(f"/billing/price/{price.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Price.objects.exists() and "price deleted: NVIDIA L4" in caplog.text
    rows = [services.price_set(gpu_model=model, credits_per_gpu_hour=1) for model in ("Tesla T4", "")]
    console.post("/billing/price/", {"action": "delete_selected", "_selected_action": [r.pk for r in rows], "post": "yes", "index": 0})
    assert not Price.objects.exists() and "price deleted: Tesla T4" in caplog.text


def test_policy_form_refuses_what_policy_set_refuses_and_saves_and_deletes_through_it(console, caplog):
    caplog.set_level(logging.INFO, logger="billing.services")
    user, cluster = UserFactory(), ClusterFactory()
    form = {"user": user.pk, "max_sessions": "2", "max_gpus": "", "allowed_clusters": [cluster.pk], "min_balance_hours": "1", "grace_seconds": "900", **IDLE}
    for field, value, kwargs in (("max_sessions", "0", {"max_sessions": 0}), ("max_gpus", "0", {"max_gpus": 0})):
        detail = _refusal(lambda kwargs=kwargs: services.policy_set(user=user, **kwargs))
        page = console.post("/billing/policy/add/", {**form, field: value})
        assert page.status_code == 200 and detail in page_text(page), field
    assert not Policy.objects.exists()

    assert console.post("/billing/policy/add/", form).status_code == 302
    policy = Policy.objects.get(user=user)
    assert (policy.max_sessions, policy.max_gpus, list(policy.allowed_clusters.all())) == (2, None, [cluster])
    assert f"policy set: policy of {user}" in caplog.text
    assert 'name="user"' not in console.get(f"/billing/policy/{policy.pk}/change/").content.decode()
    changed = console.post(f"/billing/policy/{policy.pk}/change/", {**form, "max_gpus": "4", "allowed_clusters": []})
    assert changed.status_code == 302
    policy.refresh_from_db()
    assert (policy.max_gpus, policy.allowed_clusters.count()) == (4, 0)

    assert console.post(f"/billing/policy/{policy.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Policy.objects.exists() and f"policy deleted: policy of {user}" in caplog.text


def test_policy_form_shows_the_idle_fields_and_says_how_long_a_policy_minute_lasts(console, settings):
    text = page_text(console.get("/billing/policy/add/"))
    assert 'name="idle_timeout_minutes"' in text and 'name="idle_warning_minutes"' in text
    assert "a policy minute lasts" not in text
    settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS = 2
    text = page_text(console.get("/billing/policy/add/"))
    assert text.count("Here a policy minute lasts 2 s (GSHARE_IDLE_POLICY_MINUTE_SECONDS).") == 2
    Policy.objects.create(user=UserFactory(), idle_timeout_minutes=30, idle_warning_minutes=5)
    listed = page_text(console.get("/billing/policy/"))
    assert "column-idle_timeout_minutes" in listed and "column-idle_warning_minutes" in listed


def test_policy_form_sets_and_checks_the_time_limit(console):
    user = UserFactory()
    form = {"user": user.pk, "min_balance_hours": "1", "grace_seconds": "900", **IDLE}
    text = page_text(console.get("/billing/policy/add/"))
    assert 'name="max_runtime_hours"' in text and 'name="runtime_warning_minutes"' in text
    for hostile in ("-1", "NaN", "8761", "1.234", "1e9"):
        refused = console.post("/billing/policy/add/", {**form, "max_runtime_hours": hostile})
        assert refused.status_code == 200 and not Policy.objects.exists(), hostile
    assert console.post("/billing/policy/add/", {**form, "max_runtime_hours": "8.5", "runtime_warning_minutes": "5"}).status_code == 302
    policy = Policy.objects.get(user=user)
    assert (policy.max_runtime_hours, policy.runtime_warning_minutes) == (Decimal("8.5"), 5)
    listed = page_text(console.get("/billing/policy/"))
    assert "column-max_runtime_hours" in listed and "column-runtime_warning_minutes" in listed


def test_policy_form_sets_and_checks_cpu_and_memory_per_gpu(console):
    user = UserFactory()
    form = {"user": user.pk, "min_balance_hours": "1", "grace_seconds": "900", "max_runtime_hours": "24", "runtime_warning_minutes": "15",
            **IDLE}
    text = page_text(console.get("/billing/policy/add/"))
    assert all(f'name="{name}"' in text for name in ("default_cpu_per_gpu", "default_memory_gib_per_gpu", "max_cpu_per_gpu",
                                                       "max_memory_gib_per_gpu"))
    for hostile in ({"max_cpu_per_gpu": "-1"}, {"max_cpu_per_gpu": "257"}, {"default_memory_gib_per_gpu": "NaN"},
                    {"default_cpu_per_gpu": "8", "max_cpu_per_gpu": "4"}, {"max_memory_gib_per_gpu": "4097"}):
        refused = console.post("/billing/policy/add/", {**form, **hostile})
        assert refused.status_code == 200 and not Policy.objects.exists(), hostile
    assert console.post("/billing/policy/add/", {**form, "default_cpu_per_gpu": "2.5", "max_cpu_per_gpu": "8"}).status_code == 302
    policy = Policy.objects.get(user=user)
    assert (policy.default_cpu_per_gpu, policy.max_cpu_per_gpu, policy.default_memory_gib_per_gpu) == (Decimal("2.5"), Decimal(8), Decimal(16))
    change = page_text(console.get(f"/billing/policy/{policy.pk}/change/"))
    assert 'value="2.50"' in change
    assert console.post(f"/billing/policy/{policy.pk}/change/", {**form, "max_memory_gib_per_gpu": "32"}).status_code == 302
    policy.refresh_from_db()  # the fields left out kept their values
    assert (policy.default_cpu_per_gpu, policy.max_memory_gib_per_gpu) == (Decimal("2.5"), Decimal(32))
    record = AuditRecord.objects.filter(action="policy_update").latest("pk")
    assert set(record.changes) == {"max_memory_gib_per_gpu"}


def test_the_ledger_list_shows_an_end_entrys_idle_credits(console, lab_c1):
    from django.utils import timezone

    from sessions.models import Session

    session = metered_session(lab_c1, owner=UserFactory(username="idler"))
    services.credit_grant(user=session.owner, amount="5", reason="welcome", idempotency_key="idle-grant", created_by="test")
    ingest.usage_ingest(cluster=lab_c1, samples=[sample(session, device(lab_c1, "NVIDIA H100"), start=T0 + timedelta(minutes=i))
                                                  for i in range(3)])
    Session.objects.filter(pk=session.pk).update(phase=Session.Phase.STOPPING, stop_reason=Session.StopReason.IDLE)
    entry, _ = services.ledger_session_end(session=session, idle_since=T0, until=timezone.now(), reason="Stopped by the idle policy.",
                                           created_by="idle-policy")
    assert entry.idle_credits is not None and entry.idle_credits > 0
    text = page_text(console.get("/billing/ledgerentry/"))
    assert "Idle credits" in text
    cells = dict(re.findall(r'<tr[^>]*>.*?<a href="/billing/ledgerentry/(\d+)/change/">.*?<td class="field-idle">(.*?)</td>', text, re.S))
    assert cells[str(entry.pk)] == format(entry.idle_credits, "f")
    assert {value for pk, value in cells.items() if pk != str(entry.pk)} == {"-"}


def test_the_ledger_list_reads_like_a_bill(console, lab_c1, settings):
    """A period charge shows its billing period and how many samples it covers; the per-window columns are on the
    entry's page, not in the list."""
    from billing import periods

    settings.GSHARE_BILLING_PERIOD_SECONDS = 3600
    session = metered_session(lab_c1, owner=UserFactory(username="billed"))
    ingest.usage_ingest(cluster=lab_c1, samples=[sample(session, device(lab_c1, "NVIDIA H100"), start=T0 + timedelta(minutes=i))
                                                  for i in range(3)])
    periods.periods_close(now=T0 + timedelta(days=1))
    charge = LedgerEntry.objects.get(session=session, kind="charge")
    start, end = charge.period_start, charge.period_end
    text = page_text(console.get("/billing/ledgerentry/"))
    rows = {pk: (period, count) for pk, period, count in re.findall(
        r'<a href="/billing/ledgerentry/(\d+)/change/">.*?<td class="field-period">(.*?)</td><td class="field-sample_count">(.*?)</td>',
        text, re.S)}
    assert rows[str(charge.pk)] == (f"{period_text(start, end)} UTC", "3")
    assert "column-window_start" not in text and "column-gpu_seconds" not in text
