"""Events as the cluster's components record them (``core/v1`` Events, kubectl describe's source)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from demo.emulator.common import timestamp
from demo.emulator.store import StoreEvent


class EventRecorderMixin:
    """Recording Events for the stand-in controllers (part of ``KubeApiEmulator``)."""

    __slots__ = ()

    async def record_event(self, involved: Mapping[str, Any], *, reason: str, message: str, event_type: str,
                           component: str, host: str | None = None) -> dict[str, Any]:
        """Store a ``core/v1`` Event about ``involved`` as a component's event recorder writes it (name
        ``<object>.<unix nanoseconds in hex>``, ``source``/``reporting*``, ``count: 1``); watchers get ``ADDED``."""
        events = self.served("", "v1", "events")
        meta = involved["metadata"]
        now = timestamp()
        namespace = meta.get("namespace") or "default"  # events about cluster-scoped objects go to "default"
        source: dict[str, Any] = {"component": component}
        if host:
            source["host"] = host
        event = self.build_object(events, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": {"kind": involved.get("kind"), "namespace": meta.get("namespace"), "name": meta["name"],
                               "uid": meta.get("uid"), "apiVersion": involved.get("apiVersion"),
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message, "source": source, "firstTimestamp": now, "lastTimestamp": now,
            "count": 1, "type": event_type, "eventTime": None, "reportingComponent": component,
            "reportingInstance": host or "",
        }, namespace, keep_status=True)
        await self.add_object(events, event)
        return event

    async def record_event_once(self, involved: Mapping[str, Any], *, reason: str, message: str, event_type: str,
                                component: str, host: str | None = None) -> None:
        """``record_event`` unless this object already got this reason and message (a pass repeats its checks)."""
        key = (involved["metadata"].get("uid") or "", reason, message)
        if key in self._events_sent:
            return
        self._events_sent.add(key)
        await self.record_event(involved, reason=reason, message=message, event_type=event_type,
                                component=component, host=host)

    def _forget_recorded_events(self, event: StoreEvent) -> None:
        """A deleted Pod or PVC may get the same Event again should one of that uid ever come back (store listener)."""
        if event.type == "DELETED" and event.kind in (("", "pods"), ("", "persistentvolumeclaims")):
            uid = (event.object.get("metadata") or {}).get("uid", "")
            self._events_sent = {key for key in self._events_sent if key[0] != uid}
