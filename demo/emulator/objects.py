"""Object normalisation: what the apiserver (and its admission plugins) make of a created, applied or seeded body."""

from __future__ import annotations

import copy
import ipaddress
import secrets
import string
import uuid
from collections.abc import Mapping
from typing import Any

from contract.quantity import same_quantity
from demo.emulator.common import timestamp
from demo.emulator.errors import ApiError
from demo.emulator.resources import BUILTIN_GROUPS, ResourceSpec
from demo.emulator.schema import version_schema

DEFAULT_STORAGE_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
"""StorageClass annotation ("true") naming the class the DefaultStorageClass admission plugin gives PVCs naming none."""


class ObjectsMixin:
    """Create-time defaults and CRD handling (part of ``KubeApiEmulator``)."""

    __slots__ = ()

    def build_object(self, spec: ResourceSpec, body: Mapping[str, Any], namespace: str | None, *,
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
            meta.setdefault("creationTimestamp", timestamp())
            meta.setdefault("generation", 1)
        else:  # an API create: the server decides these, whatever the client sent
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = timestamp()
            meta["generation"] = 1
            meta.pop("deletionTimestamp", None)
            meta.pop("deletionGracePeriodSeconds", None)
            if spec.kind == "Pod":
                obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj.get("spec") or {})}
            elif spec.kind in ("PersistentVolumeClaim", "PersistentVolume"):
                self._volume_defaults(spec.kind, obj)
            elif spec.group not in BUILTIN_GROUPS and "status" in spec.subresources:
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
            default = next((sc["metadata"]["name"] for sc in self.live_objects(self.served("storage.k8s.io", "v1",
                                                                                           "storageclasses"))
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
        now = timestamp()
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
                schema=version_schema(version, names["kind"], spec["group"]),
            ))
        return specs


def qos_class(pod_spec: Mapping[str, Any]) -> str:
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
            if name not in limits or not same_quantity(requests[name], limits[name]):
                guaranteed = False
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"
