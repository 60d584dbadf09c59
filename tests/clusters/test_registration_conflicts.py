"""One registration per cluster and per session hostname, and no session_domain change under live sessions:
through HTTP on the live server, against emulated apiservers of the demo fleet (a cluster is its kube-system uid)."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, transaction

from clusters.models import Cluster
from demo import fleet
from sessions.models import Session
from tests.factories import KUBECONFIG, ClusterFactory
from tests.helpers import Http, kubeconfig_text, run_threads

pytestmark = pytest.mark.django_db


def twin(fleet_cluster, uid: str):
    """An emulated copy of lab-c1 that is another cluster (its kube-system namespace has uid ``uid``)."""
    objects = fleet.cluster_objects("lab-c1")
    for obj in objects:
        if obj["kind"] == "Namespace" and obj["metadata"]["name"] == "kube-system":
            obj["metadata"]["uid"] = uid
    return fleet_cluster("lab-c1", objects=objects)


def register(http, emulated, name: str, domain: str | None = None):
    return http.post("/api/v1/clusters", json={"name": name, "kubeconfig": kubeconfig_text(emulated),
                                                "session_domain": domain if domain is not None else f"{name}.example.com"})


def test_the_same_cluster_under_another_name_is_refused_naming_the_registered_one(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    first = register(http, emulated, "lab-c1")
    assert first.status_code == 201, first.text
    first_id = first.json()["id"]
    # The copy of the report: lab-c1's kubeconfig under another name and lab-c1's own session_domain; then with a
    # domain of its own; then the same cluster behind another address (the same kube-system uid).
    for attempt in (register(http, emulated, "lab-c1-copy", "lab-c1.example.com"),
                    register(http, emulated, "lab-c1-copy"),
                    register(http, fleet_cluster("lab-c1"), "lab-c1-moved")):
        assert attempt.status_code == 409, attempt.text
        body = attempt.json()
        assert body["code"] == "cluster_already_registered"
        assert f"'lab-c1' ({first_id})" in body["detail"] and body["cluster"] == first_id
        assert f"PATCH /api/v1/clusters/{first_id}" in body["detail"]
        assert "emulator-token" not in attempt.text
    assert list(Cluster.objects.values_list("name", flat=True)) == ["lab-c1"]

    # Once the first is deregistered, the cluster may be registered again (under any name).
    assert http.delete(f"/api/v1/clusters/{first_id}").status_code == 200
    again = register(http, emulated, "lab-c1-new", "lab-c1.example.com")
    assert again.status_code == 201, again.text


def test_a_session_domain_another_cluster_serves_is_refused(http, fleet_cluster):
    first = register(http, fleet_cluster("lab-c1"), "lab-c1", "gpu.example.com")
    assert first.status_code == 201, first.text
    lab_c2 = fleet_cluster("lab-c2")
    refused = register(http, lab_c2, "lab-c2", "gpu.example.com")
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "session_domain_taken"
    assert f"'lab-c1' ({first.json()['id']})" in refused.json()["detail"]
    assert Cluster.objects.count() == 1
    # Without a session_domain (sessions cannot run there yet) there is nothing to share.
    assert register(http, lab_c2, "lab-c2", "").status_code == 201
    assert register(http, twin(fleet_cluster, "0b7a4e5e-0000-4000-8000-000000000003"), "lab-c3", "").status_code == 201


def test_the_database_refuses_a_second_row_for_one_cluster_or_domain():
    ClusterFactory(name="a", kube_system_uid="uid-1", session_domain="a.example.com")
    with pytest.raises(IntegrityError), transaction.atomic():
        ClusterFactory(name="b", kube_system_uid="uid-1")
    with pytest.raises(IntegrityError), transaction.atomic():
        ClusterFactory(name="c", session_domain="a.example.com")
    # Deregistered rows and empty values are outside the rule.
    ClusterFactory(name="d", kube_system_uid="uid-2", session_domain="d.example.com", status=Cluster.Status.DEREGISTERED)
    ClusterFactory(name="e", kube_system_uid="uid-2", session_domain="d.example.com")
    ClusterFactory(name="f", kube_system_uid="", session_domain="")
    ClusterFactory(name="g", kube_system_uid="", session_domain="")


def concurrently(live_server, staff_token, bodies: list[dict]) -> list:
    """POST every body to /api/v1/clusters at once (one client and thread each); the responses in order."""
    barrier = threading.Barrier(len(bodies))
    responses: list = [None] * len(bodies)

    def send(index: int) -> None:
        client = Http(live_server.url, staff_token)
        barrier.wait()
        responses[index] = client.post("/api/v1/clusters", json=bodies[index])

    run_threads(send, [(i,) for i in range(len(bodies))], timeout=60)
    return responses


@pytest.mark.django_db(transaction=True)
def test_concurrent_registrations_of_one_cluster_record_exactly_one(live_server, staff_token, fleet_cluster):
    kubeconfig = kubeconfig_text(fleet_cluster("lab-c1"))
    bodies = [{"name": f"copy-{i}", "kubeconfig": kubeconfig, "session_domain": f"copy-{i}.example.com"} for i in range(6)]
    responses = concurrently(live_server, staff_token, bodies)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [409] * 5, [r.text for r in responses]
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"cluster_already_registered"}
    (winner,) = [r.json() for r in responses if r.status_code == 201]
    assert all(r.json()["cluster"] == winner["id"] for r in responses if r.status_code == 409)
    assert Cluster.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_registrations_of_one_session_domain_record_exactly_one(live_server, staff_token, fleet_cluster):
    clusters = {"lab-c1": fleet_cluster("lab-c1"), "lab-c2": fleet_cluster("lab-c2"),
                "lab-c3": twin(fleet_cluster, "0b7a4e5e-0000-4000-8000-000000000003")}
    bodies = [{"name": name, "kubeconfig": kubeconfig_text(emulated), "session_domain": "gpu.example.com"}
              for name, emulated in clusters.items()]
    responses = concurrently(live_server, staff_token, bodies)
    assert sorted(r.status_code for r in responses) == [201, 409, 409], [r.text for r in responses]
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"session_domain_taken"}
    assert Cluster.objects.count() == 1


def test_patch_may_not_take_another_clusters_session_domain(http):
    a, b = ClusterFactory(name="a"), ClusterFactory(name="b")
    refused = http.patch(f"/api/v1/clusters/{b.public_id}", json={"session_domain": a.session_domain})
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "session_domain_taken" and f"'a' ({a.public_id})" in refused.json()["detail"]
    b.refresh_from_db()
    assert b.session_domain == "b.gpu.example.com"
    # Its own domain again is no change; a deregistered cluster's domain is free.
    assert http.patch(f"/api/v1/clusters/{b.public_id}", json={"session_domain": b.session_domain}).status_code == 200
    Cluster.objects.filter(pk=a.pk).update(status=Cluster.Status.DEREGISTERED)
    assert http.patch(f"/api/v1/clusters/{b.public_id}", json={"session_domain": a.session_domain}).status_code == 200


def start_session(http) -> str:
    response = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1})
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.mark.parametrize("new_domain", ["lab-c1.new.example.com", ""], ids=["moved", "emptied"])
def test_session_domain_change_is_refused_while_sessions_live(http, live_cluster, new_domain):
    cluster, emulated = live_cluster("lab-c1")
    live = [start_session(http), start_session(http)]
    assert {s.phase for s in Session.objects.all()} == {Session.Phase.STARTING}

    refused = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"session_domain": new_domain, "ingress_node": "other-node"})
    assert refused.status_code == 409, refused.text
    body = refused.json()
    assert body["code"] == "cluster_has_live_sessions"
    assert sorted(body["sessions"]) == sorted(live) and all(sid in body["detail"] for sid in live)
    assert "DELETE /api/v1/sessions/" in body["detail"]
    cluster.refresh_from_db()
    assert cluster.session_domain == "lab-c1.gshare.localhost" and cluster.ingress_node == ""  # nothing half-applied
    for sid in live:  # the sessions' URLs still match their Ingress host
        assert http.get(f"/api/v1/sessions/{sid}").json()["url"].startswith("https://lab-c1.gshare.localhost/")

    # Other settings may change meanwhile; the domain once the sessions ended.
    assert http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"ingress_node": "lab-c1-cp-01"}).status_code == 200
    for sid in live:
        assert http.delete(f"/api/v1/sessions/{sid}").status_code in (200, 202)
    assert not Session.objects.exclude(phase__in=Session.TERMINAL_PHASES).exists()
    moved = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"session_domain": new_domain})
    assert moved.status_code == 200, moved.text
    assert moved.json()["session_domain"] == new_domain


def test_the_live_sessions_of_other_clusters_do_not_hold_a_change(http, live_cluster):
    live_cluster("lab-c1")
    other, _ = live_cluster("lab-c2")
    start = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, "cluster": "lab-c1"})
    assert start.status_code == 201, start.text
    response = http.patch(f"/api/v1/clusters/{other.public_id}", json={"session_domain": "lab-c2.new.example.com"})
    assert response.status_code == 200, response.text


def test_the_migration_names_duplicates_registered_before_the_rule_instead_of_failing_in_sql():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    def migrate(target: str) -> None:
        executor = MigrationExecutor(connection)
        executor.migrate([("clusters", target)])

    migrate("0007_cluster_name_validator")
    # Rows of 0007's schema go in through 0007's model: today's model names columns added since.
    old_cluster = MigrationExecutor(connection).loader.project_state(("clusters", "0007_cluster_name_validator")).apps.get_model("clusters", "Cluster")

    def old_row(**fields):
        return old_cluster.objects.create(apiserver_url="http://127.0.0.1:9", kubeconfig=KUBECONFIG, status="connected", **fields)

    try:
        original = old_row(name="lab-c1", kube_system_uid="uid-1", session_domain="gpu.example.com")
        copy = old_row(name="lab-c1-copy", kube_system_uid="uid-1", session_domain="gpu.example.com")
        with pytest.raises(RuntimeError) as refused:
            migrate("0008_unique_identity_and_session_domain")
        message = str(refused.value)
        assert f"lab-c1 ({original.public_id}), lab-c1-copy ({copy.public_id}) reach the same cluster (kube-system uid uid-1)" in message
        assert "share the session domain gpu.example.com" in message and "DELETE /api/v1/clusters/<id>" in message
        old_cluster.objects.filter(pk=copy.pk).update(status=Cluster.Status.DEREGISTERED)
    finally:  # back to the newest migration (not only 0008): the tests after this one need every column
        (latest,) = MigrationExecutor(connection).loader.graph.leaf_nodes("clusters")
        migrate(latest[1])
    with pytest.raises(IntegrityError), transaction.atomic():
        ClusterFactory(name="lab-c1-again", kube_system_uid="uid-1")


def test_a_copy_registered_before_the_rule_cannot_take_the_identity(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")
    first = register(http, emulated, "lab-c1").json()
    row = Cluster.objects.get(public_id=first["id"])
    # A copy from before identities were checked: same kubeconfig, no uid recorded yet.
    copy = ClusterFactory(name="lab-c1-copy", kubeconfig=row.kubeconfig, apiserver_url=row.apiserver_url, kube_system_uid="")

    report = http.post(f"/api/v1/clusters/{copy.public_id}/connection-test")
    assert report.status_code == 200, report.text  # recorded what it could, never a 500
    copy.refresh_from_db()
    assert copy.kube_system_uid == "" and copy.last_connection_test_at is not None

    refused = http.patch(f"/api/v1/clusters/{copy.public_id}", json={"kubeconfig": kubeconfig_text(emulated)})
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "cluster_already_registered" and refused.json()["cluster"] == first["id"]
    copy.refresh_from_db()
    assert copy.kube_system_uid == ""
