"""The GPU inventory report: a snapshot of this cluster's GPU nodes, sent with ``PUT /internal/v1/inventory``.

``report_inventory`` is one tick of the main thread's loop (``operator_agent.main.run``): it collects the snapshot
(``collect_inventory``) and sends it (``send_inventory``: digest-only when the control plane holds it already), with
the session-path checks (``operator_agent.session_path``) and this node's clock offset (``operator_agent.clock``).

Shape (every node labelled ``gpu=on``, sorted by name; devices sorted by ``index``, then ``uuid``)::

    {
      "nodes": [
        {
          "name": "gpu-node-01",
          "labels": {"gpu": "on", ...},          # all labels of the Node, unchanged
          "ready": true,                         # condition Ready == "True"
          "devices": [
            {
              "uuid": "GPU-…",                   # NVML UUID; the device's key
              "index": 0,                        # NVML index (position for legacy 5/6/7-field records)
              "model": "NVIDIA H100 80GB HBM3",  # HAMi type without its "NVIDIA-" prefix
              "memory_mib": 81559,               # MiB, after HAMi deviceMemoryScaling
              "split_count": 10,                 # max pods sharing the GPU
              "cores": 100,                      # percent of one GPU
              "health": true,
              "mode": "hami-core",               # "hami-core" | "mig" | "mps" | null
              "numa": 0
            }
          ],
          "hami_error": "…",                     # only when the HAMi annotation failed to decode;
                                                 # "devices" is then []
          "cpu_allocatable_millicores": 160000,  # status.allocatable cpu, millicores rounded down
          "memory_allocatable_mib": 2063808,     # status.allocatable memory, MiB rounded down
          "cpu_requested_millicores": 2500,      # what the node's pods that are not sessions request (rounded up)
          "memory_requested_mib": 4096
        }
      ]
    }

A node without a HAMi registration annotation (device plugin not running yet) is reported
with ``devices: []`` and no ``hami_error``.

The four CPU and memory figures (placement fits a session's CPU and memory in what is left: ``sessions.placement``) are
sent together or not at all: a node whose ``status.allocatable`` lacks ``cpu`` or ``memory`` (or has one the quantity
grammar refuses) goes without them, and so does every node when the pods cannot be listed (the control plane then
treats the node as having no CPU or memory limit, as it does for operators that predate them). A pod's request is what
the scheduler counts: the sum of its containers' requests, or its largest init container's when larger, plus its
``overhead``; pods that ended (``Succeeded``, ``Failed``) and session pods (label ``gshare.io/session-id``: the control
plane counts the sessions itself) are left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract import GPU_NODE_LABEL_SELECTOR, INVENTORY_SNAPSHOT_REQUIRED, SESSION_ID_LABEL, inventory_digest
from contract.quantity import quantity_decimal
from operator_agent import kube
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient, ControlPlaneError, ControlPlaneRejected, ControlPlaneUnavailable
from operator_agent.hami import HamiDecodeError, HamiDevice, decode_node_register, node_register_annotation
from operator_agent.session_path import SessionPathChecks

__all__ = [
    "FULL_SNAPSHOT_EVERY",
    "InventoryState",
    "collect_inventory",
    "device_to_snapshot",
    "node_to_snapshot",
    "pod_requests",
    "report_inventory",
    "send_inventory",
    "snapshot_counts",
]

logger = logging.getLogger(__name__)

LIST_PAGE_SIZE = 500
"""Nodes per ``list_node`` page (``limit``/``continue`` pagination)."""


def collect_inventory(core_v1: kube.CoreV1Api, *, request_timeout: float | None = None) -> dict:
    """List the GPU nodes (label selector ``gpu=on``) and return the inventory snapshot.

    Args:
        core_v1: client of the data-plane cluster's apiserver.
        request_timeout: seconds per list call (``_request_timeout``); ``None`` = client default.

    Raises:
        kube.ApiException, or a transport error (``kube.apiserver_call`` makes it ``KubeUnavailable``): the apiserver
            could not be listed.
            A node whose HAMi annotation does not decode does not raise (see ``node_to_snapshot``).
    """
    nodes: list[dict] = []
    continue_token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"label_selector": GPU_NODE_LABEL_SELECTOR, "limit": LIST_PAGE_SIZE}
        if continue_token:
            kwargs["_continue"] = continue_token
        if request_timeout is not None:
            kwargs["_request_timeout"] = request_timeout
        page = core_v1.list_node(**kwargs)
        nodes.extend(node_to_snapshot(node) for node in page.items or [])
        continue_token = page.metadata._continue if page.metadata is not None else None
        if not continue_token:
            break
    nodes.sort(key=lambda node: node["name"])
    sized = [node for node in nodes if "cpu_allocatable_millicores" in node]
    if sized:
        try:
            requested = _requested_by_node(core_v1, {node["name"] for node in sized}, request_timeout=request_timeout)
        except kube.ApiException as exc:
            # E.g. an RBAC without the cluster-wide pod list: report the nodes without CPU/memory rather than too much room.
            logger.warning("cannot list pods for the nodes' CPU and memory requests (%s %s): reporting no CPU/memory figures",
                           exc.status, exc.reason)
            requested = None
        for node in sized:
            if requested is None:
                del node["cpu_allocatable_millicores"], node["memory_allocatable_mib"]
            else:
                node["cpu_requested_millicores"], node["memory_requested_mib"] = requested.get(node["name"], (0, 0))
    return {"nodes": nodes}


_MIB = 1 << 20

#: Pods that hold nothing on their node any more: only the others are listed.
_LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def _requested_by_node(core_v1: kube.CoreV1Api, names: set[str], *, request_timeout: float | None) -> dict[str, tuple[int, int]]:
    """``{node name: (millicores, MiB)}`` requested by the pods on the nodes ``names`` that are not sessions (one paged
    list of the cluster's live pods)."""
    cpu: dict[str, int] = {}
    memory: dict[str, int] = {}
    continue_token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"field_selector": _LIVE_PODS, "limit": LIST_PAGE_SIZE}
        if continue_token:
            kwargs["_continue"] = continue_token
        if request_timeout is not None:
            kwargs["_request_timeout"] = request_timeout
        page = core_v1.list_pod_for_all_namespaces(**kwargs)
        for pod in page.items or []:
            node = pod.spec.node_name if pod.spec is not None else None
            if node not in names or SESSION_ID_LABEL in ((pod.metadata.labels if pod.metadata is not None else None) or {}):
                continue
            millicores, memory_bytes = pod_requests(pod)
            cpu[node] = cpu.get(node, 0) + millicores
            memory[node] = memory.get(node, 0) + memory_bytes
        continue_token = page.metadata._continue if page.metadata is not None else None
        if not continue_token:
            break
    return {node: (cpu.get(node, 0), -(-memory.get(node, 0) // _MIB)) for node in names}


def _quantity(value: Any, scale: int) -> int:
    """A quantity × ``scale``, rounded up; 0 when it is not one."""
    try:
        return int(-(-quantity_decimal(value) * scale // 1))
    except (ValueError, ArithmeticError):
        return 0


def _container_requests(resources: Any) -> tuple[int, int]:
    requests = (resources.requests if resources is not None else None) or {}
    return _quantity(requests.get("cpu", 0), 1000), _quantity(requests.get("memory", 0), 1)


def pod_requests(pod: kube.V1Pod) -> tuple[int, int]:
    """``(millicores, bytes)`` the scheduler counts for ``pod``: its containers' requests summed, or its largest init
    container's when larger (each resource on its own), plus its ``spec.overhead``; rounded up."""
    spec = pod.spec
    if spec is None:
        return 0, 0
    containers = [_container_requests(c.resources) for c in spec.containers or []]
    cpu, memory = sum(c for c, _ in containers), sum(m for _, m in containers)
    for init in spec.init_containers or []:
        init_cpu, init_memory = _container_requests(init.resources)
        cpu, memory = max(cpu, init_cpu), max(memory, init_memory)
    overhead = spec.overhead or {}
    return cpu + _quantity(overhead.get("cpu", 0), 1000), memory + _quantity(overhead.get("memory", 0), 1)


def node_to_snapshot(node: kube.V1Node | Mapping[str, Any]) -> dict:
    """Return the snapshot entry of one Node.

    ``node`` is either a ``kube.V1Node`` or the Node's JSON as the apiserver
    serves it (camelCase keys, e.g. ``json.load`` of ``kubectl get node -o json``).
    A HAMi annotation that fails to decode is logged as a warning naming the node and the
    error, and the node is reported with ``devices: []`` and ``hami_error``.
    """
    name, labels, annotations, conditions = _node_fields(node)
    entry: dict[str, Any] = {
        "name": name,
        "labels": dict(labels),
        "ready": any(ctype == "Ready" and status == "True" for ctype, status in conditions),
        "devices": [],
    }
    entry.update(_allocatable(node))
    value = node_register_annotation(annotations)
    if value is None:
        return entry
    try:
        devices = decode_node_register(value)
    except HamiDecodeError as exc:
        logger.warning("node %s: cannot decode HAMi node-register annotation, reporting no GPUs: %s", name, exc)
        entry["hami_error"] = str(exc)
        return entry
    entry["devices"] = [device_to_snapshot(d) for d in sorted(devices, key=lambda d: (d.index, d.uuid))]
    return entry


def _allocatable(node: kube.V1Node | Mapping[str, Any]) -> dict:
    """``{"cpu_allocatable_millicores", "memory_allocatable_mib"}`` from the node's ``status.allocatable`` (rounded down:
    never more room than there is), or ``{}`` when either is missing or not a quantity."""
    if isinstance(node, Mapping):
        allocatable = (node.get("status") or {}).get("allocatable") or {}
    else:
        allocatable = (node.status.allocatable if node.status is not None else None) or {}
    try:
        cpu, memory = quantity_decimal(allocatable["cpu"]), quantity_decimal(allocatable["memory"])
    except (KeyError, ValueError):
        return {}
    if cpu < 0 or memory < 0:
        return {}
    return {"cpu_allocatable_millicores": int(cpu * 1000 // 1), "memory_allocatable_mib": int(memory // _MIB)}


def device_to_snapshot(device: HamiDevice) -> dict:
    """Return the snapshot entry of one GPU (units as in ``operator_agent.hami.HamiDevice``)."""
    return {
        "uuid": device.uuid,
        "index": device.index,
        "model": device.model,
        "memory_mib": device.memory_mib,
        "split_count": device.split_count,
        "cores": device.cores,
        "health": device.health,
        "mode": device.mode,
        "numa": device.numa,
    }


def snapshot_counts(snapshot: Mapping[str, Any]) -> tuple[int, int]:
    """Return ``(nodes, GPUs)`` counted in an inventory snapshot."""
    nodes = snapshot.get("nodes") or []
    return len(nodes), sum(len(node.get("devices") or []) for node in nodes)


def _node_fields(
    node: kube.V1Node | Mapping[str, Any],
) -> tuple[str, Mapping[str, str], Mapping[str, str], list[tuple[str | None, str | None]]]:
    """Extract ``(name, labels, annotations, [(condition type, status)])`` from a V1Node or Node JSON."""
    if isinstance(node, Mapping):
        metadata = node.get("metadata") or {}
        status = node.get("status") or {}
        conditions = [(c.get("type"), c.get("status")) for c in status.get("conditions") or []]
        return metadata.get("name") or "", metadata.get("labels") or {}, metadata.get("annotations") or {}, conditions
    metadata = node.metadata
    status = node.status
    raw_conditions = (status.conditions if status is not None else None) or []
    conditions = [(c.type, c.status) for c in raw_conditions]
    if metadata is None:
        return "", {}, {}, conditions
    return metadata.name or "", metadata.labels or {}, metadata.annotations or {}, conditions


# --------------------------------------------------------------------------- the report


FULL_SNAPSHOT_EVERY = 600.0
"""Seconds after which the full snapshot is sent even when nothing changed (digest-only reports in between)."""


@dataclass
class InventoryState:
    """What the inventory loop remembers between ticks: the digest the control plane last answered (``""``: none, the
    next report is a full snapshot) and when the last full snapshot was accepted (``time.monotonic()``)."""

    digest: str = ""
    full_at: float = float("-inf")


def report_inventory(core_v1: kube.CoreV1Api, client: ControlPlaneClient, config: OperatorConfig,
                     checks: SessionPathChecks | None = None, state: InventoryState | None = None) -> bool:
    """Run one tick: collect the inventory and report it. Return ``True`` on success; never raises for I/O failures.

    Sent by ``send_inventory``: digest-only when ``state`` says the control plane holds this snapshot already; without
    ``state`` (``--once``) the full snapshot.

    With ``checks``, the report carries the latest session-path checks (``operator_agent.session_path``), and they are
    run again after the report with what the control plane's answer names (reported at the next tick).
    """
    try:
        with kube.apiserver_call():
            snapshot = collect_inventory(core_v1, request_timeout=config.http_timeout)
    except kube.ApiException as exc:
        logger.warning("cannot list GPU nodes from the apiserver: %s %s", exc.status, exc.reason)
        return False
    except kube.KubeUnavailable as exc:
        logger.warning("cannot reach the apiserver to list GPU nodes: %s", exc)
        return False
    extra = {"checks": checks.payload()} if checks is not None and checks.payload() else {}
    extra.update(client.clock.payload())  # the offset learnt from earlier answers (none before the first)
    try:
        answer = send_inventory(client, snapshot, state=state, extra=extra)
    except ControlPlaneUnavailable as exc:
        logger.warning("inventory not reported: %s", exc)
        return False
    except ControlPlaneError:
        # 401/403/4xx and token-file problems were logged by the client with code and detail.
        return False
    nodes, gpus = snapshot_counts(snapshot)
    logger.info("inventory reported: %d nodes, %d GPUs%s", nodes, gpus, " (unchanged: digest only)" if answer.get("unchanged") else "")
    if checks is not None:
        try:
            checks.update(core_v1, answer, timeout=min(config.http_timeout, 5.0))
        except Exception:  # a check's bug must not stop the reports; the traceback is logged
            logger.exception("session path checks failed unexpectedly")
    return True


def send_inventory(client: ControlPlaneClient, snapshot: dict, *, state: InventoryState | None = None,
                   extra: dict | None = None) -> dict:
    """``PUT /internal/v1/inventory`` once for ``snapshot`` (``{"nodes": [...]}`` of ``operator_agent.reporters.inventory``), digest-only
    when it can be; return the control plane's answer.

    The snapshot gets its digest (``contract.inventory_digest`` of its nodes) and ``extra`` (e.g. ``{"checks": ...}``).
    With ``state``, a snapshot whose digest is the one the control plane answered last is reported digest-only
    (``{"digest", **extra}``: no node is sent, read or written), unless ``FULL_SNAPSHOT_EVERY`` seconds passed since the
    last full one; when the control plane answers that it needs the full snapshot (409 ``inventory_snapshot_required``,
    or 400 ``invalid_inventory`` from a control plane that predates digests), it is sent at once. Without ``state`` the
    full snapshot is sent. ``state`` is updated from the answer.

    Raises:
        ControlPlaneUnavailable: the control plane did not answer (after the client's retries).
        ControlPlaneError: any other refusal (logged by the client with code and detail).
    """
    extra = extra or {}
    digest = inventory_digest(snapshot["nodes"])
    snapshot["digest"] = digest
    snapshot.update(extra)
    answer = None
    if state is not None and state.digest == digest and time.monotonic() - state.full_at < FULL_SNAPSHOT_EVERY:
        try:
            answer = client.put_inventory({"digest": digest, **extra})
        except ControlPlaneRejected as exc:
            if exc.code not in (INVENTORY_SNAPSHOT_REQUIRED, "invalid_inventory"):
                raise
            logger.info("control plane asks for the full inventory snapshot (%s): sending it", exc.code)
    if answer is None:
        answer = client.put_inventory(snapshot)
        if state is not None:
            state.full_at = time.monotonic()
    if state is not None:
        state.digest = answer.get("digest") if isinstance(answer.get("digest"), str) else ""
    return answer
