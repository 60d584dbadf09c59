"""Numbers of the public API are JSON numbers (core.api.fields.StrictIntegerField), through HTTP on the live server.

The sessions fields are tested in tests/sessions/test_api.py (they need an emulated cluster); credit amounts are
decimal strings or JSON numbers by design (docs/billing.md) and are tested in tests/billing/test_api.py.
"""

import pytest

from storage import services
from storage.models import StoragePool, Volume
from tests.storage.kube import pool_cluster

pytestmark = pytest.mark.django_db

REFUSED = ["10", "1e2", True, False, 10.5, [10], {"gb": 10}]
#: JSON numbers that are not integer tokens: the parser reads them as floats.
NOT_INTEGER_TOKENS = ["1.0", "1e0", "1e3", "10.0", "1E1", "2.5e1", "-0.0"]


def refused(response, field: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "invalid_request" and field in body["detail"] and field in body["errors"]


@pytest.mark.parametrize("value", REFUSED)
def test_pool_capacity_must_be_a_json_number(http, value):
    cluster = pool_cluster()  # its apiserver serves nfs-a: registration reads the StorageClass
    body = {"name": "nfs-a", "cluster": cluster.public_id, "storage_class": "nfs-a"}
    refused(http.post("/api/v1/storage/pools", json={**body, "manual_capacity_gb": value}), "manual_capacity_gb")
    assert not StoragePool.objects.exists()
    created = http.post("/api/v1/storage/pools", json={**body, "manual_capacity_gb": 10})
    assert created.status_code == 201 and created.json()["manual_capacity_gb"] == 10
    path = f"/api/v1/storage/pools/{created.json()['id']}"
    refused(http.patch(path, json={"manual_capacity_gb": value}), "manual_capacity_gb")
    assert http.patch(path, json={"manual_capacity_gb": 20}).json()["manual_capacity_gb"] == 20


@pytest.mark.parametrize("value", REFUSED)
def test_volume_quota_must_be_a_json_number(http_user, value):
    services.pool_create(name="p", cluster=pool_cluster(), storage_class="nfs-a", manual_capacity_gb=100)
    refused(http_user.post("/api/v1/storage/volumes", json={"name": "v", "quota_gb": value}), "quota_gb")
    assert not Volume.objects.exists()
    created = http_user.post("/api/v1/storage/volumes", json={"name": "v", "quota_gb": 10})
    assert created.status_code == 201 and created.json()["quota_gb"] == 10
    path = f"/api/v1/storage/volumes/{created.json()['id']}"
    refused(http_user.patch(path, json={"quota_gb": value}), "quota_gb")
    assert http_user.patch(path, json={"quota_gb": 11}).json()["quota_gb"] == 11
    assert Volume.objects.get().quota_gb == 11


def raw_json(client, method: str, path: str, text: str):
    """Send ``text`` as the JSON body verbatim (``requests``' json= would write a float as ``1.0`` only)."""
    return client.request(method, path, data=text.encode(), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("token", NOT_INTEGER_TOKENS)
def test_integers_are_integer_tokens(http_user, token):
    services.pool_create(name="p", cluster=pool_cluster(), storage_class="nfs-a", manual_capacity_gb=2000)
    response = raw_json(http_user, "POST", "/api/v1/storage/volumes", f'{{"name": "v", "quota_gb": {token}}}')
    refused(response, "quota_gb")
    assert "without a decimal point or an exponent" in response.json()["errors"]["quota_gb"][0]
    assert not Volume.objects.exists()
    created = raw_json(http_user, "POST", "/api/v1/storage/volumes", '{"name": "v", "quota_gb": 10}')
    assert created.status_code == 201, created.text
    path = f"/api/v1/storage/volumes/{created.json()['id']}"
    refused(raw_json(http_user, "PATCH", path, f'{{"quota_gb": {token}}}'), "quota_gb")
    assert Volume.objects.get().quota_gb == 10
