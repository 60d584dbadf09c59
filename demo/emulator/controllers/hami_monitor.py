"""Stand-ins for the DaemonSet controller running HAMi's device-plugin pods and for their ``vGPUmonitor`` container.

The pods: while a HAMi device-plugin DaemonSet exists (``device_plugin.is_hami_device_plugin``: the component label on
the DaemonSet or its pod template), every Node its template's ``nodeSelector`` selects that has HAMi-registered GPUs
(``hami.io/node-nvidia-register``) runs one Pod of it, as kube-controller-manager's DaemonSet controller would create
it: in the DaemonSet's namespace, named ``<daemonset>-<5 lowercase alphanumerics>``, labels = the template's plus
``controller-revision-hash`` and ``pod-template-generation``, a controller ``ownerReference`` to the DaemonSet, the
template's spec with ``spec.nodeName`` (and the node affinity the controller pins it with), ``Running`` at once with
the kubelet stand-in's status (``hostNetwork`` pods: pod IP = the node's InternalIP). ``device_plugin_seconds`` after
a DaemonSet, Node or owned Pod change the pods are put right: missing ones created, ones on nodes no longer selected
or registered (or gone) deleted, a deleted one re-created; deleting the DaemonSet deletes them (owner cascade).

The monitor: a Running pod with a container named ``vgpu-monitor`` answers on port ``HAMI_MONITOR_PORT`` (9394,
HAMi's ``--metrics-bind-address`` default) at ``/metrics`` with ``hami_metrics.render_metrics`` in the emulator's
``hami_monitor_scheme``: one reading per (container, GPU) of every Running pod bound to its node whose
``hami.io/vgpu-devices-allocated`` annotation gives that container GPUs (segments: init containers first, as HAMi
writes them; like HAMi's monitor only regular containers are read), with the limit = the allocation's MiB x 2**20,
plus one host reading per GPU of the node's register annotation (memory used = its containers' sum, utilization =
their sum capped at 100). HAMi's monitor lists the pods labelled ``hami.io/vgpu-node=<node>``; the stand-in takes the
pods bound to the node, as the scheduler stand-in does not write that label.

What a container does is set per pod (``set_activity``; default idle):

* ``idle`` -- since the pod became ``Running`` or since idle was last set: last kernel = whole seconds since then,
  utilization 0, memory used = ``IDLE_MEMORY_BYTES`` (a CUDA context) capped at a quarter of the limit;
* ``busy`` -- last kernel 0 s, utilization 60-99 % and memory used 50-94 % of the limit, fixed per (pod, container,
  GPU) by a hash so tests can predict them (``reading``).

A node's monitor can be made to fail (``set_monitor``): ``down`` (the container is not listening: the apiserver's 503
``connection refused``) or ``hang`` (accepts and never answers: the request waits ``hami_monitor_hang_seconds``, then
gets the 503 of a dial time-out; setting the node ``ok`` again answers waiting requests at once).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contract import HAMI_MONITOR_PORT_DEFAULT
from demo.emulator.controllers import Controller, DelayedPass
from demo.emulator.controllers.device_plugin import daemonset_selects, is_hami_device_plugin
from demo.emulator.controllers.hami_metrics import CONTENT_TYPE, ContainerGpu, HostGpu, render_metrics
from demo.emulator.controllers.hami_rules import HAMI_DEVICES_ALLOCATED
from demo.emulator.store import StoreEvent
from operator_agent.hami import HamiDecodeError, decode_node_register, node_register_annotation
from operator_agent.hami_pods import decode_pod_devices

if TYPE_CHECKING:
    from demo.emulator.server import KubeApiEmulator

logger = logging.getLogger(__name__)

HAMI_MONITOR_CONTAINER = "vgpu-monitor"
"""Name of the monitor's container in HAMi's device-plugin pod (``daemonsetnvidia.yaml``)."""
HAMI_MONITOR_PORT = HAMI_MONITOR_PORT_DEFAULT
STATE_BUSY, STATE_IDLE = "busy", "idle"
GPU_ACTIVITY_STATES = (STATE_BUSY, STATE_IDLE)
MONITOR_OK, MONITOR_DOWN, MONITOR_HANG = "ok", "down", "hang"
MONITOR_MODES = (MONITOR_OK, MONITOR_DOWN, MONITOR_HANG)
IDLE_MEMORY_BYTES = 331_350_016
"""Memory an idle container holds: the CUDA context size in ``metrics.legacy.volcano-vgpu-device-plugin-readme.txt``."""
MIB = 1024 * 1024
_NOT_FOUND_BODY = b"404 page not found\n"  # Go's http.NotFound, what HAMi's ServeMux answers off /metrics


@dataclass(frozen=True)
class MonitorAnswer:
    """What the pod behind a proxy request answers.

    Attributes:
        status, content_type, body: its HTTP answer (when reached).
        unreachable: None when reached, else the transport error the apiserver reports as ``503 error trying to reach
            service: <unreachable>``.
        hang: the monitor accepted and does not answer (wait with ``HamiMonitor.hang``, then ask again).
    """

    status: int = 200
    content_type: str = ""
    body: bytes = b""
    unreachable: str | None = None
    hang: bool = False


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> float | None:
    try:
        return datetime.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None


def _owner_uid(pod: Mapping[str, Any]) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "DaemonSet" and ref.get("controller"):
            return ref.get("uid")
    return None


def is_monitor_pod(pod: Mapping[str, Any]) -> bool:
    """Whether a Pod runs HAMi's monitor (a container named ``vgpu-monitor``)."""
    return any(c.get("name") == HAMI_MONITOR_CONTAINER for c in (pod.get("spec") or {}).get("containers") or [])


