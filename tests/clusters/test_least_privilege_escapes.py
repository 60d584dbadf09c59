"""Attempts to get past the control plane's least-privilege credential (``attach.least_privilege``) in the emulator,
each one a request a real apiserver refuses: Secrets listed or watched, another Secret reached through the one
``resourceNames`` grant (a body naming another object, a field selector), RBAC written to escalate, Pods made directly,
through a Deployment or a TokenRequest, logs read, a forged token Secret; a deleted ServiceAccount's token; the admin
token staying cluster-admin."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import pytest
import yaml

from attach import least_privilege
from kube.kubeconfig import validate_kubeconfig
from tests.helpers import kubeconfig_text

pytestmark = pytest.mark.django_db

RBAC = "/apis/rbac.authorization.k8s.io/v1"


def call(emulated, token, path, method="GET", body=None, content_type="application/json", headers=None):
    """``(status, JSON body or text)`` of one request to the emulator with ``token``."""
    request = urllib.request.Request(emulated.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type,
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    else:
        status = response.status
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@pytest.fixture
def attached(fleet_cluster, settings):
    """``(emulated, token)``: a fleet cluster with the control plane's credential applied (and the operator's own
    ServiceAccount, as its chart makes it), and the credential's bearer token."""
    emulated = fleet_cluster("lab-c1")
    config = validate_kubeconfig(kubeconfig_text(emulated), loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST).config
    text = least_privilege.least_privilege_kubeconfig(config, server=emulated.url, timeout=10)
    emulated.add({"apiVersion": "v1", "kind": "ServiceAccount",
                  "metadata": {"name": "gshare-operator", "namespace": settings.GSHARE_OPERATOR_NAMESPACE}})
    return emulated, yaml.safe_load(text)["users"][0]["user"]["token"]


def test_secrets_are_not_listed_or_watched(attached, settings):
    emulated, token = attached
    ns = settings.GSHARE_OPERATOR_NAMESPACE
    for path in (f"/api/v1/namespaces/{ns}/secrets?watch=true&timeoutSeconds=1",
                 "/api/v1/secrets?watch=1&timeoutSeconds=1",
                 f"/api/v1/namespaces/{ns}/secrets?fieldSelector=metadata.name%3D{least_privilege.TOKEN_SECRET_NAME}",
                 f"/api/v1/namespaces/{ns}/secrets?watch=true&fieldSelector=metadata.name%3D{least_privilege.TOKEN_SECRET_NAME}"):
        status, body = call(emulated, token, path)
        assert status == 403, (path, body)
        assert least_privilege.TOKEN_SECRET_NAME not in json.dumps(body) or "forbidden" in body["message"]
    # The one Secret it may read, watched by name, streams that Secret only: never its own token Secret.
    status, body = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/{least_privilege.TOKEN_SECRET_NAME}?watch=true")
    assert status == 403


def test_the_named_secret_grant_reaches_no_other_secret(attached, settings):
    emulated, token = attached
    ns, allowed = settings.GSHARE_OPERATOR_NAMESPACE, settings.GSHARE_OPERATOR_TOKEN_SECRET
    other = least_privilege.TOKEN_SECRET_NAME
    assert call(emulated, token, f"/api/v1/namespaces/{ns}/secrets", "POST", {  # no create at all: the attach made it
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": allowed}, "data": {"internal-jwt": "eA=="}})[0] == 403
    assert call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/{allowed}")[0] == 200
    # A PUT or PATCH on the allowed name whose body names another Secret (or another namespace) is refused.
    status, body = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/{allowed}", "PUT", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": other, "namespace": ns}, "data": {}})
    assert status == 400, body
    status, body = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/{allowed}", "PUT", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": allowed, "namespace": "kube-system"}, "data": {}})
    assert status == 400, body
    status, body = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/{allowed}", "PATCH",
                        {"metadata": {"name": other}}, "application/merge-patch+json")
    assert status in (400, 403, 422), body  # patch is not granted anyway
    token_secret = next(s for s in emulated.objects_of("secrets") if s["metadata"]["name"] == other)
    assert token_secret["type"] == "kubernetes.io/service-account-token" and token_secret["data"]["token"]
    # A Secret's type cannot be changed by an update (the apiserver: field is immutable).
    current = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/{allowed}")[1]
    status, body = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/{allowed}", "PUT", {
        **current, "type": "kubernetes.io/service-account-token",
        "metadata": {**current["metadata"], "annotations": {"kubernetes.io/service-account.name": "gshare-operator"}}})
    assert status == 422, body
    # Path tricks name the object the authorizer saw.
    for path in (f"/api/v1/namespaces/{ns}/secrets/{allowed}/../{other}", f"/api/v1/namespaces/{ns}/secrets/{allowed}%2F..%2F{other}",
                 f"/api/v1/namespaces/{ns}/secrets/{other.upper()}"):
        status, body = call(emulated, token, path)
        assert status in (403, 404), (path, body)
        assert "token" not in json.dumps(body.get("data") if isinstance(body, dict) else "")


