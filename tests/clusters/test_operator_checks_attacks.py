"""Hostile and broken ``checks`` in the operator's inventory (``PUT /internal/v1/inventory``): another cluster's
objects, huge or malformed checks, times that are not times, markup in a detail (escaped on the cluster page and in
the API), each refused whole with a JSON error and a code, or recorded as plain text; never a 500, never half
applied."""

from __future__ import annotations

import json

import pytest

from clusters.models import Cluster
from clusters.operator_token.tokens import operator_token_mint
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory
from tests.helpers import Http

pytestmark = pytest.mark.django_db

AT = "2026-12-01T18:00:00Z"
NODES = [{"name": "gpu-node-01", "labels": {"gpu": "on"}, "ready": True, "devices": []}]


def check(ok=True, detail="as reported", checked_at=AT) -> dict:
    return {"ok": ok, "detail": detail, "checked_at": checked_at}


@pytest.fixture
def cluster():
    return ClusterFactory(status=Cluster.Status.CONNECTED, session_domain="gpu-a.example.org", ingress_node="gpu-node-01",
                          operator_checks={"verify_reachable": check(True, "before")})


@pytest.fixture
def operator(http_for, cluster) -> Http:
    return http_for(operator_token_mint(cluster_id=cluster.public_id))


def refused(response, status=400, code="invalid_inventory") -> dict:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert body["code"] == code, body
    return body


def unchanged(cluster) -> None:
    fresh = Cluster.objects.get(pk=cluster.pk)
    assert fresh.operator_checks == {"verify_reachable": check(True, "before")}
    assert fresh.last_heartbeat_at == cluster.last_heartbeat_at


def test_an_operator_cannot_touch_another_clusters_checks_or_gpus(operator, cluster):
    other = ClusterFactory(operator_checks={"verify_reachable": check(True, "theirs")})
    node = NodeFactory(cluster=other, name="their-node")
    theirs = GpuDeviceFactory(node=node, cluster=other)
    # Naming the other cluster in the body changes nothing there (the cluster is the token's).
    response = operator.put("/internal/v1/inventory", json={"cluster": other.public_id, "nodes": NODES,
                                                            "checks": {"verify_reachable": check(False, "mine")}})
    assert response.status_code in (200, 400), response.text
    assert Cluster.objects.get(pk=other.pk).operator_checks == {"verify_reachable": check(True, "theirs")}
    # Listing the other cluster's GPU is refused whole: its own checks are not recorded either.
    device = {"uuid": theirs.uuid, "index": 0, "model": "NVIDIA A100", "memory_mib": 40960, "split_count": 4, "cores": 100,
              "health": True}
    cluster.refresh_from_db()
    before = (cluster.operator_checks, cluster.last_heartbeat_at)
    response = operator.put("/internal/v1/inventory", json={"nodes": [{**NODES[0], "devices": [device]}],
                                                            "checks": {"verify_reachable": check(False, "stolen")}})
    refused(response, 403, "forbidden_cluster_scope")
    cluster.refresh_from_db()
    assert (cluster.operator_checks, cluster.last_heartbeat_at) == before
    assert Cluster.objects.get(pk=other.pk).operator_checks == {"verify_reachable": check(True, "theirs")}