def reading(namespace: str, pod: str, container: str, vdevice_index: int, device: Mapping[str, Any], state: str,
            idle_seconds: float) -> ContainerGpu:
    """The monitor's reading of one container on one GPU.

    Args:
        namespace, pod, container, vdevice_index: whose reading.
        device: the GPU's entry of the allocation (``decode_pod_devices``: ``uuid``, ``memory_mib``).
        state: ``busy`` or ``idle``.
        idle_seconds: seconds since the idle clock started (ignored when busy).
    """
    limit = int(device["memory_mib"]) * MIB
    digest = int(hashlib.sha256(f"{namespace}/{pod}/{container}/{device['uuid']}".encode()).hexdigest(), 16)
    if state == STATE_BUSY:
        utilization, used, last_kernel = 60 + digest % 40, limit * (50 + (digest >> 16) % 45) // 100, 0
    else:
        utilization, used, last_kernel = 0, min(IDLE_MEMORY_BYTES, limit // 4), max(0, int(idle_seconds))
    context = min(used, IDLE_MEMORY_BYTES)
    return ContainerGpu(namespace=namespace, pod=pod, container=container, vdevice_index=vdevice_index,
                        device_uuid=str(device["uuid"]), memory_used=used, memory_limit=limit, memory_context=context,
                        memory_module=0, memory_buffer=used - context, utilization=utilization,
                        last_kernel_seconds=last_kernel)


class HamiMonitor(Controller):
    """The device-plugin pods and the monitor of one emulator (see the module docstring)."""

    def __init__(self, api: KubeApiEmulator) -> None:
        super().__init__(api)
        self._pass = DelayedPass(api, self._daemonset_pass, lambda: api.device_plugin_seconds,
                                 name="emulated-daemonset-controller", what="DaemonSet controller")
        self._running_since: dict[str, float] = {}  # pod uid -> when it became Running (Unix seconds)
        self._activity: dict[str, tuple[str, float]] = {}  # pod uid -> (state, since)
        self._modes: dict[str, str] = {}  # node -> monitor mode other than ok
        self._hangs: dict[str, set[asyncio.Task]] = {}  # node -> requests waiting on a hung monitor

    # ----------------------------------------------------------------- store events

    def on_event(self, event: StoreEvent) -> None:
        """Note when pods start running; kick a pass on a DaemonSet, Node or owned Pod change."""
        obj, meta = event.object, event.object.get("metadata") or {}
        old_meta = (event.old or {}).get("metadata") or {}
        if event.kind == ("", "pods"):
            uid = meta.get("uid", "")
            if event.type == "DELETED":
                self._running_since.pop(uid, None)
                self._activity.pop(uid, None)
                if _owner_uid(obj) is not None:
                    self.kick()
            elif (obj.get("status") or {}).get("phase") == "Running" and uid not in self._running_since:
                self._running_since[uid] = time.time()
        elif event.kind == ("", "nodes"):
            changed = event.type != "MODIFIED" or meta.get("labels") != old_meta.get("labels") or (
                node_register_annotation(meta.get("annotations")) != node_register_annotation(old_meta.get("annotations")))
            if changed:
                self.kick()
        elif event.kind == ("apps", "daemonsets"):
            if is_hami_device_plugin(obj) or (event.old is not None and is_hami_device_plugin(event.old)):
                self.kick()

    def start(self) -> None:
        """Seeded Running pods count as running since their ``startTime``; seeded DaemonSets get their pods."""
        now = time.time()
        for pod in self.api.live_objects(self.api.served("", "v1", "pods")):
            if (pod.get("status") or {}).get("phase") == "Running":
                started = _parse_time((pod.get("status") or {}).get("startTime"))
                self._running_since.setdefault(pod["metadata"]["uid"], min(now, started or now))
        self.kick()

    def kick(self) -> None:
        """Schedule a pass of the DaemonSet controller stand-in (see ``DelayedPass.kick``); in the emulator's loop."""
        self._pass.kick()

    # ----------------------------------------------------------------- the DaemonSet controller

    async def _daemonset_pass(self) -> None:
        pods = self.api.served("", "v1", "pods")
        daemonsets = [ds for ds in self.api.live_objects(self.api.served("apps", "v1", "daemonsets"))
                      if is_hami_device_plugin(ds)]
        nodes = {n["metadata"]["name"]: n for n in self.api.live_objects(self.api.served("", "v1", "nodes"))
                 if not n["metadata"].get("deletionTimestamp")}
        by_uid = {ds["metadata"]["uid"]: ds for ds in daemonsets}
        wanted = {(ds["metadata"]["uid"], name) for ds in daemonsets for name, node in nodes.items()
                  if daemonset_selects(ds, node) and node_register_annotation(node["metadata"].get("annotations"))}
        have: set[tuple[str, str]] = set()
        for pod in self.api.live_objects(pods):
            owner = _owner_uid(pod)
            if owner not in by_uid or pod["metadata"].get("deletionTimestamp"):
                continue
            key = (owner, (pod.get("spec") or {}).get("nodeName") or "")
            if key in wanted and key not in have:
                have.add(key)
            else:
                await self.api.delete_object(pods, pod["metadata"]["namespace"], pod["metadata"]["name"], dry_run=False)
        for uid, node_name in sorted(wanted - have):
            await self._create_pod(by_uid[uid], nodes[node_name])

    async def _create_pod(self, daemonset: Mapping[str, Any], node: Mapping[str, Any]) -> None:
        """One pod of ``daemonset`` on ``node``, running (see the module docstring)."""
        pods = self.api.served("", "v1", "pods")
        meta = daemonset["metadata"]
        template = copy.deepcopy((daemonset.get("spec") or {}).get("template") or {})
        template_meta = template.get("metadata") or {}
        revision = hashlib.sha256(repr(template).encode()).hexdigest()[:10]
        spec = template.get("spec") or {}
        node_name = node["metadata"]["name"]
        spec["nodeName"] = node_name
        spec["affinity"] = {**(spec.get("affinity") or {}), "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}}
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "generateName": f"{meta['name']}-",
                "labels": {**(template_meta.get("labels") or {}), "controller-revision-hash": revision,
                           "pod-template-generation": str(meta.get("generation") or 1)},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": spec,
        }
        if template_meta.get("annotations"):
            body["metadata"]["annotations"] = dict(template_meta["annotations"])
        while True:
            pod = self.api.build_object(pods, body, meta["namespace"], keep_status=False)
            if self.api.get_object(pods, meta["namespace"], pod["metadata"]["name"]) is None:
                break
        pod = self.api.kubelet.running(pod, node)
        if spec.get("hostNetwork"):
            pod["status"]["podIP"] = pod["status"]["hostIP"]
            pod["status"]["podIPs"] = [{"ip": pod["status"]["hostIP"]}]
        self._running_since[pod["metadata"]["uid"]] = time.time()
        await self.api.add_object(pods, pod)

    # ----------------------------------------------------------------- busy / idle

    def _pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self.api.get_object(self.api.served("", "v1", "pods"), namespace, name)
        if pod is None:
            raise KeyError(f'pods "{name}" not found')
        return pod

    def _state(self, pod: Mapping[str, Any], now: float) -> tuple[str, float]:
        uid = pod["metadata"]["uid"]
        if uid in self._activity:
            return self._activity[uid]
        return STATE_IDLE, min(now, self._running_since.get(uid, now))

    def set_activity(self, namespace: str, name: str, state: str) -> dict[str, Any]:
        """Make every container of a pod ``busy`` or ``idle`` (idle: the idle clock starts now).

        Returns:
            ``describe_activity``'s answer.

        Raises:
            KeyError: no such pod. ValueError: an unknown state.
        """
        if state not in GPU_ACTIVITY_STATES:
            raise ValueError(f"state must be one of {', '.join(GPU_ACTIVITY_STATES)}, not {state!r}")
        pod = self._pod(namespace, name)
        self._activity[pod["metadata"]["uid"]] = (state, time.time())
        return self.describe_activity(namespace, name)

    def describe_activity(self, namespace: str, name: str) -> dict[str, Any]:
        """A pod's activity and what the monitor reads of it now.

        Returns:
            ``{"namespace", "name", "uid", "node", "state": "busy"|"idle", "since": RFC 3339 UTC (when the state began),
            "gpus": [{"container", "vdevice_index", "device_uuid", "last_kernel_seconds", "utilization_percent",
            "memory_used_bytes", "memory_limit_bytes"}]}`` (``gpus`` empty while the pod is not Running or holds no HAMi
            GPUs).

        Raises:
            KeyError: no such pod.
        """
        pod = self._pod(namespace, name)
        now = time.time()
        state, since = self._state(pod, now)
        return {
            "namespace": namespace, "name": name, "uid": pod["metadata"]["uid"],
            "node": (pod.get("spec") or {}).get("nodeName") or None, "state": state, "since": _utc(since),
            "gpus": [{"container": r.container, "vdevice_index": r.vdevice_index, "device_uuid": r.device_uuid,
                      "last_kernel_seconds": r.last_kernel_seconds, "utilization_percent": r.utilization,
                      "memory_used_bytes": r.memory_used, "memory_limit_bytes": r.memory_limit}
                     for r in self._pod_readings(pod, now)],
        }

    def _pod_readings(self, pod: Mapping[str, Any], now: float) -> list[ContainerGpu]:
        meta = pod["metadata"]
        value = (meta.get("annotations") or {}).get(HAMI_DEVICES_ALLOCATED)
        if not value or (pod.get("status") or {}).get("phase") != "Running" or meta.get("deletionTimestamp"):
            return []
        try:
            segments = decode_pod_devices(value)
        except HamiDecodeError as exc:
            logger.warning("pod %s/%s: %s does not decode, not monitored: %s", meta.get("namespace"), meta["name"],
                           HAMI_DEVICES_ALLOCATED, exc)
            return []
        spec = pod.get("spec") or {}
        first = len(spec.get("initContainers") or [])
        state, since = self._state(pod, now)
        found = []
        for position, container in enumerate(spec.get("containers") or []):
            devices = segments[first + position] if first + position < len(segments) else []
            found += [reading(meta["namespace"], meta["name"], container.get("name", ""), index, device, state,
                              now - since) for index, device in enumerate(devices)]
        return found

    # ----------------------------------------------------------------- the monitor

    def set_monitor(self, node: str, mode: str) -> dict[str, Any]:
        """Make a node's monitor answer (``ok``), refuse connections (``down``) or hang (``hang``).

        Returns:
            ``describe_monitor``'s answer.

        Raises:
            KeyError: no such node. ValueError: an unknown mode.
        """
        if mode not in MONITOR_MODES:
            raise ValueError(f"monitor must be one of {', '.join(MONITOR_MODES)}, not {mode!r}")
        if self.api.get_object(self.api.served("", "v1", "nodes"), None, node) is None:
            raise KeyError(f'nodes "{node}" not found')
        if mode == MONITOR_OK:
            self._modes.pop(node, None)
        else:
            self._modes[node] = mode
        if mode != MONITOR_HANG:
            for task in self._hangs.pop(node, set()):
                task.cancel()
        return self.describe_monitor(node)

    def describe_monitor(self, node: str) -> dict[str, Any]:
        """``{"node", "monitor": "ok"|"down"|"hang", "pods": [{"namespace", "name"}]}`` (the node's monitor pods).

        Raises:
            KeyError: no such node.
        """
        if self.api.get_object(self.api.served("", "v1", "nodes"), None, node) is None:
            raise KeyError(f'nodes "{node}" not found')
        pods = [p for p in self.api.live_objects(self.api.served("", "v1", "pods"))
                if is_monitor_pod(p) and (p.get("spec") or {}).get("nodeName") == node]
        return {"node": node, "monitor": self._modes.get(node, MONITOR_OK),
                "pods": [{"namespace": p["metadata"]["namespace"], "name": p["metadata"]["name"]} for p in pods]}

    def answer(self, pod: Mapping[str, Any], address: str, port: str, scheme: str, path: str) -> MonitorAnswer:
        """What ``address:port`` of ``pod`` answers to a proxied request for ``path`` (call it under the lock).

        Only a Running monitor pod listens, on ``HAMI_MONITOR_PORT``, plain HTTP; ``metrics`` (or ``/metrics``) is
        its only path (else Go's ``404 page not found``). Any other pod or port refuses the connection.
        """
        target = f"{address}:{port or (443 if scheme == 'https' else 80)}"
        node = (pod.get("spec") or {}).get("nodeName") or ""
        listening = (is_monitor_pod(pod) and (pod.get("status") or {}).get("phase") == "Running"
                     and port == str(HAMI_MONITOR_PORT) and not pod["metadata"].get("deletionTimestamp"))
        mode = self._modes.get(node, MONITOR_OK)
        if not listening or mode == MONITOR_DOWN:
            return MonitorAnswer(unreachable=f"dial tcp {target}: connect: connection refused")
        if mode == MONITOR_HANG:
            return MonitorAnswer(hang=True)
        if scheme == "https":
            return MonitorAnswer(unreachable="tls: first record does not look like a TLS handshake")
        if path.strip("/") != "metrics" or path.endswith("/"):
            return MonitorAnswer(404, "text/plain; charset=utf-8", _NOT_FOUND_BODY)
        return MonitorAnswer(200, CONTENT_TYPE, self.metrics(node).encode("utf-8"))

    async def hang(self, pod: Mapping[str, Any]) -> None:
        """Wait as a request to a hung monitor does: ``hami_monitor_hang_seconds``, or until the node's monitor is set
        to another mode or the emulator closes (call it without the lock)."""
        node = (pod.get("spec") or {}).get("nodeName") or ""
        waiter = self.api.spawn(asyncio.sleep(self.api.hami_monitor_hang_seconds), f"emulated-vgpu-monitor-hang-{node}")
        self._hangs.setdefault(node, set()).add(waiter)
        try:
            await asyncio.wait({waiter})
        finally:
            self._hangs.get(node, set()).discard(waiter)

    def metrics(self, node: str) -> str:
        """The monitor's ``/metrics`` text for ``node`` now (see the module docstring)."""
        now = time.time()
        readings: list[ContainerGpu] = []
        for pod in self.api.live_objects(self.api.served("", "v1", "pods")):
            if (pod.get("spec") or {}).get("nodeName") == node:
                readings += self._pod_readings(pod, now)
        found = self.api.get_object(self.api.served("", "v1", "nodes"), None, node)
        value = node_register_annotation(((found or {}).get("metadata") or {}).get("annotations"))
        try:
            devices = decode_node_register(value) if value is not None else []
        except HamiDecodeError:
            devices = []
        hosts = []
        for device in sorted(devices, key=lambda d: (d.index, d.uuid)):
            mine = [r for r in readings if r.device_uuid == device.uuid]
            utilization = min(100, sum(r.utilization for r in mine))
            hosts.append(HostGpu(index=device.index, uuid=device.uuid, name=device.model,
                                 memory_used=sum(r.memory_used for r in mine), utilization=utilization,
                                 memory_utilization=utilization // 2))
        return render_metrics(self.api.hami_monitor_scheme, node, readings, hosts)
