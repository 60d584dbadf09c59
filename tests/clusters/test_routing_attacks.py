"""Attacks on ``PATCH /api/v1/clusters/{id}``'s routing fields: malformed values of every type, Gateway names with path
and dot tricks, session domains that are the control plane's host in another spelling, researchers, and concurrent
PATCHes flipping the routing of a cluster with live sessions (the GShareSessions must end on the final routing)."""

from __future__ import annotations

import contextlib
import threading
from unittest import mock

import pytest

from audit.models import AuditRecord
from clusters.models import Cluster
from clusters.routing_mode import is_control_plane_host
from sessions import lifecycle
from sessions.lifecycle import outbox
from sessions.models import Session
from tests.clusters.test_routing_reapply import object_name, specs, start
from tests.factories import ClusterFactory

BAD = [
    ("session_domain", ["lab.example.com"]), ("session_domain", {"a": 1}),
    ("session_domain", None), ("session_domain", "lab\x00.example.com"), ("session_domain", "a" * 300),
    ("session_domain", "l\u00e4b.example.com"), ("session_domain", "LAB.example.com"), ("session_domain", "lab.example.com."),
    ("session_domain", "lab.example.com:443"), ("session_domain", "lab.example.com/s/"), ("session_domain", "*.example.com"),
    ("session_domain", ".example.com"), ("session_domain", "lab..example.com"), ("session_domain", "lab.example.com\n.evil"),
    ("routing", True), ("routing", "gateway-api "), ("routing", "gateway\u2010api"), ("routing", "x" * 1_000_000),
    ("gateway_name", "../edge"), ("gateway_name", "edge/.."), ("gateway_name", "edge."), ("gateway_name", ".edge"),
    ("gateway_name", "a..b"), ("gateway_name", "edge%2f"), ("gateway_name", "edge/x"), ("gateway_name", "edge "),
    ("gateway_name", None), ("gateway_name", ["edge"]), ("gateway_name", "\uff45dge"), ("gateway_name", "a" * 254),
    ("gateway_namespace", ".."), ("gateway_namespace", "."), ("gateway_namespace", "kube-system/"),
    ("gateway_namespace", "a.b"), ("gateway_namespace", 0), ("gateway_namespace", "infra\x00"), ("gateway_namespace", ""),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_malformed_routing_values_are_a_400_and_change_nothing(http, field, value):
    cluster = ClusterFactory(session_domain="lab.gpu.example.com")
    response = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"routing": "gateway-api", field: value})
    assert response.status_code == 400, (response.status_code, response.text[:300])
    assert response.json()["code"] and response.json()["detail"]
    cluster.refresh_from_db()
    assert (cluster.session_domain, cluster.routing, cluster.gateway_name, cluster.gateway_namespace) == (
        "lab.gpu.example.com", "ingress-nginx", "gshare-sessions", "gshare-system")
    assert not AuditRecord.objects.filter(action="cluster_update").exists()


@pytest.mark.parametrize("url", ["https://GShare.Example.COM", "https://gshare.example.com.", "https://gshare.example.com:8443",
                                 "https://GSHARE.example.com.:8443/console/"])
def test_the_control_planes_host_in_any_spelling_of_its_url_is_not_a_session_domain(settings, url):
    settings.GSHARE_CONTROL_PLANE_URL = url
    settings.ALLOWED_HOSTS = ["*"]
    assert is_control_plane_host("gshare.example.com")
    assert not is_control_plane_host("sessions.gshare.example.com")


@pytest.mark.django_db
def test_a_researcher_changes_no_routing_field_by_any_method(http_user):
    cluster = ClusterFactory(session_domain="lab.gpu.example.com", routing="gateway-api", gateway_name="edge")
    url = f"/api/v1/clusters/{cluster.public_id}"
    for body in ({"routing": "ingress-nginx"}, {"gateway_name": "evil"}, {"gateway_namespace": "kube-system"},
                 {"session_domain": "evil.example.com"}, {"routing": "bogus"}):
        assert http_user.patch(url, json=body).status_code == 403, body
        assert http_user.put(url, json=body).status_code in (403, 405), body
    cluster.refresh_from_db()
    assert (cluster.routing, cluster.gateway_name, cluster.session_domain) == ("gateway-api", "edge", "lab.gpu.example.com")
    assert not AuditRecord.objects.filter(action="cluster_update").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("publishes_lost", [False, True], ids=["published", "publishes-lost"])
