"""Stand-in for kube-scheduler with HAMi's scheduler extender (on with ``pod_startup_seconds``).

Pods created through the API are bound to a node with room for their HAMi GPU request (rules in ``hami_rules``),
get HAMi's pod annotations in the real format and are handed to the kubelet stand-in to start; Pods that do not fit
stay ``Pending``/``Unschedulable`` with kube-scheduler's message until a Pod, Node or claim change makes room.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from demo.emulator.common import timestamp
from demo.emulator.controllers import Controller
from demo.emulator.controllers.hami_rules import (
    HAMI_BIND_PHASE,
    HAMI_BIND_TIME,
    HAMI_DEVICES_ALLOCATED,
    HAMI_DEVICES_TO_ALLOCATE,
    HAMI_UNFIT,
    HAMI_UNREGISTERED,
    HAMI_VGPU_NODE,
    HAMI_VGPU_TIME,
    PREEMPTION_USELESS,
    GpuAllocation,
    GpuState,
    Placement,
    binpack_score,
    encode_pod_devices,
    fit_error,
    fit_pod,
    node_filter_failure,
    pod_gpu_requests,
)
from demo.emulator.controllers.host_facts import check_pod_kind
from demo.emulator.resources import ResourceSpec
from demo.emulator.store import StoreEvent
from operator_agent.hami import HamiDecodeError, decode_node_register, node_register_annotation
from operator_agent.hami_pods import decode_pod_devices

if TYPE_CHECKING:
    from demo.emulator.controllers.kubelet import Kubelet
    from demo.emulator.server import KubeApiEmulator

logger = logging.getLogger(__name__)


def _frees_room(event: StoreEvent) -> bool:
    """Whether an event may let an unschedulable Pod fit: any Node or PersistentVolumeClaim change (a claim bound), a
    Pod gone or finished."""
    if event.spec.group or event.spec.plural not in ("nodes", "pods", "persistentvolumeclaims"):
        return False
    if event.spec.plural in ("nodes", "persistentvolumeclaims") or event.type == "DELETED":
        return True
    finished = ("Succeeded", "Failed")
    return ((event.object.get("status") or {}).get("phase") in finished
            and ((event.old or {}).get("status") or {}).get("phase") not in finished)


def _prefilter_error(total: int, reason: str) -> str:
    """kube-scheduler's message when a PreFilter plugin (VolumeBinding) rules the pod out on every node."""
    if total == 0:
        return "no nodes available to schedule pods"
    return (f"0/{total} nodes are available: {reason}. "
            f"preemption: 0/{total} nodes are available: {total} {PREEMPTION_USELESS}.")


