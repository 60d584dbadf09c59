"""Findings of an attack on the hardened API, each through HTTP on the live server.

* a POST to an unknown route or a GET-only project view answered Django's HTML CSRF page (403), not JSON;
* a NUL in an API token reached PostgreSQL (500);
* pools showed their wiring (StorageClass, storage node) to researchers, which clusters keep for staff;
* credit amounts accepted other scripts' digits ("١" granted one credit).
"""

from __future__ import annotations

import pytest

from billing.models import LedgerEntry
from tests.conftest import Http
from tests.factories import ClusterFactory, StoragePoolFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("path", ["/api/v1/nope", "/internal/v1/nope", "/api/v1/storage/volumes/vol_x/connect"])
def test_writes_to_unknown_routes_answer_json_404_not_a_csrf_page(anon, method, path):
    response = anon.request(method, path)
    assert response.status_code == 404 and response.headers["Content-Type"].startswith("application/json"), response.text[:200]
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_get_only_views_answer_json_405(anon, method):
    for path in ("/.well-known/gshare-internal-jwks.json", "/healthz"):
        response = anon.request(method, path)
        assert response.status_code == 405 and response.json()["code"] == "method_not_allowed", (path, response.text[:200])
        assert response.headers["Allow"] == "GET, HEAD"
    assert anon.get("/.well-known/gshare-internal-jwks.json").json()["keys"] is not None


def test_ping_takes_any_method_without_csrf(anon):
    assert anon.post("/internal/ping").status_code == 204


@pytest.mark.parametrize("token", ["gsh_\x00_x", "gsh_abcd\x00_secret", "gsh_" + "a" * 5000 + "_s", "gsh_abcd_s\x00", "gsh_ABCD_s", "gsh_éé_x"])
def test_malformed_api_tokens_are_refused_before_the_database(live_server, token):
    response = Http(live_server.url, token).get("/api/v1/clusters")
    assert response.status_code == 401 and response.json()["code"] == "api_token_invalid", response.text[:200]


def test_pool_wiring_is_for_staff_only(http, http_user):
    pool = StoragePoolFactory(cluster=ClusterFactory(), storage_node="nas-1")
    for path in ("/api/v1/storage/pools", f"/api/v1/storage/pools/{pool.public_id}"):
        staff, user = http.get(path).json(), http_user.get(path).json()
        staff, user = (body["results"][0] if "results" in body else body for body in (staff, user))
        assert staff["storage_class"] == pool.storage_class and staff["storage_node"] == "nas-1"
        assert "storage_class" not in user and "storage_node" not in user
        assert set(staff) - set(user) == {"storage_class", "storage_node"}


@pytest.mark.parametrize("amount", ["١", "١٢.5", "１０", "5\u0660"])
def test_credit_amounts_take_ascii_digits_only(http, plain_user, amount):
    response = http.post("/api/v1/billing/grants", json={"user": "alice", "amount": amount, "reason": "digits"},
                         headers={"Idempotency-Key": f"k-{amount.encode().hex()}"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_amount", response.text
    assert not LedgerEntry.objects.exists()
