"""Every API list with odd filter values (NUL, control characters, 10 KB, unicode, repeated parameters) and odd
pagination: 2xx or 4xx JSON with a code, never 500, each answer bounded: a few SQL queries, none reading more than a
page (``GSHARE_API_MAX_PAGE_SIZE``) whatever ``limit`` asked, counted by the ``sql`` spy rather than timed."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.db.backends import utils as db_utils

pytestmark = pytest.mark.django_db(transaction=True)

LISTS = {
    "/api/v1/clusters": ["status"], "/api/v1/nodes": ["cluster"], "/api/v1/gpus": ["cluster"],
    "/api/v1/sessions": ["cluster", "phase"], "/api/v1/storage/volumes": ["cluster", "pool"], "/api/v1/storage/pools": ["cluster"],
    "/api/v1/storage/summary": ["cluster"], "/api/v1/audit": ["cluster", "since", "until"],
    "/api/v1/billing/ledger": ["session", "user", "since", "until"], "/api/v1/billing/grants": ["user"],
    "/api/v1/billing/account": ["user"],
}
VALUES = ["a%00b", "%1B%5B31m", "x" * 10_000, "%F0%9F%92%A5", "clu_%00", "%FF%ED%A0%80"]
PAGES = ["limit=0&offset=-1", "limit=-5&offset=99999999999999999999", "limit=99999999999&offset=abc", "limit=1%00&offset=1%00",
         "page=1%00&page_size=99999999999&cursor=%00&ordering=%00"]


#: Most SQL queries one list request may issue (scope, count, page: at most 5 today, whatever the parameters).
MAX_QUERIES = 8
_LIMIT = re.compile(r"\bLIMIT (\d+)")


@pytest.fixture
def sql(monkeypatch) -> list[str]:
    """Every SQL statement run, from any thread (the live server's too), in order."""
    seen: list[str] = []
    real = db_utils.CursorWrapper._execute

    def spy(self, sql, params, *ignored_wrappers):
        seen.append(sql)
        return real(self, sql, params, *ignored_wrappers)

    monkeypatch.setattr(db_utils.CursorWrapper, "_execute", spy)
    return seen


def check(response, issued: list[str]) -> None:
    """``response`` is not a 500 (a JSON error with a code for a 4xx), and ``issued``, the SQL it ran, is bounded."""
    assert response.status_code < 500, (response.request.url[:200], response.status_code, response.text[:300])
    assert len(issued) <= MAX_QUERIES, (response.request.url[:200], len(issued), issued)
    limits = [int(n) for statement in issued for n in _LIMIT.findall(statement)]
    assert all(n <= settings.GSHARE_API_MAX_PAGE_SIZE + 1 for n in limits), (response.request.url[:200], limits)
    if response.status_code >= 400:
        assert response.headers["Content-Type"].startswith("application/json"), response.text[:200]
        assert response.json().get("code"), response.text[:200]


@pytest.mark.parametrize(("client", "values", "pages"), [("http_user", VALUES, PAGES), ("http", VALUES[:2], PAGES[:1])])
def test_hostile_filter_values_and_pages_never_500(request, client, values, pages, sql):
    http = request.getfixturevalue(client)

    def get(url: str) -> None:
        first = len(sql)
        response = http.get(url)
        check(response, sql[first:])

    for path, names in LISTS.items():
        for name in names:
            for value in values:
                get(f"{path}?{name}={value}")
            get(f"{path}?{name}=a&{name}=b")
        for page in pages:
            get(f"{path}?{page}")
    assert any(_LIMIT.search(statement) for statement in sql)  # the spy sees the page queries


def _patch(http, path, body, raw=None):
    if raw is not None:
        return http.patch(path, data=raw, headers={"Content-Type": "application/json"})
    return http.patch(path, json=body)


def test_patch_bodies_that_are_not_objects_or_name_unknown_fields_change_nothing(http, http_user, plain_user, sql):
    from clusters.models import Cluster
    from storage.models import StoragePool, Volume
    from tests.factories import ClusterFactory, StoragePoolFactory, VolumeFactory

    cluster = ClusterFactory(name="lab-c1", session_domain="")
    pool = StoragePoolFactory()
    volume = VolumeFactory(owner=plain_user, pool=pool)
    targets = [
        (http, f"/api/v1/clusters/{cluster.public_id}", {"session_domain": "gpu.example.org"}, lambda: Cluster.objects.get(pk=cluster.pk).session_domain),
        (http, f"/api/v1/storage/pools/{pool.public_id}", {"name": "renamed"}, lambda: StoragePool.objects.get(pk=pool.pk).name),
        (http_user, f"/api/v1/storage/volumes/{volume.public_id}", {"quota_gb": 20}, lambda: Volume.objects.get(pk=volume.pk).quota_gb),
    ]
    for client, path, known, read in targets:
        before = read()
        for body, raw in [({**known, "bogus": 1}, None), ({**known, "id": "x"}, None), (None, "null"), (None, "[]"),
                          (None, '[{"a": 1}]'), (None, '"text"'), (None, "5"), (None, "true"), (None, "{"),
                          (None, "[" * 100_000)]:
            first = len(sql)
            response = _patch(client, path, body, raw)
            assert response.status_code == 400, (path, body or raw[:20], response.status_code, response.text[:300])
            check(response, sql[first:])
            assert len(response.text) < 2000
        assert read() == before, path


def test_a_researcher_sees_only_their_own_rows_whatever_the_filters(http_user, plain_user, staff_user):
    from billing import services as billing
    from tests.factories import SessionFactory, UserFactory, VolumeFactory

    bob = UserFactory(username="bob")
    session, volume = SessionFactory(owner=bob), VolumeFactory(owner=bob)
    billing.credit_grant(user=bob, amount=100, reason="r", idempotency_key="k-bob", created_by="test")
    own = VolumeFactory(owner=plain_user)
    cluster = session.cluster.public_id
    for query in ["", f"?user=bob&user={plain_user.username}", f"?session={session.public_id}", f"?cluster={cluster}",
                  f"?cluster={cluster}&cluster={session.cluster.name}", "?limit=1000&offset=0", "?user=bob&user=bob"]:
        sessions = http_user.get("/api/v1/sessions" + query)
        volumes = http_user.get("/api/v1/storage/volumes" + query)
        ledger = http_user.get("/api/v1/billing/ledger" + query)
        for response in (sessions, volumes, ledger):
            assert response.status_code in (200, 404), (response.request.url, response.text[:300])
            assert "bob" not in response.text and session.public_id not in response.text and volume.public_id not in response.text, query
        if volumes.status_code == 200 and not query.startswith(("?cluster", "?session")):
            assert own.public_id in volumes.text
    assert http_user.get(f"/api/v1/sessions/{session.public_id}").status_code == 404
    assert http_user.get(f"/api/v1/storage/volumes/{volume.public_id}").status_code == 404
    assert http_user.get("/api/v1/billing/account?user=bob").json().get("user", plain_user.username) != "bob"
    for path in ["/api/v1/audit", f"/api/v1/audit?cluster={cluster}"]:
        response = http_user.get(path)
        assert response.status_code == 403 and response.json()["code"], path
    assert http_user.post("/api/v1/billing/grants", json={"user": "alice", "amount": "5", "reason": "r"},
                          headers={"Idempotency-Key": "x"}).status_code == 403