class HamiScheduler(Controller):
    """The scheduler stand-in of one emulator (see the module docstring and ``KubeApiEmulator``).

    Args:
        api: the emulator whose Pods it binds.
        kubelet: the kubelet stand-in that starts the bound Pods.
    """

    def __init__(self, api: KubeApiEmulator, kubelet: Kubelet) -> None:
        super().__init__(api)
        self.kubelet = kubelet
        self._unscheduled: dict[str, tuple[str, str]] = {}  # uid -> (ns, name)
        self._starting: dict[str, tuple[str, str, float]] = {}  # uid -> (ns, name, loop time due)
        self._scheduler_wake = asyncio.Event()
        self._scheduler_task: asyncio.Task | None = None

    def on_event(self, event: StoreEvent) -> None:
        """Queue a Pod created through the API (not a check pod) and wake the loop; wake it too when an event may
        let an unschedulable Pod fit (``_frees_room``)."""
        if self.api.pod_startup_seconds is None:
            return
        obj = event.object
        if event.created and event.kind == ("", "pods") and check_pod_kind(obj) is None:
            self._unscheduled[obj["metadata"]["uid"]] = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            self._ensure_scheduler()
            self.wake()
        elif self._scheduler_task is not None and _frees_room(event):
            self.wake()

    def on_host_change(self, node: str) -> None:
        """The kubelet retries the mounts of Pods stuck in ``ContainerCreating`` (the host may have an NFS client now)."""
        if self.kubelet.mount_waiting:
            self.wake()

    def wake(self) -> None:
        """Make the loop run a pass now."""
        self._scheduler_wake.set()

    def _ensure_scheduler(self) -> None:
        if self._scheduler_task is None or self._scheduler_task.done():
            self._scheduler_task = self.api.spawn(self._scheduler_loop(), "emulated-scheduler")

    async def _scheduler_loop(self) -> None:
        """Run ``_scheduler_pass`` whenever woken (Pod created, Pod/Node change), a start is due or a retry is."""
        loop = asyncio.get_running_loop()
        while True:
            self._scheduler_wake.clear()
            try:
                async with self.api._lock:
                    next_start = await self._scheduler_pass()
            except Exception:  # keep scheduling the other pods; the failure is in the log
                logger.exception("the emulated scheduler failed a pass")
                next_start = None
            delays = [] if next_start is None else [max(0.0, next_start - loop.time())]
            if self._unscheduled or self.kubelet.mount_waiting:
                delays.append(self.api.scheduler_retry_seconds)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(delays) if delays else None):
                    await self._scheduler_wake.wait()

    async def _scheduler_pass(self) -> float | None:
        """Bind the pending Pods that fit (oldest first), then start the bound Pods whose start-up time has come.

        Starting is the kubelet's part: it mounts the Pod's PersistentVolumeClaim volumes first, and a mount that
        fails (``Kubelet.mount_failure``: an NFS volume on a host without an NFS client) leaves the Pod ``Pending`` in
        ``ContainerCreating`` with a ``FailedMount`` Warning Event; such Pods are tried again on every pass (a
        ``set_host`` that installs the client wakes the scheduler) and start once their volumes mount.

        Returns:
            The loop time of the next start, or None when no Pod is waiting to start.
        """
        pods = self.api.served("", "v1", "pods")
        loop = asyncio.get_running_loop()
        for uid, (namespace, name) in list(self._unscheduled.items()):
            current = self.kubelet.waiting_pod(pods, namespace, name, uid)
            if current is None:
                del self._unscheduled[uid]
                continue
            placement = self._place(current)
            if isinstance(placement, str):
                await self._mark_unschedulable(pods, current, placement)
                continue
            del self._unscheduled[uid]
            await self.api.write_object(pods, self._bound(current, placement), current)
            self._starting[uid] = (namespace, name, loop.time() + (self.api.pod_startup_seconds or 0.0))
        for uid, (namespace, name, due) in list(self._starting.items()):
            if due > loop.time():
                continue
            del self._starting[uid]
            current = self.kubelet.waiting_pod(pods, namespace, name, uid)
            node = self.api.get_object(self.api.served("", "v1", "nodes"), None,
                                       ((current or {}).get("spec") or {}).get("nodeName") or "")
            if current is not None and node is not None:
                await self.kubelet.start_pod(pods, current, node)
        for uid, (namespace, name) in list(self.kubelet.mount_waiting.items()):
            current = self.kubelet.waiting_pod(pods, namespace, name, uid)
            node = self.api.get_object(self.api.served("", "v1", "nodes"), None,
                                       ((current or {}).get("spec") or {}).get("nodeName") or "")
            if current is None or node is None:
                self.kubelet.mount_waiting.pop(uid, None)
                continue
            await self.kubelet.start_pod(pods, current, node)
        return min((due for _, _, due in self._starting.values()), default=None)

    def _gpu_states(self) -> dict[str, list[GpuState] | None]:
        """Per node name: its healthy GPUs (index order) with what live Pods hold on them.

        GPUs come from the node's ``hami.io/node-nvidia-register`` (or ``4pd.io/...``) annotation, decoded by
        ``operator_agent.hami.decode_node_register``; None when the node has no such annotation or it does not
        decode (HAMi: "node unregistered"). Holdings come from the ``hami.io/vgpu-devices-allocated`` annotation
        of every Pod bound to the node that has not finished (``Succeeded``/``Failed``), decoded by
        ``operator_agent.hami_pods.decode_pod_devices``, as HAMi's scheduler rebuilds them from its pod informer;
        a deleted Pod holds nothing.
        """
        states: dict[str, list[GpuState] | None] = {}
        for node in self.api.live_objects(self.api.served("", "v1", "nodes")):
            name = node["metadata"]["name"]
            value = node_register_annotation(node["metadata"].get("annotations"))
            try:
                devices = decode_node_register(value) if value is not None else None
            except HamiDecodeError as exc:
                logger.warning("node %s: HAMi register annotation not decodable, treated as unregistered: %s",
                               name, exc)
                devices = None
            states[name] = None if devices is None else [
                GpuState(d) for d in sorted(devices, key=lambda d: (d.index, d.uuid)) if d.health]
        for pod in self.api.live_objects(self.api.served("", "v1", "pods")):
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

    def _place(self, pod: Mapping[str, Any]) -> Placement | str:
        """Choose a node (and GPUs) for a Pod, or return kube-scheduler's failure message.

        Nodes are filtered as kube-scheduler's default plugins do (``node_filter_failure``). A Pod without HAMi
        resources goes to the first remaining node by name. A GPU Pod is then filtered as HAMi's scheduler
        extender does: nodes without a register annotation are "node unregistered", nodes whose GPUs cannot hold
        every container's vGPUs are "NodeUnfitPod" (``fit_pod``); among the nodes that fit, the binpack policy
        takes the most used one (``binpack_score``), ties broken by name. Before any of that, like kube-scheduler's
        VolumeBinding plugin, a Pod whose PersistentVolumeClaims are missing or not ``Bound`` fits nowhere
        (``pod has unbound immediate PersistentVolumeClaims``; every StorageClass is treated as ``Immediate``).
        """
        spec = pod.get("spec") or {}
        meta = pod["metadata"]
        nodes = self.api.live_objects(self.api.served("", "v1", "nodes"))
        unbound = self._unbound_claims(pod)
        if unbound is not None:  # kube-scheduler's VolumeBinding PreFilter: unresolvable on every node
            return _prefilter_error(len(nodes), unbound)
        failures: dict[str, tuple[str, bool]] = {}
        candidates = []
        for node in nodes:
            reason = node_filter_failure(node, spec)
            if reason is None:
                candidates.append(node)
            else:
                failures[node["metadata"]["name"]] = (reason, False)
        requests = pod_gpu_requests(spec)
        if not any(requests):
            if candidates:
                return Placement(candidates[0], None)
            return fit_error(len(nodes), failures)
        states = self._gpu_states()
        annotations = meta.get("annotations") or {}
        fits = []
        card_reasons: dict[str, list[str]] = collections.defaultdict(list)
        for node in candidates:
            name = node["metadata"]["name"]
            gpus = states.get(name)
            if gpus is None:
                failures[name] = (HAMI_UNREGISTERED, True)
                continue
            score = binpack_score(gpus)
            allocation, reasons = fit_pod(gpus, requests, annotations)
            if allocation is None:
                failures[name] = (HAMI_UNFIT, True)
                for reason in reasons:
                    card_reasons[reason].append(name)
                continue
            fits.append((-score, name, node, allocation))
        if fits:
            _, _, node, allocation = min(fits, key=lambda fit: (fit[0], fit[1]))
            return Placement(node, allocation)
        if card_reasons:  # what HAMi records as FilteringFailed events
            logger.info("hami-scheduler: pod %s/%s does not fit: %s", meta.get("namespace"), meta["name"], "; ".join(
                f"{len(names)} nodes {reason}({','.join(sorted(names))})" for reason, names in sorted(card_reasons.items())))
        return fit_error(len(nodes), failures)

    async def _mark_unschedulable(self, pods: ResourceSpec, current: dict[str, Any], message: str) -> None:
        """Set ``PodScheduled=False``/``Unschedulable`` with ``message`` (no write when nothing changes)."""
        conditions = (current.get("status") or {}).get("conditions") or []
        scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("message") == message:
            return
        pod = copy.deepcopy(current)
        now = timestamp()
        pod["status"]["conditions"] = [c for c in conditions if c.get("type") != "PodScheduled"] + [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastProbeTime": None, "lastTransitionTime": now}]
        await self.api.write_object(pods, pod, current)

    @staticmethod
    def _bound(current: Mapping[str, Any], placement: Placement) -> dict[str, Any]:
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
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": timestamp()}]}
        return pod


    def _unbound_claims(self, pod: Mapping[str, Any]) -> str | None:
        """kube-scheduler's VolumeBinding reason for a Pod whose PersistentVolumeClaims are not all ``Bound``, or None."""
        pvcs = self.api.served("", "v1", "persistentvolumeclaims")
        namespace = pod["metadata"].get("namespace")
        unbound = False
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim_name:
                continue
            claim = self.api.get_object(pvcs, namespace, claim_name)
            if claim is None:
                return f'persistentvolumeclaim "{claim_name}" not found'
            if claim["metadata"].get("deletionTimestamp"):
                return f'persistentvolumeclaim "{claim_name}" is being deleted'
            unbound = unbound or (claim.get("status") or {}).get("phase") != "Bound"
        return "pod has unbound immediate PersistentVolumeClaims" if unbound else None
