"""The control plane's own credential on a data-plane cluster: a ServiceAccount with exactly the rights the control
plane uses, its non-expiring token, and the kubeconfig built from it (what registration stores).

The rights come from every apiserver call the control plane makes through ``kube.KubeGateway``
(``control_plane_rules`` lists them with the caller of each); docs/attach.md explains them. Created with the admin
kubeconfig given to ``attach_cluster`` (server-side apply, so a re-run changes the rules in place and leaves the token
alone).

The token is the one the tokens controller writes into a Secret of type ``kubernetes.io/service-account-token``: the
control plane holds the credential for months and has no way to renew a TokenRequest token (those expire, an hour by
default), so it uses what the Kubernetes docs recommend for a long-lived ServiceAccount token. It is revoked by deleting
that Secret (``kubectl -n gshare-system delete secret gshare-control-plane-token``); a re-run of attach then makes a new
one and registers it.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

import yaml
from django.conf import settings

from attach.releases import OPERATOR_RELEASE
from core.layout import CONTROL_PLANE_SECRET_LABELS
from kube import KubeGateway
from kube.gateway import SECRETS

#: The ServiceAccount (in the operator namespace, ``GSHARE_OPERATOR_NAMESPACE``) and the Secret holding its token.
ACCOUNT_NAME = "gshare-control-plane"
TOKEN_SECRET_NAME = "gshare-control-plane-token"
#: Name of the ClusterRole and of each Role (and of their bindings).
ROLE_NAME = "gshare-control-plane"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gshare", "app.kubernetes.io/name": "gshare-control-plane"}
_RBAC = "rbac.authorization.k8s.io/v1"
_TOKEN_TYPE = "kubernetes.io/service-account-token"


class CredentialError(Exception):
    """The credential could not be made (the token Secret was never filled, or belongs to another ServiceAccount)."""


def control_plane_rules(*, volume_move: bool | None = None) -> dict[str, list[dict[str, Any]]]:
    """The RBAC rules of the control plane's ServiceAccount, by where they apply.

    Args:
        volume_move: grant what moving a volume needs (``GSHARE_VOLUME_MOVE_ENABLED`` when None).

    Returns:
        ``{"cluster": [...], <session namespace>: [...], <operator namespace>: [...]}``: PolicyRule dicts
        (``apiGroups``, ``resources``, ``verbs``, optional ``resourceNames``) of the ClusterRole and of the Role in each
        namespace. ``create`` and ``list`` cannot be limited by ``resourceNames`` in Kubernetes, so those rules name no
        object.
    """
    if volume_move is None:
        volume_move = settings.GSHARE_VOLUME_MOVE_ENABLED
    cluster: list[dict[str, Any]] = [
        # clusters/probe.py: the GPU nodes (labelSelector gpu=on) of the connection test and registration
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
        # clusters/probe.py: HAMi's device-plugin DaemonSet, wherever HAMi is installed
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["list"]},
        # clusters/probe.py: RuntimeClass nvidia
        {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get"], "resourceNames": ["nvidia"]},
        # clusters/probe.py: the uid of kube-system identifies the cluster (a new kubeconfig must reach the same one)
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"], "resourceNames": ["kube-system"]},
        # storage/services.py: registering a storage pool reads its StorageClass
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get"]},
        # clusters/routing_mode.py: the connection test's routing report, read-only: ingress-nginx's IngressClass, Envoy
        # Gateway's GatewayClass and the cluster's Gateway (whose namespace is a cluster setting, hence cluster-wide)
        {"apiGroups": ["networking.k8s.io"], "resources": ["ingressclasses"], "verbs": ["get", "list"]},
        {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["gatewayclasses", "gateways"], "verbs": ["get", "list"]},
    ]
    sessions: list[dict[str, Any]] = [
        # sessions/lifecycle/remote.py: server-side apply of a GShareSession (patch; create when it does not exist yet)
        # and its delete when the session stops
        {"apiGroups": ["gshare.io"], "resources": ["gsharesessions"], "verbs": ["create", "patch", "delete"]},
        # storage/services.py: deleting a volume deletes its PVC
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["delete"]},
    ]
    if volume_move:
        # storage/move.py: read the bound PV, create a pre-bound PV on the target, set the source PV to Retain
        cluster.append({"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "create", "patch"]})
        # storage/move.py: read the PVC on the source, create the pre-bound one on the target
        sessions.append({"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "create"]})
    secret = settings.GSHARE_OPERATOR_TOKEN_SECRET
    operator = [
        # clusters/operator_token/rotation.py: read and replace the operator's token Secret. No `create`: Kubernetes
        # cannot limit create to one name or type, and create + get on that name would let the credential make it a
        # ServiceAccount-token Secret of the operator and read the operator's token. apply_credential creates it.
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "update"], "resourceNames": [secret]},
    ]
    return {"cluster": cluster, settings.GSHARE_SESSION_NAMESPACE: sessions, settings.GSHARE_OPERATOR_NAMESPACE: operator}


def credential_objects(*, volume_move: bool | None = None) -> list[dict[str, Any]]:
    """The ServiceAccount, ClusterRole, Roles and their bindings (no namespaces, no token Secret), as applied."""
    account_namespace = settings.GSHARE_OPERATOR_NAMESPACE
    subject = {"kind": "ServiceAccount", "name": ACCOUNT_NAME, "namespace": account_namespace}
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ACCOUNT_NAME, "namespace": account_namespace, "labels": dict(MANAGED_BY)}},
    ]
    for where, rules in control_plane_rules(volume_move=volume_move).items():
        if where == "cluster":
            objects += [
                {"apiVersion": _RBAC, "kind": "ClusterRole", "metadata": {"name": ROLE_NAME, "labels": dict(MANAGED_BY)},
                 "rules": rules},
                {"apiVersion": _RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": ROLE_NAME, "labels": dict(MANAGED_BY)},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE_NAME},
                 "subjects": [subject]},
            ]
            continue
        meta = {"name": ROLE_NAME, "namespace": where, "labels": dict(MANAGED_BY)}
        objects += [
            {"apiVersion": _RBAC, "kind": "Role", "metadata": dict(meta), "rules": rules},
            {"apiVersion": _RBAC, "kind": "RoleBinding", "metadata": dict(meta),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE_NAME}, "subjects": [subject]},
        ]
    return objects


def _ensure_session_namespace(kube: KubeGateway) -> None:
    """The session namespace must exist for its RoleBinding; made before the operator chart that owns it, it carries
    Helm's ownership metadata so the chart's install adopts it instead of refusing it."""
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": settings.GSHARE_SESSION_NAMESPACE,
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": OPERATOR_RELEASE,
                        "meta.helm.sh/release-namespace": settings.GSHARE_OPERATOR_NAMESPACE,
                        "helm.sh/resource-policy": "keep"},
    }}, exists_ok=True)


def _token_of(secret: dict) -> str:
    try:
        return base64.b64decode(str((secret.get("data") or {}).get("token") or ""), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return ""


def _ensure_operator_token_secret(kube: KubeGateway) -> None:
    """Create the operator token Secret, empty, when it is missing: the credential may only read and replace it."""
    kube.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                 "metadata": {"name": settings.GSHARE_OPERATOR_TOKEN_SECRET, "namespace": settings.GSHARE_OPERATOR_NAMESPACE,
                              "labels": dict(CONTROL_PLANE_SECRET_LABELS)}}, exists_ok=True)


def apply_credential(kube: KubeGateway, *, volume_move: bool | None = None, wait_seconds: float = 30.0) -> str:
    """Create or update the control plane's ServiceAccount and RBAC, and return its token.

    Call it with a gateway holding cluster-admin rights (it writes RBAC); the operator namespace must exist. The session
    namespace is created when missing. The token Secret is created once and kept (its token stays valid across
    re-runs), unless it holds the token of a ServiceAccount of the same name deleted since (revoked): then it is made
    again.

    Args:
        kube: gateway to the cluster, with the admin kubeconfig.
        volume_move: see ``control_plane_rules``.
        wait_seconds: how long to wait for the tokens controller to fill the Secret.

    Returns:
        The ServiceAccount's bearer token (a secret: never log or print it).

    Raises:
        KubeRefused, KubeUnavailable: from the gateway.
        CredentialError: the Secret was not filled in time, or exists for another ServiceAccount.
    """
    namespace = settings.GSHARE_OPERATOR_NAMESPACE
    _ensure_session_namespace(kube)
    _ensure_operator_token_secret(kube)
    account_uid = ""
    for obj in credential_objects(volume_move=volume_move):
        applied = kube.apply(obj)
        if obj["kind"] == "ServiceAccount":
            account_uid = str(((applied or {}).get("metadata") or {}).get("uid") or "")
    token_secret = {"apiVersion": "v1", "kind": "Secret", "type": _TOKEN_TYPE,
                    "metadata": {"name": TOKEN_SECRET_NAME, "namespace": namespace, "labels": dict(MANAGED_BY),
                                 "annotations": {"kubernetes.io/service-account.name": ACCOUNT_NAME}}}
    kube.create(token_secret, exists_ok=True)
    deadline = time.monotonic() + wait_seconds
    while True:
        secret = kube.get(SECRETS, TOKEN_SECRET_NAME, namespace=namespace) or {}
        annotations = (secret.get("metadata") or {}).get("annotations") or {}
        owner = annotations.get("kubernetes.io/service-account.name")
        if secret.get("type") != _TOKEN_TYPE or owner != ACCOUNT_NAME:
            raise CredentialError(f"the Secret {namespace}/{TOKEN_SECRET_NAME} exists but is not the token of ServiceAccount "
                                  f"{ACCOUNT_NAME}: delete it (kubectl -n {namespace} delete secret {TOKEN_SECRET_NAME})")
        written_for = annotations.get("kubernetes.io/service-account.uid")
        if account_uid and written_for and written_for != account_uid:
            # The token of a ServiceAccount deleted since (and made again by this run): revoked, so make a new one.
            kube.delete(SECRETS, TOKEN_SECRET_NAME, namespace=namespace)
            kube.create(token_secret, exists_ok=True)
            continue
        token = _token_of(secret)
        if token:
            return token
        if time.monotonic() > deadline:
            raise CredentialError(f"the token of ServiceAccount {namespace}/{ACCOUNT_NAME} was not written into the Secret "
                                  f"{TOKEN_SECRET_NAME} within {wait_seconds:g} s (is kube-controller-manager running?)")
        time.sleep(0.2)


def credential_kubeconfig(admin_config: dict, token: str) -> str:
    """The kubeconfig YAML of the control plane's credential: the admin kubeconfig's cluster (server, CA, TLS server
    name) and the ServiceAccount's token.

    Args:
        admin_config: a kubeconfig reduced to its current context (``ValidKubeconfig.config``).
        token: from ``apply_credential``.

    Returns:
        YAML text with one cluster, user ``gshare-control-plane`` and context ``gshare-control-plane@<cluster>``.
    """
    entry = (admin_config.get("clusters") or [{}])[0]
    cluster = {key: value for key, value in (entry.get("cluster") or {}).items()
               if key in ("server", "certificate-authority-data", "tls-server-name", "insecure-skip-tls-verify")}
    name = entry.get("name") or "cluster"
    context = f"{ACCOUNT_NAME}@{name}"
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": ACCOUNT_NAME, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": name, "user": ACCOUNT_NAME}}],
        "current-context": context,
    }
    return yaml.safe_dump(config, sort_keys=False)


def least_privilege_kubeconfig(admin_config: dict, *, server: str, timeout: float, volume_move: bool | None = None) -> str:
    """``apply_credential`` through the admin kubeconfig, then ``credential_kubeconfig``: the kubeconfig to register.

    Args:
        admin_config: the admin kubeconfig, reduced to its current context.
        server: its apiserver URL (for messages).
        timeout: seconds each apiserver call may take.

    Raises:
        KubeRefused, KubeUnavailable, CredentialError: see ``apply_credential``.
    """
    with KubeGateway.for_kubeconfig(admin_config, server=server, call_timeout=timeout) as kube:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": settings.GSHARE_OPERATOR_NAMESPACE}},
                    exists_ok=True)
        token = apply_credential(kube, volume_move=volume_move)
    return credential_kubeconfig(admin_config, token)
