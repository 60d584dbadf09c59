"""A routing change re-applies the live sessions of the cluster, so their GShareSessions (and the routing objects the
operator builds from them) follow: against emulated apiservers, Celery eager (the re-apply runs after the commit).

The races go through a loopback proxy in front of the emulator (``apiserver_proxy``) that acts while the re-apply's
PATCH is in flight: another routing change committed meanwhile, or a stop. The last change must win, and a stopped
session must not be left with a GShareSession.
"""

from __future__ import annotations

import pytest
import yaml
from django.db import connections

from clusters import services as cluster_services
from clusters.models import Cluster
from demo import fleet
from sessions import create, lifecycle
from sessions.models import Session
from tests.factories import UserFactory

GSS = ("gsharesessions", "gshare.io", "v1alpha1")
EXT_AUTHZ = "/internal/connect/ext-authz"


def start(http, **body):
    response = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, **body})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def specs(emulated) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj["spec"] for obj in emulated.objects_of(*GSS)}


def object_name(session_id: str) -> str:
    return session_id.replace("_", "-")


@pytest.mark.django_db
def test_a_routing_change_reapplies_every_live_session_of_the_cluster_and_no_other(http, live_cluster):
    cluster, emulated = live_cluster("lab-c1")
    _, other = live_cluster("lab-c2")
    starting, running = start(http, cluster="lab-c1"), start(http, cluster="lab-c1")
    Session.objects.filter(public_id=running).update(phase=Session.Phase.RUNNING)
    stopped = start(http, cluster="lab-c1")
    assert http.delete(f"/api/v1/sessions/{stopped}").status_code == 202
    elsewhere = start(http, cluster="lab-c2")
    before = specs(emulated)
    assert set(before) == {object_name(starting), object_name(running)}
    assert all(spec["routing"] == "ingress-nginx" and "gateway" not in spec for spec in before.values())

    response = http.patch(f"/api/v1/clusters/{cluster.public_id}",
                          json={"routing": "gateway-api", "gateway_name": "edge", "gateway_namespace": "infra"})
    assert response.status_code == 200, response.text
    assert response.json()["sessions_reapplied"] == 2
    after = specs(emulated)
    assert set(after) == set(before)  # the stopped session was not applied again
    for spec in after.values():
        assert spec["routing"] == "gateway-api"
        assert spec["gateway"] == {"name": "edge", "namespace": "infra"}
        assert spec["extAuthUrl"].endswith(EXT_AUTHZ)
    assert specs(other)[object_name(elsewhere)]["routing"] == "ingress-nginx"
    assert dict(Session.objects.values_list("public_id", "phase")) == {
        starting: "Starting", running: "Running", stopped: "Terminated", elsewhere: "Starting"}
    assert not Session.objects.filter(reapply_due_at__isnull=False).exists()

    # Another Gateway: followed. Back to ingress-nginx: the Gateway leaves the spec (server-side apply drops the field
    # the control plane no longer sends).
    assert http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"gateway_name": "edge-2"}).json()["sessions_reapplied"] == 2
    assert {spec["gateway"]["name"] for spec in specs(emulated).values()} == {"edge-2"}
    assert http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"routing": "ingress-nginx"}).json()["sessions_reapplied"] == 2
    assert all(spec["routing"] == "ingress-nginx" and "gateway" not in spec for spec in specs(emulated).values())
    # In ingress-nginx mode the Gateway decides nothing: changing it re-applies nothing.
    assert http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"gateway_name": "edge-3"}).json()["sessions_reapplied"] == 0


@pytest.mark.django_db
def test_a_new_session_after_the_change_is_applied_with_the_new_routing(http, live_cluster):
    cluster, emulated = live_cluster("lab-c1")
    assert http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"routing": "gateway-api"}).json()["sessions_reapplied"] == 0
    session_id = start(http)
    spec = specs(emulated)[object_name(session_id)]
    assert spec["routing"] == "gateway-api" and spec["gateway"] == {"name": "gshare-sessions", "namespace": "gshare-system"}


@pytest.fixture
def proxied_cluster(fleet_cluster, apiserver_proxy, settings):
    """lab-c1 registered through a proxy whose ``hook(method, path)`` (set by the test) runs before each request to the
    emulator is relayed (a hook returning ``(status, body)`` answers instead); returns ``(cluster, emulated, hooks)``
    with ``hooks`` the list the test appends to."""
    settings.GSHARE_PROBE_TIMEOUT = 15.0
    emulated = fleet_cluster("lab-c1")
    hooks = []

    def answer(method, path, data):
        given = None
        for hook in list(hooks):
            given = hook(method, path) or given
        connections.close_all()  # the proxy's threads must not keep connections that outlive the test database
        return given

    url = apiserver_proxy(emulated.url, answer)
    kubeconfig = emulated.kubeconfig("lab")
    kubeconfig["clusters"][0]["cluster"]["server"] = url
    cluster = cluster_services.cluster_register(name="lab-c1", kubeconfig=yaml.safe_dump(kubeconfig), session_domain="lab-c1.gshare.localhost")
    cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory("lab-c1")["snapshot"]["nodes"])
    return cluster, emulated, hooks


