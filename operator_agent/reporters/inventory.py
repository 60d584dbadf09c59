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
          "hami_error": "…"                      # only when the HAMi annotation failed to decode;
        }                                        # "devices" is then []
      ]
    }

A node without a HAMi registration annotation (device plugin not running yet) is reported
with ``devices: []`` and no ``hami_error``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract import GPU_NODE_LABEL_SELECTOR, INVENTORY_SNAPSHOT_REQUIRED, inventory_digest
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
    return {"nodes": nodes}


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