def test_huge_checks_are_refused_before_validation(operator, cluster, monkeypatch):
    # 100k names: refused on the count before each is validated (that took 4 s of a worker per request), so the
    # schema validator never runs (counted by a spy on it, any thread: the live server's too).
    from jsonschema import Draft202012Validator

    from clusters.internal.schemas import inventory_errors

    validations: list[int] = []
    real = Draft202012Validator.iter_errors

    def spy(self, *args, **kwargs):
        validations.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Draft202012Validator, "iter_errors", spy)
    many = {f"check_{i}": check() for i in range(100_000)}
    assert inventory_errors({"nodes": NODES, "checks": many}) == ["checks: has more than 16 keys"]
    body = refused(operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": many}))
    assert "checks: has more than 16 keys" in body["detail"] and len(body["detail"]) < 5000
    assert validations == []
    assert inventory_errors({"nodes": NODES, "checks": {"a": {}}}) and validations  # 1 check: validated
    unchanged(cluster)
    ten_mb = {"verify_reachable": check(detail="x" * 10_000_000)}
    body = refused(operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": ten_mb}))
    assert len(body["detail"]) < 5000
    one_mb = {"session_domain_resolves": check(detail="y" * 1_000_000)}
    body = refused(operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": one_mb}))
    assert "checks.session_domain_resolves.detail" in body["detail"] and len(body["detail"]) < 5000
    unchanged(cluster)


@pytest.mark.parametrize("bad", [
    {"ok": "yes", "detail": "", "checked_at": AT},
    {"ok": 1, "detail": "", "checked_at": AT},
    {"ok": None, "detail": "", "checked_at": AT},
    {"ok": True, "detail": ["a"], "checked_at": AT},
    {"ok": True, "detail": "", "checked_at": 1764612000},
    {"ok": True, "detail": "", "checked_at": "yesterday"},
    {"ok": True, "detail": "", "checked_at": "2026-13-45T99:99:99Z"},
    {"ok": True, "detail": "", "checked_at": ""},
    {"ok": True, "detail": "nul \x00 inside", "checked_at": AT},
    [], None, 7,
])
def test_a_malformed_check_is_refused_whole_and_nothing_is_applied(operator, cluster, bad):
    body = refused(operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": {"verify_reachable": bad}}))
    assert "checks.verify_reachable" in body["detail"]
    unchanged(cluster)


@pytest.mark.parametrize("checks", [[], "all ok", 0, {"": check()}, {"n" * 1_000_000: check()}])
def test_checks_of_the_wrong_shape_are_refused(operator, cluster, checks):
    response = operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": checks})
    if checks == {"": check()}:  # a name it does not know: dropped, as any other
        assert response.status_code == 200, response.text
        return
    refused(response)
    unchanged(cluster)


def test_a_check_time_far_in_the_future_is_recorded_as_reported(operator, cluster):
    future = "9999-12-31T23:59:59Z"
    response = operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": {
        "verify_reachable": check(False, "the auth-url answered 502", checked_at=future)}})
    assert response.status_code == 200, response.text
    cluster.refresh_from_db()
    assert cluster.operator_checks["verify_reachable"]["checked_at"] == future


HOSTILE = ('`<script>alert("x")</script>` and `</code><img src=x onerror=alert(1)>` '
           "\"quoted\" 'single' `' onmouseover='alert(2)` \x1b[31m red \r\n<b>bold</b> &amp; `a`b`c`")


def test_markup_in_a_detail_is_text_on_the_cluster_page_and_in_the_api(operator, cluster, console, http):
    response = operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": {
        "verify_reachable": check(False, HOSTILE), "session_domain_resolves": check(False, "`<svg/onload=alert(3)>`")}})
    assert response.status_code == 200, response.text
    page = console.get(f"/clusters/cluster/{cluster.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "gs-problems" in html
    for raw in ("<script>alert", "<img src=x", "<svg/onload", "<b>bold</b>", "onmouseover='alert", "\x1b"):
        assert raw not in html, raw
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "<code>&lt;svg/onload=alert(3)&gt;</code>" in html
    # The API answers the detail as JSON text (the browser never renders it as HTML).
    answer = http.get(f"/api/v1/clusters/{cluster.public_id}")
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("application/json")
    problems = {p["check"]: p["detail"] for p in answer.json()["problems"]}
    shown = HOSTILE.replace("\x1b", " ").replace("\r", " ").replace("\n", " ")  # control characters: spaces
    assert problems["verify_reachable"].startswith(shown)
    assert json.loads(answer.text)["operator_checks"]["verify_reachable"]["detail"] == shown


def test_researchers_see_neither_the_checks_nor_the_problems(operator, cluster, http_user, researcher_console):
    assert operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": {
        "verify_reachable": check(False, "internal host gshare-internal.corp:8443 refused")}}).status_code == 200
    answer = http_user.get(f"/api/v1/clusters/{cluster.public_id}")
    assert answer.status_code == 200
    assert "operator_checks" not in answer.json() and "problems" not in answer.json()
    assert "gshare-internal.corp" not in answer.text
    page = researcher_console.get(f"/clusters/cluster/{cluster.pk}/change/")
    assert page.status_code in (302, 403, 404) or "gshare-internal.corp" not in page.content.decode()


@pytest.mark.parametrize("before", [Cluster.Status.PENDING, Cluster.Status.UNREACHABLE])
def test_a_report_of_a_broken_session_path_does_not_make_a_cluster_connected(operator, cluster, before):
    Cluster.objects.filter(pk=cluster.pk).update(status=before)
    assert operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": {
        "session_domain_resolves": check(False, "gpu-a.example.org does not resolve"),
        "verify_reachable": check(True)}}).status_code == 200
    assert Cluster.objects.get(pk=cluster.pk).status == Cluster.Status.DEGRADED
    # Fixed in the next report: connected (a degraded cluster whose last test found nothing else returns).
    Cluster.objects.filter(pk=cluster.pk).update(last_connection_test={"checks": {"apiserver_reachable": True}})
    assert operator.put("/internal/v1/inventory", json={"nodes": NODES, "checks": {
        "session_domain_resolves": check(True), "verify_reachable": check(True)}}).status_code == 200
    assert Cluster.objects.get(pk=cluster.pk).status == Cluster.Status.CONNECTED
    # A report without checks (an older operator) still makes an unreachable cluster connected, as before.
    Cluster.objects.filter(pk=cluster.pk).update(status=Cluster.Status.UNREACHABLE)
    assert operator.put("/internal/v1/inventory", json={"nodes": NODES}).status_code == 200
    assert Cluster.objects.get(pk=cluster.pk).status == Cluster.Status.CONNECTED
