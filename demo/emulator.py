"""A Kubernetes API emulator for the demo fleet and the tests, built on kmock's ``KubernetesEmulator``.

The official ``kubernetes`` Python client (and kubectl-style clients) talk to it over plain HTTP on
loopback as if it were an apiserver, or over HTTPS in the opt-in TLS mode (``tls=True``, ``--tls``; see
below). Objects live in kmock's object store (``emulator.objects``, a ``kmock.ObjectsArray`` keyed by
``(kmock.resource, namespace, name)``, each value keeping its history of versions); watch events travel on
kmock's per-resource buses. What this module adds on top of kmock 0.8
(which stores raw dicts and serves them back as they were sent):

* ``/version`` from a configurable dict (kmock hard-codes a k3s v1.26.4 answer);
* discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>``, ``/apis/<group>/<version>``) from
  declared resources with their real ``kind``, ``namespaced`` flag, verbs, short names and subresources
  (``BUILTIN_RESOURCES``), plus the resources of every CustomResourceDefinition created or seeded;
* apiserver-like object metadata: ``apiVersion``/``kind``, ``metadata.uid``, ``resourceVersion`` (one
  cluster-wide counter), ``creationTimestamp``, ``generation``; ``generateName``;
* lists with ``kind: <Kind>List``, ``apiVersion``, ``metadata.resourceVersion``, ``limit``/``continue``;
  items sorted by namespace/name and, for built-in kinds, without ``apiVersion``/``kind`` (as the
  apiserver sends them; custom resources keep them);
* ``labelSelector`` (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x,y)``,
  ``a>1``, ``a<1``) and ``fieldSelector`` (``=``, ``==``, ``!=`` on ``metadata.name``,
  ``metadata.namespace`` and the per-resource fields of ``FIELD_SELECTORS``, e.g. pods'
  ``spec.nodeName`` and ``status.phase``) on list, watch and deletecollection;
* watch with ``resourceVersion`` (replay from an event log, ``410 Expired`` when compacted),
  ``timeoutSeconds`` (default 1800 s), selector transitions (an object leaving a selector is sent as
  ``DELETED``);
* create (``201``; ``409 AlreadyExists``; ``404`` when the namespace does not exist), replace (``PUT``,
  ``409 Conflict`` on a stale ``metadata.resourceVersion``), patch: JSON patch
  (``application/json-patch+json``), JSON merge patch (``application/merge-patch+json``, RFC 7386),
  strategic merge patch (``application/strategic-merge-patch+json``; **treated as a merge patch**: lists
  are replaced whole and ``$patch``/``$setElementOrder``/``$retainKeys``/``$deleteFromPrimitiveList``
  directives are dropped), server-side apply (``application/apply-patch+yaml`` with the required
  ``fieldManager`` query parameter; **create-or-merge**: the applied configuration is merged like a merge
  patch, fields owned by the manager but left out of the configuration are not removed, conflicts are
  never reported, one ``managedFields`` entry per manager is kept);
* the ``status`` subresource: writes to ``.../status`` change only ``status``; writes to the main
  resource leave ``status`` alone for kinds that have that subresource; create drops ``status`` of
  custom resources whose CRD enables the subresource and sets a Pod's to ``Pending``;
* delete: ``Status`` ``Success`` (Pods and custom resources: the deleted object), finalizers make it a
  ``deletionTimestamp`` update and the object goes once they are removed; deleting a Namespace deletes its
  objects, deleting an owner deletes its dependents (``ownerReferences``), deleting a CRD deletes its
  resource and objects; ``404 NotFound`` as a proper ``Status``;
* errors as ``Status`` objects with the apiserver's ``reason`` (``NotFound``, ``AlreadyExists``,
  ``Conflict``, ``Invalid``, ``BadRequest``, ``MethodNotAllowed``, ``UnsupportedMediaType``,
  ``Unauthorized``, ``Expired``, ``InternalError``);
* an optional bearer token: with ``token`` set, any request without ``Authorization: Bearer <token>``
  (health endpoints included) gets ``401 Unauthorized``;
* opt-in TLS (``EmulatedCluster(tls=True)``, ``serve(tls=...)``, ``--tls``): HTTPS with a throwaway self-signed CA
  and a server certificate it signs for ``IP:127.0.0.1``, ``DNS:localhost`` and the configured loopback host,
  generated at start and kept in memory (``ServerCertificates``, ``generate_certificates``; ``ssl`` loads a key only
  from a file, so it is written to a private temporary directory removed once loaded); ``kubeconfig()`` then carries
  the CA as ``certificate-authority-data`` and the CLI's ready file as ``ca_data``. client-go (so Helm and kubectl)
  sends a kubeconfig user's bearer token only over TLS: against the plain-HTTP server it sends no ``Authorization``
  header and gets ``401`` once a token is required. Plain HTTP stays the default;
* ``dryRun=All`` on create/patch/replace/delete;
* Services get a ``spec.clusterIP`` (from 10.96.0.0/16) when they ask for one;
* opt-in (``pod_startup_seconds``): a stand-in for kube-scheduler with HAMi's scheduler extender, HAMi's
  device plugin and the kubelet. Pods created through the API are bound to a node with room for their
  HAMi GPU request (``nvidia.com/gpu``, ``nvidia.com/gpumem`` MiB, ``nvidia.com/gpumem-percentage``,
  ``nvidia.com/gpucores`` percent), read from each node's ``hami.io/node-nvidia-register`` annotation with
  ``operator_agent.hami``, get HAMi's pod annotations in the real format (``hami.io/vgpu-devices-allocated:
  GPU-…,NVIDIA,<MiB>,<cores %>:;`` ...) and run; Pods that do not fit stay ``Pending``/``Unschedulable``
  with kube-scheduler's message until a Pod or Node change makes room (see ``KubeApiEmulator``);
* host facts (``hosts``: per node, what is installed on its host -- NVIDIA GPUs on the PCI bus, ``nvidia-smi -L``,
  ``nvidia-ctk --version``, containerd's ``nvidia`` runtime, ``mount.nfs``, reachable ``host:port`` targets, the
  HAMi register value; ``HOST_FACTS``), never visible through the API, changeable while serving (``set_host``),
  and what ``manage.py attach_cluster`` learns from them, always on: its check pods (label
  ``app.kubernetes.io/name: gshare-attach-check``, ``gshare.io/check: node|nfs``, bound with ``spec.nodeName``)
  are run by a kubelet stand-in without the scheduler (``Running``, then ``Succeeded``) and log what the check
  script prints on such a host; HAMi's device plugin stand-in registers the nodes a ``hami-device-plugin``
  DaemonSet selects (``hami.io/node-nvidia-register``, ``hami.io/node-handshake``, ``nvidia.com/gpu`` capacity)
  once the DaemonSet exists or a node gets the selected label (see ``KubeApiEmulator``);
* ``pods/log`` (``GET``, ``text/plain``; the check pods' logs, ``""`` for other pods; ``container``,
  ``tailLines``, ``limitBytes``);
* always on, stand-ins for kube-controller-manager's PersistentVolume controller and a CSI driver's external-provisioner
  (see ``KubeApiEmulator._volume_controller_pass``), ~``volume_controller_seconds`` (0.1 s) after a PVC, PV or
  StorageClass change: a PVC whose StorageClass's provisioner is a CSI driver gets PV ``pvc-<PVC uid>`` (``csi``
  driver/new volume handle/``fsType`` from the class, ``nfs`` by default; capacity = request; the class's reclaim policy,
  ``Delete`` by default, and mount options; ``claimRef``) and both are ``Bound``, with the ``ExternalProvisioning``,
  ``Provisioning`` and ``ProvisioningSucceeded`` Events; a PVC naming a PV (``spec.volumeName``, e.g. pre-bound after a
  volume move) or named by an ``Available`` PV's ``claimRef`` is bound to it, or gets the controller's ``FailedBinding``
  (``volume "x" already bound to a different claim.``) or ``VolumeMismatch`` Warning; a PVC whose StorageClass does not
  exist stays ``Pending`` with ``ProvisioningFailed`` ``storageclass.storage.k8s.io "<name>" not found``; a deleted PVC's
  PV is deleted (``Delete``) or ``Released`` (``Retain``, ``claimRef`` kept); a ``Bound`` PVC whose PV is gone is
  ``Lost`` (``ClaimLost``). Create defaults as the apiserver's: status ``Pending``, ``volumeMode: Filesystem``, a PV's
  ``Retain``, the default StorageClass (``storageclass.kubernetes.io/is-default-class``) for a PVC naming none;
* with the scheduler/kubelet stand-in, Pods with ``persistentVolumeClaim`` volumes: not bound to a node while a PVC is
  missing or not ``Bound`` (kube-scheduler's VolumeBinding messages: ``persistentvolumeclaim "x" not found``, ``pod has
  unbound immediate PersistentVolumeClaims``); once bound, the kubelet mounts them first: on a node whose host facts
  say no NFS client (``mount_nfs`` missing/None; a node without any host facts is not judged) an NFS volume (CSI
  ``fsType: nfs``/NFS driver, or in-tree ``nfs``) does not mount, and the Pod stays ``Pending`` in
  ``ContainerCreating`` (no pod IP) with a Warning ``FailedMount`` Event carrying the kubelet's real text
  (``nfs_mount_failure_message``) until ``set_host`` gives the node an NFS client.

Not emulated: authorization (RBAC objects are stored, never enforced), admission (HAMi's webhook does not set
``schedulerName``; only the DefaultStorageClass plugin is), volume binding modes (``WaitForFirstConsumer`` classes bind
at once, like ``Immediate``), static binding of a PVC to any matching unclaimed PV (only the two pre-bound cases above),
PV/PVC protection finalizers, volume expansion, snapshots, attach/detach, CSI drivers' own behaviour (a class's CSI
driver always provisions, whether or not it is installed; no CSIStorageCapacity is ever written: seed them), field
validation against schemas, controllers (Deployments and DaemonSets keep the status they were given; the device
plugin stand-in creates no Pods), scheduling beyond the stand-in above
(taints/tolerations, affinity, CPU/memory fit, preemption, HAMi's MIG geometries: ``mig``-mode GPUs are shared
like ``hami-core`` ones, by memory, cores and split count), running containers (only check pods "run", by
their known output), ``exec``/``attach``/``portforward``/``proxy``/``scale`` and other subresources besides
``status`` and ``pods/log`` (``404``), ``pods/log`` streaming (``follow``) and timestamps, protobuf/CBOR (except
the protobuf ``Secret``/``ConfigMap`` request bodies Helm's release storage sends, decoded by ``demo.k8s_protobuf``;
responses are always JSON), aggregated discovery (clients fall back to the legacy documents served here), OpenAPI
schemas (``/openapi/v3`` serves only what client-go's field-validation check reads), client certificates.

Entry points:

* ``EmulatedCluster`` – a thread-backed server for tests and scripts (``start()``/``stop()``, context
  manager);
* ``serve()`` – the same as an async context manager for code that already runs an event loop;
* ``python -m demo.emulator --seed PATH --port N [--tls]`` – a process serving a seed file until SIGTERM/SIGINT.

This module must not import Django (the demo starts one emulator process per cluster and they must
start fast): it imports only the standard library, aiohttp, attrs, jsonpatch, PyYAML, kmock, ``demo.k8s_protobuf``
(Google's ``protobuf`` runtime), ``operator_agent.hami``/``operator_agent.hami_pods`` (standard library only: the
operator's decoders of HAMi's node-register and pod-allocation annotations, so each format has one decoder) and,
in TLS mode only (imported when certificates are generated), ``cryptography``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import copy
import dataclasses
import datetime
import decimal
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import pathlib
import re
import secrets
import signal
import ssl
import string
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal.rendering import StreamingError  # not re-exported by kmock 0.8

from demo import k8s_protobuf
from operator_agent.hami import HamiDecodeError, HamiDevice, decode_node_register, node_register_annotation
from operator_agent.hami_pods import decode_pod_devices

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- resources

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

    @property
    def api_version(self) -> str:
        """``apiVersion`` of the objects: ``v1`` for core, else ``<group>/<version>``."""
        return f"{self.group}/{self.version}" if self.group else self.version


def _rs(group: str, version: str, plural: str, kind: str, namespaced: bool, **kwargs: Any) -> ResourceSpec:
    return ResourceSpec(group, version, plural, kind, namespaced, **kwargs)


def _res(group: str | None, version: str | None, plural: str | None) -> kmock.resource:
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
_GROUP_ORDER = ("apps", "batch", "networking.k8s.io", "rbac.authorization.k8s.io", "storage.k8s.io",
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


# --------------------------------------------------------------------------- errors


@attrs.frozen
class ApiError(kmock.KubernetesError):
    """An error answered as a Kubernetes ``Status`` object.

    Attributes:
        status: HTTP status code (also the Status ``code``).
        reason: the Status ``reason`` (``NotFound``, ``AlreadyExists``, ``Conflict`` ...).
        message: the Status ``message``.
        details: the Status ``details`` (``name``, ``group``, ``kind``, ``causes``), or None.
    """


def _not_found(spec: ResourceSpec, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(spec)} "{name}" not found', _details(spec, name))


def _qualified(spec: ResourceSpec) -> str:
    return f"{spec.plural}.{spec.group}" if spec.group else spec.plural


def _details(spec: ResourceSpec, name: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": spec.plural}
    if spec.group:
        details["group"] = spec.group
    details.update(extra)
    return details


def _no_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", None)


def _status(code: int, reason: str, message: str, details: Mapping[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = dict(details)
    return status


# --------------------------------------------------------------------------- selectors


@dataclass(frozen=True)
class LabelRequirement:
    """One requirement of a label selector.

    Attributes:
        key: label key.
        op: one of ``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!``, ``>``, ``<``.
        values: compared values (one for ``=``/``!=``/``>``/``<``, none for ``exists``/``!``).
    """

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label dict satisfies this requirement (apimachinery ``labels.Requirement.Matches``)."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present:
            return False
        try:
            number = int(value or "")
        except ValueError:
            return False
        return number > int(self.values[0]) if self.op == ">" else number < int(self.values[0])


_LABEL_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_TERM = re.compile(rf"\s*(?P<key>{_LABEL_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*")
_CMP_TERM = re.compile(rf"\s*(?P<key>{_LABEL_KEY})\s*(?P<op>==|!=|=|>|<)\s*(?P<value>{_LABEL_VALUE})\s*")
_EXISTS_TERM = re.compile(rf"\s*(?P<neg>!)?\s*(?P<key>{_LABEL_KEY})\s*")


def _split_top_level(text: str) -> list[str]:
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return terms


def parse_label_selector(text: str) -> list[LabelRequirement]:
    """Parse a Kubernetes label selector string.

    Args:
        text: e.g. ``gpu=on,tier in (a,b),!legacy`` (``=``/``==``, ``!=``, ``in``, ``notin``, existence
            ``key``, non-existence ``!key``, integer ``>``/``<``); empty means "everything".

    Returns:
        The requirements, all of which must match (AND).

    Raises:
        ApiError: ``400 BadRequest`` naming the term that does not parse.
    """
    requirements: list[LabelRequirement] = []
    if not text.strip():
        return requirements
    for term in _split_top_level(text):
        if match := _SET_TERM.fullmatch(term):
            values = tuple(v.strip() for v in match["values"].split(",") if v.strip())
            if not values:
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {term.strip()!r}: values are required")
            requirements.append(LabelRequirement(match["key"], match["op"], values))
        elif match := _CMP_TERM.fullmatch(term):
            op = "=" if match["op"] == "==" else match["op"]
            if op in (">", "<") and not re.fullmatch(r"-?\d+", match["value"]):
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {term.strip()!r}: not an integer")
            requirements.append(LabelRequirement(match["key"], op, (match["value"],)))
        elif match := _EXISTS_TERM.fullmatch(term):
            requirements.append(LabelRequirement(match["key"], "!" if match["neg"] else "exists"))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: found {term.strip()!r}")
    return requirements


@dataclass(frozen=True)
class FieldRequirement:
    """One requirement of a field selector.

    Attributes:
        field: dotted field path, e.g. ``spec.nodeName``.
        negate: True for ``!=``.
        value: compared value (missing fields compare as ``""``; booleans as ``true``/``false``).
    """

    field: str
    negate: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether an object satisfies this requirement."""
        current: Any = obj
        for part in self.field.split("."):
            current = current.get(part) if isinstance(current, Mapping) else None
        if isinstance(current, bool):
            actual = "true" if current else "false"
        elif current is None:
            actual = "false" if self.field == "spec.unschedulable" else ""
        else:
            actual = str(current)
        return (actual != self.value) if self.negate else (actual == self.value)


def parse_field_selector(text: str, allowed: Iterable[str] = ("metadata.name", "metadata.namespace")) -> list[
        FieldRequirement]:
    """Parse a Kubernetes field selector string.

    Args:
        text: e.g. ``spec.nodeName=gpu-h100-01,status.phase!=Succeeded`` (``=``, ``==``, ``!=``).
        allowed: the field paths this resource supports.

    Returns:
        The requirements, all of which must match (AND).

    Raises:
        ApiError: ``400 BadRequest`` for an unparseable term or an unsupported field
            (``field label not supported: <field>``, as the apiserver answers).
    """
    allowed = set(allowed)
    requirements: list[FieldRequirement] = []
    if not text.strip():
        return requirements
    for term in text.split(","):
        match = re.fullmatch(r"\s*([^=!\s]+)\s*(==|!=|=)\s*(.*?)\s*", term)
        if not match:
            raise ApiError(400, "BadRequest", f"invalid selector: {text!r}; can't understand {term!r}")
        name, op, value = match.groups()
        if name not in allowed:
            raise ApiError(400, "BadRequest", f'field label not supported: {name}')
        requirements.append(FieldRequirement(name, op == "!=", value))
    return requirements


@dataclass(frozen=True)
class _Selection:
    namespace: str | None = None
    name: str | None = None
    labels: tuple[LabelRequirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.name is not None and meta.get("name") != self.name:
            return False
        labels = meta.get("labels") or {}
        return all(r.matches(labels) for r in self.labels) and all(r.matches(obj) for r in self.fields)


# --------------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch (``null`` deletes a key, objects merge, anything else replaces).

    Args:
        target: the current document (not modified).
        patch: the merge patch.

    Returns:
        A new document.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strip_directives(value: Any) -> Any:
    """Drop strategic-merge-patch directives (``$patch``, ``$setElementOrder/...``, ``$retainKeys`` ...)."""
    if isinstance(value, Mapping):
        return {k: _strip_directives(v) for k, v in value.items() if not str(k).startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, Mapping) and "$patch" in v)]
    return value


# --------------------------------------------------------------------------- helpers


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _header(headers: Mapping[str, str], name: str) -> str:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return ""


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1", "yes")


_VERSION_RANK = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")


