"""Every list endpoint pages with a ceiling: a huge ``limit`` or ``offset`` is a page, never a 500 (bigint overflow)."""

from __future__ import annotations

import pytest

LISTS = [
    "/api/v1/clusters", "/api/v1/nodes", "/api/v1/gpus", "/api/v1/sessions", "/api/v1/storage/pools",
    "/api/v1/storage/volumes", "/api/v1/billing/ledger",
]
HUGE = "9999999999999999999999"


@pytest.mark.django_db
@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize("query", [f"limit={HUGE}", f"offset={HUGE}", f"limit={HUGE}&offset={HUGE}", "limit=-1", "limit=abc"])
def test_huge_or_odd_limits_answer_a_page(http, path, query):
    response = http.get(f"{path}?{query}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) >= {"count", "results"} and isinstance(body["results"], list)


@pytest.mark.django_db
def test_limit_is_capped_at_the_maximum_page_size(http, settings):
    settings.GSHARE_API_MAX_PAGE_SIZE = 3
    for n in range(5):
        http.post("/api/v1/billing/grants", json={"user": "admin", "amount": "1", "reason": "t"},
                  headers={"Idempotency-Key": f"k{n}"}).raise_for_status()
    page = http.get(f"/api/v1/billing/ledger?limit={HUGE}").json()
    assert page["count"] == 5 and len(page["results"]) == 3 and page["next"]
