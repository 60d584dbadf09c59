"""The object store: served resources, objects with their versions, resource versions and the events they send.

Objects live in kmock's store (``self.objects``, a ``kmock.ObjectsArray`` keyed by ``(kmock.resource, namespace,
name)``, each value keeping its history of versions); watch events travel on kmock's per-resource buses and are kept
in an event log for ``resourceVersion`` replays. Every event is then handed to the listeners (``subscribe``): the
stand-in controllers are fed this way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kmock

from demo.emulator.common import WatchClosed
from demo.emulator.errors import ApiError, no_resource
from demo.emulator.resources import ResourceSpec, resource_key


@dataclass(frozen=True)
class StoreEvent:
    """What a listener of the store hears (``StoreMixin.subscribe``).

    Attributes:
        spec: the object's resource.
        type: ``ADDED``, ``MODIFIED`` or ``DELETED``.
        object: the object as stored (for ``DELETED``, its last version); do not modify it.
        old: the previous version for ``MODIFIED`` (None otherwise).
        created: ``ADDED`` by an API create request (not by a seed, ``put_object`` or a controller).
    """

    spec: ResourceSpec
    type: str
    object: dict[str, Any]
    old: dict[str, Any] | None
    created: bool = False

    @property
    def kind(self) -> tuple[str, str]:
        """``(group, plural)`` of the object's resource, e.g. ``("", "pods")``."""
        return (self.spec.group, self.spec.plural)


class StoreMixin:
    """Resources served, object storage and events (part of ``KubeApiEmulator``)."""

    __slots__ = ()

    # ----------------------------------------------------------------- resources

    def register(self, spec: ResourceSpec) -> None:
        """Serve a resource (listed in discovery, accepted in URLs and seeds)."""
        key = resource_key(spec.group, spec.version, spec.plural)
        self._specs[key] = spec
        self.resources[key] = kmock.ResourceInfo(
            namespaced=spec.namespaced, kind=spec.kind, singular=spec.kind.lower(), verbs=set(spec.verbs),
            shortnames=set(spec.short_names), categories=set(spec.categories), subresources=set(spec.subresources),
        )

    def unregister(self, group: str, version: str, plural: str) -> None:
        """Stop serving a resource (its objects are deleted by the caller)."""
        key = resource_key(group, version, plural)
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

    def served(self, group: str, version: str, plural: str) -> ResourceSpec:
        """The served resource ``group/version/plural`` (``served("", "v1", "pods")``).

        Raises:
            KeyError: not served (a custom resource whose CRD is gone).
        """
        return self._specs[resource_key(group, version, plural)]

    def _spec(self, resource: kmock.resource | None) -> ResourceSpec:
        spec = self._specs.get(resource) if resource is not None else None
        if spec is None:
            raise no_resource()
        return spec

    def _get_resources(self) -> list[kmock.resource]:
        return list(self._specs)

    # ----------------------------------------------------------------- store primitives

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _key(self, spec: ResourceSpec, namespace: str | None, name: str) -> tuple[kmock.resource, str | None, str]:
        return (resource_key(spec.group, spec.version, spec.plural), namespace if spec.namespaced else None, name)

    def get_object(self, spec: ResourceSpec, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The live object (as stored: do not modify it), or None (never created, or deleted)."""
        key = self._key(spec, namespace, name)
        if key not in self.objects:
            return None
        obj = self.objects[key]
        return None if obj.deleted else obj.raw

    def live_objects(self, spec: ResourceSpec, namespace: str | None = None) -> list[dict[str, Any]]:
        """The live objects of a resource (in ``namespace``, or all), sorted by namespace and name, as stored."""
        wanted = resource_key(spec.group, spec.version, spec.plural)
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

    def subscribe(self, listener: Callable[[StoreEvent], None]) -> None:
        """Call ``listener`` with every store event, after the watchers got it (in the emulator's loop, under its
        lock: a listener must not block; it starts a task for anything that takes time, see ``spawn``)."""
        self._listeners.append(listener)

    async def _emit(self, spec: ResourceSpec, event_type: str, obj: dict[str, Any], old: dict[str, Any] | None, *,
                    created: bool = False) -> None:
        """Record an event for watch replays, hand it to the watchers, then to the listeners (``subscribe``).

        ``created``: the object was created by an API request (not seeded, nor written by a controller).
        """
        rv = int(obj["metadata"]["resourceVersion"])
        event = {"rv": rv, "type": event_type, "object": obj, "old": old}
        resource = resource_key(spec.group, spec.version, spec.plural)
        self._events.append((resource, event))
        while len(self._events) > self.event_log_size:
            _, dropped = self._events.popleft()
            self._compacted_rv = dropped["rv"]
        await self._buses[resource].put(event)
        notice = StoreEvent(spec, event_type, obj, old, created)
        for listener in self._listeners:
            listener(notice)

    async def add_object(self, spec: ResourceSpec, obj: dict[str, Any]) -> None:
        """Store an object a controller made (from ``build_object``) and send ``ADDED``."""
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._store(spec, obj)
        await self._emit(spec, "ADDED", obj, None)

    async def write_object(self, spec: ResourceSpec, new: dict[str, Any], old: dict[str, Any]) -> None:
        """Store a controller's new version of an object and send ``MODIFIED``."""
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._store(spec, new)
        await self._emit(spec, "MODIFIED", new, old)

    async def close_watches(self) -> None:
        """End every open watch stream and pending Pod start-up (called before the server stops)."""
        for task in list(self._tasks):
            task.cancel()
        for bus in list(self._buses.values()):
            await bus.put(WatchClosed())

    # ----------------------------------------------------------------- loading

    def load(self, objects: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Store objects directly (no API semantics, no events): for seeds, before serving.

        Each object needs ``apiVersion``, ``kind`` and ``metadata.name`` (and ``metadata.namespace`` when
        namespaced); ``status`` is kept; ``uid``/``creationTimestamp`` are kept when given; the
        ``resourceVersion`` is always assigned by the emulator; custom resources are pruned, defaulted and validated
        as created ones (``demo.emulator.schema``). CRDs register their resources, so custom
        objects may follow their CRD in the same list.

        Returns:
            The stored objects.

        Raises:
            ValueError: an object has no served resource or no name, or its CRD's schema refuses it.
        """
        return [self._load_one(obj)[0] for obj in objects]

    def _load_one(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, ResourceSpec]:
        spec = self.spec_for(str(body.get("apiVersion", "")), str(body.get("kind", "")))
        meta = body.get("metadata") or {}
        if not meta.get("name"):
            raise ValueError(f"{spec.kind} without metadata.name: {body!r:.200}")
        if spec.namespaced and not meta.get("namespace"):
            raise ValueError(f"{spec.kind} {meta['name']!r} is namespaced but has no metadata.namespace")
        old = self.get_object(spec, meta.get("namespace"), meta["name"])
        obj = self.build_object(spec, body, meta.get("namespace"), keep_status=True)
        if spec.schema is not None:
            try:
                spec.schema.admit(obj)
            except ApiError as exc:
                raise ValueError(f"seed object refused: {exc.message}") from None
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
