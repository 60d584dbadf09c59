"""The emulator's identities and RBAC over HTTP (``demo.emulator.auth``, ``demo.emulator.rbac``): ServiceAccount
tokens from token Secrets and TokenRequests, Roles/ClusterRoles and their bindings evaluated per request (verbs,
apiGroups, resources and subresources, resourceNames, ``*``), the apiserver's 403 Status, the self reviews, and the
admin token staying cluster-admin."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import pytest

from demo.emulator import EmulatedCluster

NS = "team-a"
SA = "robot"
USER = f"system:serviceaccount:{NS}:{SA}"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def call(cluster, token, path, method="GET", body=None, content_type="application/json"):
    """``(status, JSON body)`` of one request with ``token``."""
    request = urllib.request.Request(cluster.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, (json.loads(raw) if raw and raw[:1] in b"{[" else raw.decode())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def cluster():
    seed = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in ("default", "kube-system", NS)]
    seed += [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}},
             {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": NS}},
             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "allowed", "namespace": NS}},
             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "namespace": NS}}]
    with EmulatedCluster(seed, token="admin") as running:
        yield running


def token_secret(cluster, name="robot-token", account=SA) -> str:
    status, secret = call(cluster, "admin", f"/api/v1/namespaces/{NS}/secrets", "POST", {
        "metadata": {"name": name, "annotations": {"kubernetes.io/service-account.name": account}},
        "type": "kubernetes.io/service-account-token"})
    assert status == 201, secret
    assert "token" not in (secret.get("data") or {})  # the tokens controller fills it afterwards, as in a cluster
    return base64.b64decode(filled(cluster, NS, name)["data"]["token"]).decode()


def filled(cluster, namespace, name) -> dict:
    """The token Secret once the tokens controller has written its token (within a few seconds)."""
    deadline = time.monotonic() + 5
    while True:
        status, secret = call(cluster, "admin", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if status == 200 and (secret.get("data") or {}).get("token"):
            return secret
        assert time.monotonic() < deadline, secret
        time.sleep(0.02)


def grant(cluster, rules, *, namespace=None, name="grant"):
    """A Role (in ``namespace``) or ClusterRole with ``rules``, bound to the ServiceAccount."""
    subject = [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]
    kind, where = ("Role", f"/namespaces/{namespace}") if namespace else ("ClusterRole", "")
    binding = "RoleBinding" if namespace else "ClusterRoleBinding"
    assert call(cluster, "admin", f"{RBAC}{where}/{kind.lower()}s", "POST", {"metadata": {"name": name}, "rules": rules})[0] == 201
    assert call(cluster, "admin", f"{RBAC}{where}/{binding.lower()}s", "POST", {
        "metadata": {"name": name}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}})[0] == 201


def test_a_service_account_token_is_forbidden_everything_until_granted(cluster):
    token = token_secret(cluster)
    status, body = call(cluster, token, "/api/v1/nodes")
    assert status == 403
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": f'nodes is forbidden: User "{USER}" cannot list resource "nodes" in API group "" at the cluster scope',
                    "details": {"kind": "nodes"}}
    status, body = call(cluster, token, f"/api/v1/namespaces/{NS}/configmaps/allowed")
    assert (status, body["message"]) == (403, f'configmaps "allowed" is forbidden: User "{USER}" cannot get resource "configmaps" '
                                              f'in API group "" in the namespace "{NS}"')
    assert body["details"] == {"kind": "configmaps", "name": "allowed"}
    status, body = call(cluster, token, "/apis/apps/v1/daemonsets")
    assert body["message"].startswith("daemonsets.apps is forbidden:") and body["details"]["group"] == "apps"
    # Discovery, /version and health are every authenticated user's (the bootstrap policy).
    assert call(cluster, token, "/version")[0] == 200 and call(cluster, token, "/apis")[0] == 200
    assert call(cluster, token, "/healthz")[0] == 200
    # The admin token is cluster-admin, as before.
    assert call(cluster, "admin", "/api/v1/nodes")[0] == 200
    assert call(cluster, "not-a-token", "/api/v1/nodes")[0] == 401


def test_rules_match_verbs_groups_resources_names_and_scope(cluster):
    token = token_secret(cluster)
    grant(cluster, [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "update"], "resourceNames": ["allowed"]},
                    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}], namespace=NS)
    grant(cluster, [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
                    {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["get"]}], name="cluster-wide")
    assert call(cluster, token, f"/api/v1/namespaces/{NS}/configmaps/allowed")[0] == 200
    assert call(cluster, token, f"/api/v1/namespaces/{NS}/configmaps/other")[0] == 403
    assert call(cluster, token, f"/api/v1/namespaces/{NS}/configmaps")[0] == 403  # list carries no name
    assert call(cluster, token, f"/api/v1/namespaces/{NS}/configmaps/allowed", "DELETE")[0] == 403
    assert call(cluster, token, "/api/v1/namespaces/default/configmaps/allowed")[0] == 403  # the Role's namespace only
    assert call(cluster, token, "/api/v1/nodes")[0] == 200
    assert call(cluster, token, "/api/v1/nodes/n1")[0] == 403  # list, not get
    status, body = call(cluster, token, "/api/v1/nodes?watch=true&timeoutSeconds=1")
    assert status == 403 and "cannot watch resource" in body["message"]
    assert call(cluster, token, "/api/v1/nodes/n1/status")[0] == 200  # */status in any group
    status, body = call(cluster, token, f"/api/v1/namespaces/{NS}/pods/p/log")
    assert status == 404  # allowed (pods/log), the pod does not exist
    status, body = call(cluster, token, f"/api/v1/namespaces/{NS}/pods/p")
    assert status == 403 and body["message"].startswith('pods "p" is forbidden')


def test_server_side_apply_of_a_new_object_needs_create_too(cluster):
    token = token_secret(cluster)
    grant(cluster, [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]}], namespace=NS)
    apply = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "new"}, "data": {"a": "b"}}
    path = f"/api/v1/namespaces/{NS}/configmaps/new?fieldManager=t"
    status, body = call(cluster, token, path, "PATCH", apply, "application/apply-patch+yaml")
    assert status == 403 and "cannot create resource" in body["message"]
    assert call(cluster, token, f"/api/v1/namespaces/{NS}/configmaps/allowed?fieldManager=t", "PATCH",
                {**apply, "metadata": {"name": "allowed"}}, "application/apply-patch+yaml")[0] == 200


def test_self_reviews_answer_for_the_caller(cluster):
    token = token_secret(cluster)
    grant(cluster, [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["allowed"]}], namespace=NS)
    review = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    status, body = call(cluster, token, review, "POST", {"spec": {"resourceAttributes": {
        "namespace": NS, "verb": "get", "resource": "configmaps", "name": "allowed"}}})
    assert status == 201 and body["kind"] == "SelfSubjectAccessReview" and body["status"]["allowed"] is True
    assert body["status"]["reason"] == f'RBAC: allowed by RoleBinding "grant/{NS}" of Role "grant" to ServiceAccount "{SA}/{NS}"'
    everything = {"spec": {"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}}}
    assert call(cluster, token, review, "POST", everything)[1]["status"] == {"allowed": False}
    assert call(cluster, "admin", review, "POST", everything)[1]["status"]["allowed"] is True
    assert call(cluster, token, review, "POST", {"spec": {}})[0] == 422
    assert call(cluster, token, review)[0] == 403 and call(cluster, "admin", review)[0] == 405  # create only
    status, body = call(cluster, token, "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", "POST", {"spec": {"namespace": NS}})
    assert status == 201 and body["status"]["incomplete"] is False
    assert {"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["allowed"]} in body["status"]["resourceRules"]
    assert {"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                                                  "/openapi/*", "/readyz", "/version", "/version/"]} in body["status"]["nonResourceRules"]
    other = call(cluster, token, "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", "POST", {"spec": {"namespace": "default"}})[1]
    assert not any(rule["resources"] == ["configmaps"] for rule in other["status"]["resourceRules"])
    admin = call(cluster, "admin", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", "POST", {"spec": {"namespace": NS}})[1]
    assert {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]} in admin["status"]["resourceRules"]


def test_tokens_are_revoked_with_their_secret_or_service_account(cluster):
    token = token_secret(cluster)
    assert call(cluster, token, "/version")[0] == 200
    assert call(cluster, "admin", f"/api/v1/namespaces/{NS}/secrets/robot-token", "DELETE")[0] == 200
    assert call(cluster, token, "/version")[0] == 401
    status, request = call(cluster, "admin", f"/api/v1/namespaces/{NS}/serviceaccounts/{SA}/token", "POST",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    assert status == 201 and request["kind"] == "TokenRequest" and request["status"]["expirationTimestamp"]
    short = request["status"]["token"]
    assert call(cluster, short, "/version")[0] == 200
    assert call(cluster, "admin", f"/api/v1/namespaces/{NS}/serviceaccounts/{SA}/token", "POST",
                {"spec": {"expirationSeconds": 60}})[0] == 422
    assert call(cluster, "admin", f"/api/v1/namespaces/{NS}/serviceaccounts/{SA}", "DELETE")[0] == 200
    assert call(cluster, short, "/version")[0] == 401
    # A token Secret for a ServiceAccount that does not exist is never filled.
    status, secret = call(cluster, "admin", f"/api/v1/namespaces/{NS}/secrets", "POST", {
        "metadata": {"name": "orphan", "annotations": {"kubernetes.io/service-account.name": "nobody"}},
        "type": "kubernetes.io/service-account-token"})
    assert status == 201
    time.sleep(0.2)
    assert "token" not in (call(cluster, "admin", f"/api/v1/namespaces/{NS}/secrets/orphan")[1].get("data") or {})


def test_token_secrets_carry_the_ca_over_tls():
    seed = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": NS}}]
    with EmulatedCluster(seed, token="admin", tls=True) as running:
        import ssl

        context = ssl.create_default_context(cadata=running.ca_pem.decode())
        request = urllib.request.Request(running.url + f"/api/v1/namespaces/{NS}/secrets", method="POST", data=json.dumps({
            "metadata": {"name": "t", "annotations": {"kubernetes.io/service-account.name": SA}},
            "type": "kubernetes.io/service-account-token"}).encode(),
            headers={"Authorization": "Bearer admin", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            assert response.status == 201
        secret = running.objects_of("secrets")[0]
        for _ in range(100):
            if "token" in (secret.get("data") or {}):
                break
            time.sleep(0.02)
            secret = running.objects_of("secrets")[0]
        assert base64.b64decode(secret["data"]["ca.crt"]) == running.ca_pem
        assert base64.b64decode(secret["data"]["namespace"]).decode() == NS
        assert secret["metadata"]["annotations"]["kubernetes.io/service-account.uid"]


def test_rbac_writes_cannot_grant_what_their_writer_does_not_hold(cluster):
    """The apiserver's escalation prevention: a ServiceAccount that may write Roles and RoleBindings still cannot bind
    cluster-admin or write a Role with rights it lacks, unless it may ``bind`` or ``escalate``."""
    token = token_secret(cluster)
    grant(cluster, [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"],
                     "verbs": ["create", "update", "patch", "get"]},
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}], namespace=NS)
    subject = [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]
    admin_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}
    assert call(cluster, "admin", f"{RBAC}/clusterroles", "POST", {"metadata": {"name": "cluster-admin"}, "rules": [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]})[0] == 201
    status, body = call(cluster, token, f"{RBAC}/namespaces/{NS}/rolebindings", "POST",
                        {"metadata": {"name": "mine"}, "roleRef": admin_ref, "subjects": subject})
    assert status == 403, body
    assert body["message"].startswith(f'rolebindings.rbac.authorization.k8s.io "mine" is forbidden: user "{USER}"')
    assert "attempting to grant RBAC permissions not currently held" in body["message"]
    status, body = call(cluster, token, f"{RBAC}/namespaces/{NS}/roles", "POST", {"metadata": {"name": "more"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]})
    assert status == 403 and 'Resources:["secrets"]' in body["message"], body
    # What it holds it may grant (a Role, and a binding to it).
    status, role = call(cluster, token, f"{RBAC}/namespaces/{NS}/roles", "POST", {"metadata": {"name": "same"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["allowed"]}]})
    assert status == 201, role
    assert call(cluster, token, f"{RBAC}/namespaces/{NS}/rolebindings", "POST", {"metadata": {"name": "same"}, "subjects": subject,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "same"}})[0] == 201
    # Widening it afterwards by a patch is refused the same way.
    status, body = call(cluster, token, f"{RBAC}/namespaces/{NS}/roles/same", "PATCH", {"rules": [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}, "application/merge-patch+json")
    assert status == 403, body
    # With `bind` on cluster-admin, or `escalate` on roles, the apiserver allows it.
    grant(cluster, [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
                     "resourceNames": ["cluster-admin"]},
                    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}],
          namespace=NS, name="binder")
    assert call(cluster, token, f"{RBAC}/namespaces/{NS}/rolebindings", "POST",
                {"metadata": {"name": "mine"}, "roleRef": admin_ref, "subjects": subject})[0] == 201
    assert call(cluster, token, f"{RBAC}/namespaces/{NS}/roles", "POST", {"metadata": {"name": "more"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]})[0] == 201
