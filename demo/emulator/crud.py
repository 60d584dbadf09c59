"""Writes: create, replace, patch (JSON patch, merge patch, strategic merge patch as a merge patch, server-side apply),
delete with finalizers and cascades, ``dryRun=All``; custom resources pruned, defaulted and validated against their
CRD's schema (``demo.emulator.schema``) before they are stored."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch
import kmock

from demo import k8s_protobuf
from demo.emulator import apply
from demo.emulator.common import Outcome, header_value, timestamp
from demo.emulator.errors import ApiError, not_found, qualified, status_details
from demo.emulator.patches import merge_patch, spec_part, strip_directives
from demo.emulator.rbac import RBAC_GROUP, RBAC_PLURALS
from demo.emulator.resources import BUILTIN_GROUPS, RETURNS_DELETED_OBJECT, ResourceSpec


class CrudMixin:
    """Mutating requests (part of ``KubeApiEmulator``); ``_handle`` runs them under the lock before dispatch."""

    __slots__ = ()

    async def _mutate(self, spec: ResourceSpec, request: kmock.Request) -> Outcome | None:
        dry_run = request.params.get("dryRun") == "All"
        if request.action == kmock.action.CREATE:
            return await self._create(spec, request, self._body(request, spec), dry_run=dry_run)
        if request.action == kmock.action.UPDATE and request.method == kmock.method.PUT:
            return await self._replace(spec, request, dry_run=dry_run)
        if request.action == kmock.action.UPDATE:
            return await self._patch(spec, request, dry_run=dry_run)
        if request.action == kmock.action.DELETE and request.name is not None:
            return await self.delete_object(spec, request.namespace, request.name, dry_run=dry_run)
        if request.action == kmock.action.DELETE:
            selection = self._selection(spec, request)
            deleted = []
            for obj in self.live_objects(spec, request.namespace):
                if selection.matches(obj):
                    meta = obj["metadata"]
                    outcome = await self.delete_object(spec, meta.get("namespace"), meta["name"], dry_run=dry_run)
                    deleted.append(self._list_item(spec, outcome.body if outcome.body.get("kind") != "Status" else obj))
            return Outcome(200, {"kind": f"{spec.kind}List", "apiVersion": spec.api_version,
                                 "metadata": {"resourceVersion": str(self._rv)}, "items": deleted})
        return None

    @staticmethod
    def _body(request: kmock.Request, spec: ResourceSpec) -> dict[str, Any]:
        if header_value(request.headers, "Content-Type").startswith(k8s_protobuf.CONTENT_TYPE):
            try:
                return k8s_protobuf.decode_object(request.body)
            except k8s_protobuf.UnsupportedProtobuf as exc:
                raise ApiError(415, "UnsupportedMediaType", str(exc), None) from None
        if not isinstance(request.data, dict):
            raise ApiError(400, "BadRequest", f"the body of the request was not a {spec.kind} object", None)
        return request.data

    async def _create(self, spec: ResourceSpec, request: kmock.Request, body: dict[str, Any], *,
                      dry_run: bool) -> Outcome:
        namespace = request.namespace
        body_ns = (body.get("metadata") or {}).get("namespace")
        if spec.namespaced and body_ns and body_ns != namespace:
            raise ApiError(400, "BadRequest",
                           "the namespace of the provided object does not match the namespace sent on the request",
                           None)
        self._require_namespace(spec, namespace)
        obj = self.build_object(spec, body, namespace, keep_status=False)
        if spec.schema is not None:
            spec.schema.admit(obj)
        if spec.group == RBAC_GROUP and spec.plural in RBAC_PLURALS:
            self._authorize_rbac_write(request, spec.plural, obj)
        name = obj["metadata"]["name"]
        if self.get_object(spec, namespace, name) is not None:
            raise ApiError(409, "AlreadyExists", f'{qualified(spec)} "{name}" already exists', status_details(spec, name))
        crd_specs = self._crd_specs(obj) if spec.kind == "CustomResourceDefinition" else []
        if dry_run:
            return Outcome(201, obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._store(spec, obj)
        for crd_spec in crd_specs:
            self.register(crd_spec)
        await self._emit(spec, "ADDED", obj, None, created=True)
        return Outcome(201, obj)

    def _require_namespace(self, spec: ResourceSpec, namespace: str | None) -> None:
        if spec.namespaced and namespace is not None:
            ns_spec = self.served("", "v1", "namespaces")
            if self.get_object(ns_spec, None, namespace) is None:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})

    def _precondition(self, spec: ResourceSpec, current: Mapping[str, Any], body: Any) -> None:
        wanted = ((body or {}).get("metadata") or {}).get("resourceVersion") if isinstance(body, Mapping) else None
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            name = current["metadata"]["name"]
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified(spec)} "{name}": the object '
                           "has been modified; please apply your changes to the latest version and try again",
                           status_details(spec, name))

    async def _replace(self, spec: ResourceSpec, request: kmock.Request, *, dry_run: bool) -> Outcome:
        body = self._body(request, spec)
        name = request.name or ""
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL", None)
        body_ns = (body.get("metadata") or {}).get("namespace")
        if spec.namespaced and body_ns and body_ns != request.namespace:
            raise ApiError(400, "BadRequest",
                           "the namespace of the provided object does not match the namespace sent on the request",
                           None)
        current = self.get_object(spec, request.namespace, name)
        if current is None:
            raise not_found(spec, name)
        self._precondition(spec, current, body)
        self._check_rbac_update(spec, request, body)
        return await self._update(spec, current, copy.deepcopy(body), request.subresource, dry_run=dry_run,
                                  manager=_update_manager(request))

    async def _patch(self, spec: ResourceSpec, request: kmock.Request, *, dry_run: bool) -> Outcome:
        content_type = header_value(request.headers, "Content-Type").split(";")[0].strip().lower()
        name = request.name or ""
        current = self.get_object(spec, request.namespace, name)
        patch = request.data
        if content_type == "application/apply-patch+yaml":
            manager = request.params.get("fieldManager")
            if not manager:
                raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                               "is required for apply patch", None)
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "the apply configuration is not a YAML/JSON object", None)
            if not isinstance(patch.get("metadata", {}), dict):
                raise ApiError(400, "BadRequest", "the metadata of the apply configuration is not an object", None)
            if (patch.get("apiVersion"), patch.get("kind")) != (spec.api_version, spec.kind):
                raise ApiError(400, "BadRequest", f"the apply configuration must have apiVersion {spec.api_version!r} "
                               f"and kind {spec.kind!r}", None)
            if (patch.get("metadata") or {}).get("name") not in (None, name):
                raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL", None)
            applied = copy.deepcopy(patch)
            applied.setdefault("metadata", {})["name"] = name
            status_separate = "status" in spec.subresources
            if current is None:
                if request.subresource:
                    raise not_found(spec, name)
                body = apply.applied_on_create(applied, manager, spec.api_version, None, status_separate)
                return await self._create(spec, request, body, dry_run=dry_run)
            self._precondition(spec, current, patch)
            new = apply.apply(current, applied, manager, spec.api_version, request.subresource, status_separate)
            self._check_rbac_update(spec, request, new)
            return await self._update(spec, current, new, request.subresource, dry_run=dry_run)
        if current is None:
            raise not_found(spec, name)
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
                patch = strip_directives(patch)
            new = merge_patch(current, patch)
        else:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted "
                           "media types include: application/json-patch+json, application/merge-patch+json, "
                           "application/apply-patch+yaml", None)
        self._check_rbac_update(spec, request, new)
        return await self._update(spec, current, new, request.subresource, dry_run=dry_run,
                                  manager=_update_manager(request))

    def _check_rbac_update(self, spec: ResourceSpec, request: kmock.Request, new: Any) -> None:
        """Escalation prevention (``AuthMixin._authorize_rbac_write``) on the object an update would store."""
        if spec.group == RBAC_GROUP and spec.plural in RBAC_PLURALS and isinstance(new, dict):
            self._authorize_rbac_write(request, spec.plural, new)

    async def _update(self, spec: ResourceSpec, current: dict[str, Any], new: Any, subresource: str | None, *,
                      dry_run: bool, manager: str | None = None) -> Outcome:
        """Store ``new`` as the next version of ``current`` (or ``current``'s status, for ``subresource`` "status").

        ``manager``: the field manager of a replace or patch (``apply.track_update`` records it); None for applies,
        whose ``new`` carries its managed fields already.
        """
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
        if spec.kind == "Secret" and (result.get("type") or "Opaque") != (current.get("type") or "Opaque"):
            # the apiserver's ValidateSecretUpdate: an Opaque Secret never becomes a ServiceAccount token Secret
            raise ApiError(422, "Invalid", f'Secret "{meta["name"]}" is invalid: type: Invalid value: '
                           f'"{result.get("type") or "Opaque"}": field is immutable', None)
        if spec.schema is not None:
            spec.schema.admit(result)
        if manager is not None:
            apply.track_update(current, result, manager, spec.api_version, subresource, "status" in spec.subresources)
        if result == current:
            return Outcome(200, result)  # a no-op write keeps the revision and sends no event
        if spec_part(result) != spec_part(current):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        crd_specs = self._crd_specs(result) if spec.kind == "CustomResourceDefinition" else []
        if dry_run:
            return Outcome(200, result)
        meta["resourceVersion"] = self._next_rv()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._remove(spec, result)
            return Outcome(200, result)
        self._store(spec, result)
        if spec.kind == "CustomResourceDefinition":
            for old_spec in self._crd_specs(current):
                self.unregister(old_spec.group, old_spec.version, old_spec.plural)
        for crd_spec in crd_specs:
            self.register(crd_spec)
        await self._emit(spec, "MODIFIED", result, current)
        return Outcome(200, result)

    async def delete_object(self, spec: ResourceSpec, namespace: str | None, name: str, *, dry_run: bool) -> Outcome:
        """Delete an object as a DELETE request does: with finalizers, mark it (``deletionTimestamp``); else remove
        it and what depends on it (``_remove``).

        Raises:
            ApiError: ``404 NotFound``.
        """
        current = self.get_object(spec, namespace, name)
        if current is None:
            raise not_found(spec, name)
        meta = current["metadata"]
        if dry_run:
            return Outcome(200, current)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return Outcome(200, current)
            pending = copy.deepcopy(current)
            pending["metadata"]["deletionTimestamp"] = timestamp()
            pending["metadata"]["deletionGracePeriodSeconds"] = 0
            pending["metadata"]["resourceVersion"] = self._next_rv()
            self._store(spec, pending)
            await self._emit(spec, "MODIFIED", pending, current)
            return Outcome(200, pending)
        final = copy.deepcopy(current)
        final["metadata"]["resourceVersion"] = self._next_rv()
        await self._remove(spec, final)
        # The apiserver answers with the deleted object for the kinds whose registry sets ReturnDeletedObject (Pods,
        # PVCs and PVs, which the official client >= 35 decodes as such) and for custom resources; else a Status.
        if spec.kind in RETURNS_DELETED_OBJECT or spec.group not in BUILTIN_GROUPS:
            return Outcome(200, final)
        return Outcome(200, {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": status_details(spec, name, uid=meta.get("uid")),
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
                    for obj in self.live_objects(other, meta["name"]):
                        await self._cascade(other, obj)
        elif spec.kind == "CustomResourceDefinition":
            for crd_spec in self._crd_specs(final):
                for obj in self.live_objects(crd_spec):
                    await self._cascade(crd_spec, obj)
                self.unregister(crd_spec.group, crd_spec.version, crd_spec.plural)
        uid = meta.get("uid")
        for other in list(self._specs.values()):
            for obj in self.live_objects(other):
                owners = obj["metadata"].get("ownerReferences") or []
                if any(owner.get("uid") == uid for owner in owners):
                    await self._cascade(other, obj)

    async def _cascade(self, spec: ResourceSpec, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        if self.get_object(spec, meta.get("namespace"), meta["name"]) is not None:
            await self.delete_object(spec, meta.get("namespace"), meta["name"], dry_run=False)


def _update_manager(request: kmock.Request) -> str:
    """The field manager of a replace or patch: ``fieldManager``, else the client's User-Agent product."""
    return request.params.get("fieldManager") or apply.default_manager(header_value(request.headers, "User-Agent"))
