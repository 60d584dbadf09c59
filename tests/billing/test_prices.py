"""What a researcher sees of prices: the price list (``GET /api/v1/prices``), each live session's credits per hour,
and the account's runway (``credits_last_until``), over HTTP on the live server."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import selectors, services
from billing.models import Price
from clusters.models import Cluster, GpuDevice
from sessions.models import Allocation
from tests.factories import SessionFactory
from tests.helpers import device

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"


def test_price_list_names_every_model_of_the_fleet_with_its_price_memory_and_free_gpus(http_user, lab_c1, lab_c2):
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1.2"))
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("2.5"))
    Price.objects.create(gpu_model="A model nobody has", credits_per_gpu_hour=Decimal("9"))
    held = device(lab_c1, H100)
    Allocation.objects.create(session=SessionFactory(cluster=lab_c1), device=held, memory_mib=held.memory_mib, cores=100, exclusive=True)
    GpuDevice.objects.filter(pk=held.pk).update(used_count=1, used_memory_mib=held.memory_mib, used_cores=100, used_exclusive=True)
    sick = GpuDevice.objects.filter(cluster=lab_c1, model=H100).exclude(pk=held.pk).order_by("pk").first()
    GpuDevice.objects.filter(pk=sick.pk).update(health=False)

    body = http_user.get("/api/v1/prices").json()

    assert body["default_credits_per_gpu_hour"] == "1.200000"
    fleet = GpuDevice.objects.exclude(cluster__status=Cluster.Status.DEREGISTERED)
    assert [m["model"] for m in body["models"]] == sorted(set(fleet.values_list("model", flat=True)))
    h100 = next(m for m in body["models"] if m["model"] == H100)
    healthy = fleet.filter(model=H100, health=True)
    assert h100 == {"model": H100, "credits_per_gpu_hour": "2.500000", "priced_as": "model",
                    "memory_mib": min(fleet.filter(model=H100).values_list("memory_mib", flat=True)),
                    "gpus": healthy.count(), "free_gpus": healthy.count() - 1,
                    "clusters": sorted(set(fleet.filter(model=H100).values_list("cluster__name", flat=True)))}
    others = [m for m in body["models"] if m["model"] != H100]
    assert others and all((m["priced_as"], m["credits_per_gpu_hour"]) == ("default", "1.200000") for m in others)
    assert "A model nobody has" not in {m["model"] for m in body["models"]}


def test_price_list_leaves_out_deregistered_clusters_and_reads_in_three_queries(http_user, lab_c1, lab_c2):
    Cluster.objects.filter(pk=lab_c2.pk).update(status=Cluster.Status.DEREGISTERED)
    with CaptureQueriesContext(connection) as queries:
        listed = selectors.price_list()
    assert len(queries) == 3
    assert all(m["clusters"] == ["lab-c1"] for m in listed["models"])
    assert {m["model"] for m in listed["models"]} == set(lab_c1.devices.values_list("model", flat=True))


def test_price_list_needs_a_login(anon):
    response = anon.get("/api/v1/prices")
    assert response.status_code == 401 and response.json()["code"]


def test_a_live_session_shows_what_it_costs_per_hour_and_an_ended_one_shows_null(http_user, plain_user, lab_c1):
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("2.5"))
    h100s = list(lab_c1.devices.filter(model=H100).order_by("index")[:2])
    shared = SessionFactory(cluster=lab_c1, owner=plain_user, gpus=2, gpu_memory_mib=20000, gpu_cores=10, phase="Running")
    for gpu in h100s:
        Allocation.objects.create(session=shared, device=gpu, memory_mib=20000, cores=10)
    ended = SessionFactory(cluster=lab_c1, owner=plain_user, phase="Terminated")

    one = http_user.get(f"/api/v1/sessions/{shared.public_id}").json()
    listed = {s["id"]: s for s in http_user.get("/api/v1/sessions").json()["results"]}

    assert Decimal(one["credits_per_hour"]) == selectors.session_hourly_cost(shared) > 0
    assert listed[shared.public_id]["credits_per_hour"] == one["credits_per_hour"]
    assert listed[ended.public_id]["credits_per_hour"] is None
    # The account's burn is the same definition: the one Running session's rate.
    assert http_user.get("/api/v1/billing/account").json()["burn_rate_per_hour"] == one["credits_per_hour"]


@pytest.mark.parametrize(("balance", "accrued", "burn", "after"), [
    ("10", "0", "2.5", timedelta(hours=4)),
    ("10", "4", "3", timedelta(hours=2)),
    ("1", "0", "7", timedelta(seconds=514)),  # 514.28... s, rounded down: never promises a second too many
    ("5", "5", "1", timedelta(0)),  # nothing left: now
    ("5", "6", "1", timedelta(0)),
])
def test_credits_last_until_is_balance_less_accrued_over_the_burn(balance, accrued, burn, after):
    now = datetime(2026, 11, 30, 23, 59, 30, tzinfo=UTC)
    until = selectors.credits_last_until(balance=Decimal(balance), accrued=Decimal(accrued), burn_per_hour=Decimal(burn), now=now)
    assert until == now + after


def test_credits_last_until_is_null_while_nothing_burns_or_beyond_any_date():
    now = datetime(2026, 11, 30, tzinfo=UTC)
    assert selectors.credits_last_until(balance=Decimal(10), accrued=Decimal(0), burn_per_hour=Decimal(0), now=now) is None
    assert selectors.credits_last_until(balance=Decimal("1e17"), accrued=Decimal(0), burn_per_hour=Decimal("0.000001"), now=now) is None


def test_account_shows_the_runway_of_the_running_sessions(http_user, plain_user, lab_c1):
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("2.5"))
    gpu = device(lab_c1, H100)
    running = SessionFactory(cluster=lab_c1, owner=plain_user, phase="Running")
    Allocation.objects.create(session=running, device=gpu, memory_mib=gpu.memory_mib, cores=100, exclusive=True)
    services.credit_grant(user=plain_user, amount="10", reason="t", idempotency_key="k", created_by="test")

    summary = selectors.account_summary(plain_user, now=datetime(2026, 12, 31, 22, tzinfo=UTC))
    assert summary["credits_last_until"] == datetime(2027, 1, 1, 2, tzinfo=UTC)  # 10 credits at 2.5 an hour
    before = datetime.now(UTC).replace(microsecond=0)
    body = http_user.get("/api/v1/billing/account").json()
    after = datetime.now(UTC)
    assert before + timedelta(hours=4) <= datetime.fromisoformat(body["credits_last_until"]) <= after + timedelta(hours=4)