def _version_key(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA > beta > alpha, then by number (higher first)."""
    match = _VERSION_RANK.fullmatch(version)
    if not match:
        return (3, 0, 0)
    stage = {"alpha": 2, "beta": 1, None: 0}[match[2]]
    return (stage, -int(match[1]), -int(match[3] or 0))


@dataclass
class _Outcome:
    """What a mutation produced; the fallback serving the request renders it."""

    status: int
    body: Any


class _WatchClosed(Exception):
    """Put on the buses when the emulator shuts down: every open watch ends its stream."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- HAMi scheduler stand-in
#
# Formats and rules below follow Project-HAMi/HAMi v2.10.0 (and agree with v2.4 ... v2.9 where noted):
# resource names from ``charts/hami/values.yaml`` (copied as ``demo/data/hami/helm-values.resource-names.v2.10.0.yaml``),
# pod annotation keys and value grammar from ``pkg/device/devices.go`` EncodePodSingleDevice/DecodePodDevices and
# ``pkg/util/types.go``, fit rules from ``pkg/device/nvidia/device.go`` Fit, failure reason codes from
# ``pkg/scheduler`` (``common.CardInsufficientMemory`` ...), node score from ``pkg/scheduler/policy`` (binpack).
# Real values as seen on pods: ``demo/data/hami/pod-annotations.observed.yaml``.

HAMI_RESOURCE_COUNT = "nvidia.com/gpu"
"""Extended resource: number of vGPUs of a container; each vGPU is on a different physical GPU (count)."""

HAMI_RESOURCE_MEMORY = "nvidia.com/gpumem"
"""Extended resource: device memory per vGPU, MiB (HAMi ``memoryFactor`` 1). Unset: 100 % of the GPU's memory."""

HAMI_RESOURCE_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
"""Extended resource: device memory per vGPU in percent of the GPU's registered memory (values > 100 clamped)."""

HAMI_RESOURCE_CORES = "nvidia.com/gpucores"
"""Extended resource: SM share per vGPU in percent of one GPU (100 = whole GPU); unset/0 = no core limit."""

HAMI_DEVICE_TYPE = "NVIDIA"
"""The ``<type>`` field of every device in HAMi's pod allocation annotations (``NvidiaGPUDevice``), not the model."""

HAMI_DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
"""Pod annotation: devices the device plugin still has to hand out; the scheduler writes the allocation, the
device plugin empties it container by container (``;`` per container when done)."""

HAMI_DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
"""Pod annotation: the scheduler's allocation, ``<uuid>,NVIDIA,<usedmem MiB>,<usedcores %>:`` per device, one
``;``-terminated segment per container (init containers first; empty segment for a container without GPU)."""

HAMI_VGPU_NODE = "hami.io/vgpu-node"
"""Pod annotation: the node HAMi's scheduler chose."""

HAMI_VGPU_TIME = "hami.io/vgpu-time"
"""Pod annotation: when the scheduler chose the node, Unix seconds as a decimal string."""

HAMI_BIND_TIME = "hami.io/bind-time"
"""Pod annotation: when the scheduler bound the pod, Unix seconds as a decimal string."""

HAMI_BIND_PHASE = "hami.io/bind-phase"
"""Pod annotation: ``allocating`` (scheduler, at bind) then ``success`` (device plugin, containers allocated)."""

HAMI_USE_GPUTYPE = "nvidia.com/use-gputype"
"""Pod annotation: comma-separated model names; only GPUs whose model contains one of them (case-insensitive)."""

HAMI_NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
"""Pod annotation: comma-separated model names; GPUs whose model contains one of them are excluded."""

HAMI_USE_GPUUUID = "nvidia.com/use-gpuuuid"
"""Pod annotation: comma-separated GPU UUIDs; only these GPUs."""

HAMI_NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
"""Pod annotation: comma-separated GPU UUIDs excluded from the allocation."""

_QUANTITY_RE = re.compile(r"\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?\s*")
_QUANTITY_FACTORS: dict[str, decimal.Decimal] = {
    "Ki": decimal.Decimal(2) ** 10, "Mi": decimal.Decimal(2) ** 20, "Gi": decimal.Decimal(2) ** 30,
    "Ti": decimal.Decimal(2) ** 40, "Pi": decimal.Decimal(2) ** 50, "Ei": decimal.Decimal(2) ** 60,
    "n": decimal.Decimal("1e-9"), "u": decimal.Decimal("1e-6"), "m": decimal.Decimal("1e-3"),
    "k": decimal.Decimal("1e3"), "M": decimal.Decimal("1e6"), "G": decimal.Decimal("1e9"),
    "T": decimal.Decimal("1e12"), "P": decimal.Decimal("1e15"), "E": decimal.Decimal("1e18"),
}


def _quantity_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return decimal.Decimal(value)
    match = _QUANTITY_RE.fullmatch(value)
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number = decimal.Decimal(match[1])
    if match[2]:
        return number.scaleb(int(match[2][1:]))
    if match[3]:
        return number * _QUANTITY_FACTORS[match[3]]
    return number


def parse_quantity(value: Any) -> int:
    """The integer value of a Kubernetes quantity, rounded up as apimachinery's ``Quantity.Value()`` does.

    Args:
        value: a JSON number or a quantity string (``"2"``, ``"8192"``, ``"20k"`` = 20000, ``"1Gi"``, ``"500m"``,
            ``"1e3"``).

    Raises:
        ValueError: not a quantity.
    """
    return math.ceil(_quantity_decimal(value))


@dataclass(frozen=True)
class GpuRequest:
    """What one container asks of HAMi (HAMi ``ContainerDeviceRequest``).

    Attributes:
        count: vGPUs (``nvidia.com/gpu``), each on a different physical GPU of one node.
        memory_mib: device memory per vGPU, MiB (``nvidia.com/gpumem``), or None.
        memory_percent: device memory per vGPU in percent of the GPU's registered memory
            (``nvidia.com/gpumem-percentage``, at most 100), or None; ignored when ``memory_mib`` is set.
        cores_percent: SM share per vGPU in percent of one GPU (``nvidia.com/gpucores``, at most 100), or None.
    """

    count: int
    memory_mib: int | None = None
    memory_percent: int | None = None
    cores_percent: int | None = None

    @property
    def exclusive(self) -> bool:
        """A whole-GPU request: neither memory nor cores asked (how gShare asks for whole GPUs).

        Such a vGPU gets a GPU nothing else holds, and nothing else is put on it while it is held. HAMi
        reaches the same result through its memory default (the request takes 100 % of the memory).
        """
        return self.memory_mib is None and self.memory_percent is None and self.cores_percent is None

    @property
    def cores(self) -> int:
        """Cores taken per vGPU, percent of one GPU; 0 = no core limit (HAMi's default ``gpucores``)."""
        return self.cores_percent or 0

    def memory_for(self, device_memory_mib: int) -> int:
        """MiB taken on a GPU registering ``device_memory_mib`` MiB (HAMi default: 100 % of it)."""
        if self.memory_mib is not None:
            return self.memory_mib
        percent = 100 if self.memory_percent is None else self.memory_percent
        return device_memory_mib * percent // 100


def _container_gpu_request(container: Mapping[str, Any]) -> GpuRequest | None:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}

    def read(name: str) -> int | None:
        raw = limits.get(name, requests.get(name))
        if raw is None:
            return None
        try:
            return parse_quantity(raw)
        except ValueError:
            logger.warning("container %r: %s=%r is not a quantity, ignored", container.get("name"), name, raw)
            return None

    count = read(HAMI_RESOURCE_COUNT)
    memory = read(HAMI_RESOURCE_MEMORY)
    percent = read(HAMI_RESOURCE_MEMORY_PERCENTAGE)
    cores = read(HAMI_RESOURCE_CORES)
    if count is None and (memory is not None or percent is not None or cores is not None):
        count = 1  # HAMi's admission webhook adds nvidia.com/gpu: 1 (defaultGPUNum) to such a container
    if not count or count < 1:
        return None
    return GpuRequest(
        count=count,
        memory_mib=memory if memory is not None and memory > 0 else None,
        memory_percent=min(max(percent, 0), 100) if percent is not None else None,
        cores_percent=min(max(cores, 0), 100) if cores is not None else None,
    )


def pod_gpu_requests(pod_spec: Mapping[str, Any]) -> list[GpuRequest | None]:
    """The HAMi request of every container of a Pod spec, init containers first (HAMi's annotation order).

    Values come from ``resources.limits``, else ``resources.requests`` (HAMi reads limits first). A container
    that asks for ``gpumem``/``gpumem-percentage``/``gpucores`` without ``nvidia.com/gpu`` gets 1 vGPU.

    Returns:
        One entry per container; None for a container that asks for no GPU.
    """
    containers = list(pod_spec.get("initContainers") or []) + list(pod_spec.get("containers") or [])
    return [_container_gpu_request(c) for c in containers]


@dataclass(frozen=True)
class GpuAllocation:
    """One vGPU in HAMi's pod allocation annotation.

    Attributes:
        uuid: GPU UUID (``GPU-xxxxxxxx-…``, the node register annotation's ``id``).
        memory_mib: ``usedmem``, device memory reserved, MiB.
        cores_percent: ``usedcores``, SM share reserved, percent of one GPU (0 = no core limit).
        device_type: ``NVIDIA`` for NVIDIA GPUs (the vendor keyword, not the model).
    """

    uuid: str
    memory_mib: int
    cores_percent: int
    device_type: str = HAMI_DEVICE_TYPE


def encode_pod_devices(containers: Iterable[Iterable[GpuAllocation]]) -> str:
    """Encode an allocation as HAMi writes ``hami.io/vgpu-devices-allocated`` (EncodePodSingleDevice @ v2.10.0).

    Args:
        containers: per container (init containers first), its vGPUs; empty for a container without GPU.

    Returns:
        e.g. ``GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;`` (one container, one vGPU) or
        ``;GPU-…,NVIDIA,6144,30:;`` (container 0 has no GPU).
    """
    return "".join(
        "".join(f"{d.uuid},{d.device_type},{d.memory_mib},{d.cores_percent}:" for d in devices) + ";"
        for devices in containers
    )


@dataclass
class _GpuState:
    """A registered GPU and what the pods bound to its node hold on it (HAMi ``DeviceUsage``)."""

    device: HamiDevice
    used: int = 0  # vGPUs placed on it (HAMi counts one per container device)
    used_mem: int = 0  # MiB
    used_cores: int = 0  # percent of one GPU
    exclusive: bool = False  # held by a whole-GPU request

    def take(self, allocation: GpuAllocation, exclusive: bool) -> None:
        self.used += 1
        self.used_mem += allocation.memory_mib
        self.used_cores += allocation.cores_percent
        self.exclusive = self.exclusive or exclusive


def _listed(annotations: Mapping[str, str], key: str) -> list[str]:
    return [item.strip() for item in (annotations.get(key) or "").split(",") if item.strip()]


def _gpu_refusal(gpu: _GpuState, request: GpuRequest, annotations: Mapping[str, str]) -> str | None:
    """Why HAMi would not put one vGPU of ``request`` on ``gpu`` (its reason code), or None if it fits."""
    device = gpu.device
    model = device.model.upper()
    use_types = _listed(annotations, HAMI_USE_GPUTYPE)
    if use_types and not any(t.upper() in model for t in use_types):
        return "CardTypeMismatch"
    if any(t.upper() in model for t in _listed(annotations, HAMI_NOUSE_GPUTYPE)):
        return "CardTypeMismatch"
    use_uuids = _listed(annotations, HAMI_USE_GPUUUID)
    if (use_uuids and device.uuid not in use_uuids) or device.uuid in _listed(annotations, HAMI_NOUSE_GPUUUID):
        return "CardUuidMismatch"
    if gpu.used >= device.split_count:
        return "CardTimeSlicingExhausted"
    if device.memory_mib - gpu.used_mem < request.memory_for(device.memory_mib):
        return "CardInsufficientMemory"
    if device.cores - gpu.used_cores < request.cores:
        return "CardInsufficientCore"
    if gpu.exclusive or (request.exclusive and gpu.used > 0):
        return "ExclusiveDeviceAllocateConflict"
    if device.cores == 100 and request.cores == 100 and gpu.used > 0:  # HAMi: gpucores 100 = the card alone
        return "ExclusiveDeviceAllocateConflict"
    if device.cores != 0 and gpu.used_cores == device.cores and request.cores == 0:
        return "CardComputeUnitsExhausted"  # HAMi: no core-less job on a GPU whose cores are all taken
    return None


def _fit_pod(gpus: list[_GpuState], requests: list[GpuRequest | None], annotations: Mapping[str, str]) -> tuple[
        list[list[GpuAllocation]] | None, collections.Counter[str]]:
    """Place every container's vGPUs on one node's GPUs, container by container (HAMi ``fitInDevices``).

    Args:
        gpus: the node's healthy GPUs in index order; updated in place with what is placed.
        requests: per container (``pod_gpu_requests``).
        annotations: the Pod's annotations (``nvidia.com/use-gputype`` ...).

    Returns:
        ``(allocation, reasons)``: per container its vGPUs (GPUs by index, distinct within a container), or None
        when the node cannot host the pod; ``reasons`` counts HAMi's reason codes of the refused GPUs.
    """
    reasons: collections.Counter[str] = collections.Counter()
    allocation: list[list[GpuAllocation]] = []
    for request in requests:
        if request is None:
            allocation.append([])
            continue
        if request.count > len(gpus):
            reasons["NodeInsufficientDevice"] += 1
            return None, reasons
        chosen: list[tuple[_GpuState, GpuAllocation]] = []
        for gpu in gpus:
            refusal = _gpu_refusal(gpu, request, annotations)
            if refusal is not None:
                reasons[refusal] += 1
                continue
            chosen.append((gpu, GpuAllocation(gpu.device.uuid, request.memory_for(gpu.device.memory_mib),
                                              request.cores)))
            if len(chosen) == request.count:
                break
        if len(chosen) < request.count:
            if chosen:
                reasons["AllocatedCardsInsufficientRequest"] += len(chosen)
            return None, reasons
        for gpu, device in chosen:
            gpu.take(device, request.exclusive)
        allocation.append([device for _, device in chosen])
    return allocation, reasons


def _binpack_score(gpus: Iterable[_GpuState]) -> float:
    """HAMi's node score (``policy.NodeScore.ComputeDefaultScore``): share of vGPU slots + cores + memory in use.

    The binpack node policy prefers the highest score (the most used node).
    """
    gpus = list(gpus)
    score = 0.0
    for used, total in ((sum(g.used for g in gpus), sum(g.device.split_count for g in gpus)),
                        (sum(g.used_cores for g in gpus), sum(g.device.cores for g in gpus)),
                        (sum(g.used_mem for g in gpus), sum(g.device.memory_mib for g in gpus))):
        if total > 0:
            score += used / total
    return score


#: kube-scheduler filter failures (``pkg/scheduler/framework/plugins``), in the order the default plugins run.
_UNSCHEDULABLE_NODE = "node(s) were unschedulable"  # NodeUnschedulable
_WRONG_NODE_NAME = "node(s) didn't match the requested node name"  # NodeName
_NO_SELECTOR_MATCH = "node(s) didn't match Pod's node affinity/selector"  # NodeAffinity (nodeSelector)
#: HAMi extender answers for nodes it refuses (``FailedNodes``): no register annotation, or no fit.
_HAMI_UNREGISTERED = "node unregistered"
_HAMI_UNFIT = "NodeUnfitPod"
_PREEMPTION_USELESS = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"


