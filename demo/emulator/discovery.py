"""Discovery: ``/version``, ``/api``, ``/apis``, group and group-version documents, the root path list, and the
sliver of OpenAPI v3 client-go reads to decide about field validation."""

from __future__ import annotations

import collections
from typing import Any

import kmock

from demo.emulator.errors import no_resource
from demo.emulator.resources import GROUP_ORDER, version_key


class DiscoveryMixin:
    """Discovery documents (part of ``KubeApiEmulator``), from the served resources."""

    __slots__ = ()

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
        order = {g: i for i, g in enumerate(GROUP_ORDER)}
        return {g: sorted(groups[g], key=version_key)
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
            raise no_resource()
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_doc(group or "", versions)}

    async def _serve_version(self, request: kmock.Request) -> Any:
        group = request.resource.group if request.resource is not None else None
        version = request.resource.version if request.resource is not None else None
        specs = sorted((s for s in self._specs.values() if s.group == group and s.version == version),
                       key=lambda s: s.plural)
        if not specs:
            raise no_resource()
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
            raise no_resource()
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