def test_concurrent_routing_flips_end_with_every_gss_on_the_final_routing(http, live_cluster, publishes_lost):
    """Four clients flip the routing (and the Gateway) twelve times at once; then ``sessions_reconcile`` (the beat's
    relay) runs until nothing is due. With every publish after the commits lost, only the durable marks remain."""
    cluster, emulated = live_cluster("lab-c1")
    ids = [start(http, cluster="lab-c1") for _ in range(3)]
    Session.objects.filter(public_id__in=ids).update(phase=Session.Phase.RUNNING)
    url = f"/api/v1/clusters/{cluster.public_id}"
    bodies = [{"routing": "gateway-api", "gateway_name": f"edge-{i}"} if i % 2 else {"routing": "ingress-nginx"} for i in range(12)]
    gate = threading.Barrier(4)
    statuses: list[int] = []

    def flip(mine: list[dict]) -> None:
        gate.wait()
        statuses.extend(http.patch(url, json=body).status_code for body in mine)

    lost = mock.patch.object(outbox, "publish_each", return_value=0) if publishes_lost else contextlib.nullcontext()
    with lost:
        workers = [threading.Thread(target=flip, args=(bodies[i::4],)) for i in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
    assert statuses and set(statuses) == {200}, statuses
    if publishes_lost:
        assert Session.objects.filter(public_id__in=ids, reapply_due_at__isnull=False).count() == 3
    for _ in range(10):
        if not Session.objects.filter(reapply_due_at__isnull=False).exists():
            break
        lifecycle.sessions_reconcile(older_than=0)
    assert not Session.objects.filter(reapply_due_at__isnull=False).exists()
    final = Cluster.objects.get(pk=cluster.pk)
    applied = specs(emulated)
    for sid in ids:
        spec = applied[object_name(sid)]
        assert spec["routing"] == final.routing, (sid, spec, final.routing)
        if final.routing == "gateway-api":
            assert spec["gateway"] == {"name": final.gateway_name, "namespace": final.gateway_namespace}
        else:
            assert "gateway" not in spec


@pytest.mark.django_db(transaction=True)
def test_a_routing_change_during_the_first_apply_is_not_lost_when_the_operator_reports_first(http, live_cluster):
    """The first apply reads the routing, a PATCH changes it (its re-apply finds the session still Scheduled), the apply
    lands, and the operator reports the session Starting before ``session_apply`` moves it there itself: the routing
    check after the apply must still run (before the fix nothing did, and no mark was left for ``sessions_reconcile``)."""
    from clusters import services as cluster_services
    from kube import KubeGateway

    cluster, emulated = live_cluster("lab-c1")
    original, raced = KubeGateway.apply, []

    def apply(self, obj, **kwargs):
        if obj.get("kind") != "GShareSession" or raced:
            return original(self, obj, **kwargs)
        raced.append(obj["spec"]["sessionId"])
        assert obj["spec"]["routing"] == "ingress-nginx"
        cluster_services.cluster_update(cluster=Cluster.objects.get(pk=cluster.pk), changes={"routing": "gateway-api"})
        answer = original(self, obj, **kwargs)
        Session.objects.filter(public_id=raced[0]).update(phase=Session.Phase.STARTING)  # the operator's report, first
        return answer

    with mock.patch.object(KubeGateway, "apply", apply):
        sid = start(http, cluster="lab-c1")
    assert raced == [sid]
    for _ in range(5):
        if not Session.objects.filter(reapply_due_at__isnull=False).exists():
            break
        lifecycle.sessions_reconcile(older_than=0)
    assert Cluster.objects.get(pk=cluster.pk).routing == "gateway-api"
    assert specs(emulated)[object_name(sid)]["routing"] == "gateway-api"


@pytest.mark.django_db(transaction=True)
def test_a_routing_change_during_an_apply_whose_answer_is_lost_is_not_lost(http, live_cluster):
    """As above, but the apply's answer never arrives (it landed; the call timed out): the retry finds the session
    Starting (the operator reported it) and does nothing, so the change must still be due somewhere."""
    from clusters import services as cluster_services
    from kube import KubeGateway, KubeUnavailable

    cluster, emulated = live_cluster("lab-c1")
    original, raced = KubeGateway.apply, []

    def apply(self, obj, **kwargs):
        if obj.get("kind") != "GShareSession" or raced:
            return original(self, obj, **kwargs)
        raced.append(obj["spec"]["sessionId"])
        cluster_services.cluster_update(cluster=Cluster.objects.get(pk=cluster.pk), changes={"routing": "gateway-api"})
        original(self, obj, **kwargs)
        Session.objects.filter(public_id=raced[0]).update(phase=Session.Phase.STARTING)  # the operator's report
        raise KubeUnavailable(cause=TimeoutError("read timed out"))

    with mock.patch.object(KubeGateway, "apply", apply):
        sid = start(http, cluster="lab-c1")
    assert raced == [sid]
    for _ in range(5):  # the task's retries (eager) and the beat's relay
        lifecycle.session_apply(session=Session.objects.get(public_id=sid))
        lifecycle.sessions_reconcile(older_than=0)
    assert specs(emulated)[object_name(sid)]["routing"] == "gateway-api"
