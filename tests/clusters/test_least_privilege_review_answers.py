"""The connection test's ``credential_least_privilege`` check when the apiserver's SelfSubjectAccessReview answer is
refused or not what Kubernetes sends: an apiserver in front of the emulator (a loopback proxy) changes only that
answer; the test never fails with a 500, the other checks are judged as usual, and the credential check is left out
(nothing is known) rather than guessed."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from attach import least_privilege
from clusters import services
from clusters.models import Cluster
from kube.kubeconfig import validate_kubeconfig
from tests.helpers import kubeconfig_text

pytestmark = pytest.mark.django_db

REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@pytest.fixture
def review_proxy(fleet_cluster, settings, apiserver_proxy):
    """Factory: ``start(status, body) -> Cluster``: an emulated cluster with the least-privilege credential, registered
    through a proxy that answers every SelfSubjectAccessReview with ``status`` and ``body`` (bytes) and passes every
    other request to the emulator."""

    def start(status: int, body: bytes):
        emulated = fleet_cluster("lab-c1")
        url = apiserver_proxy(emulated.url, lambda method, path, data: (status, body) if path.split("?")[0] == REVIEW_PATH
                              else None)
        config = validate_kubeconfig(kubeconfig_text(emulated), loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST).config
        text = least_privilege.least_privilege_kubeconfig(config, server=emulated.url, timeout=10).replace(emulated.url, url)
        cluster = services.cluster_register(name="lab-c1", kubeconfig=text, session_domain="lab-c1.example.com")
        cluster.last_heartbeat_at = timezone.now()
        cluster.save(update_fields=["last_heartbeat_at"])
        return cluster

    return start


def status_body(code: int, reason: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
                       "message": f"selfsubjectaccessreviews.authorization.k8s.io is {reason.lower()}"}).encode()


@pytest.mark.parametrize(("status", "body"), [
    (403, status_body(403, "Forbidden")),
    (404, status_body(404, "NotFound")),
    (201, b"not json at all"),
    (201, b"[1, 2, 3]"),
    (201, b'{"status": "allowed"}'),
    (201, b'{"status": ["allowed"]}'),
    (201, b'{"status": {"allowed": "yes"}}'),
    (201, b'{"status": {"allowed": 1}}'),
    (201, b"{}"),
])
def test_a_refused_or_strange_review_leaves_the_check_out(review_proxy, status, body):
    cluster = review_proxy(status, body)
    report = services.cluster_connection_test(cluster=cluster)
    assert report["checks"]["apiserver_reachable"] is True and report["checks"]["gpu_nodes"] is True
    assert report["checks"].get("credential_least_privilege") in (None, True)
    assert report["status"] == "connected"
    assert Cluster.objects.get(pk=cluster.pk).status == Cluster.Status.CONNECTED


def test_a_review_answered_with_a_server_error_is_not_the_apiserver_unreachable(review_proxy):
    cluster = review_proxy(500, status_body(500, "InternalError"))
    report = services.cluster_connection_test(cluster=cluster)
    assert report["checks"]["apiserver_reachable"] is True, report
    assert "credential_least_privilege" not in report["checks"]


def test_an_allowed_review_is_reported_only_when_it_says_true(review_proxy):
    cluster = review_proxy(201, json.dumps({"kind": "SelfSubjectAccessReview", "status": {"allowed": True}}).encode())
    report = services.cluster_connection_test(cluster=cluster)
    assert report["checks"]["credential_least_privilege"] is False and report["status"] == "connected"


def test_the_cluster_page_says_unknown_rather_than_not_tested(review_proxy, console):
    cluster = review_proxy(403, status_body(403, "Forbidden"))
    services.cluster_connection_test(cluster=cluster)
    page = console.get(f"/clusters/cluster/{cluster.pk}/change/").content.decode()
    assert "unknown (the apiserver did not answer the connection test&#x27;s SelfSubjectAccessReview)" in page
    assert "not tested (run the connection test)" not in page
    Cluster.objects.filter(pk=cluster.pk).update(last_connection_test=["not", "a", "report"])
    assert console.get(f"/clusters/cluster/{cluster.pk}/change/").status_code == 200
