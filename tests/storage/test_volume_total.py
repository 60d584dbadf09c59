"""A user's volumes hold at most their policy's max_volume_gb in all (through HTTP and the services, concurrency
included), volumes show their price, and their quota holdings follow create, raise and delete."""

import threading
import time
from decimal import Decimal

import pytest
from django.db import connection

from billing.models import StorageHolding
from billing.services import policy_set
from storage import services
from storage.models import StoragePool, Volume
from tests.factories import UserFactory
from tests.helpers import run_threads
from tests.storage.kube import pool_cluster

pytestmark = pytest.mark.django_db


def make_pool(gb: int, name: str = "lab-nfs") -> StoragePool:
    return services.pool_create(name=name, cluster=pool_cluster(), storage_class="nfs-a", manual_capacity_gb=gb)


def refused_over_total(response, *, limit: int, held: int) -> dict:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["code"] == "volume_quota_exceeded"
    assert f"at most {limit} GiB in all" in body["detail"]
    assert (f"already hold {held} GiB" if held else "you hold no other volume") in body["detail"]
    assert "max_volume_gb" in body["detail"]
    assert (body["max_volume_gb"], body["held_gb"]) == (limit, held)
    return body


def test_one_user_cannot_take_the_whole_pool_by_default(http_user):
    """The issue's case: one volume sized to the whole 1,604 GiB pool, then another user is refused pool_full."""
    make_pool(1604)
    whole = http_user.post("/api/v1/storage/volumes", json={"name": "everything", "quota_gb": 1604})
    body = refused_over_total(whole, limit=500, held=0)
    assert "ask for at most 500 GiB" in body["detail"]
    made = http_user.post("/api/v1/storage/volumes", json={"name": "data", "quota_gb": 400})
    assert made.status_code == 201, made.text
    raised = http_user.patch(f"/api/v1/storage/volumes/{made.json()['id']}", json={"quota_gb": 1604})
    refused_over_total(raised, limit=500, held=0)
    assert Volume.objects.get().quota_gb == 400
    # Another user still has room on the pool.
    admin_volume = services.volume_create(owner=UserFactory(), name="admin", quota_gb=1)
    assert admin_volume.pool.name == "lab-nfs"


def test_the_total_counts_every_live_volume_and_frees_on_delete(http_user, plain_user):
    make_pool(2000)
    policy_set(user=plain_user, max_volume_gb=100)
    first = http_user.post("/api/v1/storage/volumes", json={"name": "a", "quota_gb": 60}).json()
    refused_over_total(http_user.post("/api/v1/storage/volumes", json={"name": "b", "quota_gb": 41}), limit=100, held=60)
    second = http_user.post("/api/v1/storage/volumes", json={"name": "b", "quota_gb": 40})
    assert second.status_code == 201, second.text
    refused_over_total(http_user.patch(f"/api/v1/storage/volumes/{first['id']}", json={"quota_gb": 61}), limit=100, held=40)
    assert http_user.delete(f"/api/v1/storage/volumes/{second.json()['id']}").status_code in (200, 204)
    assert http_user.patch(f"/api/v1/storage/volumes/{first['id']}", json={"quota_gb": 100}).json()["quota_gb"] == 100
    # Lowered below what they hold: kept (nothing is taken away), but nothing grows and nothing new is created.
    policy_set(user=plain_user, max_volume_gb=50)
    refused_over_total(http_user.post("/api/v1/storage/volumes", json={"name": "c", "quota_gb": 1}), limit=50, held=100)
    assert Volume.objects.get(public_id=first["id"]).quota_gb == 100
    policy_set(user=plain_user, max_volume_gb=None)  # no limit
    assert http_user.post("/api/v1/storage/volumes", json={"name": "c", "quota_gb": 900}).status_code == 201


def test_huge_and_negative_quotas_are_refused_cleanly(http_user, plain_user):
    make_pool(2000)
    policy_set(user=plain_user, max_volume_gb=None)
    for quota in (0, -1, 2**63, 10**30):
        response = http_user.post("/api/v1/storage/volumes", json={"name": "x", "quota_gb": quota})
        assert response.status_code == 400 and response.json()["code"] == "invalid_request", response.text
    assert not Volume.objects.exists()


def test_volumes_show_their_price_and_are_held_for_charging(http_user, settings):
    settings.GSHARE_STORAGE_PRICE_PER_GB_MONTH = Decimal("0.05")
    make_pool(2000)
    assert http_user.get("/api/v1/storage/summary").json()["credits_per_gb_month"] == "0.050000"
    made = http_user.post("/api/v1/storage/volumes", json={"name": "a", "quota_gb": 100})
    assert made.json()["pricing"] == {"credits_per_gb_month": "0.050000", "monthly_credits": "5.000000", "month_days": 30}
    volume = Volume.objects.get()
    raised = http_user.patch(f"/api/v1/storage/volumes/{volume.public_id}", json={"quota_gb": 150})
    assert raised.json()["pricing"]["monthly_credits"] == "7.500000"
    assert http_user.delete(f"/api/v1/storage/volumes/{volume.public_id}").status_code in (200, 204)
    held = list(StorageHolding.objects.filter(volume=volume).order_by("start"))
    assert [h.quota_gb for h in held] == [100, 150]
    assert all(h.end is not None for h in held) and held[-1].end == Volume.objects.get().deleted_at


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("second", ["create", "raise"])
def test_concurrent_creates_and_raises_cannot_pass_the_total_together(monkeypatch, second):
    assert connection.vendor == "postgresql"
    make_pool(2000)
    owner = UserFactory()
    policy_set(user=owner, max_volume_gb=100)
    existing = services.volume_create(owner=owner, name="existing", quota_gb=10) if second == "raise" else None
    real = services.policy_for

    def slow(user):  # widen the window between reading the total and writing the volume
        result = real(user)
        time.sleep(0.5)
        return result

    monkeypatch.setattr(services, "policy_for", slow)
    barrier = threading.Barrier(2)
    outcomes = []

    def run(kind):
        try:
            barrier.wait()
            if kind == "create" or existing is None:
                services.volume_create(owner=owner, name=f"v-{kind}-{threading.get_ident()}", quota_gb=60)
            else:
                services.volume_update_quota(volume=existing, quota_gb=70)
            outcomes.append("done")
        except services.VolumeQuotaExceeded:
            outcomes.append("volume_quota_exceeded")
        finally:
            connection.close()

    run_threads(run, [("create",), (second,)], timeout=60)
    assert sorted(outcomes) == ["done", "volume_quota_exceeded"]
    total = sum(Volume.objects.filter(owner=owner).exclude(status=Volume.Status.DELETED).values_list("quota_gb", flat=True))
    assert total <= 100
