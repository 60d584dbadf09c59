"""Stand-in for HAMi's NVIDIA device plugin: registers the nodes a ``hami-device-plugin`` DaemonSet selects.

While a DaemonSet labelled (or whose pod template is labelled) ``app.kubernetes.io/component: hami-device-plugin``
exists, every Node its template's ``nodeSelector`` selects whose host facts have ``hami_register`` gets
``hami.io/node-nvidia-register`` (that value), ``hami.io/node-handshake: Reported <Go time>`` and
``status.capacity``/``allocatable`` ``nvidia.com/gpu`` = the devices' split counts
(``operator_agent.hami.decode_node_register``), ``device_plugin_seconds`` after the DaemonSet appears, a selected
label changes or the host's facts change. Nodes carrying a register annotation the stand-in did not write (a seed's,
e.g. the demo fleet's) are left alone; deleting the DaemonSet leaves the annotations (like the real plugin). The
plugin creates no Pods (the DaemonSet's pods are ``controllers.hami_monitor``'s).
"""

from __future__ import annotations

import copy
import datetime
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from demo.emulator.controllers import Controller, DelayedPass
from demo.emulator.controllers.hami_rules import HAMI_RESOURCE_COUNT
from demo.emulator.store import StoreEvent
from operator_agent.hami import HamiDecodeError, decode_node_register, node_register_annotation

if TYPE_CHECKING:
    from demo.emulator.server import KubeApiEmulator

logger = logging.getLogger(__name__)

HAMI_DEVICE_PLUGIN_LABEL = "app.kubernetes.io/component"
HAMI_DEVICE_PLUGIN_COMPONENT = "hami-device-plugin"
"""Label (key, value) of the DaemonSet of HAMi's NVIDIA device plugin (``charts/hami`` ``daemonsetnvidia.yaml``)."""

HAMI_NODE_REGISTER = "hami.io/node-nvidia-register"
"""Node annotation: the GPUs HAMi's device plugin registered (decoded by ``operator_agent.hami``)."""

HAMI_NODE_HANDSHAKE = "hami.io/node-handshake"
"""Node annotation: ``Reported <Go time.Time.String()>`` from the device plugin (see
``demo/data/hami/node-handshake.observed-values.yaml``)."""


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


def is_hami_device_plugin(daemonset: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet is HAMi's device plugin (the component label on the DaemonSet or its pod template)."""
    if (daemonset.get("metadata") or {}).get("deletionTimestamp"):
        return False
    template = (daemonset.get("spec") or {}).get("template") or {}
    return any((labels or {}).get(HAMI_DEVICE_PLUGIN_LABEL) == HAMI_DEVICE_PLUGIN_COMPONENT
               for labels in ((daemonset.get("metadata") or {}).get("labels"),
                              (template.get("metadata") or {}).get("labels")))


def daemonset_selects(daemonset: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet's pod template ``nodeSelector`` matches a node's labels (affinity is not emulated)."""
    selector = (((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


class HamiDevicePlugin(Controller):
    """The device plugin stand-in of one emulator (see the module docstring)."""

    def __init__(self, api: KubeApiEmulator) -> None:
        super().__init__(api)
        self._pass = DelayedPass(api, self._device_plugin_pass, lambda: api.device_plugin_seconds,
                                 name="emulated-hami-device-plugin", what="HAMi device plugin")
        self._plugin_registered: set[str] = set()  # nodes whose annotation the stand-in wrote
        self._monotonic_origin = time.monotonic_ns()  # the plugin's "process start"

    def on_event(self, event: StoreEvent) -> None:
        """Kick a pass on a HAMi DaemonSet change or a Node added or relabelled; forget a deleted Node."""
        meta = event.object.get("metadata") or {}
        if event.kind == ("", "nodes"):
            if event.type == "DELETED":
                self._plugin_registered.discard(meta.get("name", ""))
            labels_changed = event.type == "ADDED" or (event.type == "MODIFIED" and meta.get("labels") != (
                (event.old or {}).get("metadata") or {}).get("labels"))
            if labels_changed and self.plugins():
                self.kick()
        elif event.kind == ("apps", "daemonsets"):
            if event.type in ("ADDED", "MODIFIED") and is_hami_device_plugin(event.object):
                self.kick()

    def on_host_change(self, node: str) -> None:
        """A host that can now register (driver installed) is registered (a crash-looping plugin pod would start)."""
        if self.plugins():
            self.kick()

    def start(self) -> None:
        """A seeded device plugin registers the seeded nodes it can."""
        if self.plugins():
            self.kick()

    def plugins(self) -> list[dict[str, Any]]:
        """The live DaemonSets that are HAMi's device plugin."""
        return [ds for ds in self.api.live_objects(self.api.served("apps", "v1", "daemonsets")) if is_hami_device_plugin(ds)]

    def kick(self) -> None:
        """Schedule a pass ``device_plugin_seconds`` from now (see ``DelayedPass.kick``); in the emulator's loop."""
        self._pass.kick()

    async def _device_plugin_pass(self) -> None:
        """Register every node a HAMi device-plugin DaemonSet selects whose host has ``hami_register`` (see the
        module docstring); nodes carrying a register annotation the stand-in did not write are left alone."""
        daemonsets = self.plugins()
        if not daemonsets:
            return
        nodes = self.api.served("", "v1", "nodes")
        for node in self.api.live_objects(nodes):
            name = node["metadata"]["name"]
            value = (self.api.hosts.get(name) or {}).get("hami_register")
            if value is None or not any(daemonset_selects(ds, node) for ds in daemonsets):
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
            await self.api.write_object(nodes, updated, node)
