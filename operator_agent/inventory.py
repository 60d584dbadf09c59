"""GPU inventory snapshot of this cluster, as sent to ``PUT /internal/v1/inventory``.

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
from collections.abc import Mapping
from typing import Any

import kubernetes.client

from contract import GPU_NODE_LABEL_SELECTOR
from operator_agent.hami import HamiDecodeError, HamiDevice, decode_node_register, node_register_annotation

__all__ = ["collect_inventory", "device_to_snapshot", "node_to_snapshot", "snapshot_counts"]

logger = logging.getLogger(__name__)

LIST_PAGE_SIZE = 500
"""Nodes per ``list_node`` page (``limit``/``continue`` pagination)."""


def collect_inventory(core_v1: kubernetes.client.CoreV1Api, *, request_timeout: float | None = None) -> dict:
    """List the GPU nodes (label selector ``gpu=on``) and return the inventory snapshot.

    Args:
        core_v1: client of the data-plane cluster's apiserver.
        request_timeout: seconds per list call (``_request_timeout``); ``None`` = client default.

    Raises:
        kubernetes.client.exceptions.ApiException, urllib3 errors: the apiserver could not be listed.
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


def node_to_snapshot(node: kubernetes.client.V1Node | Mapping[str, Any]) -> dict:
    """Return the snapshot entry of one Node.

    ``node`` is either a ``kubernetes.client.V1Node`` or the Node's JSON as the apiserver
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
    node: kubernetes.client.V1Node | Mapping[str, Any],
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
