"""Reads: get, list (selectors, ``limit``/``continue``) and watch (replays from the event log, ``410 Expired``,
selector transitions), and rendering the outcome of a write."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import kmock

from demo.emulator.common import WatchClosed
from demo.emulator.errors import ApiError, not_found, watch_error
from demo.emulator.resources import BUILTIN_GROUPS, FIELD_SELECTORS, ResourceSpec, resource_key
from demo.emulator.selectors import Selection, parse_field_selector, parse_label_selector


class ReadsMixin:
    """Read requests (part of ``KubeApiEmulator``)."""

    __slots__ = ()

    def _selection(self, spec: ResourceSpec, request: kmock.Request) -> Selection:
        allowed = ("metadata.name", "metadata.namespace") + FIELD_SELECTORS.get((spec.group, spec.plural), ())
        return Selection(
            namespace=request.namespace,
            name=request.name,
            labels=tuple(parse_label_selector(request.params.get("labelSelector", ""))),
            fields=tuple(parse_field_selector(request.params.get("fieldSelector", ""), allowed)),
        )

    @staticmethod
    def _list_item(spec: ResourceSpec, obj: Mapping[str, Any]) -> dict[str, Any]:
        if spec.group in BUILTIN_GROUPS:
            return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        return dict(obj)

    async def _serve_list(self, request: kmock.Request) -> Any:
        spec = self._spec(request.resource)
        selection = self._selection(spec, request)
        async with self._lock:
            items = [obj for obj in self.live_objects(spec, request.namespace) if selection.matches(obj)]
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
        obj = self.get_object(spec, request.namespace, request.name or "")
        if obj is None:
            raise not_found(spec, request.name or "")
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
        resource = resource_key(spec.group, spec.version, spec.plural)
        bus = self._buses[resource]
        yield b""  # send the headers now, as kmock does, so clients see the stream open
        async with self._lock:
            marker = await bus.mark()
            if since in ("", "0"):
                backlog = [{"type": "ADDED", "object": obj} for obj in self.live_objects(spec, request.namespace)
                           if selection.matches(obj)]
            elif not since.isdigit():
                backlog = [watch_error(400, "BadRequest", f"invalid resource version: {since!r}")]
            elif int(since) < self._compacted_rv:
                backlog = [watch_error(410, "Expired", f"too old resource version: {since} ({self._compacted_rv})")]
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
        except (TimeoutError, WatchClosed):
            return
        finally:
            with contextlib.suppress(ValueError, RuntimeError):
                await bus.unmark(marker)

def _translate(event: Mapping[str, Any], selection: Selection) -> dict[str, Any] | None:
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
