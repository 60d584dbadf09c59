"""Stand-in for the kubelet: runs gShare's attach check pods, starts the Pods the scheduler stand-in bound, mounts
their volumes (failing NFS mounts on hosts without an NFS client) and serves ``pods/log``.

Check pods (label ``app.kubernetes.io/name: gshare-attach-check``, ``gshare.io/check: node|nfs``, bound with
``spec.nodeName``) run without the scheduler: ``Running``, then ``Succeeded``, logging what the check script prints
on a host with the node's facts (``host_facts``).
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import logging
import re
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import kmock

from demo.emulator.common import timestamp
from demo.emulator.controllers import Controller
from demo.emulator.controllers.hami_rules import HAMI_BIND_PHASE, HAMI_DEVICES_ALLOCATED, HAMI_DEVICES_TO_ALLOCATE
from demo.emulator.controllers.host_facts import check_pod_kind, check_targets, nfs_check_log, node_check_log
from demo.emulator.controllers.volumes import is_nfs_volume, nfs_mount_failure_message
from demo.emulator.errors import ApiError, not_found
from demo.emulator.objects import qos_class
from demo.emulator.resources import ResourceSpec
from demo.emulator.store import StoreEvent
from operator_agent.hami_pods import decode_pod_devices

if TYPE_CHECKING:
    from demo.emulator.server import KubeApiEmulator

logger = logging.getLogger(__name__)


class Kubelet(Controller):
    """The kubelet stand-in of one emulator, for every node (see the module docstring).

    Attributes:
        mount_waiting: Pods whose volumes did not mount, ``{uid: (namespace, name)}``; the scheduler's loop retries
            them (``start_pod``).
    """

    def __init__(self, api: KubeApiEmulator) -> None:
        super().__init__(api)
        self.mount_waiting: dict[str, tuple[str, str]] = {}
        self._pod_logs: dict[str, str] = {}  # pod uid -> log text
        self._check_waiting: dict[str, tuple[str, str]] = {}  # uid -> (ns, name): the node does not exist (yet)
        self._next_pod_ip = 10
        self._node_pod_ips: dict[str, int] = {}

    async def start_pod(self, pods: ResourceSpec, current: dict[str, Any], node: dict[str, Any]) -> None:
        """The kubelet starting a bound Pod: mount its volumes, then run it (``Running``); or, when a mount fails,
        keep it in ``ContainerCreating`` and record the kubelet's ``FailedMount`` Event (once per message)."""
        uid = current["metadata"]["uid"]
        failure = self.mount_failure(current, node)
        if failure is None:
            self.mount_waiting.pop(uid, None)
            await self.api.write_object(pods, self.running(current, node), current)
            return
        self.mount_waiting[uid] = (current["metadata"]["namespace"], current["metadata"]["name"])
        creating = self.container_creating(current, node)
        if creating != current:
            await self.api.write_object(pods, creating, current)
        await self.api.record_event_once(creating, reason="FailedMount", message=failure, event_type="Warning",
                                         component="kubelet", host=node["metadata"]["name"])

    def waiting_pod(self, pods: ResourceSpec, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The Pod if it is still the one created (same uid), not being deleted and ``Pending``."""
        current = self.api.get_object(pods, namespace, name)
        if current is None or current["metadata"]["uid"] != uid or current["metadata"].get("deletionTimestamp"):
            return None
        return current if (current.get("status") or {}).get("phase") == "Pending" else None

    def running(self, current: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
        """The Pod once its containers run: what HAMi's device plugin writes (``bind-phase: success``, to-allocate
        emptied to one ``;`` per container) and the kubelet's status (``Running``, IPs, conditions, containers)."""
        pod = copy.deepcopy(dict(current))
        annotations = pod["metadata"].get("annotations") or {}
        if HAMI_DEVICES_TO_ALLOCATE in annotations and HAMI_DEVICES_ALLOCATED in annotations:
            segments = len(decode_pod_devices(annotations[HAMI_DEVICES_ALLOCATED]))
            annotations[HAMI_DEVICES_TO_ALLOCATE] = ";" * segments
            annotations[HAMI_BIND_PHASE] = "success"
        now = timestamp()
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
            "startTime": now, "qosClass": (current.get("status") or {}).get("qosClass", qos_class(spec)),
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

    def on_event(self, event: StoreEvent) -> None:
        """Run a new check pod; forget a deleted Pod's log and waits; run the check pods waiting for a new Node."""
        meta = event.object.get("metadata") or {}
        if event.kind == ("", "pods"):
            if event.type == "ADDED" and check_pod_kind(event.object) is not None:
                self.api.spawn(self._run_check_pod(meta["namespace"], meta["name"], meta["uid"]),
                               f"emulated-check-pod-{meta['name']}")
            elif event.type == "DELETED":
                self._pod_logs.pop(meta.get("uid", ""), None)
                self._check_waiting.pop(meta.get("uid", ""), None)
                self.mount_waiting.pop(meta.get("uid", ""), None)
        elif event.kind == ("", "nodes") and event.type == "ADDED":
            for uid, (namespace, name) in list(self._check_waiting.items()):
                pod = self.api.get_object(self.api.served("", "v1", "pods"), namespace, name)
                if pod is not None and (pod.get("spec") or {}).get("nodeName") == meta["name"]:
                    del self._check_waiting[uid]
                    self.api.spawn(self._run_check_pod(namespace, name, uid), f"emulated-check-pod-{name}")

    def pod_log(self, namespace: str, name: str) -> str | None:
        """The log of a live Pod (``""`` before it has one), or None when there is no such Pod."""
        current = self.api.get_object(self.api.served("", "v1", "pods"), namespace, name)
        if current is None:
            return None
        return self._pod_logs.get(current["metadata"]["uid"], "")

    async def _run_check_pod(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet stand-in running a check pod: ``Running`` (with its log) then ``Succeeded``."""
        pods = self.api.served("", "v1", "pods")
        nodes = self.api.served("", "v1", "nodes")
        try:
            await asyncio.sleep(self.api.check_pod_seconds / 2)
            async with self.api._lock:
                current = self.waiting_pod(pods, namespace, name, uid)
                if current is None:
                    return
                node_name = (current.get("spec") or {}).get("nodeName") or ""
                node = self.api.get_object(nodes, None, node_name)
                if node is None:  # no kubelet to run it: Pending until the node appears
                    self._check_waiting[uid] = (namespace, name)
                    return
                facts = self.api.hosts.get(node_name) or {}
                kind = check_pod_kind(current)
                self._pod_logs[uid] = (node_check_log(facts) if kind == "node"
                                       else nfs_check_log(facts, check_targets(current)))
                running = self.running(current, node)
                if (current.get("spec") or {}).get("hostNetwork"):
                    running["status"]["podIP"] = running["status"]["hostIP"]
                    running["status"]["podIPs"] = [{"ip": running["status"]["hostIP"]}]
                await self.api.write_object(pods, running, current)
            await asyncio.sleep(self.api.check_pod_seconds / 2)
            async with self.api._lock:
                current = self.api.get_object(pods, namespace, name)
                if (current is None or current["metadata"]["uid"] != uid or current["metadata"].get("deletionTimestamp")
                    or (current.get("status") or {}).get("phase") != "Running"):
                    return
                await self.api.write_object(pods, self._completed(current), current)
        except Exception:  # the pod stays where it is; the failure is in the log
            logger.exception("the emulated kubelet failed to run check pod %s/%s", namespace, name)

    @staticmethod
    def _completed(current: Mapping[str, Any]) -> dict[str, Any]:
        """The Pod once its containers exited 0: the kubelet's ``Succeeded`` status (``PodCompleted`` conditions,
        containers ``terminated``/``Completed``)."""
        pod = copy.deepcopy(dict(current))
        status = pod.setdefault("status", {})
        now = timestamp()
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

    async def serve_pod_log(self, request: kmock.Request) -> Any:
        """``GET .../pods/{name}/log``: the pod's log as ``text/plain`` (``""`` while it has none).

        Query parameters: ``container`` (must name one of the pod's containers; required when it has several, as
        the apiserver answers), ``tailLines``, ``limitBytes``; ``follow``, ``previous``, ``timestamps``,
        ``sinceSeconds`` are accepted and ignored (check pods have finished by the time there is a log).
        """
        pods = self.api.served("", "v1", "pods")
        name = request.name or ""
        async with self.api._lock:
            current = self.api.get_object(pods, request.namespace, name)
            if current is None:
                raise not_found(pods, name)
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

    def mount_failure(self, pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
        """The kubelet's ``FailedMount`` message when the Pod mounts an NFS PersistentVolume and the node's host facts
        say it has no NFS client (``mount_nfs`` missing/None), else None. A node without any host facts is not judged
        (the emulator knows nothing of its host): its mounts succeed, so seeds without ``hosts`` keep running pods."""
        facts = self.api.hosts.get(node["metadata"]["name"])
        if facts is None or facts.get("mount_nfs"):
            return None
        pvcs = self.api.served("", "v1", "persistentvolumeclaims")
        pvs = self.api.served("", "v1", "persistentvolumes")
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            claim = self.api.get_object(pvcs, pod["metadata"].get("namespace"), claim_name) if claim_name else None
            volume_name = ((claim or {}).get("spec") or {}).get("volumeName")
            pv = self.api.get_object(pvs, None, volume_name) if volume_name else None
            if pv is not None and is_nfs_volume(pv):
                return nfs_mount_failure_message(pv, pod["metadata"]["uid"])
        return None

    def container_creating(self, current: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
        """The Pod while the kubelet cannot mount its volumes: ``Pending``, ``Initialized``, not ready, containers
        waiting in ``ContainerCreating``, no pod IP (no sandbox yet). Returned unchanged when already so."""
        statuses = (current.get("status") or {}).get("containerStatuses") or []
        if statuses and all(((c.get("state") or {}).get("waiting") or {}).get("reason") == "ContainerCreating"
                            for c in statuses):
            return dict(current)
        pod = copy.deepcopy(dict(current))
        now = timestamp()
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
            "qosClass": (current.get("status") or {}).get("qosClass", qos_class(spec)),
            "containerStatuses": [{
                "name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "ready": False,
                "started": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}},
            } for c in spec.get("containers") or []],
        }
        return pod