def once_on_the_session_patch(action):
    """A proxy hook running ``action()`` once, when the GShareSession's server-side apply (a PATCH) arrives."""
    done = []

    def hook(method, path):
        if method == "PATCH" and "/gsharesessions/" in path and not done:
            done.append(True)
            action()

    return hook


@pytest.mark.django_db(transaction=True)
def test_a_change_committed_while_a_reapply_is_in_flight_wins(proxied_cluster):
    cluster, emulated, hooks = proxied_cluster
    session = create.session_create(owner=UserFactory(), image="img", gpus=1)  # eager: applied (ingress-nginx)
    Cluster.objects.filter(pk=cluster.pk).update(routing="gateway-api")
    Session.objects.filter(pk=session.pk).update(reapply_due_at=session.created_at)
    # While the gateway-api PATCH is in flight, the routing goes back to ingress-nginx (another PATCH, committed).
    hooks.append(once_on_the_session_patch(lambda: Cluster.objects.filter(pk=cluster.pk).update(routing="ingress-nginx")))
    lifecycle.session_reapply(session=session)
    (spec,) = specs(emulated).values()
    assert spec["routing"] == "ingress-nginx" and "gateway" not in spec  # the in-flight apply's routing did not stay
    assert Session.objects.get(pk=session.pk).reapply_due_at is None


@pytest.mark.django_db(transaction=True)
def test_a_routing_change_during_the_first_apply_is_followed(proxied_cluster):
    cluster, emulated, hooks = proxied_cluster
    hooks.append(once_on_the_session_patch(lambda: cluster_services.cluster_update(cluster=cluster, changes={"routing": "gateway-api"})))
    session = create.session_create(owner=UserFactory(), image="img", gpus=1)  # the apply reads ingress-nginx
    (spec,) = specs(emulated).values()
    assert spec["routing"] == "gateway-api" and spec["gateway"]["name"] == "gshare-sessions"
    session.refresh_from_db()
    assert session.phase == Session.Phase.STARTING and session.reapply_due_at is None


@pytest.mark.django_db(transaction=True)
def test_a_session_stopped_while_its_reapply_is_in_flight_keeps_no_object(proxied_cluster):
    cluster, emulated, hooks = proxied_cluster
    session = create.session_create(owner=UserFactory(), image="img", gpus=1)
    Session.objects.filter(pk=session.pk).update(phase=Session.Phase.RUNNING)
    # The stop's delete runs (eager) before the re-apply's PATCH is relayed: it removes the object, the PATCH makes it again.
    hooks.append(once_on_the_session_patch(lambda: lifecycle.session_stop(session=session)))
    assert cluster_services.cluster_update(cluster=cluster, changes={"routing": "gateway-api"}).sessions_reapplied == 1
    assert emulated.objects_of(*GSS) == []
    session.refresh_from_db()
    assert session.phase == Session.Phase.TERMINATED and session.reapply_due_at is None


@pytest.mark.django_db
def test_a_reapply_that_cannot_reach_the_apiserver_stays_due_and_fails_nothing(live_cluster):
    cluster, emulated = live_cluster("lab-c1")
    session = create.session_create(owner=UserFactory(), image="img", gpus=1)
    Session.objects.filter(pk=session.pk).update(phase=Session.Phase.RUNNING)
    emulated.stop()
    # Eager: the re-apply runs after the commit, its first transient failure is final (Celery retries it in production).
    assert cluster_services.cluster_update(cluster=cluster, changes={"routing": "gateway-api"}).sessions_reapplied == 1
    session.refresh_from_db()
    assert session.phase == Session.Phase.RUNNING and session.reapply_due_at is not None  # sessions.reconcile relays it


@pytest.mark.django_db(transaction=True)
def test_a_refused_reapply_is_logged_and_not_retried_forever(proxied_cluster, caplog):
    cluster, emulated, hooks = proxied_cluster
    session = create.session_create(owner=UserFactory(), image="img", gpus=1)
    Session.objects.filter(pk=session.pk).update(phase=Session.Phase.RUNNING)
    status = b'{"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "spec.routing: Unsupported value", "code": 422}'
    hooks.append(lambda method, path: (422, status) if method == "PATCH" and "/gsharesessions/" in path else None)
    assert cluster_services.cluster_update(cluster=cluster, changes={"routing": "gateway-api"}).sessions_reapplied == 1
    session.refresh_from_db()
    assert session.phase == Session.Phase.RUNNING and session.reapply_due_at is None
    (spec,) = specs(emulated).values()
    assert spec["routing"] == "ingress-nginx"
    assert any("could not be re-applied" in r.getMessage() and "Unsupported value" in r.getMessage() for r in caplog.records)