def test_a_forged_token_secret_is_no_credential(attached, settings):
    """A token Secret for the operator's ServiceAccount with a token of its writer's choosing: the credential may not
    write one at all, and one the admin writes authenticates nobody (a real apiserver only accepts tokens it signed)."""
    emulated, token = attached
    ns = settings.GSHARE_OPERATOR_NAMESPACE
    forged = "forged-token-of-the-operator"
    forged_secret = {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "forged", "annotations": {"kubernetes.io/service-account.name": "gshare-operator"}},
        "data": {"token": base64.b64encode(forged.encode()).decode()}}
    status, body = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets", "POST", forged_secret)
    assert status == 403, body
    assert call(emulated, emulated.token, f"/api/v1/namespaces/{ns}/secrets", "POST", forged_secret)[0] == 201
    time.sleep(0.3)  # the tokens controller's turn
    assert call(emulated, forged, "/version")[0] == 401
    assert call(emulated, forged, "/api/v1/nodes")[0] == 401
    # The same by the admin (a hand-written token in a token Secret) authenticates nobody either.
    assert call(emulated, emulated.token, f"/api/v1/namespaces/{ns}/secrets", "POST", {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "forged-by-admin", "annotations": {"kubernetes.io/service-account.name": least_privilege.ACCOUNT_NAME}},
        "data": {"token": base64.b64encode(b"by-hand").decode()}})[0] == 201
    time.sleep(0.3)
    assert call(emulated, "by-hand", "/version")[0] == 401
    # Nor may it create a token Secret of its own for another ServiceAccount, under any name.
    status, _ = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets", "POST", {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "mine", "annotations": {"kubernetes.io/service-account.name": "gshare-operator"}}})
    assert status == 403
    assert call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/mine")[0] == 403


