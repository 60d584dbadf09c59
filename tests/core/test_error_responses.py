"""Error answers outside the views: a write to an unknown route or to a GET-only project view is JSON 404/405
(never Django's HTML CSRF page), and a malformed API token (NUL, oversized, not ASCII) is a 401 before any query.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


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
def test_malformed_api_tokens_are_refused_before_the_database(http_for, token):
    response = http_for(token).get("/api/v1/clusters")
    assert response.status_code == 401 and response.json()["code"] == "api_token_invalid", response.text[:200]
