"""What the emulated apiserver serves: the built-in resources, their field selectors and the URL paths of the API."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import kmock

_STANDARD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceSpec:
    """One resource the emulator serves, as listed in discovery.

    Attributes:
        group: API group, ``""`` for the core group.
        version: API version, e.g. ``v1``.
        plural: resource name in URLs, e.g. ``daemonsets``.
        kind: object kind, e.g. ``DaemonSet``.
        namespaced: whether objects live in a namespace.
        short_names: ``kubectl`` short names.
        subresources: subresource names (only ``status`` and ``pods/log`` are served; the others are listed
            for fidelity).
        categories: discovery categories (``all``).
        verbs: verbs listed in discovery.
        schema: a custom resource's ``demo.emulator.schema.CrdSchema`` (None: not checked, e.g. built-in kinds).
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = _STANDARD_VERBS
    schema: Any = field(default=None, compare=False, repr=False)

    @property
    def api_version(self) -> str:
        """``apiVersion`` of the objects: ``v1`` for core, else ``<group>/<version>``."""
        return f"{self.group}/{self.version}" if self.group else self.version


def _rs(group: str, version: str, plural: str, kind: str, namespaced: bool, **kwargs: Any) -> ResourceSpec:
    return ResourceSpec(group, version, plural, kind, namespaced, **kwargs)


def resource_key(group: str | None, version: str | None, plural: str | None) -> kmock.resource:
    """A ``kmock.resource`` from its parts (keywords: kmock parses a lone positional ``"apps"`` as a plural)."""
    return kmock.resource(group=group, version=version, plural=plural)


#: Resources served without a CRD. Kinds, scopes, short names and subresources as a kubeadm v1.32 apiserver
#: lists them in ``kubectl api-resources`` (Kubernetes API reference).
BUILTIN_RESOURCES: tuple[ResourceSpec, ...] = (
    _rs("", "v1", "configmaps", "ConfigMap", True, short_names=("cm",)),
    _rs("", "v1", "endpoints", "Endpoints", True, short_names=("ep",)),
    _rs("", "v1", "events", "Event", True, short_names=("ev",)),
    _rs("", "v1", "namespaces", "Namespace", False, short_names=("ns",), subresources=("finalize", "status"),
        verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    _rs("", "v1", "nodes", "Node", False, short_names=("no",), subresources=("proxy", "status")),
    _rs("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, short_names=("pvc",),
        subresources=("status",)),
    _rs("", "v1", "persistentvolumes", "PersistentVolume", False, short_names=("pv",), subresources=("status",)),
    _rs("", "v1", "pods", "Pod", True, short_names=("po",), categories=("all",),
        subresources=("attach", "binding", "ephemeralcontainers", "eviction", "exec", "log", "portforward", "proxy",
                      "resize", "status")),
    _rs("", "v1", "secrets", "Secret", True),
    _rs("", "v1", "serviceaccounts", "ServiceAccount", True, short_names=("sa",), subresources=("token",)),
    _rs("", "v1", "services", "Service", True, short_names=("svc",), categories=("all",),
        subresources=("proxy", "status")),
    _rs("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
        short_names=("crd", "crds"), categories=("api-extensions",), subresources=("status",)),
    _rs("apps", "v1", "daemonsets", "DaemonSet", True, short_names=("ds",), categories=("all",),
        subresources=("status",)),
    _rs("apps", "v1", "deployments", "Deployment", True, short_names=("deploy",), categories=("all",),
        subresources=("scale", "status")),
    _rs("apps", "v1", "replicasets", "ReplicaSet", True, short_names=("rs",), categories=("all",),
        subresources=("scale", "status")),
    _rs("apps", "v1", "statefulsets", "StatefulSet", True, short_names=("sts",), categories=("all",),
        subresources=("scale", "status")),
    _rs("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False, verbs=("create",)),
    _rs("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview", False, verbs=("create",)),
    _rs("batch", "v1", "cronjobs", "CronJob", True, short_names=("cj",), categories=("all",), subresources=("status",)),
    _rs("batch", "v1", "jobs", "Job", True, categories=("all",), subresources=("status",)),
    _rs("coordination.k8s.io", "v1", "leases", "Lease", True),
    _rs("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False),
    _rs("networking.k8s.io", "v1", "ingresses", "Ingress", True, short_names=("ing",), subresources=("status",)),
    _rs("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, short_names=("netpol",)),
    _rs("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    _rs("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _rs("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _rs("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    _rs("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    _rs("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False),
    _rs("storage.k8s.io", "v1", "csistoragecapacities", "CSIStorageCapacity", True),
    _rs("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, short_names=("sc",)),
)

#: Order of groups in ``/apis`` (the apiserver lists built-in groups in a fixed order, then CRD groups).
GROUP_ORDER = ("apps", "authorization.k8s.io", "batch", "networking.k8s.io", "rbac.authorization.k8s.io", "storage.k8s.io",
               "apiextensions.k8s.io", "coordination.k8s.io", "node.k8s.io")

#: Field selectors the apiserver accepts beyond ``metadata.name``/``metadata.namespace``, per (group, plural)
#: (``pkg/registry/*/strategy.go`` ``*ToSelectableFields`` and the conversion funcs of each group).
FIELD_SELECTORS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                   "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"),
    ("", "nodes"): ("spec.unschedulable",),
    ("", "namespaces"): ("status.phase",),
    ("", "secrets"): ("type",),
    ("", "events"): ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
                     "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
                     "reason", "reportingComponent", "source", "type"),
    ("batch", "jobs"): ("status.successful",),
    ("apps", "replicasets"): ("status.replicas",),
}

_UNSERVED_SUBRESOURCE_KINDS = {"log", "exec", "attach", "portforward", "proxy", "binding", "eviction",
                               "ephemeralcontainers", "resize", "scale", "token", "finalize"}

_VERSION_RANK = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")


def version_key(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA > beta > alpha, then by number (higher first)."""
    match = _VERSION_RANK.fullmatch(version)
    if not match:
        return (3, 0, 0)
    stage = {"alpha": 2, "beta": 1, None: 0}[match[2]]
    return (stage, -int(match[1]), -int(match[3] or 0))

BUILTIN_GROUPS = frozenset(spec.group for spec in BUILTIN_RESOURCES)
RETURNS_DELETED_OBJECT = frozenset({"Pod", "PersistentVolumeClaim", "PersistentVolume"})


@dataclass(frozen=True)
class ApiPath:
    group: str | None
    version: str | None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> ApiPath | None:
    """Split an apiserver URL path; None for non-resource paths (``/version``, ``/api``, ``/apis``, ``/``)."""
    parts = [p for p in path.strip("/").split("/") if p]  # aiohttp's request.path is already percent-decoded
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 2 and parts[0] == "apis":
        if len(parts) == 2:
            return ApiPath(parts[1], None)
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return ApiPath(group, version)
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return ApiPath(group, version, plural, namespace, name, subresource)


def iter_resources() -> Iterator[ResourceSpec]:
    """The built-in resources, for documentation and tests."""
    return iter(BUILTIN_RESOURCES)
