"""The control plane's one way to a cluster's apiserver: :class:`KubeGateway`.

Built from a registered cluster (its stored kubeconfig) or a validated kubeconfig, and a time budget: a
:class:`~kube.client.Deadline` shared by every call, or a bound per call. Objects go in and come out as
plain dicts (the JSON of the Kubernetes API). Every failure is one of two errors (``kube.errors``):
:class:`KubeUnavailable` (transient) or :class:`KubeRefused` (carrying status, reason and the apiserver's message).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import kubernetes
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

import contract
from contract.quantity import parse_quantity as parse_quantity  # re-exported: quantities of the objects read here
from kube.client import Deadline, DeadlineExceeded, api_client_for_kubeconfig, tls_failure_detail
from kube.errors import KubeRefused, KubeUnavailable, clean_text, status_message

#: The field manager of every server-side apply of the control plane (the operator applies as its own).
FIELD_MANAGER = "gshare-control-plane"

_JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
_APPLY_PATCH = "application/apply-patch+yaml"


@dataclass(frozen=True)
class Resource:
    """A kind of object the control plane reads or writes.

    Attributes:
        api_version: ``v1`` (core) or ``<group>/<version>``.
        plural: the resource name in URLs (``persistentvolumeclaims``).
        namespaced: whether its objects live in a namespace.
    """

    api_version: str
    plural: str
    namespaced: bool

    def path(self, *, namespace: str | None = None, name: str | None = None) -> str:
        """The URL path of the collection (no ``name``) or of one object; ``namespace`` None on a namespaced kind:
        across all namespaces."""
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        return f"{base}/{quote(name, safe='')}" if name is not None else base


NAMESPACES = Resource("v1", "namespaces", False)
NODES = Resource("v1", "nodes", False)
PODS = Resource("v1", "pods", True)
SECRETS = Resource("v1", "secrets", True)
PERSISTENT_VOLUMES = Resource("v1", "persistentvolumes", False)
PERSISTENT_VOLUME_CLAIMS = Resource("v1", "persistentvolumeclaims", True)
STORAGE_CLASSES = Resource("storage.k8s.io/v1", "storageclasses", False)
CSI_STORAGE_CAPACITIES = Resource("storage.k8s.io/v1", "csistoragecapacities", True)
RUNTIME_CLASSES = Resource("node.k8s.io/v1", "runtimeclasses", False)
DAEMON_SETS = Resource("apps/v1", "daemonsets", True)
SERVICE_ACCOUNTS = Resource("v1", "serviceaccounts", True)
ROLES = Resource("rbac.authorization.k8s.io/v1", "roles", True)
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "rolebindings", True)
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io/v1", "clusterroles", False)
CLUSTER_ROLE_BINDINGS = Resource("rbac.authorization.k8s.io/v1", "clusterrolebindings", False)
SELF_SUBJECT_RULES_REVIEWS = Resource("authorization.k8s.io/v1", "selfsubjectrulesreviews", False)
SELF_SUBJECT_ACCESS_REVIEWS = Resource("authorization.k8s.io/v1", "selfsubjectaccessreviews", False)
INGRESS_CLASSES = Resource("networking.k8s.io/v1", "ingressclasses", False)
GATEWAY_CLASSES = Resource("gateway.networking.k8s.io/v1", "gatewayclasses", False)
GATEWAYS = Resource("gateway.networking.k8s.io/v1", "gateways", True)
GSHARE_SESSIONS = Resource(f"{contract.GSHARE_API_GROUP}/{contract.GSHARE_API_VERSION}", contract.GSHARE_SESSION_PLURAL, True)

#: ``(apiVersion, kind)`` -> resource, for the objects ``create``/``replace``/``apply`` are given.
_BY_KIND = {
    ("v1", "Namespace"): NAMESPACES, ("v1", "Node"): NODES, ("v1", "Pod"): PODS, ("v1", "Secret"): SECRETS,
    ("v1", "PersistentVolume"): PERSISTENT_VOLUMES, ("v1", "PersistentVolumeClaim"): PERSISTENT_VOLUME_CLAIMS,
    ("storage.k8s.io/v1", "StorageClass"): STORAGE_CLASSES, ("storage.k8s.io/v1", "CSIStorageCapacity"): CSI_STORAGE_CAPACITIES,
    ("node.k8s.io/v1", "RuntimeClass"): RUNTIME_CLASSES, ("apps/v1", "DaemonSet"): DAEMON_SETS,
    (GSHARE_SESSIONS.api_version, contract.GSHARE_SESSION_KIND): GSHARE_SESSIONS,
    (INGRESS_CLASSES.api_version, "IngressClass"): INGRESS_CLASSES, (GATEWAY_CLASSES.api_version, "GatewayClass"): GATEWAY_CLASSES,
    (GATEWAYS.api_version, "Gateway"): GATEWAYS,
    ("v1", "ServiceAccount"): SERVICE_ACCOUNTS, (ROLES.api_version, "Role"): ROLES,
    (ROLE_BINDINGS.api_version, "RoleBinding"): ROLE_BINDINGS, (CLUSTER_ROLES.api_version, "ClusterRole"): CLUSTER_ROLES,
    (CLUSTER_ROLE_BINDINGS.api_version, "ClusterRoleBinding"): CLUSTER_ROLE_BINDINGS,
    (SELF_SUBJECT_RULES_REVIEWS.api_version, "SelfSubjectRulesReview"): SELF_SUBJECT_RULES_REVIEWS,
    (SELF_SUBJECT_ACCESS_REVIEWS.api_version, "SelfSubjectAccessReview"): SELF_SUBJECT_ACCESS_REVIEWS,
}


def resource_of(obj: dict) -> Resource:
    """The resource of an object by its ``apiVersion`` and ``kind``; ValueError for a kind the gateway does not know."""
    try:
        return _BY_KIND[(obj.get("apiVersion"), obj.get("kind"))]
    except KeyError:
        raise ValueError(f"no resource known for {obj.get('apiVersion')}/{obj.get('kind')}") from None


class KubeGateway:
    """Calls to one apiserver, each bounded as a whole (``Deadline.call``); use it as a context manager.

    Args:
        api: an ``ApiClient`` from ``kube.client.api_client_for_kubeconfig`` (closed with the gateway).
        deadline: one budget shared by every call, or None to bound each call by ``call_timeout``.
        call_timeout: seconds each call may take when there is no shared ``deadline``.
        server: the apiserver URL, for messages.

    Every method raises only :class:`KubeUnavailable` (connect failure, time budget spent, TLS failure, 5xx, 429)
    or :class:`KubeRefused` (another 4xx, or an answer that is not JSON).
    """

    def __init__(self, api: kubernetes.client.ApiClient, *, deadline: Deadline | None = None, call_timeout: float | None = None,
                 server: str = ""):
        if (deadline is None) == (call_timeout is None):
            raise TypeError("give a shared deadline or a call_timeout, not both")
        self._api, self._deadline, self._call_timeout, self.server = api, deadline, call_timeout, server

    @classmethod
    def for_kubeconfig(cls, config: dict, *, server: str = "", **budget) -> KubeGateway:
        """A gateway to the apiserver of a kubeconfig dict checked by ``validate_kubeconfig`` (``server``: its URL for
        messages, by default the kubeconfig's).

        Raises:
            KubeconfigError: ``kubeconfig_invalid`` when the client library cannot use it.
        """
        server = server or ((config.get("clusters") or [{}])[0].get("cluster") or {}).get("server", "")
        return cls(api_client_for_kubeconfig(config), server=server, **budget)

    @classmethod
    def for_cluster(cls, cluster, **budget) -> KubeGateway:
        """A gateway to a registered ``Cluster``'s apiserver (its kubeconfig is decrypted in memory only).

        Raises:
            KubeconfigError: ``kubeconfig_invalid`` when the stored kubeconfig cannot be used.
        """
        return cls(api_client_for_kubeconfig(yaml.safe_load(cluster.kubeconfig)), server=cluster.apiserver_url, **budget)

    def __enter__(self) -> KubeGateway:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._api.close()

    # -- reads

    def version(self) -> dict:
        """``GET /version``: ``{"gitVersion": "v1.32.3", ...}``."""
        return self._json("GET", "/version")

    def get(self, resource: Resource, name: str, *, namespace: str | None = None, missing_ok: bool = False) -> dict | None:
        """One object; None for a 404 when ``missing_ok``."""
        try:
            return self._json("GET", resource.path(namespace=namespace, name=name))
        except KubeRefused as exc:
            if missing_ok and exc.status == 404:
                return None
            raise

    def list(self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None) -> list[dict]:
        """The objects of a kind (in ``namespace``, or in all namespaces), optionally by label selector."""
        query = [("labelSelector", label_selector)] if label_selector else []
        return list(self._json("GET", resource.path(namespace=namespace), query=query).get("items") or [])

    def pod_log(self, name: str, *, namespace: str) -> str:
        """The log of a pod's (only) container, as text."""
        return self._send("GET", PODS.path(namespace=namespace, name=name) + "/log", accept="text/plain").decode("utf-8", "replace")

    # -- writes

    def create(self, obj: dict, *, exists_ok: bool = False) -> dict | None:
        """Create ``obj`` (its kind and namespace from the object); None for a 409 when ``exists_ok``."""
        resource = resource_of(obj)
        namespace = (obj.get("metadata") or {}).get("namespace")
        try:
            return self._json("POST", resource.path(namespace=namespace), body=obj)
        except KubeRefused as exc:
            if exists_ok and exc.status == 409:
                return None
            raise

    def replace(self, obj: dict) -> dict:
        """Replace ``obj`` (with the ``resourceVersion`` it carries: 409 when the object changed since)."""
        metadata = obj.get("metadata") or {}
        return self._json("PUT", resource_of(obj).path(namespace=metadata.get("namespace"), name=metadata["name"]), body=obj)

    def patch(self, resource: Resource, name: str, patch: dict, *, namespace: str | None = None) -> dict:
        """A JSON merge patch (RFC 7386) of one object."""
        return self._json("PATCH", resource.path(namespace=namespace, name=name), body=patch, content_type=MERGE_PATCH)

    def apply(self, obj: dict, *, force: bool = True) -> dict:
        """Server-side apply of ``obj`` as field manager ``gshare-control-plane`` (``force``: take over conflicting fields)."""
        metadata = obj.get("metadata") or {}
        query = [("fieldManager", FIELD_MANAGER)] + ([("force", "true")] if force else [])
        path = resource_of(obj).path(namespace=metadata.get("namespace"), name=metadata["name"])
        return self._json("PATCH", path, query=query, body=obj, content_type=_APPLY_PATCH)

    def delete(self, resource: Resource, name: str, *, namespace: str | None = None, propagation_policy: str | None = None,
               grace_period_seconds: int | None = None, uid: str | None = None) -> bool:
        """Delete one object; a 404 counts as done.

        Args:
            propagation_policy: ``Foreground``, ``Background`` or ``Orphan``, or None for the kind's default.
            grace_period_seconds: the pod's grace period, or None.
            uid: delete only the object of this uid (a precondition: 409 when the name now holds another object).

        Returns:
            True when the object was deleted now, False when it did not exist.
        """
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            self._json("DELETE", resource.path(namespace=namespace, name=name), body=options)
        except KubeRefused as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # -- the one place a call is made and its failure classified

    def _json(self, method: str, path: str, **request) -> dict:
        data = self._send(method, path, **request)
        try:
            body = json.loads(data) if data else {}
        except ValueError as exc:
            raise self._unreadable(exc) from None
        if not isinstance(body, dict):
            raise self._unreadable(TypeError(f"a JSON {type(body).__name__}, not an object"))
        return body

    def _unreadable(self, exc: Exception) -> KubeRefused:
        return KubeRefused(status=200, reason="Unreadable answer", server=self.server,
                           message=f"not a Kubernetes API object: {type(exc).__name__}")

    def _send(self, method: str, path: str, *, query: list | None = None, body: Any = None, content_type: str = _JSON,
              accept: str = _JSON) -> bytes:
        """One request within the time budget; returns the body of a 2xx answer.

        Raises:
            KubeUnavailable: no answer (connect failure, cut off, TLS), 5xx or 429. KubeRefused: any other status.
        """
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self._api.param_serialize(method=method, resource_path=path, query_params=query or [], header_params=headers,
                                            body=body, auth_settings=["BearerToken"])

        def call(_request_timeout) -> bytes:
            response = self._api.call_api(*request, _request_timeout=_request_timeout)
            response.read()
            if not 200 <= response.status <= 299:
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            return response.data

        deadline = self._deadline or Deadline(self._call_timeout)
        try:
            return deadline.call(call)
        except ApiException as exc:
            raise self._classified(exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._transport(exc) from None

    def _classified(self, exc: ApiException) -> KubeRefused | KubeUnavailable:
        status = exc.status or 0
        if not status:  # the client's wrapping of a TLS failure (no answer)
            return self._transport(exc)
        # A hostile apiserver can quote back the credential it was sent: never let it into a message.
        credential = str((self._api.configuration.api_key or {}).get("BearerToken") or "")
        secrets = (credential, credential.removeprefix("Bearer ").strip())
        fields = {"status": status, "reason": clean_text(exc.reason, secrets=secrets),
                  "message": status_message(exc.body, secrets=secrets), "server": self.server}
        if status == 429 or status >= 500:
            return KubeUnavailable(**fields)
        return KubeRefused(**fields)

    def _transport(self, exc: BaseException) -> KubeUnavailable:
        return KubeUnavailable(cause=exc, deadline_exceeded=isinstance(exc, DeadlineExceeded),
                               tls_detail=tls_failure_detail(exc, server=self.server), server=self.server)

