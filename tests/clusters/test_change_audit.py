"""Who may change a cluster: console actions need the change permission (view-only staff run none, nor revoke API
tokens); every change and deregistration, from the console, the API or a service, is audited with its actor.
"""

from __future__ import annotations

import logging

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import RequestFactory

from clusters import services
from clusters.models import Cluster
from console.pages.clusters.admin import ClusterAdmin
from console.pages.credentials import ApiTokenAdmin
from identity.models import ApiToken
from identity.tokens import api_token_create
from tests.factories import ClusterFactory
from tests.helpers import kubeconfig_text

pytestmark = pytest.mark.django_db

CLUSTER_ACTIONS = {"connection_test", "deregister", "rotate_operator_token", "revoke_operator_tokens"}


def audits(caplog, action: str | None = None) -> list[dict]:
    return [r.audit for r in caplog.records if r.name == "gshare.audit" and (action is None or r.audit["action"] == action)]


@pytest.fixture
def viewer(client, django_user_model):
    user = django_user_model.objects.create_user("viewer", "v@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_cluster"), Permission.objects.get(codename="view_apitoken"))
    client.force_login(user)
    return user


def test_view_only_staff_can_run_no_cluster_action(client, viewer):
    c = ClusterFactory()
    for action in sorted(CLUSTER_ACTIONS):
        client.post("/clusters/cluster/", {"action": action, "_selected_action": [c.pk]})
    row = Cluster.objects.get(pk=c.pk)
    assert (row.credential_generation, row.status) == (1, c.status), "view-only staff changed the cluster"
    request = RequestFactory().get("/clusters/cluster/")
    request.user = viewer
    assert not set(ClusterAdmin(Cluster, admin.site).get_actions(request)) & CLUSTER_ACTIONS
    assert "revoke" not in ApiTokenAdmin(ApiToken, admin.site).get_actions(request)
    page = client.get("/clusters/cluster/")
    assert page.status_code == 200 and b"revoke_operator_tokens" not in page.content


def test_view_only_staff_cannot_revoke_api_tokens(client, viewer, staff_user):
    api_token_create(username=staff_user.username)
    row = ApiToken.objects.get()
    client.post("/gshare/apitoken/", {"action": "revoke", "_selected_action": [row.pk]})
    assert ApiToken.objects.get(pk=row.pk).revoked_at is None


@pytest.mark.django_db(transaction=True)
def test_staff_with_change_permission_runs_the_actions_audited_as_themselves(client, django_user_model, caplog):
    user = django_user_model.objects.create_user("editor", "e@example.com", "pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_cluster"), Permission.objects.get(codename="change_cluster"))
    client.force_login(user)
    c = ClusterFactory()
    caplog.set_level(logging.INFO, logger="gshare.audit")
    client.post("/clusters/cluster/", {"action": "revoke_operator_tokens", "_selected_action": [c.pk]})
    client.post("/clusters/cluster/", {"action": "deregister", "_selected_action": [c.pk]})
    row = Cluster.objects.get(pk=c.pk)
    assert (row.credential_generation, row.status) == (3, Cluster.Status.DEREGISTERED)
    assert [(a["action"], a["actor"]) for a in audits(caplog)] == [
        ("operator_tokens_revoke", "console:editor"), ("cluster_deregister", "console:editor"),
    ]


def test_patch_and_delete_through_the_api_are_audited_with_the_user(http, fleet_cluster, caplog):
    emulated = fleet_cluster("lab-c1")
    cluster_id = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": kubeconfig_text(emulated)}).json()["id"]
    caplog.set_level(logging.INFO, logger="gshare.audit")

    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(emulated), "session_domain": "x.example.com"})
    assert response.status_code == 200, response.text
    [update] = audits(caplog, "cluster_update")
    assert (update["actor"], update["cluster"], update["fields"]) == ("api:admin", cluster_id, ["kubeconfig", "session_domain"])
    assert update["apiserver_url"] == Cluster.objects.get(public_id=cluster_id).apiserver_url
    stored = Cluster.objects.get(public_id=cluster_id).kubeconfig
    token_line = next(line for line in stored.splitlines() if "token:" in line)
    assert token_line.split("token:")[1].strip() not in caplog.text  # never the credential

    response = http.delete(f"/api/v1/clusters/{cluster_id}")
    assert response.status_code == 200, response.text
    [deregister] = audits(caplog, "cluster_deregister")
    assert (deregister["actor"], deregister["cluster"], deregister["generation"]) == ("api:admin", cluster_id, 2)


def test_a_refused_patch_writes_no_audit_line(http, fleet_cluster, caplog):
    lab_c1, lab_c2 = fleet_cluster("lab-c1"), fleet_cluster("lab-c2")
    cluster_id = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": kubeconfig_text(lab_c1)}).json()["id"]
    caplog.set_level(logging.INFO, logger="gshare.audit")
    response = http.patch(f"/api/v1/clusters/{cluster_id}", json={"kubeconfig": kubeconfig_text(lab_c2)})
    assert response.json()["code"] == "different_cluster"
    assert audits(caplog) == []


@pytest.mark.django_db(transaction=True)
def test_services_default_to_the_system_actor(caplog):
    c = ClusterFactory()
    caplog.set_level(logging.INFO, logger="gshare.audit")
    services.cluster_update(cluster=c, changes={"session_domain": "y.example.com"})
    services.cluster_deregister(cluster=c)
    assert [(a["action"], a["actor"]) for a in audits(caplog)] == [("cluster_update", "system"), ("cluster_deregister", "system")]