def _node_filter_failure(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> str | None:
    """The kube-scheduler reason a node is filtered out for a pod, or None (taints are not emulated beyond Ready)."""
    name = node["metadata"]["name"]
    if (node.get("spec") or {}).get("unschedulable"):
        return _UNSCHEDULABLE_NODE
    if pod_spec.get("nodeName") and pod_spec["nodeName"] != name:
        return _WRONG_NODE_NAME
    ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or []
                  if c.get("type") == "Ready"), None)
    if ready != "True":  # the node lifecycle controller taints it; no toleration is checked here
        key = "node.kubernetes.io/not-ready" if ready == "False" else "node.kubernetes.io/unreachable"
        return f"node(s) had untolerated taint {{{key}: }}"
    labels = node["metadata"].get("labels") or {}
    if not all(labels.get(k) == v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return _NO_SELECTOR_MATCH
    return None


def _fit_error(total: int, failures: Mapping[str, tuple[str, bool]]) -> str:
    """kube-scheduler's ``FitError`` message (``0/3 nodes are available: ... preemption: ...``).

    Args:
        total: number of nodes.
        failures: per node ``(reason, preemption_could_help)``; filter-plugin failures are unresolvable
            (``Preemption is not helpful for scheduling``), extender failures are not (``No preemption victims
            found for incoming pod``: the emulator has no lower-priority pods to evict).
    """
    if total == 0:
        return "no nodes available to schedule pods"

    def histogram(reasons: Iterable[str]) -> str:
        return ", ".join(sorted(f"{count} {reason}" for reason, count in collections.Counter(reasons).items()))

    filters = histogram(reason for reason, _ in failures.values())
    preemption = histogram(_NO_VICTIMS if helps else _PREEMPTION_USELESS for _, helps in failures.values())
    return (f"0/{total} nodes are available: {filters}. "
            f"preemption: 0/{total} nodes are available: {preemption}.")


@dataclass(frozen=True)
class _Placement:
    node: dict[str, Any]
    devices: list[list[GpuAllocation]] | None  # None: the pod asks for no GPU


def _qos_class(pod_spec: Mapping[str, Any]) -> str:
    """The Pod's QoS class from its containers' cpu/memory requests and limits (extended resources do not count)."""
    containers = list(pod_spec.get("initContainers") or []) + list(pod_spec.get("containers") or [])
    any_set = False
    guaranteed = bool(containers)
    for container in containers:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = {**limits, **(resources.get("requests") or {})}  # requests default to limits
        for name in ("cpu", "memory"):
            any_set = any_set or name in limits or name in requests
            if name not in limits or not _same_quantity(requests[name], limits[name]):
                guaranteed = False
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return _quantity_decimal(a) == _quantity_decimal(b)
    except (ValueError, decimal.InvalidOperation):
        return False


# --------------------------------------------------------------------------- host facts and gShare's attach checks
#
# What ``manage.py attach_cluster`` finds out about a node it learns from short-lived check pods (scripts in
# ``clusters/attach/checks.py``) and from HAMi's device plugin registering the node once HAMi is installed. Both
# depend on the host (PCI bus, driver, toolkit, containerd config, NFS client, network), which is not in the
# Kubernetes API: the emulator keeps it as per-node "host facts" (``KubeApiEmulator.hosts``).

HOST_FACTS: dict[str, str] = {
    "nvidia_pci": "number of NVIDIA display/3D controllers on the PCI bus (int, 0 for a CPU node)",
    "nvidia_smi": "verbatim output of `nvidia-smi -L` (str), None: nvidia-smi not installed",
    "nvidia_smi_error": "nvidia-smi is installed but fails with this output (str), None: it works",
    "nvidia_ctk": "verbatim output of `nvidia-ctk --version` (str), None: not installed",
    "containerd_nvidia_runtime": "containerd config file registering the `nvidia` runtime (str), None: none does",
    "mount_nfs": "path of the `mount.nfs` helper (str), None: no NFS client",
    "reachable": "TCP targets `host:port` the node can connect to (list of str)",
    "hami_register": "the hami.io/node-nvidia-register value HAMi's device plugin writes on the node (str), None: none",
}
"""Keys of a node's host facts (all optional; a missing key means absent/none/nothing) and what they mean."""

CHECK_POD_LABEL = "app.kubernetes.io/name"
CHECK_POD_LABEL_VALUE = "gshare-attach-check"
"""Label (key, value) of gShare's attach check pods."""

CHECK_KIND_LABEL = "gshare.io/check"
"""Label of a check pod naming its script: ``node`` (GPU prerequisites) or ``nfs`` (NFS client and reachability)."""

CHECK_KINDS = ("node", "nfs")

CHECK_TARGETS_ENV = "GSHARE_CHECK_TARGETS"
"""Environment variable of an ``nfs`` check pod's first container: space-separated ``host:port`` targets."""

CHECK_PREFIX = "gshare-check "

HAMI_DEVICE_PLUGIN_LABEL = "app.kubernetes.io/component"
HAMI_DEVICE_PLUGIN_COMPONENT = "hami-device-plugin"
"""Label (key, value) of the DaemonSet of HAMi's NVIDIA device plugin (``charts/hami`` ``daemonsetnvidia.yaml``)."""

HAMI_NODE_REGISTER = "hami.io/node-nvidia-register"
"""Node annotation: the GPUs HAMi's device plugin registered (decoded by ``operator_agent.hami``)."""

HAMI_NODE_HANDSHAKE = "hami.io/node-handshake"
"""Node annotation: ``Reported <Go time.Time.String()>`` from the device plugin (see
``demo/data/hami/node-handshake.observed-values.yaml``)."""

_OPTIONAL_TEXT_FACTS = ("nvidia_smi", "nvidia_smi_error", "nvidia_ctk", "containerd_nvidia_runtime", "mount_nfs",
                        "hami_register")


def validate_host_facts(node: str, facts: Mapping[str, Any]) -> dict[str, Any]:
    """Check one node's host facts (keys and types of ``HOST_FACTS``) and return a deep copy.

    Raises:
        ValueError: not a mapping, an unknown key, or a value of the wrong type.
    """
    if not isinstance(facts, Mapping):
        raise ValueError(f"host facts of node {node!r} must be an object, not {type(facts).__name__}")
    unknown = sorted(set(facts) - set(HOST_FACTS))
    if unknown:
        raise ValueError(f"host facts of node {node!r}: unknown key(s) {', '.join(map(repr, unknown))} "
                         f"(known: {', '.join(HOST_FACTS)})")
    pci = facts.get("nvidia_pci", 0)
    if isinstance(pci, bool) or not isinstance(pci, int) or pci < 0:
        raise ValueError(f"host facts of node {node!r}: nvidia_pci must be an integer >= 0, not {pci!r}")
    for key in _OPTIONAL_TEXT_FACTS:
        if facts.get(key) is not None and not isinstance(facts[key], str):
            raise ValueError(f"host facts of node {node!r}: {key} must be a string or null, not {facts[key]!r}")
    reachable = facts.get("reachable", [])
    if not isinstance(reachable, list | tuple) or not all(isinstance(t, str) for t in reachable):
        raise ValueError(f"host facts of node {node!r}: reachable must be a list of 'host:port' strings, "
                         f"not {reachable!r}")
    return copy.deepcopy({k: list(v) if k == "reachable" else v for k, v in facts.items()})


def validate_hosts(hosts: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Check ``{node name: host facts}`` (see ``validate_host_facts``); None means no facts. Returns a deep copy.

    Raises:
        ValueError: not a mapping of node names to facts, or bad facts.
    """
    if hosts is None:
        return {}
    if not isinstance(hosts, Mapping):
        raise ValueError(f"hosts must be an object {{node name: facts}}, not {type(hosts).__name__}")
    return {str(node): validate_host_facts(str(node), facts) for node, facts in hosts.items()}


def _tool_output(text: str, *, substituted: bool) -> list[str]:
    """Lines a tool's output adds to a check log.

    ``substituted``: printed as ``printf '%s\\n' "$(tool)"`` (trailing newlines dropped, one added, so an empty
    output is one empty line); otherwise printed as the tool wrote it (a missing final newline is added so the
    next item starts a line, as real tools end their output with one).
    """
    if substituted:
        return text.rstrip("\n").split("\n")
    if not text:
        return []
    return text.removesuffix("\n").split("\n")


def node_check_log(facts: Mapping[str, Any]) -> str:
    """The log of a ``gshare.io/check: node`` pod on a host with these facts (``clusters/attach/checks.py``
    ``NODE_SCRIPT``): ``nvidia-pci``, then (with at least one NVIDIA GPU) ``nvidia-smi``, ``nvidia-ctk`` and
    ``containerd-nvidia-runtime``, each followed by the tool's raw output where it has one, then ``done``."""
    lines: list[str] = []
    count = int(facts.get("nvidia_pci") or 0)
    if count < 1:
        lines.append(f"{CHECK_PREFIX}nvidia-pci none")
    else:
        lines.append(f"{CHECK_PREFIX}nvidia-pci found {count}")
        if facts.get("nvidia_smi_error") is not None:
            lines.append(f"{CHECK_PREFIX}nvidia-smi failed")
            lines.extend(_tool_output(facts["nvidia_smi_error"], substituted=True))
        elif facts.get("nvidia_smi") is not None:
            lines.append(f"{CHECK_PREFIX}nvidia-smi ok")
            lines.extend(_tool_output(facts["nvidia_smi"], substituted=True))
        else:
            lines.append(f"{CHECK_PREFIX}nvidia-smi missing")
        if facts.get("nvidia_ctk") is not None:
            lines.append(f"{CHECK_PREFIX}nvidia-ctk ok")
            lines.extend(_tool_output(facts["nvidia_ctk"], substituted=False))
        else:
            lines.append(f"{CHECK_PREFIX}nvidia-ctk missing")
        if facts.get("containerd_nvidia_runtime"):
            lines.append(f"{CHECK_PREFIX}containerd-nvidia-runtime ok {facts['containerd_nvidia_runtime']}")
        else:
            lines.append(f"{CHECK_PREFIX}containerd-nvidia-runtime missing")
    lines.append(f"{CHECK_PREFIX}done")
    return "\n".join(lines) + "\n"


def nfs_check_log(facts: Mapping[str, Any], targets: Iterable[str]) -> str:
    """The log of a ``gshare.io/check: nfs`` pod on a host with these facts (``NFS_SCRIPT``): ``mount.nfs``, one
    ``tcp <host:port> ok|unreachable`` per target in order (reachable: listed in the ``reachable`` fact), ``done``."""
    lines = [f"{CHECK_PREFIX}mount.nfs ok {facts['mount_nfs']}" if facts.get("mount_nfs")
             else f"{CHECK_PREFIX}mount.nfs missing"]
    reachable = set(facts.get("reachable") or ())
    lines.extend(f"{CHECK_PREFIX}tcp {target} {'ok' if target in reachable else 'unreachable'}" for target in targets)
    lines.append(f"{CHECK_PREFIX}done")
    return "\n".join(lines) + "\n"


def _pod_labelled(pod: Mapping[str, Any], key: str) -> str | None:
    meta = pod.get("metadata") or {}
    value = (meta.get("labels") or {}).get(key)
    return value if value is not None else (meta.get("annotations") or {}).get(key)


def check_pod_kind(pod: Mapping[str, Any]) -> str | None:
    """``node``/``nfs`` for a gShare attach check pod bound to a node (label ``app.kubernetes.io/name:
    gshare-attach-check``, ``spec.nodeName`` set, ``gshare.io/check`` label, or annotation, ``node``/``nfs``), else
    None (an ordinary pod)."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(CHECK_POD_LABEL) != CHECK_POD_LABEL_VALUE:
        return None
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    kind = _pod_labelled(pod, CHECK_KIND_LABEL)
    return kind if kind in CHECK_KINDS else None


def _check_targets(pod: Mapping[str, Any]) -> list[str]:
    """``GSHARE_CHECK_TARGETS`` of the pod's first container, split as the shell splits ``$GSHARE_CHECK_TARGETS``."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    for env in containers[0].get("env") or []:
        if env.get("name") == CHECK_TARGETS_ENV:
            return str(env.get("value") or "").split()
    return []


def go_time_string(wall_ns: int, monotonic_ns: int | None = None) -> str:
    """Go's ``time.Time.String()`` of a UTC time, as HAMi's device plugin writes it after ``Reported ``.

    ``2025-03-27 10:34:13.547080338 +0000 UTC m=+5494.154355430``: layout ``2006-01-02 15:04:05.999999999 -0700
    MST`` (fraction without trailing zeros, none when zero), then with a monotonic reading ``m=±<s>.<9 digits>``.

    Args:
        wall_ns: Unix time in nanoseconds.
        monotonic_ns: the monotonic clock reading (nanoseconds since the process started), or None.
    """
    seconds, nanos = divmod(wall_ns, 1_000_000_000)
    stamp = datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    fraction = f".{nanos:09d}".rstrip("0").rstrip(".")
    text = f"{stamp}{fraction} +0000 UTC"
    if monotonic_ns is not None:
        sign = "-" if monotonic_ns < 0 else "+"
        whole, part = divmod(abs(monotonic_ns), 1_000_000_000)
        text += f" m={sign}{whole}.{part:09d}"
    return text


def _is_hami_device_plugin(daemonset: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet is HAMi's device plugin (the component label on the DaemonSet or its pod template)."""
    if (daemonset.get("metadata") or {}).get("deletionTimestamp"):
        return False
    template = (daemonset.get("spec") or {}).get("template") or {}
    return any((labels or {}).get(HAMI_DEVICE_PLUGIN_LABEL) == HAMI_DEVICE_PLUGIN_COMPONENT
               for labels in ((daemonset.get("metadata") or {}).get("labels"),
                              (template.get("metadata") or {}).get("labels")))


def _daemonset_selects(daemonset: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet's pod template ``nodeSelector`` matches a node's labels (affinity is not emulated)."""
    selector = (((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())



# --------------------------------------------------------------------------- PV controller, CSI provisioner, kubelet mounts
#
# Texts below are what the real components print (found in public cluster output, see each constant); the emulator
# fills in names, uids and paths. ``demo/emulator.py`` and ``tests/demo/test_emulator_volumes.py`` cover them.

DEFAULT_STORAGE_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
"""StorageClass annotation ("true") naming the class the DefaultStorageClass admission plugin gives PVCs naming none."""

PV_CONTROLLER = "persistentvolume-controller"
"""Event source of kube-controller-manager's PersistentVolume controller."""

PROVISIONED_BY_ANNOTATION = "pv.kubernetes.io/provisioned-by"
"""PV annotation naming the provisioner that created it (external-provisioner writes the driver name)."""

NFS_HELPER_MISSING = "bad option; for several filesystems (e.g. nfs, cifs) you might need a /sbin/mount.<type> helper program."
"""util-linux ``mount(8)`` (2.3x) on a host without ``mount.nfs`` (verbatim in the kubelet's FailedMount event quoted in
kubernetes-sigs/provider-aws-test-infra PR #232, 2023)."""

DEMOCRATIC_CSI_MOUNT_WRAPPER = "/usr/local/bin/mount: illegal option -- o"
"""First stderr line of every failed mount run by democratic-csi's node plugin (its ``mount`` wrapper; verbatim in
democratic-csi issues #234, #445, #494)."""

CLAIM_LOST_MESSAGE = "Bound claim has lost its PersistentVolume. Data on the volume is lost!"
"""Warning ``ClaimLost`` of the PV controller (``pkg/controller/volume/persistentvolume/pv_controller.go``)."""


def storage_class_not_found_message(name: str) -> str:
    """The PV controller's ``ProvisioningFailed`` Event for a PVC naming a StorageClass that does not exist."""
    return f'storageclass.storage.k8s.io "{name}" not found'


def external_provisioning_message(provisioner: str) -> str:
    """The PV controller's ``ExternalProvisioning`` Event while a CSI driver's external-provisioner is to create the PV
    (Kubernetes 1.28+ wording, as ``kubectl describe pvc`` shows it)."""
    return (f"Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the "
            "system administrator. If volume creation is delayed, please verify that the provisioner is running and "
            "correctly registered.")


def nfs_mount_failure_message(pv: Mapping[str, Any], pod_uid: str) -> str:
    """The kubelet's ``FailedMount`` Event for an NFS PersistentVolume on a host without an NFS client (``mount.nfs``).

    * CSI volume (democratic-csi, which stages NFS volumes): ``MountVolume.MountDevice failed for volume "<pv>" : rpc
      error: code = Internal desc = {"code":32,"stdout":"","stderr":"<wrapper line>\\nmount: <staging path>: bad
      option; …helper program.\\n","timeout":false}`` -- the kubelet's prefix (democratic-csi issue #189), the node
      plugin's gRPC error body (issue #494) and mount(8)'s line (above), assembled: the staging path is the kubelet's
      ``plugins/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount``.
    * in-tree ``nfs`` volume: ``MountVolume.SetUp failed for volume "<pv>" : mount failed: exit status 32`` then the
      ``Mounting command``/``Mounting arguments``/``Output`` lines, as in provider-aws-test-infra PR #232.
    """
    name = pv["metadata"]["name"]
    spec = pv.get("spec") or {}
    csi = spec.get("csi")
    if csi:
        handle = hashlib.sha256(str(csi.get("volumeHandle") or "").encode("utf-8")).hexdigest()
        staging = f"/var/lib/kubelet/plugins/kubernetes.io/csi/{csi.get('driver')}/{handle}/globalmount"
        body = json.dumps({"code": 32, "stdout": "",
                           "stderr": f"{DEMOCRATIC_CSI_MOUNT_WRAPPER}\nmount: {staging}: {NFS_HELPER_MISSING}\n",
                           "timeout": False}, separators=(",", ":"))
        return f'MountVolume.MountDevice failed for volume "{name}" : rpc error: code = Internal desc = {body}'
    nfs = spec.get("nfs") or {}
    target = f"/var/lib/kubelet/pods/{pod_uid}/volumes/kubernetes.io~nfs/{name}"
    options = ",".join(spec.get("mountOptions") or [])
    arguments = "-t nfs" + (f" -o {options}" if options else "") + f" {nfs.get('server')}:{nfs.get('path')} {target}"
    return (f'MountVolume.SetUp failed for volume "{name}" : mount failed: exit status 32\n'
            f"Mounting command: mount\nMounting arguments: {arguments}\nOutput: mount: {target}: {NFS_HELPER_MISSING}\n")


def _is_external_provisioner(provisioner: str) -> bool:
    """A CSI driver's name (provisioned by its external-provisioner), not an in-tree ``kubernetes.io/...`` plugin."""
    return bool(provisioner) and not provisioner.startswith("kubernetes.io/")


def _is_nfs_volume(pv: Mapping[str, Any]) -> bool:
    """Whether mounting the PV needs the host's NFS client: an in-tree ``nfs`` volume, or a CSI volume of an NFS driver
    (``fsType: nfs`` or a driver named ``...nfs...``, e.g. ``org.democratic-csi.nfs``, ``nfs.csi.k8s.io``)."""
    spec = pv.get("spec") or {}
    if spec.get("nfs"):
        return True
    csi = spec.get("csi") or {}
    driver = str(csi.get("driver") or "").lower()
    return str(csi.get("fsType") or "").lower() == "nfs" or "nfs" in re.split(r"[._/-]", driver)


def _with_phase(pv: Mapping[str, Any], phase: str) -> dict[str, Any]:
    """A copy of a PV with ``status.phase`` (and ``lastPhaseTransitionTime`` when it changes)."""
    new = copy.deepcopy(dict(pv))
    status = new.setdefault("status", {})
    if status.get("phase") != phase:
        status["phase"] = phase
        status["lastPhaseTransitionTime"] = _now()
    return new


def _claim_ref_names(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """Whether a PV is pre-bound to this claim: ``claimRef`` naming its namespace and name, without a uid or with its uid."""
    ref = (pv.get("spec") or {}).get("claimRef") or {}
    meta = claim["metadata"]
    return ((ref.get("namespace"), ref.get("name")) == (meta.get("namespace"), meta["name"])
            and ref.get("uid") in (None, "", meta.get("uid")))


def _prefilter_error(total: int, reason: str) -> str:
    """kube-scheduler's message when a PreFilter plugin (VolumeBinding) rules the pod out on every node."""
    if total == 0:
        return "no nodes available to schedule pods"
    return (f"0/{total} nodes are available: {reason}. "
            f"preemption: 0/{total} nodes are available: {total} {_PREEMPTION_USELESS}.")


def _binding_refusal(claim: Mapping[str, Any], pv: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why the PV controller will not bind ``claim`` to the PV it asks for (``(reason, message)`` of its Warning), or
    None: claimed by another PVC (``claimRef`` naming another claim or uid: ``FailedBinding``), or not satisfying the
    claim (``VolumeMismatch``: StorageClass, size, access modes)."""
    meta = claim["metadata"]
    name = pv["metadata"]["name"]
    spec = pv.get("spec") or {}
    ref = spec.get("claimRef") or {}
    phase = (pv.get("status") or {}).get("phase")
    other = ref and ((ref.get("namespace"), ref.get("name")) != (meta.get("namespace"), meta["name"])
                     or (ref.get("uid") and ref["uid"] != meta.get("uid")))
    if other or (phase == "Bound" and ref.get("uid") != meta.get("uid")):
        return "FailedBinding", f'volume "{name}" already bound to a different claim.'
    claim_spec = claim.get("spec") or {}
    mismatch = None
    if (claim_spec.get("storageClassName") or "") != (spec.get("storageClassName") or ""):
        mismatch = "storageClassName does not match"
    else:
        try:
            too_small = parse_quantity((spec.get("capacity") or {}).get("storage") or 0) < parse_quantity(
                ((claim_spec.get("resources") or {}).get("requests") or {}).get("storage") or 0)
        except ValueError:
            too_small = False
        if too_small:
            mismatch = "requested PV is too small"
        elif not set(claim_spec.get("accessModes") or ()) <= set(spec.get("accessModes") or ()):
            mismatch = "incompatible accessMode"
    if mismatch:
        return "VolumeMismatch", f'Cannot bind to requested volume "{name}": {mismatch}'
    return None


# --------------------------------------------------------------------------- the emulator


@attrs.define(kw_only=True)
class KubeApiEmulator(kmock.KubernetesEmulator):
    """kmock's ``KubernetesEmulator`` made to behave like an apiserver for the official clients.

    The object store is kmock's (``self.objects``); resource metadata is kmock's (``self.resources``,
    filled from ``BUILTIN_RESOURCES`` and from CRDs); watch events go through kmock's buses; request
    dispatch and user reactions (``emulator['get /x'] << ...``) work as in kmock. See the module
    docstring for the behaviour.

    Args (keyword-only):
        server_version: the ``/version`` document (keys ``major``, ``minor``, ``gitVersion`` ... as strings); keys
            it lacks are taken from kmock's default (k3s v1.26.4), None serves that default.
        token: bearer token every request must carry; None disables authentication.
        keep_requests: how many past requests to keep for inspection (``list(emulator)``); bounded so a
            long-running demo does not grow.
        history_limit: versions kept per object in ``emulator.objects[...].history`` (None: all).
        event_log_size: watch events kept for ``resourceVersion`` replays; older ones answer ``410 Expired``.
        pod_startup_seconds: None (default) leaves Pods created through the API ``Pending`` as there is no
            scheduler or kubelet. A number of seconds makes the emulator play kube-scheduler with HAMi's
            scheduler extender, HAMi's device plugin and the kubelet for Pods created through the API (see
            ``_scheduler_pass``): the Pod is bound at once to a node that passes the scheduler's filters
            (``nodeName``, ``nodeSelector``, Ready, not cordoned) and, when it asks for HAMi resources
            (``nvidia.com/gpu``/``gpumem``/``gpumem-percentage``/``gpucores``), has room for it with HAMi's sharing
            rules on the GPUs of its ``hami.io/node-nvidia-register`` annotation; GPU pods go to the most used
            node first (binpack), then by name, on GPUs by index, and get HAMi's pod annotations
            (``hami.io/vgpu-devices-allocated`` ..., ``bind-phase: allocating``). That many seconds later it is
            ``Running`` (``bind-phase: success``, ``vgpu-devices-to-allocate`` emptied) with Ready conditions, a
            pod IP from its node's ``podCIDR`` and running container statuses. With no room it stays ``Pending``
            with ``PodScheduled=False``/``Unschedulable`` and kube-scheduler's message, and is tried again when
            a Pod or Node changes (a deleted Pod frees its GPUs) and every ``scheduler_retry_seconds``.
        scheduler_retry_seconds: how often unschedulable Pods are tried again without any change (seconds).
        hosts: host facts per node name (``HOST_FACTS``: what is installed on the node's host, never visible
            through the API); a node without facts is a host with nothing installed and nothing reachable. They
            decide what gShare's attach check pods print and what HAMi's device plugin registers (see
            "gShare attach checks" below); ``set_host`` changes them while serving.
        check_pod_seconds: how long after creation a check pod has ``Succeeded`` (``Running`` half-way).
        device_plugin_seconds: how long after a HAMi device-plugin DaemonSet or a Node label change the device
            plugin stand-in registers the selected nodes.
        volume_controller_seconds: how long after a PVC, PV or StorageClass change the PV controller and CSI
            provisioner stand-ins act (see the module docstring and ``_volume_controller_pass``).

    gShare attach checks (always on, whatever ``pod_startup_seconds`` says):

    * a Pod labelled ``app.kubernetes.io/name: gshare-attach-check`` and ``gshare.io/check: node|nfs`` with
      ``spec.nodeName`` set is run by the kubelet stand-in on that node without the scheduler stand-in:
      ``Running``, then ``Succeeded`` (container terminated, exit code 0, ``Completed``); its log
      (``pods/log``) is what ``clusters/attach/checks.py``'s script prints on a host with the node's facts
      (``node_check_log``/``nfs_check_log``). A check pod naming a node that does not exist stays ``Pending``
      (and runs if the node appears);
    * HAMi's device plugin: while a DaemonSet labelled (or whose pod template is labelled)
      ``app.kubernetes.io/component: hami-device-plugin`` exists, every Node its template's ``nodeSelector``
      selects whose host facts have ``hami_register`` gets ``hami.io/node-nvidia-register`` (that value),
      ``hami.io/node-handshake: Reported <Go time>`` and ``status.capacity``/``allocatable`` ``nvidia.com/gpu`` =
      the devices' split counts (``operator_agent.hami.decode_node_register``). Nodes carrying a register
      annotation the stand-in did not write (a seed's, e.g. the demo fleet's) are left alone; deleting the
      DaemonSet leaves the annotations (like the real plugin).

    Must be created and used inside the event loop that serves it (see ``serve``/``EmulatedCluster``).
    """

    server_version: dict[str, str] | None = None
    token: str | None = None
    keep_requests: int = 1000
    history_limit: int | None = 50
    event_log_size: int = 1000
    pod_startup_seconds: float | None = None
    scheduler_retry_seconds: float = 10.0
    hosts: dict[str, dict[str, Any]] = attrs.field(factory=dict, converter=validate_hosts)
    check_pod_seconds: float = 0.2
    device_plugin_seconds: float = 0.2
    volume_controller_seconds: float = 0.1

    _rv: int = attrs.field(default=0, init=False)
    _compacted_rv: int = attrs.field(default=0, init=False)
    _events: collections.deque = attrs.field(factory=collections.deque, init=False)
    _outcomes: dict[int, _Outcome] = attrs.field(factory=dict, init=False)
    _specs: dict[kmock.resource, ResourceSpec] = attrs.field(factory=dict, init=False)
    _next_cluster_ip: int = attrs.field(default=10, init=False)
    _next_pod_ip: int = attrs.field(default=10, init=False)
    _kubelet_tasks: set = attrs.field(factory=set, init=False)
    _node_pod_ips: dict[str, int] = attrs.field(factory=dict, init=False)
    _unscheduled: dict[str, tuple[str, str]] = attrs.field(factory=dict, init=False)  # uid -> (ns, name)
    _starting: dict[str, tuple[str, str, float]] = attrs.field(factory=dict, init=False)  # uid -> (ns, name, due)
    _scheduler_wake: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _scheduler_task: asyncio.Task | None = attrs.field(default=None, init=False)
    _pod_logs: dict[str, str] = attrs.field(factory=dict, init=False)  # pod uid -> log text
    _check_waiting: dict[str, tuple[str, str]] = attrs.field(factory=dict, init=False)  # uid -> (ns, name), no node
    _plugin_waiting: bool = attrs.field(default=False, init=False)  # a device-plugin pass is scheduled
    _plugin_registered: set[str] = attrs.field(factory=set, init=False)  # nodes whose annotation the stand-in wrote
    _monotonic_origin: int = attrs.field(factory=time.monotonic_ns, init=False)  # the plugin's "process start"
    _volume_waiting: bool = attrs.field(default=False, init=False)  # a PV controller pass is scheduled
    _volume_events_sent: set[tuple[str, str, str]] = attrs.field(factory=set, init=False)  # (uid, reason, message)
    _mount_waiting: dict[str, tuple[str, str]] = attrs.field(factory=dict, init=False)  # pod uid -> (ns, name)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for spec in BUILTIN_RESOURCES:
            self.register(spec)
        for path in ("/healthz", "/livez", "/readyz"):
            self.fallback["get", path] << b"ok"
        self.fallback["get", re.compile(r"/openapi/v3/(api|apis)/.+")] << self._serve_openapi_group_version
        self.fallback["get /openapi/v3"] << self._serve_openapi_root
        # Before the FETCH fallback (a higher sub-priority): kmock merges the headers of a returned Response into
        # the reaction serving it for good, so text/plain must stay on a reaction of its own.
        (self.fallback ** 1)["get", re.compile(r"/api/v1/namespaces/[^/]+/pods/[^/]+/log")] << self._serve_pod_log

    # ----------------------------------------------------------------- resources

    def register(self, spec: ResourceSpec) -> None:
        """Serve a resource (listed in discovery, accepted in URLs and seeds)."""
        key = _res(spec.group, spec.version, spec.plural)
        self._specs[key] = spec
        self.resources[key] = kmock.ResourceInfo(
            namespaced=spec.namespaced, kind=spec.kind, singular=spec.kind.lower(), verbs=set(spec.verbs),
            shortnames=set(spec.short_names), categories=set(spec.categories), subresources=set(spec.subresources),
        )

    def unregister(self, group: str, version: str, plural: str) -> None:
        """Stop serving a resource (its objects are deleted by the caller)."""
        key = _res(group, version, plural)
        self._specs.pop(key, None)
        if key in self.resources:
            del self.resources[key]

    def spec_for(self, api_version: str, kind: str) -> ResourceSpec:
        """Return the served resource of an ``apiVersion``/``kind`` pair.

        Raises:
            ValueError: no served resource has that kind.
        """
        for spec in self._specs.values():
            if spec.api_version == api_version and spec.kind == kind:
                return spec
        raise ValueError(f"no resource serves apiVersion={api_version!r} kind={kind!r}: create its CRD first")

    def _spec(self, resource: kmock.resource | None) -> ResourceSpec:
        spec = self._specs.get(resource) if resource is not None else None
        if spec is None:
            raise _no_resource()
        return spec

    def _get_resources(self) -> list[kmock.resource]:
        return list(self._specs)

    # ----------------------------------------------------------------- store primitives

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _key(self, spec: ResourceSpec, namespace: str | None, name: str) -> tuple[kmock.resource, str | None, str]:
        return (_res(spec.group, spec.version, spec.plural), namespace if spec.namespaced else None, name)

    def _current(self, spec: ResourceSpec, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = self._key(spec, namespace, name)
        if key not in self.objects:
            return None
        obj = self.objects[key]
        return None if obj.deleted else obj.raw

    def _live(self, spec: ResourceSpec, namespace: str | None = None) -> list[dict[str, Any]]:
        wanted = _res(spec.group, spec.version, spec.plural)
        found = [
            (ns or "", name, obj.raw)
            for (res, ns, name), obj in self.objects.items()
            if res == wanted and not obj.deleted and (namespace is None or ns == namespace)
        ]
        return [raw for _, _, raw in sorted(found, key=lambda item: (item[0], item[1]))]

    def _store(self, spec: ResourceSpec, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = self._key(spec, meta.get("namespace"), meta["name"])
        if key in self.objects:
            self.objects[key].history.append(obj)
            if self.history_limit is not None and len(self.objects[key].history) > self.history_limit:
                del self.objects[key].history[: -self.history_limit]
        else:
            self.objects[key] = obj

    async def _emit(self, spec: ResourceSpec, event_type: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        event = {"rv": rv, "type": event_type, "object": obj, "old": old}
        resource = _res(spec.group, spec.version, spec.plural)
        self._events.append((resource, event))
        while len(self._events) > self.event_log_size:
            _, dropped = self._events.popleft()
            self._compacted_rv = dropped["rv"]
        await self._buses[resource].put(event)
        if self._scheduler_task is not None and self._frees_room(spec, event_type, obj, old):
            self._scheduler_wake.set()
        self._react_for_attach_checks(spec, event_type, obj, old)
        self._react_for_volumes(spec, event_type, obj, old)

    @staticmethod
    def _frees_room(spec: ResourceSpec, event_type: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
        """Whether an event may let an unschedulable Pod fit: any Node or PersistentVolumeClaim change (a claim
        bound), a Pod gone or finished."""
        if spec.group or spec.plural not in ("nodes", "pods", "persistentvolumeclaims"):
            return False
        if spec.plural in ("nodes", "persistentvolumeclaims") or event_type == "DELETED":
            return True
        finished = ("Succeeded", "Failed")
        return ((obj.get("status") or {}).get("phase") in finished
                and ((old or {}).get("status") or {}).get("phase") not in finished)

    async def close_watches(self) -> None:
        """End every open watch stream and pending Pod start-up (called before the server stops)."""
        for task in list(self._kubelet_tasks):
            task.cancel()
        for bus in list(self._buses.values()):
            await bus.put(_WatchClosed())

    # ----------------------------------------------------------------- object normalisation

    def _new_object(self, spec: ResourceSpec, body: Mapping[str, Any], namespace: str | None, *,
                    keep_status: bool) -> dict[str, Any]:
        """Build a stored object from a create/apply/seed body; the caller assigns ``resourceVersion``."""
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", f'{spec.kind} "" is invalid: metadata.name: Required value: name or '
                               "generateName is required", {"kind": spec.kind, "causes": [
                                   {"reason": "FieldValueRequired", "field": "metadata.name",
                                    "message": "Required value: name or generateName is required"}]})
            suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
            meta["name"] = f"{meta['generateName']}{suffix}"
        if spec.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta.pop("resourceVersion", None)
        if keep_status:  # a seed: keep the identity it was given
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta.setdefault("generation", 1)
        else:  # an API create: the server decides these, whatever the client sent
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta["generation"] = 1
            meta.pop("deletionTimestamp", None)
            meta.pop("deletionGracePeriodSeconds", None)
            if spec.kind == "Pod":
                obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}
            elif spec.kind in ("PersistentVolumeClaim", "PersistentVolume"):
                self._volume_defaults(spec.kind, obj)
            elif spec.group not in _BUILTIN_GROUPS and "status" in spec.subresources:
                obj.pop("status", None)
        if spec.kind == "Service":
            self._default_service(obj)
        if spec.kind == "CustomResourceDefinition":
            self._crd_defaults(obj)
        # Key order as the apiserver writes it: apiVersion, kind, metadata, then the rest.
        rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        return {"apiVersion": spec.api_version, "kind": spec.kind, "metadata": meta, **rest}

    def _volume_defaults(self, kind: str, obj: dict[str, Any]) -> None:
        """What the apiserver does to a PVC or PV on create: status reset to ``phase: Pending`` (the PV controller
        moves it on), ``volumeMode: Filesystem``, a PV's ``persistentVolumeReclaimPolicy: Retain``, and the
        DefaultStorageClass admission plugin's ``storageClassName`` for a PVC that names none (key absent; ``""``
        means "no class" and is kept)."""
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        spec.setdefault("volumeMode", "Filesystem")
        obj["status"] = {"phase": "Pending"}
        if kind == "PersistentVolume":
            spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
        elif "storageClassName" not in spec or spec["storageClassName"] is None:
            default = next((sc["metadata"]["name"] for sc in self._live(self._specs[_res("storage.k8s.io", "v1",
                                                                                         "storageclasses")])
                            if (sc["metadata"].get("annotations") or {}).get(DEFAULT_STORAGE_CLASS_ANNOTATION)
                            == "true"), None)
            if default is not None:
                spec["storageClassName"] = default

    def _default_service(self, obj: dict[str, Any]) -> None:
        svc = obj.setdefault("spec", {})
        svc.setdefault("type", "ClusterIP")
        if svc.get("clusterIP") in (None, "") and svc["type"] != "ExternalName":
            self._next_cluster_ip += 1
            ip = str(ipaddress.IPv4Address("10.96.0.0") + self._next_cluster_ip)
            svc["clusterIP"] = ip
            svc["clusterIPs"] = [ip]

    @staticmethod
    def _crd_defaults(obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        now = _now()
        obj["status"] = {
            "acceptedNames": names,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts",
                 "message": "no conflicts found"},
                {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted"},
            ],
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
        }

    def _crd_specs(self, crd: Mapping[str, Any]) -> list[ResourceSpec]:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        if not spec.get("group") or not names.get("plural") or not names.get("kind"):
            raise ApiError(422, "Invalid", "CustomResourceDefinition is invalid: spec.group, spec.names.plural and "
                           "spec.names.kind are required")
        specs = []
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            subresources = tuple(sorted((version.get("subresources") or {}).keys()))
            specs.append(ResourceSpec(
                group=spec["group"], version=version["name"], plural=names["plural"], kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()), subresources=subresources,
                categories=tuple(names.get("categories") or ()),
            ))
        return specs

    # ----------------------------------------------------------------- loading

    def load(self, objects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Store objects directly (no API semantics, no events): for seeds, before serving.

        Each object needs ``apiVersion``, ``kind`` and ``metadata.name`` (and ``metadata.namespace`` when
        namespaced); ``status`` is kept; ``uid``/``creationTimestamp`` are kept when given; the
        ``resourceVersion`` is always assigned by the emulator. CRDs register their resources, so custom
        objects may follow their CRD in the same list.

        Returns:
            The stored objects.

        Raises:
            ValueError: an object has no served resource or no name.
        """
        return [self._load_one(obj)[0] for obj in objects]

    def _load_one(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, ResourceSpec]:
        spec = self.spec_for(str(body.get("apiVersion", "")), str(body.get("kind", "")))
        meta = body.get("metadata") or {}
        if not meta.get("name"):
            raise ValueError(f"{spec.kind} without metadata.name: {body!r:.200}")
        if spec.namespaced and not meta.get("namespace"):
            raise ValueError(f"{spec.kind} {meta['name']!r} is namespaced but has no metadata.namespace")
        old = self._current(spec, meta.get("namespace"), meta["name"])
        obj = self._new_object(spec, body, meta.get("namespace"), keep_status=True)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        if old is not None:
            obj["metadata"]["uid"] = old["metadata"]["uid"]
            obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        self._store(spec, obj)
        if spec.kind == "CustomResourceDefinition":
            for crd_spec in self._crd_specs(obj):
                self.register(crd_spec)
        return obj, old, spec

    async def put_object(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object outside the API (like ``load``) and notify watchers.

        Returns:
            The stored object (with the emulator's metadata).
        """
        async with self._lock:
            obj, old, spec = self._load_one(body)
            await self._emit(spec, "MODIFIED" if old is not None else "ADDED", obj, old)
            return copy.deepcopy(obj)

    # ----------------------------------------------------------------- HTTP entry

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """aiohttp entry point: kmock's ``RawHandler.__call__`` with this module's request parsing.

        kmock 0.8's parser fails on ``/api/v1/namespaces`` (the Namespace collection) and cannot tell a
        Namespace object from a namespaced collection, and its request/error lists grow without bound.
        """
        await raw_request.read()
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            request = await self._parse_request(raw_request)
            self._requests.append(request)
            if len(self._requests) > self.keep_requests:
                del self._requests[: -self.keep_requests]
            try:
                return await self._handle(request)
            except StreamingError as exc:
                raw_response = exc.args[0]
                raise exc.__cause__ or exc from None
        except Exception as exc:
            if not self._errors:
                raise
            self._errors[-1].append(exc)
            del self._errors[-1][: -self.keep_requests]
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(exc)
            await self._stream_error(exc, raw_response)
            await raw_response.write_eof()
            return raw_response

    async def _parse_request(self, raw: aiohttp.web.BaseRequest) -> kmock.Request:
        body = await raw.read()
        text = body.decode("utf-8", errors="replace")
        data: Any = None
        if body:
            try:
                data = json.loads(text)
            except ValueError:
                if "yaml" in raw.headers.get("Content-Type", ""):
                    try:
                        data = yaml.safe_load(text)
                    except yaml.YAMLError:
                        data = None
        parsed = _parse_path(raw.path)
        query = dict(raw.query)
        method = raw.method.upper()
        action: kmock.action | None = None
        resource = None
        if parsed is not None:
            resource = _res(parsed.group, parsed.version, parsed.plural)
            if parsed.plural is not None:
                if method == "GET" and _truthy(query.get("watch")):
                    action = kmock.action.WATCH
                elif method == "GET":
                    action = kmock.action.FETCH if parsed.name else kmock.action.LIST
                elif method == "POST" and not parsed.name:
                    action = kmock.action.CREATE
                elif method in ("PATCH", "PUT") and parsed.name:
                    action = kmock.action.UPDATE
                elif method == "DELETE":
                    action = kmock.action.DELETE
        # The official client asks for "/version/", "/api/", "/apis/": the apiserver ignores a trailing slash.
        url = raw.url.with_path(raw.path.rstrip("/") or "/", keep_query=True) if raw.path != "/" else raw.url
        return kmock.Request(
            id=len(self._requests), raw_request=raw, url=url, method=raw.method, params=query,
            headers=dict(raw.headers), cookies=dict(raw.cookies), data=data, body=body, text=text,
            action=action, resource=resource,
            namespace=parsed.namespace if parsed else None,
            name=parsed.name if parsed else None,
            subresource=parsed.subresource if parsed else None,
        )

    def _authenticate(self, request: kmock.Request) -> None:
        if self.token is None:
            return
        header = _header(request.headers, "Authorization")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), self.token.encode()):
            raise ApiError(401, "Unauthorized", "Unauthorized", None)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        self._authenticate(request)
        if request.resource is not None and request.resource.plural is not None:
            spec = self._spec(request.resource)
            self._check_scope(spec, request)
            async with self._lock:
                outcome = await self._mutate(spec, request)
            if outcome is not None:
                self._outcomes[id(request)] = outcome
        try:
            # Skip KubernetesEmulator._handle (its raw-dict bookkeeping is replaced by _mutate above) and
            # dispatch like kmock does: user reactions first, then the fallbacks, which call _serve_* below.
            return await super(kmock.KubernetesEmulator, self)._handle(request)
        finally:
            self._outcomes.pop(id(request), None)

    def _check_scope(self, spec: ResourceSpec, request: kmock.Request) -> None:
        if not spec.namespaced and request.namespace is not None:
            raise _no_resource()
        if spec.namespaced and request.namespace is None and request.name is not None:
            raise _no_resource()
        if request.subresource == "log" and (spec.group, spec.plural) == ("", "pods") and request.name is not None:
            if request.action != kmock.action.FETCH:  # pods/log is read-only (GET)
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                               "resource", None)
        elif request.subresource is not None:
            if request.subresource != "status" or "status" not in spec.subresources or request.name is None:
                raise _no_resource()
        if request.action is None or (request.action == kmock.action.CREATE and spec.namespaced
                                      and request.namespace is None):
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                           None)

    # ----------------------------------------------------------------- mutations

    async def _mutate(self, spec: ResourceSpec, request: kmock.Request) -> _Outcome | None:
        dry_run = request.params.get("dryRun") == "All"
        if request.action == kmock.action.CREATE:
            return await self._create(spec, request, self._body(request, spec), dry_run=dry_run)
        if request.action == kmock.action.UPDATE and request.method == kmock.method.PUT:
            return await self._replace(spec, request, dry_run=dry_run)
        if request.action == kmock.action.UPDATE:
            return await self._patch(spec, request, dry_run=dry_run)
        if request.action == kmock.action.DELETE and request.name is not None:
            return await self._delete_named(spec, request.namespace, request.name, dry_run=dry_run)
        if request.action == kmock.action.DELETE:
            selection = self._selection(spec, request)
            deleted = []
            for obj in self._live(spec, request.namespace):
                if selection.matches(obj):
                    meta = obj["metadata"]
                    outcome = await self._delete_named(spec, meta.get("namespace"), meta["name"], dry_run=dry_run)
                    deleted.append(self._list_item(spec, outcome.body if outcome.body.get("kind") != "Status" else obj))
            return _Outcome(200, {"kind": f"{spec.kind}List", "apiVersion": spec.api_version,
                                  "metadata": {"resourceVersion": str(self._rv)}, "items": deleted})
        return None

    @staticmethod
    def _body(request: kmock.Request, spec: ResourceSpec) -> dict[str, Any]:
        if _header(request.headers, "Content-Type").startswith(k8s_protobuf.CONTENT_TYPE):
            try:
                return k8s_protobuf.decode_object(request.body)
            except k8s_protobuf.UnsupportedProtobuf as exc:
                raise ApiError(415, "UnsupportedMediaType", str(exc), None) from None
        if not isinstance(request.data, dict):
            raise ApiError(400, "BadRequest", f"the body of the request was not a {spec.kind} object", None)
        return request.data

    async def _create(self, spec: ResourceSpec, request: kmock.Request, body: dict[str, Any], *,
                      dry_run: bool) -> _Outcome:
        namespace = request.namespace
        body_ns = (body.get("metadata") or {}).get("namespace")
        if spec.namespaced and body_ns and body_ns != namespace:
            raise ApiError(400, "BadRequest",
                           "the namespace of the provided object does not match the namespace sent on the request",
                           None)
        self._require_namespace(spec, namespace)
        obj = self._new_object(spec, body, namespace, keep_status=False)
        name = obj["metadata"]["name"]
        if self._current(spec, namespace, name) is not None:
            raise ApiError(409, "AlreadyExists", f'{_qualified(spec)} "{name}" already exists', _details(spec, name))
        crd_specs = self._crd_specs(obj) if spec.kind == "CustomResourceDefinition" else []
        if dry_run:
            return _Outcome(201, obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._store(spec, obj)
        for crd_spec in crd_specs:
            self.register(crd_spec)
        await self._emit(spec, "ADDED", obj, None)
        if spec.kind == "Pod" and self.pod_startup_seconds is not None and check_pod_kind(obj) is None:
            self._unscheduled[obj["metadata"]["uid"]] = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            self._ensure_scheduler()
            self._scheduler_wake.set()
        return _Outcome(201, obj)

    # ----------------------------------------------------------------- scheduler, HAMi and kubelet stand-ins

    def _ensure_scheduler(self) -> None:
        if self._scheduler_task is None or self._scheduler_task.done():
            self._scheduler_task = asyncio.create_task(self._scheduler_loop(), name="emulated-scheduler")
            self._kubelet_tasks.add(self._scheduler_task)
            self._scheduler_task.add_done_callback(self._kubelet_tasks.discard)

    async def _scheduler_loop(self) -> None:
        """Run ``_scheduler_pass`` whenever woken (Pod created, Pod/Node change), a start is due or a retry is."""
        loop = asyncio.get_running_loop()
        while True:
            self._scheduler_wake.clear()
            try:
                async with self._lock:
                    next_start = await self._scheduler_pass()
            except Exception:  # keep scheduling the other pods; the failure is in the log
                logger.exception("the emulated scheduler failed a pass")
                next_start = None
            delays = [] if next_start is None else [max(0.0, next_start - loop.time())]
            if self._unscheduled or self._mount_waiting:
                delays.append(self.scheduler_retry_seconds)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(delays) if delays else None):
                    await self._scheduler_wake.wait()

    async def _scheduler_pass(self) -> float | None:
        """Bind the pending Pods that fit (oldest first), then start the bound Pods whose start-up time has come.

        Starting is the kubelet's part: it mounts the Pod's PersistentVolumeClaim volumes first, and a mount that
        fails (``_mount_failure``: an NFS volume on a host without an NFS client) leaves the Pod ``Pending`` in
        ``ContainerCreating`` with a ``FailedMount`` Warning Event; such Pods are tried again on every pass (a
        ``set_host`` that installs the client wakes the scheduler) and start once their volumes mount.

        Returns:
            The loop time of the next start, or None when no Pod is waiting to start.
        """
        pods = self._specs[_res("", "v1", "pods")]
        loop = asyncio.get_running_loop()
        for uid, (namespace, name) in list(self._unscheduled.items()):
            current = self._waiting_pod(pods, namespace, name, uid)
            if current is None:
                del self._unscheduled[uid]
                continue
            placement = self._place(current)
            if isinstance(placement, str):
                await self._mark_unschedulable(pods, current, placement)
                continue
            del self._unscheduled[uid]
            await self._write(pods, self._bound(current, placement), current)
            self._starting[uid] = (namespace, name, loop.time() + (self.pod_startup_seconds or 0.0))
        for uid, (namespace, name, due) in list(self._starting.items()):
            if due > loop.time():
                continue
            del self._starting[uid]
            current = self._waiting_pod(pods, namespace, name, uid)
            node = self._current(self._specs[_res("", "v1", "nodes")], None,
                                 ((current or {}).get("spec") or {}).get("nodeName") or "")
            if current is not None and node is not None:
                await self._start_pod(pods, current, node)
        for uid, (namespace, name) in list(self._mount_waiting.items()):
            current = self._waiting_pod(pods, namespace, name, uid)
            node = self._current(self._specs[_res("", "v1", "nodes")], None,
                                 ((current or {}).get("spec") or {}).get("nodeName") or "")
            if current is None or node is None:
                self._mount_waiting.pop(uid, None)
                continue
            await self._start_pod(pods, current, node)
        return min((due for _, _, due in self._starting.values()), default=None)

    async def _start_pod(self, pods: ResourceSpec, current: dict[str, Any], node: dict[str, Any]) -> None:
        """The kubelet starting a bound Pod: mount its volumes, then run it (``Running``); or, when a mount fails,
        keep it in ``ContainerCreating`` and record the kubelet's ``FailedMount`` Event (once per message)."""
        uid = current["metadata"]["uid"]
        failure = self._mount_failure(current, node)
        if failure is None:
            self._mount_waiting.pop(uid, None)
            await self._write(pods, self._running(current, node), current)
            return
        self._mount_waiting[uid] = (current["metadata"]["namespace"], current["metadata"]["name"])
        creating = self._container_creating(current, node)
        if creating != current:
            await self._write(pods, creating, current)
        await self._record_event_once(creating, reason="FailedMount", message=failure, event_type="Warning",
                                      component="kubelet", host=node["metadata"]["name"])

    def _waiting_pod(self, pods: ResourceSpec, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The Pod if it is still the one created (same uid), not being deleted and ``Pending``."""
        current = self._current(pods, namespace, name)
        if current is None or current["metadata"]["uid"] != uid or current["metadata"].get("deletionTimestamp"):
            return None
        return current if (current.get("status") or {}).get("phase") == "Pending" else None

    async def _write(self, spec: ResourceSpec, new: dict[str, Any], old: dict[str, Any]) -> None:
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store(spec, new)
        await self._emit(spec, "MODIFIED", new, old)

    def _gpu_states(self) -> dict[str, list[_GpuState] | None]:
        """Per node name: its healthy GPUs (index order) with what live Pods hold on them.

        GPUs come from the node's ``hami.io/node-nvidia-register`` (or ``4pd.io/...``) annotation, decoded by
        ``operator_agent.hami.decode_node_register``; None when the node has no such annotation or it does not
        decode (HAMi: "node unregistered"). Holdings come from the ``hami.io/vgpu-devices-allocated`` annotation
        of every Pod bound to the node that has not finished (``Succeeded``/``Failed``), decoded by
        ``operator_agent.hami_pods.decode_pod_devices``, as HAMi's scheduler rebuilds them from its pod informer;
        a deleted Pod holds nothing.
        """
        states: dict[str, list[_GpuState] | None] = {}
        for node in self._live(self._specs[_res("", "v1", "nodes")]):
            name = node["metadata"]["name"]
            value = node_register_annotation(node["metadata"].get("annotations"))
            try:
                devices = decode_node_register(value) if value is not None else None
            except HamiDecodeError as exc:
                logger.warning("node %s: HAMi register annotation not decodable, treated as unregistered: %s",
                               name, exc)
                devices = None
            states[name] = None if devices is None else [
                _GpuState(d) for d in sorted(devices, key=lambda d: (d.index, d.uuid)) if d.health]
        for pod in self._live(self._specs[_res("", "v1", "pods")]):
            gpus = states.get((pod.get("spec") or {}).get("nodeName") or "")
            value = (pod["metadata"].get("annotations") or {}).get(HAMI_DEVICES_ALLOCATED)
            if not gpus or not value or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            try:
                containers = decode_pod_devices(value)
            except HamiDecodeError as exc:
                logger.warning("pod %s/%s: %s not decodable, ignored: %s", pod["metadata"].get("namespace"),
                               pod["metadata"]["name"], HAMI_DEVICES_ALLOCATED, exc)
                continue
            requests = pod_gpu_requests(pod.get("spec") or {})
            by_uuid = {gpu.device.uuid: gpu for gpu in gpus}
            for index, devices in enumerate(containers):
                request = requests[index] if index < len(requests) else None
                for device in devices:
                    if device["uuid"] in by_uuid:
                        held = GpuAllocation(device["uuid"], device["memory_mib"], device["cores"], device["type"])
                        by_uuid[device["uuid"]].take(held, request is not None and request.exclusive)
        return states

    def _place(self, pod: Mapping[str, Any]) -> _Placement | str:
        """Choose a node (and GPUs) for a Pod, or return kube-scheduler's failure message.

        Nodes are filtered as kube-scheduler's default plugins do (``_node_filter_failure``). A Pod without HAMi
        resources goes to the first remaining node by name. A GPU Pod is then filtered as HAMi's scheduler
        extender does: nodes without a register annotation are "node unregistered", nodes whose GPUs cannot hold
        every container's vGPUs are "NodeUnfitPod" (``_fit_pod``); among the nodes that fit, the binpack policy
        takes the most used one (``_binpack_score``), ties broken by name. Before any of that, like kube-scheduler's
        VolumeBinding plugin, a Pod whose PersistentVolumeClaims are missing or not ``Bound`` fits nowhere
        (``pod has unbound immediate PersistentVolumeClaims``; every StorageClass is treated as ``Immediate``).
        """
        spec = pod.get("spec") or {}
        meta = pod["metadata"]
        nodes = self._live(self._specs[_res("", "v1", "nodes")])
        unbound = self._unbound_claims(pod)
        if unbound is not None:  # kube-scheduler's VolumeBinding PreFilter: unresolvable on every node
            return _prefilter_error(len(nodes), unbound)
        failures: dict[str, tuple[str, bool]] = {}
        candidates = []
        for node in nodes:
            reason = _node_filter_failure(node, spec)
            if reason is None:
                candidates.append(node)
            else:
                failures[node["metadata"]["name"]] = (reason, False)
        requests = pod_gpu_requests(spec)
        if not any(requests):
            if candidates:
                return _Placement(candidates[0], None)
            return _fit_error(len(nodes), failures)
        states = self._gpu_states()
        annotations = meta.get("annotations") or {}
        fits = []
        card_reasons: dict[str, list[str]] = collections.defaultdict(list)
        for node in candidates:
            name = node["metadata"]["name"]
            gpus = states.get(name)
            if gpus is None:
                failures[name] = (_HAMI_UNREGISTERED, True)
                continue
            score = _binpack_score(gpus)
            allocation, reasons = _fit_pod(gpus, requests, annotations)
            if allocation is None:
                failures[name] = (_HAMI_UNFIT, True)
                for reason in reasons:
                    card_reasons[reason].append(name)
                continue
            fits.append((-score, name, node, allocation))
        if fits:
            _, _, node, allocation = min(fits, key=lambda fit: (fit[0], fit[1]))
            return _Placement(node, allocation)
        if card_reasons:  # what HAMi records as FilteringFailed events
            logger.info("hami-scheduler: pod %s/%s does not fit: %s", meta.get("namespace"), meta["name"], "; ".join(
                f"{len(names)} nodes {reason}({','.join(sorted(names))})" for reason, names in sorted(card_reasons.items())))
        return _fit_error(len(nodes), failures)

    async def _mark_unschedulable(self, pods: ResourceSpec, current: dict[str, Any], message: str) -> None:
        """Set ``PodScheduled=False``/``Unschedulable`` with ``message`` (no write when nothing changes)."""
        conditions = (current.get("status") or {}).get("conditions") or []
        scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("message") == message:
            return
        pod = copy.deepcopy(current)
        now = _now()
        pod["status"]["conditions"] = [c for c in conditions if c.get("type") != "PodScheduled"] + [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastProbeTime": None, "lastTransitionTime": now}]
        await self._write(pods, pod, current)

    @staticmethod
    def _bound(current: Mapping[str, Any], placement: _Placement) -> dict[str, Any]:
        """The Pod once bound: ``spec.nodeName``, ``PodScheduled=True``, and for a GPU Pod HAMi's annotations as its
        scheduler writes them at bind time (``bind-phase: allocating``, to-allocate = allocated)."""
        pod = copy.deepcopy(dict(current))
        name = placement.node["metadata"]["name"]
        pod.setdefault("spec", {})["nodeName"] = name
        if placement.devices is not None:
            value = encode_pod_devices(placement.devices)
            unix = str(int(time.time()))
            pod["metadata"].setdefault("annotations", {}).update({
                HAMI_VGPU_NODE: name, HAMI_VGPU_TIME: unix, HAMI_DEVICES_TO_ALLOCATE: value,
                HAMI_DEVICES_ALLOCATED: value, HAMI_BIND_PHASE: "allocating", HAMI_BIND_TIME: unix,
            })
        pod["status"] = {**pod.get("status", {}), "phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": _now()}]}
        return pod

    def _running(self, current: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
        """The Pod once its containers run: what HAMi's device plugin writes (``bind-phase: success``, to-allocate
        emptied to one ``;`` per container) and the kubelet's status (``Running``, IPs, conditions, containers)."""
        pod = copy.deepcopy(dict(current))
        annotations = pod["metadata"].get("annotations") or {}
        if HAMI_DEVICES_TO_ALLOCATE in annotations and HAMI_DEVICES_ALLOCATED in annotations:
            segments = len(decode_pod_devices(annotations[HAMI_DEVICES_ALLOCATED]))
            annotations[HAMI_DEVICES_TO_ALLOCATE] = ";" * segments
            annotations[HAMI_BIND_PHASE] = "success"
        now = _now()
        pod_ip = self._pod_ip(node)
        host_ip = next((a["address"] for a in (node.get("status") or {}).get("addresses") or []
                        if a.get("type") == "InternalIP"), "10.0.0.1")
        spec = pod.get("spec") or {}
        pod["status"] = {
            "phase": "Running",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                           for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                     "PodScheduled")],
            "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
            "startTime": now, "qosClass": (current.get("status") or {}).get("qosClass", _qos_class(spec)),
            "containerStatuses": [{
                "name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "ready": True,
                "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}},
            } for c in spec.get("containers") or []],
        }
        return pod

    def _pod_ip(self, node: Mapping[str, Any]) -> str:
        """The next address of the node's ``spec.podCIDR`` (from ``.2``, wrapping), else of 10.244.0.0/16.

        Data only: nothing listens there (the emulator serves the API on loopback and nothing else).
        """
        try:
            network = ipaddress.ip_network((node.get("spec") or {}).get("podCIDR") or "")
        except ValueError:
            self._next_pod_ip += 1
            return str(ipaddress.IPv4Address("10.244.0.0") + self._next_pod_ip)
        name = node["metadata"]["name"]
        self._node_pod_ips[name] = self._node_pod_ips.get(name, -1) + 1
        return str(network.network_address + 2 + self._node_pod_ips[name] % max(1, network.num_addresses - 3))

    # ----------------------------------------------------------------- gShare attach checks: host facts, check pods
    # ----------------------------------------------------------------- and HAMi's device plugin

    def set_host(self, node: str, facts: Mapping[str, Any] | None) -> None:
        """Replace the host facts of a node (None: forget them, the host then has nothing installed).

        Check pods created afterwards see the new facts; HAMi's device plugin stand-in registers the node if it
        now can (a plugin pod crash-looping on a host without a driver starts once the driver is fixed). Call it
        in the emulator's event loop (``EmulatedCluster.set_host`` does).

        Raises:
            ValueError: bad facts (see ``HOST_FACTS``).
        """
        if facts is None:
            self.hosts.pop(node, None)
        else:
            self.hosts[node] = validate_host_facts(node, facts)
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to kick yet
            asyncio.get_running_loop()
            if self._hami_device_plugins():
                self.kick_device_plugin()
            if self._mount_waiting:  # the kubelet retries the mounts of Pods stuck in ContainerCreating
                self._scheduler_wake.set()

    def host_facts(self, node: str) -> dict[str, Any]:
        """A copy of a node's host facts (``{}`` when it has none)."""
        return copy.deepcopy(self.hosts.get(node) or {})

    def pod_log(self, namespace: str, name: str) -> str | None:
        """The log of a live Pod (``""`` before it has one), or None when there is no such Pod."""
        current = self._current(self._specs[_res("", "v1", "pods")], namespace, name)
        if current is None:
            return None
        return self._pod_logs.get(current["metadata"]["uid"], "")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._kubelet_tasks.add(task)
        task.add_done_callback(self._kubelet_tasks.discard)

    def _react_for_attach_checks(self, spec: ResourceSpec, event_type: str, obj: Mapping[str, Any],
                                 old: Mapping[str, Any] | None) -> None:
        """Start check pods, and kick the device plugin on a HAMi DaemonSet or Node label change (from ``_emit``)."""
        meta = obj.get("metadata") or {}
        if (spec.group, spec.plural) == ("", "pods"):
            if event_type == "ADDED" and check_pod_kind(obj) is not None:
                self._spawn(self._run_check_pod(meta["namespace"], meta["name"], meta["uid"]),
                            f"emulated-check-pod-{meta['name']}")
            elif event_type == "DELETED":
                self._pod_logs.pop(meta.get("uid", ""), None)
                self._check_waiting.pop(meta.get("uid", ""), None)
        elif (spec.group, spec.plural) == ("", "nodes"):
            if event_type == "ADDED":
                for uid, (namespace, name) in list(self._check_waiting.items()):
                    pod = self._current(self._specs[_res("", "v1", "pods")], namespace, name)
                    if pod is not None and (pod.get("spec") or {}).get("nodeName") == meta["name"]:
                        del self._check_waiting[uid]
                        self._spawn(self._run_check_pod(namespace, name, uid), f"emulated-check-pod-{name}")
            elif event_type == "DELETED":
                self._plugin_registered.discard(meta.get("name", ""))
            labels_changed = event_type == "ADDED" or (event_type == "MODIFIED" and meta.get("labels") != (
                (old or {}).get("metadata") or {}).get("labels"))
            if labels_changed and self._hami_device_plugins():
                self.kick_device_plugin()
        elif (spec.group, spec.plural) == ("apps", "daemonsets"):
            if event_type in ("ADDED", "MODIFIED") and _is_hami_device_plugin(obj):
                self.kick_device_plugin()

    async def _run_check_pod(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet stand-in running a check pod: ``Running`` (with its log) then ``Succeeded``."""
        pods = self._specs[_res("", "v1", "pods")]
        nodes = self._specs[_res("", "v1", "nodes")]
        try:
            await asyncio.sleep(self.check_pod_seconds / 2)
            async with self._lock:
                current = self._waiting_pod(pods, namespace, name, uid)
                if current is None:
                    return
                node_name = (current.get("spec") or {}).get("nodeName") or ""
                node = self._current(nodes, None, node_name)
                if node is None:  # no kubelet to run it: Pending until the node appears
                    self._check_waiting[uid] = (namespace, name)
                    return
                facts = self.hosts.get(node_name) or {}
                kind = check_pod_kind(current)
                self._pod_logs[uid] = (node_check_log(facts) if kind == "node"
                                       else nfs_check_log(facts, _check_targets(current)))
                running = self._running(current, node)
                if (current.get("spec") or {}).get("hostNetwork"):
                    running["status"]["podIP"] = running["status"]["hostIP"]
                    running["status"]["podIPs"] = [{"ip": running["status"]["hostIP"]}]
                await self._write(pods, running, current)
            await asyncio.sleep(self.check_pod_seconds / 2)
            async with self._lock:
                current = self._current(pods, namespace, name)
                if (current is None or current["metadata"]["uid"] != uid or current["metadata"].get("deletionTimestamp")
                        or (current.get("status") or {}).get("phase") != "Running"):
                    return
                await self._write(pods, self._completed(current), current)
        except Exception:  # the pod stays where it is; the failure is in the log
            logger.exception("the emulated kubelet failed to run check pod %s/%s", namespace, name)

    @staticmethod
    def _completed(current: Mapping[str, Any]) -> dict[str, Any]:
        """The Pod once its containers exited 0: the kubelet's ``Succeeded`` status (``PodCompleted`` conditions,
        containers ``terminated``/``Completed``)."""
        pod = copy.deepcopy(dict(current))
        status = pod.setdefault("status", {})
        now = _now()
        running = {c.get("name"): ((c.get("state") or {}).get("running") or {}).get("startedAt", now)
                   for c in status.get("containerStatuses") or []}

        def condition(kind: str, value: str, reason: str | None = None) -> dict[str, Any]:
            entry: dict[str, Any] = {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": now}
            if reason:
                entry["reason"] = reason
            return entry

        status["phase"] = "Succeeded"
        status["conditions"] = [
            condition("PodReadyToStartContainers", "False"), condition("Initialized", "True", "PodCompleted"),
            condition("Ready", "False", "PodCompleted"), condition("ContainersReady", "False", "PodCompleted"),
            condition("PodScheduled", "True"),
        ]
        statuses = []
        for container in (pod.get("spec") or {}).get("containers") or []:
            container_id = f"containerd://{secrets.token_hex(32)}"
            statuses.append({
                "name": container.get("name", ""), "image": container.get("image", ""), "imageID": "",
                "containerID": container_id, "ready": False, "started": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "containerID": container_id,
                                         "startedAt": running.get(container.get("name"), now), "finishedAt": now}},
            })
        status["containerStatuses"] = statuses
        return pod

    async def _serve_pod_log(self, request: kmock.Request) -> Any:
        """``GET .../pods/{name}/log``: the pod's log as ``text/plain`` (``""`` while it has none).

        Query parameters: ``container`` (must name one of the pod's containers; required when it has several, as
        the apiserver answers), ``tailLines``, ``limitBytes``; ``follow``, ``previous``, ``timestamps``,
        ``sinceSeconds`` are accepted and ignored (check pods have finished by the time there is a log).
        """
        pods = self._specs[_res("", "v1", "pods")]
        name = request.name or ""
        async with self._lock:
            current = self._current(pods, request.namespace, name)
            if current is None:
                raise _not_found(pods, name)
            text = self._pod_logs.get(current["metadata"]["uid"], "")
        spec = current.get("spec") or {}
        names = [c.get("name") for key in ("initContainers", "containers", "ephemeralContainers")
                 for c in spec.get(key) or []]
        container = request.params.get("container")
        if container and container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}", None)
        regular = [c.get("name") for c in spec.get("containers") or []]
        if not container and len(regular) > 1:
            raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}, choose one of: "
                           f"[{' '.join(regular)}]", None)

        def non_negative(param: str) -> int | None:
            raw = request.params.get(param)
            if raw is None:
                return None
            if not re.fullmatch(r"\d+", raw):
                raise ApiError(400, "BadRequest", f"{param}: Invalid value: {raw!r}: must be a non-negative integer",
                               None)
            return int(raw)

        tail = non_negative("tailLines")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[len(lines) - tail:] if tail else [])
        body = text.encode("utf-8")
        limit = non_negative("limitBytes")
        if limit:
            body = body[:limit]
        return kmock.Response(status=200, payload=body, headers={"Content-Type": "text/plain"})

    def _hami_device_plugins(self) -> list[dict[str, Any]]:
        return [ds for ds in self._live(self._specs[_res("apps", "v1", "daemonsets")]) if _is_hami_device_plugin(ds)]

    def kick_device_plugin(self) -> None:
        """Schedule a pass of HAMi's device-plugin stand-in ``device_plugin_seconds`` from now (unless one is
        already waiting, which will see the current state). Call it in the emulator's event loop."""
        if self._plugin_waiting:
            return
        self._plugin_waiting = True
        self._spawn(self._device_plugin_after_delay(), "emulated-hami-device-plugin")

    async def _device_plugin_after_delay(self) -> None:
        try:
            await asyncio.sleep(self.device_plugin_seconds)
            async with self._lock:
                self._plugin_waiting = False  # a change from now on needs a pass of its own
                await self._device_plugin_pass()
        except Exception:  # the next DaemonSet/Node/host change tries again; the failure is in the log
            logger.exception("the emulated HAMi device plugin failed a pass")

    async def _device_plugin_pass(self) -> None:
        """Register every node a HAMi device-plugin DaemonSet selects whose host has ``hami_register`` (see the
        class docstring); nodes carrying a register annotation the stand-in did not write are left alone."""
        daemonsets = self._hami_device_plugins()
        if not daemonsets:
            return
        nodes = self._specs[_res("", "v1", "nodes")]
        for node in self._live(nodes):
            name = node["metadata"]["name"]
            value = (self.hosts.get(name) or {}).get("hami_register")
            if value is None or not any(_daemonset_selects(ds, node) for ds in daemonsets):
                continue
            annotations = node["metadata"].get("annotations") or {}
            present = node_register_annotation(annotations)
            if present is not None and (name not in self._plugin_registered or annotations.get(HAMI_NODE_REGISTER)
                                        == value):
                continue
            updated = copy.deepcopy(node)
            updated["metadata"]["annotations"] = {
                **annotations, HAMI_NODE_REGISTER: value,
                HAMI_NODE_HANDSHAKE: "Reported " + go_time_string(time.time_ns(),
                                                                  time.monotonic_ns() - self._monotonic_origin),
            }
            try:
                vgpus: str | None = str(sum(device.split_count for device in decode_node_register(value)))
            except HamiDecodeError as exc:
                logger.warning("node %s: host fact hami_register does not decode, capacity left alone: %s", name, exc)
                vgpus = None
            if vgpus is not None:
                status = updated.setdefault("status", {})
                for key in ("capacity", "allocatable"):
                    status[key] = {**(status.get(key) or {}), HAMI_RESOURCE_COUNT: vgpus}
            self._plugin_registered.add(name)
            await self._write(nodes, updated, node)

    # ----------------------------------------------------------------- PV controller and CSI provisioner stand-ins

    def _react_for_volumes(self, spec: ResourceSpec, event_type: str, obj: Mapping[str, Any],
                           old: Mapping[str, Any] | None) -> None:
        """Kick the PV controller on a PVC, PV or StorageClass change; forget what a deleted Pod/PVC waited for
        (from ``_emit``)."""
        kind = (spec.group, spec.plural)
        if kind in (("", "persistentvolumeclaims"), ("", "persistentvolumes"), ("storage.k8s.io", "storageclasses")):
            self.kick_volume_controller()
        if event_type == "DELETED" and kind in (("", "pods"), ("", "persistentvolumeclaims")):
            uid = (obj.get("metadata") or {}).get("uid", "")
            self._mount_waiting.pop(uid, None)
            self._volume_events_sent = {key for key in self._volume_events_sent if key[0] != uid}

    def kick_volume_controller(self) -> None:
        """Schedule a pass of the PV controller stand-in ``volume_controller_seconds`` from now (unless one is already
        waiting, which will see the current state). Call it in the emulator's event loop."""
        if self._volume_waiting:
            return
        with contextlib.suppress(RuntimeError):  # no running loop (a seed being loaded): serve() kicks later
            asyncio.get_running_loop()
            self._volume_waiting = True
            self._spawn(self._volume_controller_after_delay(), "emulated-pv-controller")

    async def _volume_controller_after_delay(self) -> None:
        try:
            await asyncio.sleep(self.volume_controller_seconds)
            async with self._lock:
                self._volume_waiting = False  # a change from now on needs a pass of its own
                await self._volume_controller_pass()
        except Exception:  # the next PVC/PV/StorageClass change tries again; the failure is in the log
            logger.exception("the emulated PV controller failed a pass")

    async def _volume_controller_pass(self) -> None:
        """One pass of kube-controller-manager's PV controller with a CSI external-provisioner (see the class docstring).

        Volumes first: a PV whose bound claim (``claimRef.uid``) is gone is deleted (reclaim policy ``Delete``) or
        ``Released`` (``Retain``); a new PV without a claim, or pre-bound to one (``claimRef`` without uid), becomes
        ``Available``. Then claims: a ``Bound`` claim whose PV is gone is ``Lost``; a pending claim naming a PV
        (``spec.volumeName``) or named by an ``Available`` PV's ``claimRef`` is bound to it (or gets the controller's
        Warning why not); any other pending claim is provisioned from its StorageClass when the class's provisioner is
        a CSI driver (``ProvisioningFailed`` when the class does not exist).
        """
        pvcs = self._specs[_res("", "v1", "persistentvolumeclaims")]
        pvs = self._specs[_res("", "v1", "persistentvolumes")]
        classes = self._specs[_res("storage.k8s.io", "v1", "storageclasses")]
        claims = {c["metadata"]["uid"]: c for c in self._live(pvcs)}
        for pv in self._live(pvs):
            meta = pv["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            phase = (pv.get("status") or {}).get("phase")
            if ref.get("uid") and ref["uid"] not in claims:
                if phase == "Released" or phase == "Failed":
                    continue
                if (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Delete":
                    await self._delete_named(pvs, None, meta["name"], dry_run=False)  # the provisioner deletes it
                else:
                    await self._write(pvs, _with_phase(pv, "Released"), pv)
            elif not ref.get("uid") and phase in (None, "", "Pending"):
                await self._write(pvs, _with_phase(pv, "Available"), pv)
        for claim in self._live(pvcs):
            meta = claim["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            spec = claim.get("spec") or {}
            phase = (claim.get("status") or {}).get("phase") or "Pending"
            if phase == "Bound":
                if spec.get("volumeName") and self._current(pvs, None, spec["volumeName"]) is None:
                    lost = copy.deepcopy(claim)
                    lost.setdefault("status", {})["phase"] = "Lost"
                    await self._write(pvcs, lost, claim)
                    await self._record_event_once(lost, reason="ClaimLost", message=CLAIM_LOST_MESSAGE,
                                                  event_type="Warning", component=PV_CONTROLLER)
                continue
            if phase != "Pending":
                continue
            if spec.get("volumeName"):
                pv = self._current(pvs, None, spec["volumeName"])
                if pv is not None:  # else: requested and not found, tried again on the next change
                    await self._bind_or_refuse(claim, pv, by_controller=False)
                continue
            prebound = next((pv for pv in self._live(pvs) if _claim_ref_names(pv, claim)
                             and (pv.get("status") or {}).get("phase") in ("Available", "Pending", None)), None)
            if prebound is not None:
                await self._bind_or_refuse(claim, prebound, by_controller=True)
                continue
            class_name = spec.get("storageClassName")
            if not class_name:  # "" or none: static binding only, not emulated beyond the two cases above
                continue
            storage_class = self._current(classes, None, class_name)
            if storage_class is None:
                await self._record_event_once(claim, reason="ProvisioningFailed",
                                              message=storage_class_not_found_message(class_name),
                                              event_type="Warning", component=PV_CONTROLLER)
                continue
            if _is_external_provisioner(str(storage_class.get("provisioner") or "")):
                await self._provision(claim, storage_class)

    async def _bind_or_refuse(self, claim: dict[str, Any], pv: dict[str, Any], *, by_controller: bool) -> None:
        refusal = _binding_refusal(claim, pv)
        if refusal is None:
            await self._bind(claim, pv, by_controller=by_controller)
        else:
            await self._record_event_once(claim, reason=refusal[0], message=refusal[1], event_type="Warning",
                                          component=PV_CONTROLLER)

    async def _bind(self, claim: dict[str, Any], pv: dict[str, Any], *, by_controller: bool,
                    provisioner: str | None = None) -> None:
        """Bind both ways, as the PV controller does: the PV's ``claimRef`` (with the claim's uid) and ``Bound``, then
        the claim's ``volumeName``, bind annotations and ``status`` (``Bound``, capacity and access modes of the PV)."""
        pvs = self._specs[_res("", "v1", "persistentvolumes")]
        pvcs = self._specs[_res("", "v1", "persistentvolumeclaims")]
        meta = claim["metadata"]
        bound_pv = copy.deepcopy(pv)
        bound_pv.setdefault("spec", {})["claimRef"] = {
            "kind": "PersistentVolumeClaim", "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
            "apiVersion": "v1", "resourceVersion": meta["resourceVersion"]}
        bound_pv = _with_phase(bound_pv, "Bound")
        if bound_pv != pv:
            await self._write(pvs, bound_pv, pv)
        bound = copy.deepcopy(claim)
        bound.setdefault("spec", {})["volumeName"] = pv["metadata"]["name"]
        annotations = bound["metadata"].setdefault("annotations", {})
        annotations["pv.kubernetes.io/bind-completed"] = "yes"
        if by_controller:
            annotations["pv.kubernetes.io/bound-by-controller"] = "yes"
        if provisioner:
            annotations["volume.beta.kubernetes.io/storage-provisioner"] = provisioner
            annotations["volume.kubernetes.io/storage-provisioner"] = provisioner
        pv_spec = bound_pv.get("spec") or {}
        bound["status"] = {"phase": "Bound", "accessModes": list(pv_spec.get("accessModes") or []),
                           "capacity": dict(pv_spec.get("capacity") or {})}
        await self._write(pvcs, bound, claim)

    async def _provision(self, claim: dict[str, Any], storage_class: Mapping[str, Any]) -> None:
        """The CSI driver's external-provisioner: create PV ``pvc-<claim uid>`` (``csi`` with the driver, a new volume
        handle and ``fsType`` from the class's parameters, ``nfs`` by default; capacity = the request; the class's
        reclaim policy and mount options) and bind it, with the events ``kubectl describe pvc`` shows."""
        pvs = self._specs[_res("", "v1", "persistentvolumes")]
        meta = claim["metadata"]
        provisioner = str(storage_class["provisioner"])
        await self._record_event(claim, reason="ExternalProvisioning", event_type="Normal", component=PV_CONTROLLER,
                                 message=external_provisioning_message(provisioner))
        component = f"{provisioner}_{provisioner.rsplit('.', 1)[-1]}-csi-controller-0_{uuid.uuid4()}"
        await self._record_event(claim, reason="Provisioning", event_type="Normal", component=component,
                                 message=f'External provisioner is provisioning volume for claim "{meta["namespace"]}/'
                                         f'{meta["name"]}"')
        name = f"pvc-{meta['uid']}"
        existing = self._current(pvs, None, name)
        if existing is None:
            parameters = storage_class.get("parameters") or {}
            spec = claim.get("spec") or {}
            pv_spec: dict[str, Any] = {
                "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
                "capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage") or "0"},
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": meta["namespace"], "name": meta["name"],
                             "uid": meta["uid"], "apiVersion": "v1", "resourceVersion": meta["resourceVersion"]},
                "csi": {"driver": provisioner, "volumeHandle": name if "democratic-csi" in provisioner else str(uuid.uuid4()),
                        "fsType": parameters.get("fsType") or parameters.get("csi.storage.k8s.io/fstype") or "nfs",
                        "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity":
                                             f"{int(time.time() * 1000)}-{secrets.randbelow(10000)}-{provisioner}"}},
                "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
                "storageClassName": storage_class["metadata"]["name"],
                "volumeMode": spec.get("volumeMode") or "Filesystem",
            }
            if storage_class.get("mountOptions"):
                pv_spec["mountOptions"] = list(storage_class["mountOptions"])
            existing = self._new_object(pvs, {
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {PROVISIONED_BY_ANNOTATION: provisioner}},
                "spec": pv_spec, "status": {"phase": "Pending"}}, None, keep_status=True)
            existing["metadata"]["resourceVersion"] = self._next_rv()
            self._store(pvs, existing)
            await self._emit(pvs, "ADDED", existing, None)
        await self._record_event(claim, reason="ProvisioningSucceeded", event_type="Normal", component=component,
                                 message=f"Successfully provisioned volume {name}")
        await self._bind(claim, existing, by_controller=True, provisioner=provisioner)

    async def _record_event(self, involved: Mapping[str, Any], *, reason: str, message: str, event_type: str,
                            component: str, host: str | None = None) -> dict[str, Any]:
        """Store a ``core/v1`` Event about ``involved`` as a component's event recorder writes it (name
        ``<object>.<unix nanoseconds in hex>``, ``source``/``reporting*``, ``count: 1``); watchers get ``ADDED``."""
        events = self._specs[_res("", "v1", "events")]
        meta = involved["metadata"]
        now = _now()
        namespace = meta.get("namespace") or "default"  # events about cluster-scoped objects go to "default"
        source: dict[str, Any] = {"component": component}
        if host:
            source["host"] = host
        event = self._new_object(events, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {"kind": involved.get("kind"), "namespace": meta.get("namespace"), "name": meta["name"],
                               "uid": meta.get("uid"), "apiVersion": involved.get("apiVersion"),
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message, "source": source, "firstTimestamp": now, "lastTimestamp": now,
            "count": 1, "type": event_type, "eventTime": None, "reportingComponent": component,
            "reportingInstance": host or "",
        }, namespace, keep_status=True)
        event["metadata"]["resourceVersion"] = self._next_rv()
        self._store(events, event)
        await self._emit(events, "ADDED", event, None)
        return event

    async def _record_event_once(self, involved: Mapping[str, Any], *, reason: str, message: str, event_type: str,
                                 component: str, host: str | None = None) -> None:
        """``_record_event`` unless this object already got this reason and message (a pass repeats its checks)."""
        key = (involved["metadata"].get("uid") or "", reason, message)
        if key in self._volume_events_sent:
            return
        self._volume_events_sent.add(key)
        await self._record_event(involved, reason=reason, message=message, event_type=event_type,
                                 component=component, host=host)

    # ----------------------------------------------------------------- kubelet: volumes of scheduled Pods

    def _unbound_claims(self, pod: Mapping[str, Any]) -> str | None:
        """kube-scheduler's VolumeBinding reason for a Pod whose PersistentVolumeClaims are not all ``Bound``, or None."""
        pvcs = self._specs[_res("", "v1", "persistentvolumeclaims")]
        namespace = pod["metadata"].get("namespace")
        unbound = False
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim_name:
                continue
            claim = self._current(pvcs, namespace, claim_name)
            if claim is None:
                return f'persistentvolumeclaim "{claim_name}" not found'
            if claim["metadata"].get("deletionTimestamp"):
                return f'persistentvolumeclaim "{claim_name}" is being deleted'
            unbound = unbound or (claim.get("status") or {}).get("phase") != "Bound"
        return "pod has unbound immediate PersistentVolumeClaims" if unbound else None

    def _mount_failure(self, pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
        """The kubelet's ``FailedMount`` message when the Pod mounts an NFS PersistentVolume and the node's host facts
        say it has no NFS client (``mount_nfs`` missing/None), else None. A node without any host facts is not judged
        (the emulator knows nothing of its host): its mounts succeed, so seeds without ``hosts`` keep running pods."""
        facts = self.hosts.get(node["metadata"]["name"])
        if facts is None or facts.get("mount_nfs"):
            return None
        pvcs = self._specs[_res("", "v1", "persistentvolumeclaims")]
        pvs = self._specs[_res("", "v1", "persistentvolumes")]
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            claim = self._current(pvcs, pod["metadata"].get("namespace"), claim_name) if claim_name else None
            volume_name = ((claim or {}).get("spec") or {}).get("volumeName")
            pv = self._current(pvs, None, volume_name) if volume_name else None
            if pv is not None and _is_nfs_volume(pv):
                return nfs_mount_failure_message(pv, pod["metadata"]["uid"])
        return None

    def _container_creating(self, current: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
        """The Pod while the kubelet cannot mount its volumes: ``Pending``, ``Initialized``, not ready, containers
        waiting in ``ContainerCreating``, no pod IP (no sandbox yet). Returned unchanged when already so."""
        statuses = (current.get("status") or {}).get("containerStatuses") or []
        if statuses and all(((c.get("state") or {}).get("waiting") or {}).get("reason") == "ContainerCreating"
                            for c in statuses):
            return dict(current)
        pod = copy.deepcopy(dict(current))
        now = _now()
        spec = pod.get("spec") or {}
        names = [c.get("name", "") for c in spec.get("containers") or []]
        unready = f"containers with unready status: [{' '.join(names)}]"
        host_ip = next((a["address"] for a in (node.get("status") or {}).get("addresses") or []
                        if a.get("type") == "InternalIP"), "10.0.0.1")

        def condition(kind: str, value: str, reason: str | None = None) -> dict[str, Any]:
            entry: dict[str, Any] = {"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": now}
            if reason:
                entry.update(reason=reason, message=unready)
            return entry

        pod["status"] = {
            "phase": "Pending",
            "conditions": [condition("PodReadyToStartContainers", "False"), condition("Initialized", "True"),
                           condition("Ready", "False", "ContainersNotReady"),
                           condition("ContainersReady", "False", "ContainersNotReady"), condition("PodScheduled", "True")],
            "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "startTime": now,
            "qosClass": (current.get("status") or {}).get("qosClass", _qos_class(spec)),
            "containerStatuses": [{
                "name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "ready": False,
                "started": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}},
            } for c in spec.get("containers") or []],
        }
        return pod

    def _require_namespace(self, spec: ResourceSpec, namespace: str | None) -> None:
        if spec.namespaced and namespace is not None:
            ns_spec = self._specs[_res("", "v1", "namespaces")]
            if self._current(ns_spec, None, namespace) is None:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})

    def _precondition(self, spec: ResourceSpec, current: Mapping[str, Any], body: Any) -> None:
        wanted = ((body or {}).get("metadata") or {}).get("resourceVersion") if isinstance(body, Mapping) else None
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            name = current["metadata"]["name"]
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(spec)} "{name}": the object '
                           "has been modified; please apply your changes to the latest version and try again",
                           _details(spec, name))

    async def _replace(self, spec: ResourceSpec, request: kmock.Request, *, dry_run: bool) -> _Outcome:
        body = self._body(request, spec)
        name = request.name or ""
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL", None)
        current = self._current(spec, request.namespace, name)
        if current is None:
            raise _not_found(spec, name)
        self._precondition(spec, current, body)
        return await self._update(spec, current, copy.deepcopy(body), request.subresource, dry_run=dry_run)

    async def _patch(self, spec: ResourceSpec, request: kmock.Request, *, dry_run: bool) -> _Outcome:
        content_type = _header(request.headers, "Content-Type").split(";")[0].strip().lower()
        name = request.name or ""
        current = self._current(spec, request.namespace, name)
        patch = request.data
        if content_type == "application/apply-patch+yaml":
            manager = request.params.get("fieldManager")
            if not manager:
                raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                               "is required for apply patch", None)
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "the apply configuration is not a YAML/JSON object", None)
            if (patch.get("apiVersion"), patch.get("kind")) != (spec.api_version, spec.kind):
                raise ApiError(400, "BadRequest", f"the apply configuration must have apiVersion {spec.api_version!r} "
                               f"and kind {spec.kind!r}", None)
            if (patch.get("metadata") or {}).get("name") not in (None, name):
                raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL", None)
            applied = copy.deepcopy(patch)
            applied.setdefault("metadata", {})["name"] = name
            _record_manager(applied, current, manager, spec.api_version, "Apply", request.subresource)
            if current is None:
                if request.subresource:
                    raise _not_found(spec, name)
                return await self._create(spec, request, applied, dry_run=dry_run)
            self._precondition(spec, current, patch)
            return await self._update(spec, current, merge_patch(current, applied), request.subresource,
                                      dry_run=dry_run)
        if current is None:
            raise _not_found(spec, name)
        if content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations", None)
            try:
                new = jsonpatch.apply_patch(copy.deepcopy(current), patch, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, TypeError) as exc:
                raise ApiError(422, "Invalid", f"the JSON patch could not be applied: {exc}", None) from None
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object", None)
            self._precondition(spec, current, patch)
            if content_type == "application/strategic-merge-patch+json":
                patch = _strip_directives(patch)
            new = merge_patch(current, patch)
        else:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted "
                           "media types include: application/json-patch+json, application/merge-patch+json, "
                           "application/apply-patch+yaml", None)
        return await self._update(spec, current, new, request.subresource, dry_run=dry_run)

    async def _update(self, spec: ResourceSpec, current: dict[str, Any], new: Any, subresource: str | None, *,
                      dry_run: bool) -> _Outcome:
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", f"the result of the update is not a {spec.kind} object", None)
        if subresource == "status":
            result = copy.deepcopy(current)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            managed = (new.get("metadata") or {}).get("managedFields")
            if managed is not None:
                result["metadata"]["managedFields"] = managed
        else:
            result = copy.deepcopy(new)
            if "status" in spec.subresources:
                if "status" in current:
                    result["status"] = copy.deepcopy(current["status"])
                else:
                    result.pop("status", None)
        meta = result.setdefault("metadata", {})
        old_meta = current["metadata"]
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                      "deletionGracePeriodSeconds", "generation"):
            if fixed in old_meta:
                meta[fixed] = old_meta[fixed]
            else:
                meta.pop(fixed, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        result = {"apiVersion": spec.api_version, "kind": spec.kind, "metadata": result.pop("metadata"),
                  **{k: v for k, v in result.items() if k not in ("apiVersion", "kind")}}
        if spec.kind == "Service":
            old_ip = (current.get("spec") or {}).get("clusterIP")
            if old_ip and isinstance(result.get("spec"), dict) and not result["spec"].get("clusterIP"):
                result["spec"]["clusterIP"] = old_ip
                result["spec"]["clusterIPs"] = (current.get("spec") or {}).get("clusterIPs", [old_ip])
            self._default_service(result)
        if result == current:
            return _Outcome(200, result)  # a no-op write keeps the revision and sends no event
        if _spec_part(result) != _spec_part(current):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        crd_specs = self._crd_specs(result) if spec.kind == "CustomResourceDefinition" else []
        if dry_run:
            return _Outcome(200, result)
        meta["resourceVersion"] = self._next_rv()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._remove(spec, result)
            return _Outcome(200, result)
        self._store(spec, result)
        if spec.kind == "CustomResourceDefinition":
            for old_spec in self._crd_specs(current):
                self.unregister(old_spec.group, old_spec.version, old_spec.plural)
        for crd_spec in crd_specs:
            self.register(crd_spec)
        await self._emit(spec, "MODIFIED", result, current)
        return _Outcome(200, result)

    async def _delete_named(self, spec: ResourceSpec, namespace: str | None, name: str, *, dry_run: bool) -> _Outcome:
        current = self._current(spec, namespace, name)
        if current is None:
            raise _not_found(spec, name)
        meta = current["metadata"]
        if dry_run:
            return _Outcome(200, current)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return _Outcome(200, current)
            pending = copy.deepcopy(current)
            pending["metadata"]["deletionTimestamp"] = _now()
            pending["metadata"]["deletionGracePeriodSeconds"] = 0
            pending["metadata"]["resourceVersion"] = self._next_rv()
            self._store(spec, pending)
            await self._emit(spec, "MODIFIED", pending, current)
            return _Outcome(200, pending)
        final = copy.deepcopy(current)
        final["metadata"]["resourceVersion"] = self._next_rv()
        await self._remove(spec, final)
        # The apiserver answers with the deleted object for the kinds whose registry sets ReturnDeletedObject (Pods,
        # PVCs and PVs, which the official client >= 35 decodes as such) and for custom resources; else a Status.
        if spec.kind in _RETURNS_DELETED_OBJECT or spec.group not in _BUILTIN_GROUPS:
            return _Outcome(200, final)
        return _Outcome(200, {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": _details(spec, name, uid=meta.get("uid")),
        })

    async def _remove(self, spec: ResourceSpec, final: dict[str, Any]) -> None:
        """Delete an object for good, then what depended on it (namespace content, owned objects, CRD objects)."""
        meta = final["metadata"]
        key = self._key(spec, meta.get("namespace"), meta["name"])
        self.objects[key].delete()
        await self._emit(spec, "DELETED", final, None)
        if spec.kind == "Namespace":
            for other in list(self._specs.values()):
                if other.namespaced:
                    for obj in self._live(other, meta["name"]):
                        await self._cascade(other, obj)
        elif spec.kind == "CustomResourceDefinition":
            for crd_spec in self._crd_specs(final):
                for obj in self._live(crd_spec):
                    await self._cascade(crd_spec, obj)
                self.unregister(crd_spec.group, crd_spec.version, crd_spec.plural)
        uid = meta.get("uid")
        for other in list(self._specs.values()):
            for obj in self._live(other):
                owners = obj["metadata"].get("ownerReferences") or []
                if any(owner.get("uid") == uid for owner in owners):
                    await self._cascade(other, obj)

    async def _cascade(self, spec: ResourceSpec, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        if self._current(spec, meta.get("namespace"), meta["name"]) is not None:
            await self._delete_named(spec, meta.get("namespace"), meta["name"], dry_run=False)

    # ----------------------------------------------------------------- reads

    def _selection(self, spec: ResourceSpec, request: kmock.Request) -> _Selection:
        allowed = ("metadata.name", "metadata.namespace") + FIELD_SELECTORS.get((spec.group, spec.plural), ())
        return _Selection(
            namespace=request.namespace,
            name=request.name,
            labels=tuple(parse_label_selector(request.params.get("labelSelector", ""))),
            fields=tuple(parse_field_selector(request.params.get("fieldSelector", ""), allowed)),
        )

    @staticmethod
    def _list_item(spec: ResourceSpec, obj: Mapping[str, Any]) -> dict[str, Any]:
        if spec.group in _BUILTIN_GROUPS:
            return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        return dict(obj)

    async def _serve_list(self, request: kmock.Request) -> Any:
        spec = self._spec(request.resource)
        selection = self._selection(spec, request)
        async with self._lock:
            items = [obj for obj in self._live(spec, request.namespace) if selection.matches(obj)]
            revision = str(self._rv)
        metadata: dict[str, Any] = {"resourceVersion": revision}
        start = 0
        if token := request.params.get("continue"):
            try:
                cont = json.loads(base64.urlsafe_b64decode(token.encode()))
                after = tuple(cont["after"])
                start = next((i for i, obj in enumerate(items)
                              if (obj["metadata"].get("namespace", ""), obj["metadata"]["name"]) > after), len(items))
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "the provided continue parameter is not valid", None) from None
        items = items[start:]
        limit = int(request.params.get("limit") or 0)
        if limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            after = [last.get("namespace", ""), last["name"]]
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps({"after": after}).encode()).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {
            "kind": f"{spec.kind}List",
            "apiVersion": spec.api_version,
            "metadata": metadata,
            "items": [self._list_item(spec, obj) for obj in items],
        }

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        spec = self._spec(request.resource)
        obj = self._current(spec, request.namespace, request.name or "")
        if obj is None:
            raise _not_found(spec, request.name or "")
        return obj

    async def _serve_create(self, request: kmock.Request) -> Any:
        return self._render_outcome(request)

    async def _serve_update(self, request: kmock.Request) -> Any:
        return self._render_outcome(request)

    async def _serve_delete(self, request: kmock.Request) -> Any:
        return self._render_outcome(request)

    def _render_outcome(self, request: kmock.Request) -> Any:
        outcome = self._outcomes.get(id(request))
        if outcome is None:  # pragma: no cover - every mutating request stores one in _handle
            raise ApiError(500, "InternalError", "no outcome recorded for this request", None)
        return kmock.Response(status=outcome.status, payload=outcome.body)

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        spec = self._spec(request.resource)
        selection = self._selection(spec, request)
        timeout = float(request.params.get("timeoutSeconds") or 1800)
        since = request.params.get("resourceVersion") or ""
        resource = _res(spec.group, spec.version, spec.plural)
        bus = self._buses[resource]
        yield b""  # send the headers now, as kmock does, so clients see the stream open
        async with self._lock:
            marker = await bus.mark()
            if since in ("", "0"):
                backlog = [{"type": "ADDED", "object": obj} for obj in self._live(spec, request.namespace)
                           if selection.matches(obj)]
            elif not since.isdigit():
                backlog = [_watch_error(400, "BadRequest", f"invalid resource version: {since!r}")]
            elif int(since) < self._compacted_rv:
                backlog = [_watch_error(410, "Expired", f"too old resource version: {since} ({self._compacted_rv})")]
            else:
                backlog = [wire for res, event in self._events
                           if res == resource and event["rv"] > int(since)
                           for wire in [_translate(event, selection)] if wire is not None]
        try:
            for wire in backlog:
                yield wire
                if wire["type"] == "ERROR":
                    return
            async with asyncio.timeout(timeout):
                async for event in bus.stream(since=marker):
                    wire = _translate(event, selection)
                    if wire is not None:
                        yield wire
        except (TimeoutError, _WatchClosed):
            return
        finally:
            with contextlib.suppress(ValueError, RuntimeError):
                await bus.unmark(marker)

    # ----------------------------------------------------------------- discovery

    async def _serve_server_version(self, request: kmock.Request) -> Any:
        # Keys missing from server_version come from kmock's default document: the official client
        # (v33+, pydantic models) refuses a /version answer without gitCommit, buildDate, platform ...
        default = await super()._serve_server_version(request)
        return {**default, **(self.server_version or {})}

    async def _serve_api(self, request: kmock.Request) -> Any:
        address = f"{request.url.host}:{request.url.port}"
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, set[str]] = collections.defaultdict(set)
        for spec in self._specs.values():
            if spec.group:
                groups[spec.group].add(spec.version)
        order = {g: i for i, g in enumerate(_GROUP_ORDER)}
        return {g: sorted(groups[g], key=_version_key)
                for g in sorted(groups, key=lambda g: (order.get(g, len(order)), g))}

    @staticmethod
    def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
        return {
            "name": group,
            "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
        }

    async def _serve_apis(self, request: kmock.Request) -> Any:
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [self._group_doc(g, vs) for g, vs in self._groups().items()]}

    async def _serve_group(self, request: kmock.Request) -> Any:
        group = request.resource.group if request.resource is not None else None
        versions = self._groups().get(group or "")
        if not versions:
            raise _no_resource()
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_doc(group or "", versions)}

    async def _serve_version(self, request: kmock.Request) -> Any:
        group = request.resource.group if request.resource is not None else None
        version = request.resource.version if request.resource is not None else None
        specs = sorted((s for s in self._specs.values() if s.group == group and s.version == version),
                       key=lambda s: s.plural)
        if not specs:
            raise _no_resource()
        resources: list[dict[str, Any]] = []
        for spec in specs:
            entry: dict[str, Any] = {"name": spec.plural, "singularName": spec.kind.lower(),
                                     "namespaced": spec.namespaced, "kind": spec.kind, "verbs": list(spec.verbs)}
            if spec.short_names:
                entry["shortNames"] = list(spec.short_names)
            if spec.categories:
                entry["categories"] = list(spec.categories)
            resources.append(entry)
            for sub in spec.subresources:
                resources.append({"name": f"{spec.plural}/{sub}", "singularName": "", "namespaced": spec.namespaced,
                                  "kind": spec.kind, "verbs": ["get", "patch", "update"] if sub == "status" else
                                  ["create"] if sub in ("binding", "eviction", "token") else ["get"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else (version or ""), "resources": resources}

    # OpenAPI v3: just enough for client-go's field-validation check (kubectl / Helm ask whether the server
    # validates fields itself before falling back to client-side schema validation, which needs the full
    # schemas). Each group-version document lists, per resource, the PATCH operation with its
    # ``x-kubernetes-group-version-kind`` and the ``fieldValidation`` query parameter; there are no schemas.

    def _openapi_key(self, group: str, version: str) -> str:
        return f"apis/{group}/{version}" if group else f"api/{version}"

    async def _serve_openapi_root(self, request: kmock.Request) -> Any:
        keys = {self._openapi_key(spec.group, spec.version) for spec in self._specs.values()}
        return {"paths": {key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={len(self._specs)}"} for key in sorted(keys)}}

    async def _serve_openapi_group_version(self, request: kmock.Request) -> Any:
        key = request.url.path.removeprefix("/openapi/v3/")
        specs = [spec for spec in self._specs.values() if self._openapi_key(spec.group, spec.version) == key]
        if not specs:
            raise _no_resource()
        paths: dict[str, Any] = {}
        param = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        for spec in specs:
            prefix = f"/{key}/namespaces/{{namespace}}" if spec.namespaced else f"/{key}"
            gvk = {"group": spec.group, "version": spec.version, "kind": spec.kind}
            paths[f"{prefix}/{spec.plural}/{{name}}"] = {
                "patch": {"operationId": f"patch{spec.kind}", "parameters": [param],
                          "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk},
            }
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": self.server_version.get("gitVersion", "")
                                             if self.server_version else ""}, "paths": paths, "components": {}}

    async def _serve_root(self, request: kmock.Request) -> Any:
        paths = {"/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"}
        for group, versions in self._groups().items():
            paths.add(f"/apis/{group}")
            paths.update(f"/apis/{group}/{v}" for v in versions)
        return {"paths": sorted(paths)}

    # ----------------------------------------------------------------- errors

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, ApiError):
            return aiohttp.web.json_response(_status(exc.status, exc.reason or "", exc.message or "", exc.details),
                                             status=exc.status)
        if isinstance(exc, kmock.KubernetesNotFoundError):
            return await self._render_error(_no_resource())
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response(_status(exc.status, exc.reason or "", exc.message or "", None),
                                             status=exc.status)
        logger.error("emulator error", exc_info=exc)
        return aiohttp.web.json_response(_status(500, "InternalError", f"{type(exc).__name__}: {exc}", None),
                                         status=500)

    async def _stream_error(self, exc: Exception, raw_response: aiohttp.web.StreamResponse) -> None:
        if isinstance(exc, ApiError):
            error = _watch_error(exc.status, exc.reason or "", exc.message or "")
        else:
            logger.error("emulator watch error", exc_info=exc)
            error = _watch_error(500, "InternalError", f"{type(exc).__name__}: {exc}")
        await raw_response.write(json.dumps(error).encode() + b"\n")


_BUILTIN_GROUPS = frozenset(spec.group for spec in BUILTIN_RESOURCES)
_RETURNS_DELETED_OBJECT = frozenset({"Pod", "PersistentVolumeClaim", "PersistentVolume"})


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}


def _record_manager(applied: dict[str, Any], current: Mapping[str, Any] | None, manager: str, api_version: str,
                    operation: str, subresource: str | None) -> None:
    entries = [dict(e) for e in ((current or {}).get("metadata") or {}).get("managedFields") or []
               if not (e.get("manager") == manager and e.get("operation") == operation
                       and e.get("subresource") == subresource)]
    entry: dict[str, Any] = {"manager": manager, "operation": operation, "apiVersion": api_version, "time": _now(),
                             "fieldsType": "FieldsV1", "fieldsV1": {}}
    if subresource:
        entry["subresource"] = subresource
    entries.append(entry)
    applied.setdefault("metadata", {})["managedFields"] = entries


def _watch_error(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"type": "ERROR", "object": _status(code, reason, message, None)}


def _translate(event: Mapping[str, Any], selection: _Selection) -> dict[str, Any] | None:
    """Turn a stored event into what one watcher sees, given its selection (transitions become ADDED/DELETED)."""
    obj = event["object"]
    new_in = selection.matches(obj)
    if event["type"] == "MODIFIED":
        old_in = selection.matches(event.get("old"))
        if new_in and old_in:
            return {"type": "MODIFIED", "object": obj}
        if new_in:
            return {"type": "ADDED", "object": obj}
        if old_in:
            return {"type": "DELETED", "object": obj}
        return None
    return {"type": event["type"], "object": obj} if new_in else None


# --------------------------------------------------------------------------- paths


@dataclass(frozen=True)
class _Path:
    group: str | None
    version: str | None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def _parse_path(path: str) -> _Path | None:
    """Split an apiserver URL path; None for non-resource paths (``/version``, ``/api``, ``/apis``, ``/``)."""
    parts = [p for p in path.strip("/").split("/") if p]  # aiohttp's request.path is already percent-decoded
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 2 and parts[0] == "apis":
        if len(parts) == 2:
            return _Path(parts[1], None)
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return _Path(group, version)
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return _Path(group, version, plural, namespace, name, subresource)


# --------------------------------------------------------------------------- serving


@dataclass(frozen=True)
class ServerCertificates:
    """The TLS material of an HTTPS emulator (all PEM): a throwaway self-signed CA and the server certificate and key
    it signed (see ``generate_certificates``). Only the CA certificate is meant to leave the process (kubeconfig)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = dataclasses.field(repr=False)
    hosts: tuple[str, ...] = ()  # the certificate's subject alternative names, e.g. ("127.0.0.1", "localhost")

    @property
    def ca_data(self) -> str:
        """The CA certificate as a kubeconfig's ``certificate-authority-data``: base64 of the PEM."""
        return base64.b64encode(self.ca_pem).decode("ascii")

    def ssl_context(self) -> ssl.SSLContext:
        """A server-side ``ssl.SSLContext`` (TLS >= 1.2, ALPN ``http/1.1``) presenting the server certificate.

        ``ssl`` loads a certificate chain only from files: the certificate and key are written to a private
        temporary directory (mode 0700, files 0600) that is removed as soon as they are loaded.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])  # aiohttp speaks HTTP/1.1 only; Go clients then skip HTTP/2
        with tempfile.TemporaryDirectory(prefix="kube-emulator-tls-") as tmp:
            paths = []
            for filename, data in (("tls.crt", self.cert_pem), ("tls.key", self.key_pem)):
                path = os.path.join(tmp, filename)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                paths.append(path)
            context.load_cert_chain(*paths)
        return context


def generate_certificates(host: str = "127.0.0.1", *, days: int = 30) -> ServerCertificates:
    """A fresh self-signed CA and a server certificate it signs, for an HTTPS emulator on ``host``.

    Both use ECDSA P-256 keys (quick to generate) and SHA-256 signatures, in memory only. The server certificate's
    subject alternative names are ``IP:127.0.0.1``, ``DNS:localhost`` and ``host`` when it is another loopback IP
    address (``::1``, ``127.0.0.2`` ...); it is valid from five minutes ago for ``days`` days, for server auth only.
    Extensions follow what strict verifiers (Go's crypto/x509, OpenSSL's ``X509_STRICT``) require: CA basic
    constraints and key usage, subject/authority key identifiers.

    Raises:
        ValueError: ``host`` is not a loopback address (see ``serve``).
    """
    if not _is_loopback(host):
        raise ValueError(f"the emulator listens on loopback only, not {host!r}")
    # imported here: plain-HTTP emulators (the demo starts one process per cluster) start without cryptography
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gShare demo"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"kube-emulator-ca@{int(now.timestamp())}")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    addresses = [ipaddress.ip_address("127.0.0.1")]
    if host != "localhost" and ipaddress.ip_address(host) not in addresses:
        addresses.append(ipaddress.ip_address(host))
    alt_names: list[x509.GeneralName] = [x509.DNSName("localhost"), *(x509.IPAddress(a) for a in addresses)]
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gShare demo"),
                                 x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return ServerCertificates(
        ca_pem=ca_cert.public_bytes(pem),
        cert_pem=cert.public_bytes(pem),
        key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        hosts=("localhost", *(str(a) for a in addresses)),
    )


@attrs.mutable
class _LoopbackServer(kmock.Server):
    """kmock's ``Server`` without its in-process aiohttp client and DNS interceptor, optionally over TLS.

    Those exist for tests that call the mock through aiohttp in the same loop; the interceptor patches
    aiohttp's resolver process-wide and must be exited in LIFO order, which breaks with several
    emulators in several threads. Here only the listening server (aiohttp ``RawTestServer``) is started,
    with ``ssl_context`` (then ``url`` is ``https://...``) or without (plain HTTP).
    """

    ssl_context: ssl.SSLContext | None = attrs.field(default=None, kw_only=True)

    async def __aenter__(self) -> _LoopbackServer:
        if self._managed_server is not None:
            raise RuntimeError("The server can be started/entered only once.")
        self._managed_server = self._server_cls(self.handler, host=self._host, port=self._port)
        if self.ssl_context is None:
            await self._managed_server.__aenter__()
        else:  # RawTestServer.__aenter__ cannot pass ``ssl``; start_server then sets the scheme to https
            await self._managed_server.start_server(loop=asyncio.get_running_loop(), ssl=self.ssl_context)
        self.handler.servers.append(self)
        return self

    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.handler.servers.remove(self)
        assert self._managed_server is not None
        await self._managed_server.__aexit__(exc_type, exc_value, traceback)
        self._managed_server = None


@contextlib.asynccontextmanager
async def serve(objects: Iterable[Mapping[str, Any]] = (), *, version: dict[str, str] | None = None,
                token: str | None = None, host: str = "127.0.0.1", port: int = 0,
                hosts: Mapping[str, Mapping[str, Any]] | None = None, tls: bool | ServerCertificates = False,
                **emulator_options: Any) -> AsyncIterator[tuple[KubeApiEmulator, str]]:
    """Serve an emulated apiserver in the running event loop.

    Args:
        objects: seed objects (see ``KubeApiEmulator.load``).
        version: the ``/version`` document (e.g. ``demo/data/k8s-objects/version.kubeadm-v1.32.3-arm64.json``).
        token: bearer token to require, or None.
        host: a loopback address (``127.0.0.1``, ``::1``, ``localhost``); anything else is refused.
        port: TCP port, 0 for a free one.
        hosts: host facts per node name (see ``KubeApiEmulator`` and ``HOST_FACTS``), or None.
        tls: False (default) for plain HTTP; True for HTTPS with freshly generated certificates for ``host``;
            or the ``ServerCertificates`` to present (from ``generate_certificates(host)``; pass them when the
            caller needs the CA, e.g. for a kubeconfig's ``certificate-authority-data``).
        **emulator_options: more ``KubeApiEmulator`` options (``history_limit``, ``keep_requests`` ...).

    Yields:
        ``(emulator, url)`` with ``url`` like ``http://127.0.0.1:41234`` (``https://...`` with TLS; no trailing
        slash).

    Raises:
        ValueError: a non-loopback host, a seed object the emulator cannot serve, or bad host facts.
    """
    if not _is_loopback(host):
        raise ValueError(f"the emulator listens on loopback only, not {host!r}")
    if isinstance(tls, ServerCertificates):
        certificates: ServerCertificates | None = tls
    else:
        certificates = generate_certificates(host) if tls else None
    ssl_context = certificates.ssl_context() if certificates is not None else None
    emulator = KubeApiEmulator(server_version=version, token=token, hosts=validate_hosts(hosts), **emulator_options)
    emulator.load(objects)
    async with emulator, _LoopbackServer(emulator, host=host, port=port, ssl_context=ssl_context) as server:
        url = str(server.url).rstrip("/")
        if emulator._hami_device_plugins():  # a seeded device plugin registers the seeded nodes it can
            emulator.kick_device_plugin()
        if any(emulator._live(emulator._specs[_res("", "v1", plural)])
               for plural in ("persistentvolumeclaims", "persistentvolumes")):
            emulator.kick_volume_controller()  # seeded claims and volumes are bound/provisioned like created ones
        try:
            yield emulator, url
        finally:
            await emulator.close_watches()


class EmulatedCluster:
    """An emulated apiserver running in a background thread with its own event loop.

    Usable from plain threads and pytest (no asyncio needed by the caller)::

        with EmulatedCluster(objects, version=version, token="t") as cluster:
            api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab"))

    With ``tls=True`` it serves HTTPS (``url`` is ``https://127.0.0.1:<port>``) with a CA generated at each
    ``start()``; ``kubeconfig()`` carries that CA, so clients verify the server, and client-go based ones (Helm,
    kubectl) send the bearer token, which they never do over plain HTTP.

    Args:
        objects: seed objects (dicts with ``apiVersion``, ``kind``, ``metadata``; see ``KubeApiEmulator.load``).
        version: the ``/version`` document (``major``, ``minor``, ``gitVersion`` ... as strings), or None for
            kmock's default.
        token: bearer token clients must send, or None to accept anonymous requests.
        host: loopback address to listen on.
        port: TCP port, 0 for a free one (see ``url``).
        pod_startup_seconds: see ``KubeApiEmulator`` (None: Pods stay ``Pending``).
        hosts: host facts per node name (``{"gpu-1": {"nvidia_pci": 1, "nvidia_smi": "GPU 0: ...", ...}}``, keys in
            ``HOST_FACTS``): what gShare's attach check pods find and what HAMi's device plugin registers (see
            ``KubeApiEmulator``); change them while running with ``set_host``.
        tls: serve HTTPS with a throwaway CA and server certificate generated at start (see
            ``generate_certificates``, ``ca_pem``) instead of plain HTTP.

    Raises:
        ValueError: bad host facts.
    """

    def __init__(self, objects: list[dict], version: dict | None = None, token: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, *, pod_startup_seconds: float | None = None,
                 hosts: Mapping[str, Mapping[str, Any]] | None = None, tls: bool = False) -> None:
        self._tls = tls
        self._certificates: ServerCertificates | None = None
        self._pod_startup_seconds = pod_startup_seconds
        self._hosts = validate_hosts(hosts)
        self._objects = [copy.deepcopy(o) for o in objects]
        self._version = version
        self._token = token
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._emulator: KubeApiEmulator | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. ``http://127.0.0.1:41234`` or, with TLS,
        ``https://127.0.0.1:41234`` (no trailing slash)."""
        if self._url is None:
            raise RuntimeError("the emulated cluster is not started")
        return self._url

    @property
    def tls(self) -> bool:
        """Whether the server speaks HTTPS (the ``tls`` argument)."""
        return self._tls

    @property
    def ca_pem(self) -> bytes | None:
        """PEM of the CA that signed the running server's certificate; None without TLS.

        Raises:
            RuntimeError: TLS mode and not started (the CA is generated at each start).
        """
        if not self._tls:
            return None
        if self._certificates is None or self._url is None:
            raise RuntimeError("the emulated cluster is not started")
        return self._certificates.ca_pem

    @property
    def ca_data(self) -> str | None:
        """``ca_pem`` base64-encoded, as a kubeconfig's ``certificate-authority-data``; None without TLS."""
        pem = self.ca_pem
        return None if pem is None else base64.b64encode(pem).decode("ascii")

    @property
    def token(self) -> str | None:
        """The bearer token clients must send (None: no authentication)."""
        return self._token

    @property
    def emulator(self) -> KubeApiEmulator:
        """The underlying kmock emulator; touch it only from its loop (see ``call``)."""
        if self._emulator is None:
            raise RuntimeError("the emulated cluster is not started")
        return self._emulator

    def start(self, timeout: float = 10.0) -> EmulatedCluster:
        """Start serving in a daemon thread; return once the port listens.

        Raises:
            RuntimeError: already started, or the server did not come up within ``timeout`` seconds.
            ValueError: a bad host or seed object (re-raised from the server thread).
        """
        if self._thread is not None:
            raise RuntimeError("the emulated cluster is already started")
        self._certificates = generate_certificates(self._host) if self._tls else None
        self._thread = threading.Thread(target=self._run, name=f"kube-emulator-{self._port or 'auto'}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the emulated cluster did not start within {timeout} s")
        if self._error is not None:
            self._thread.join(timeout)
            self._thread = None
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._ready.set()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with serve(self._objects, version=self._version, token=self._token, host=self._host,
                         port=self._port, pod_startup_seconds=self._pod_startup_seconds,
                         hosts=self._hosts, tls=self._certificates or False) as (emulator, url):
            self._emulator, self._url = emulator, url
            self._ready.set()
            await self._stop.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        self._thread = None
        self._url = None
        self._certificates = None

    def __enter__(self) -> EmulatedCluster:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def call(self, coro_fn: Any, *args: Any, timeout: float = 10.0) -> Any:
        """Run ``coro_fn(*args)`` (a coroutine function) in the server's loop and return its result."""
        if self._loop is None or self._thread is None:
            raise RuntimeError("the emulated cluster is not started")
        return asyncio.run_coroutine_threadsafe(coro_fn(*args), self._loop).result(timeout)

    def kubeconfig(self, name: str) -> dict:
        """A kubeconfig dict for this server.

        Args:
            name: used as the cluster, user and context name; the context is ``current-context``.

        Returns:
            ``{"apiVersion": "v1", "kind": "Config", "current-context": name, "clusters": [...], "users": [...],
            "contexts": [...]}`` with ``server`` = ``url``, with TLS the CA as ``certificate-authority-data``, and
            the user's ``token`` (when one is set).
        """
        user: dict[str, Any] = {"token": self._token} if self._token is not None else {}
        cluster: dict[str, Any] = {"server": self.url}
        if self._tls:
            cluster["certificate-authority-data"] = self.ca_data
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "current-context": name,
            "clusters": [{"name": name, "cluster": cluster}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        }

    def objects_of(self, plural: str, group: str = "", version: str = "v1") -> list[dict]:
        """Current objects of a resource (deep copies, sorted by namespace/name), for assertions.

        Args:
            plural: resource name, e.g. ``nodes``.
            group: API group, ``""`` for core.
            version: API version.
        """
        async def snapshot() -> list[dict]:
            emulator = self.emulator
            spec = emulator._specs.get(_res(group, version, plural))
            if spec is None:
                return []
            async with emulator._lock:
                return copy.deepcopy(emulator._live(spec))

        return self.call(snapshot)

    def requests_seen(self) -> list[dict]:
        """Requests the server has received so far, oldest first (the last 1000 are kept).

        Returns:
            ``[{"method": "GET", "path": "/api/v1/nodes", "query": {"labelSelector": "gpu=on"}}, ...]``;
            ``[]`` before ``start()``.
        """
        if self._thread is None:
            return []

        async def snapshot() -> list[dict]:
            return [{"method": str(r.method.value), "path": r.url.path, "query": dict(r.params)}
                    for r in list(self.emulator)]

        return self.call(snapshot)

    def add(self, obj: dict) -> dict:
        """Create or replace an object from any thread (watchers get ADDED/MODIFIED).

        Before ``start()`` the object is added to the seed. ``status`` is kept as given.

        Returns:
            The stored object with the emulator's metadata (before start: a copy of ``obj``).
        """
        if self._thread is None:
            self._objects.append(copy.deepcopy(obj))
            return copy.deepcopy(obj)
        return self.call(self.emulator.put_object, obj)

    @property
    def hosts(self) -> dict[str, dict[str, Any]]:
        """A copy of the host facts per node name (as given and changed with ``set_host``)."""
        return copy.deepcopy(self._hosts)

    def set_host(self, node: str, facts: Mapping[str, Any] | None) -> None:
        """Replace a node's host facts from any thread (None: forget them; before ``start()``: for the start).

        Check pods created afterwards see the new facts, and HAMi's device plugin stand-in registers the node if
        it now can (see ``KubeApiEmulator.set_host``): e.g. "install" the driver on a node, then re-run the checks.

        Raises:
            ValueError: bad facts (see ``HOST_FACTS``).
        """
        checked = None if facts is None else validate_host_facts(node, facts)
        if checked is None:
            self._hosts.pop(node, None)
        else:
            self._hosts[node] = checked
        if self._thread is not None:
            async def apply() -> None:
                self.emulator.set_host(node, checked)

            self.call(apply)

    def pod_log(self, namespace: str, name: str) -> str | None:
        """The log of a live Pod (``""`` before it has one), or None when there is no such Pod."""
        async def read() -> str | None:
            return self.emulator.pod_log(namespace, name)

        return self.call(read)


# --------------------------------------------------------------------------- CLI


_FROM_SEED: Any = object()  # --pod-startup-seconds not given


def _read_seed(path: pathlib.Path) -> tuple[dict[str, str] | None, list[dict], float | None, dict[str, dict]]:
    """``(version, objects, podStartupSeconds, hosts)`` of a seed file (podStartupSeconds None and hosts ``{}`` when
    the seed has no such key)."""
    seed = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(seed, dict) or not isinstance(seed.get("objects", []), list):
        raise ValueError(f"{path}: a seed is a JSON object {{\"version\": {{...}}, \"objects\": [...]}}")
    startup = seed.get("podStartupSeconds")
    if startup is not None and (isinstance(startup, bool) or not isinstance(startup, int | float) or startup < 0):
        raise ValueError(f"{path}: podStartupSeconds must be a number of seconds >= 0, not {startup!r}")
    try:
        hosts = validate_hosts(seed.get("hosts"))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return seed.get("version"), seed.get("objects", []), startup, hosts


def _startup_seconds(text: str) -> float | None:
    """``--pod-startup-seconds``: seconds >= 0, or ``off`` (Pods stay ``Pending`` whatever the seed says)."""
    if text.lower() in ("off", "none"):
        return None
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 or 'off'")
    return value


async def _serve_until_signalled(args: argparse.Namespace) -> None:
    version, objects, seed_startup, hosts = _read_seed(pathlib.Path(args.seed))
    startup = seed_startup if args.pod_startup_seconds is _FROM_SEED else args.pod_startup_seconds
    token = pathlib.Path(args.token_file).read_text(encoding="utf-8").strip() if args.token_file else None
    certificates = generate_certificates(args.host) if args.tls else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with serve(objects, version=version, token=token, host=args.host, port=args.port,
                     pod_startup_seconds=startup, hosts=hosts, tls=certificates or False) as (_, url):
        if args.ready_file:
            ready = pathlib.Path(args.ready_file)
            tmp = ready.with_name(ready.name + ".tmp")
            info: dict[str, Any] = {"url": url, "pid": os.getpid()}
            if certificates is not None:
                info["ca_data"] = certificates.ca_data
            tmp.write_text(json.dumps(info), encoding="utf-8")
            tmp.replace(ready)
        logger.info("emulated apiserver for %s listening on %s", args.seed, url)
        await stop.wait()
        logger.info("stopping %s", url)


def main(argv: list[str] | None = None) -> int:
    """Command line: serve a seed file until SIGTERM/SIGINT.

    ``python -m demo.emulator --seed PATH --port N [--host 127.0.0.1] [--ready-file PATH] [--token-file PATH]
    [--tls] [--pod-startup-seconds S|off] [--log-level LEVEL]``

    The seed is JSON ``{"version": {...}, "podStartupSeconds": 1.0, "objects": [...], "hosts": {...}}``
    (``demo.fleet.write_seed`` writes one; ``podStartupSeconds`` is optional and enables the scheduler/HAMi/kubelet
    stand-in, see ``KubeApiEmulator``; ``--pod-startup-seconds`` overrides it, ``off`` disables it; ``hosts`` is
    optional: host facts per node name, see ``HOST_FACTS``, for gShare's attach check pods and HAMi's device
    plugin stand-in). Once
    listening, ``{"url": "http://127.0.0.1:N", "pid": <pid>}`` is written to the ready file (atomically); with
    ``--tls`` the server speaks HTTPS with a CA generated at start and the ready file is
    ``{"url": "https://127.0.0.1:N", "pid": <pid>, "ca_data": "<base64 of the CA's PEM>"}`` (a kubeconfig's
    ``certificate-authority-data``). The token file holds the bearer token clients must send (surrounding
    whitespace ignored).

    Returns:
        The process exit code: 0 after a signal, 2 for bad arguments or an unreadable seed.
    """
    parser = argparse.ArgumentParser(prog="python -m demo.emulator", description=main.__doc__.splitlines()[0])
    parser.add_argument("--seed", required=True,
                        help="seed JSON file: {\"version\": {...}, \"objects\": [...], \"hosts\": {...}}")
    parser.add_argument("--port", type=int, required=True, help="TCP port (0: any free port, see --ready-file)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--ready-file", help="write {\"url\", \"pid\"} (and \"ca_data\" with --tls) here once "
                                             "listening")
    parser.add_argument("--token-file", help="file holding the bearer token to require")
    parser.add_argument("--tls", action="store_true",
                        help="serve HTTPS with a CA and server certificate generated at start (the ready file then "
                             "also holds \"ca_data\", the CA for a kubeconfig's certificate-authority-data)")
    parser.add_argument("--pod-startup-seconds", type=_startup_seconds, default=_FROM_SEED, metavar="S|off",
                        help="schedule created Pods (HAMi rules) and run them S seconds after binding; 'off': they "
                             "stay Pending (default: the seed's podStartupSeconds, else off)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve_until_signalled(args))
    except (OSError, ValueError) as exc:
        print(f"demo.emulator: {exc}", file=sys.stderr)
        return 2
    return 0


def iter_resources() -> Iterator[ResourceSpec]:
    """The built-in resources, for documentation and tests."""
    return iter(BUILTIN_RESOURCES)


__all__ = [
    "ApiError", "BUILTIN_RESOURCES", "CHECK_KINDS", "CHECK_KIND_LABEL", "CHECK_POD_LABEL", "CHECK_POD_LABEL_VALUE",
    "CHECK_TARGETS_ENV", "EmulatedCluster", "FIELD_SELECTORS", "FieldRequirement", "GpuAllocation",
    "GpuRequest", "HAMI_BIND_PHASE", "HAMI_BIND_TIME", "HAMI_DEVICES_ALLOCATED", "HAMI_DEVICES_TO_ALLOCATE",
    "HAMI_DEVICE_PLUGIN_COMPONENT", "HAMI_DEVICE_PLUGIN_LABEL", "HAMI_DEVICE_TYPE", "HAMI_NODE_HANDSHAKE",
    "HAMI_NODE_REGISTER", "HAMI_RESOURCE_CORES", "HAMI_RESOURCE_COUNT", "HAMI_RESOURCE_MEMORY",
    "HAMI_RESOURCE_MEMORY_PERCENTAGE", "HAMI_VGPU_NODE", "HAMI_VGPU_TIME", "HOST_FACTS", "KubeApiEmulator",
    "CLAIM_LOST_MESSAGE", "DEFAULT_STORAGE_CLASS_ANNOTATION", "NFS_HELPER_MISSING", "PV_CONTROLLER",
    "external_provisioning_message", "nfs_mount_failure_message", "storage_class_not_found_message",
    "LabelRequirement", "ResourceSpec", "ServerCertificates", "check_pod_kind", "encode_pod_devices",
    "generate_certificates", "go_time_string", "main", "merge_patch", "nfs_check_log", "node_check_log",
    "parse_field_selector", "parse_label_selector", "parse_quantity", "pod_gpu_requests", "serve",
    "validate_host_facts", "validate_hosts",
]

if __name__ == "__main__":
    sys.exit(main())