def test_no_escalation_through_rbac_pods_deployments_logs_or_token_requests(attached, settings):
    emulated, token = attached
    ns, sessions_ns = settings.GSHARE_OPERATOR_NAMESPACE, settings.GSHARE_SESSION_NAMESPACE
    subject = [{"kind": "ServiceAccount", "name": least_privilege.ACCOUNT_NAME, "namespace": ns}]
    admin_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}
    attempts = [
        (f"{RBAC}/clusterrolebindings", "POST", {"metadata": {"name": "mine"}, "roleRef": admin_ref, "subjects": subject}),
        (f"{RBAC}/namespaces/{sessions_ns}/rolebindings", "POST",
         {"metadata": {"name": "mine"}, "roleRef": admin_ref, "subjects": subject}),
        (f"{RBAC}/clusterroles/{least_privilege.ROLE_NAME}", "PATCH", {"rules": [{"apiGroups": ["*"], "resources": ["*"],
                                                                             "verbs": ["*"]}]}),
        (f"{RBAC}/namespaces/{sessions_ns}/roles/{least_privilege.ROLE_NAME}?fieldManager=x", "PATCH",
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": least_privilege.ROLE_NAME},
          "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        (f"/api/v1/namespaces/{sessions_ns}/pods", "POST",
         {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        (f"/apis/apps/v1/namespaces/{sessions_ns}/deployments", "POST",
         {"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
             "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
        (f"/apis/batch/v1/namespaces/{sessions_ns}/jobs", "POST", {"metadata": {"name": "j"}}),
        (f"/api/v1/namespaces/{sessions_ns}/pods/any/log", "GET", None),
        (f"/api/v1/namespaces/{sessions_ns}/pods/any/exec?command=sh", "POST", None),
        (f"/api/v1/namespaces/{ns}/serviceaccounts/gshare-operator/token", "POST",
         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
        (f"/api/v1/namespaces/{ns}/serviceaccounts/{least_privilege.ACCOUNT_NAME}/token", "POST",
         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
    ]
    for path, method, body in attempts:
        content = "application/apply-patch+yaml" if "fieldManager" in path else (
            "application/merge-patch+json" if method == "PATCH" else "application/json")
        status, answer = call(emulated, token, path, method, body, content)
        assert status == 403, (path, answer)
        assert answer["reason"] == "Forbidden"
    # Impersonation headers do not make it someone else.
    status, _ = call(emulated, token, f"/api/v1/namespaces/{ns}/secrets", headers={
        "Impersonate-User": "kubernetes-admin", "Impersonate-Group": "system:masters"})
    assert status == 403
    assert not [b for b in emulated.objects_of("clusterrolebindings", "rbac.authorization.k8s.io", "v1")
                if b["metadata"]["name"] == "mine"]
    assert emulated.objects_of("pods") == [] or all(p["metadata"]["namespace"] != sessions_ns for p in emulated.objects_of("pods"))


def test_the_admin_token_stays_cluster_admin(attached, settings):
    emulated, _ = attached
    ns = settings.GSHARE_OPERATOR_NAMESPACE
    status, body = call(emulated, emulated.token, f"/api/v1/namespaces/{ns}/secrets")
    assert status == 200 and least_privilege.TOKEN_SECRET_NAME in [s["metadata"]["name"] for s in body["items"]]
    assert call(emulated, emulated.token, "/api/v1/secrets")[0] == 200
    status, review = call(emulated, emulated.token, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "POST",
                          {"spec": {"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}}})
    assert status == 201 and review["status"]["allowed"] is True


def test_a_deleted_service_accounts_token_is_revoked_even_when_it_is_made_again(attached, settings):
    emulated, token = attached
    ns = settings.GSHARE_OPERATOR_NAMESPACE
    assert call(emulated, token, "/api/v1/nodes")[0] == 200
    account = f"/api/v1/namespaces/{ns}/serviceaccounts/{least_privilege.ACCOUNT_NAME}"
    assert call(emulated, emulated.token, account, "DELETE")[0] == 200
    assert call(emulated, token, "/api/v1/nodes")[0] == 401
    # The same name made again is another ServiceAccount (another uid): the old token stays revoked.
    assert call(emulated, emulated.token, f"/api/v1/namespaces/{ns}/serviceaccounts", "POST",
                {"metadata": {"name": least_privilege.ACCOUNT_NAME}})[0] == 201
    assert call(emulated, token, "/api/v1/nodes")[0] == 401
    assert call(emulated, token, "/version")[0] == 401


def test_the_credential_cannot_become_the_operator_while_its_secret_is_missing(attached, settings):
    emulated, token = attached
    ns, name = settings.GSHARE_OPERATOR_NAMESPACE, settings.GSHARE_OPERATOR_TOKEN_SECRET
    """The credential may not create Secrets (RBAC cannot limit create by name or type): with create and get on the token
    Secret's name it could make that Secret the operator ServiceAccount's token and read it. The attach creates it."""
    call(emulated, emulated.token, f"/api/v1/namespaces/{ns}/secrets/{name}", "DELETE")
    assert call(emulated, token, f"/api/v1/namespaces/{ns}/secrets", "POST", {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": name, "annotations": {"kubernetes.io/service-account.name": "gshare-operator"}}})[0] == 403
    assert call(emulated, token, f"/api/v1/namespaces/{ns}/secrets/{name}")[0] == 404


def test_its_grants_stop_at_their_verb_subresource_and_namespace(attached, settings):
    """What a real apiserver refuses although a neighbouring right is granted: ``deletecollection`` with only
    ``delete``, the ``status`` subresource with only the object's ``patch``, the same resource in another namespace,
    a dry run of what is refused."""
    emulated, token = attached
    sessions_ns = settings.GSHARE_SESSION_NAMESPACE
    group = "/apis/gshare.io/v1alpha1"
    for path, method, body, content in [
        (f"/api/v1/namespaces/{sessions_ns}/persistentvolumeclaims", "DELETE", None, "application/json"),
        (f"{group}/namespaces/{sessions_ns}/gsharesessions", "DELETE", None, "application/json"),
        (f"{group}/namespaces/{sessions_ns}/gsharesessions/s1/status", "PATCH", {"status": {"phase": "Running"}},
         "application/merge-patch+json"),
        (f"{group}/namespaces/default/gsharesessions", "POST",
         {"apiVersion": "gshare.io/v1alpha1", "kind": "GShareSession", "metadata": {"name": "s2"}, "spec": {}},
         "application/json"),
        (f"/api/v1/namespaces/{sessions_ns}/pods?dryRun=All", "POST",
         {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}, "application/json"),
        ("/api/v1/namespaces/kube-system/status", "GET", None, "application/json"),
        ("/api/v1/namespaces/kube-system/secrets", "GET", None, "application/json"),
    ]:
        status, answer = call(emulated, token, path, method, body, content)
        assert status == 403, (path, method, answer)
    assert call(emulated, token, "/api/v1/namespaces/kube-system")[0] == 200  # its one namespace get


def test_a_rerun_after_the_service_account_was_deleted_gets_a_working_token(attached, settings):
    """Deleting the ServiceAccount revokes its token (kube-controller-manager deletes its token Secrets too); the
    attach's credential step run again makes the account, a new Secret and a token that works."""
    emulated, token = attached
    ns = settings.GSHARE_OPERATOR_NAMESPACE
    assert call(emulated, emulated.token, f"/api/v1/namespaces/{ns}/serviceaccounts/{least_privilege.ACCOUNT_NAME}", "DELETE")[0] == 200
    assert call(emulated, token, "/api/v1/nodes")[0] == 401
    config = validate_kubeconfig(kubeconfig_text(emulated), loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST).config
    again = yaml.safe_load(least_privilege.least_privilege_kubeconfig(config, server=emulated.url, timeout=10))["users"][0]["user"]["token"]
    assert again != token
    assert call(emulated, again, "/api/v1/nodes")[0] == 200


def test_a_token_secret_left_from_a_deleted_service_account_is_made_again(attached, settings):
    """The Secret still there, holding the token of the ServiceAccount deleted before (its uid annotation names that
    one): the attach's credential step replaces it instead of registering a revoked token."""
    emulated, token = attached
    ns = settings.GSHARE_OPERATOR_NAMESPACE
    old = next(s for s in emulated.objects_of("secrets") if s["metadata"]["name"] == least_privilege.TOKEN_SECRET_NAME)
    assert call(emulated, emulated.token, f"/api/v1/namespaces/{ns}/serviceaccounts/{least_privilege.ACCOUNT_NAME}", "DELETE")[0] == 200
    time.sleep(0.3)
    assert not [s for s in emulated.objects_of("secrets") if s["metadata"]["name"] == least_privilege.TOKEN_SECRET_NAME]
    stale = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
             "metadata": {"name": least_privilege.TOKEN_SECRET_NAME, "annotations": old["metadata"]["annotations"]},
             "data": old["data"]}
    assert call(emulated, emulated.token, f"/api/v1/namespaces/{ns}/secrets", "POST", stale)[0] == 201
    config = validate_kubeconfig(kubeconfig_text(emulated), loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST).config
    again = yaml.safe_load(least_privilege.least_privilege_kubeconfig(config, server=emulated.url, timeout=10))["users"][0]["user"]["token"]
    assert again != token
    assert call(emulated, again, "/api/v1/nodes")[0] == 200
