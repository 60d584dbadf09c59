"""Decoder for HAMi's pod allocation annotation (``hami.io/vgpu-devices-allocated``).

``hami-scheduler`` writes the annotation on a Pod when it binds it (the same value as
``hami.io/vgpu-devices-to-allocate`` at that moment, which the device plugin then empties);
it lists, per container, the GPUs HAMi gave that container. Source of the grammar:
``pkg/device/devices.go`` ``EncodePodSingleDevice``/``DecodePodDevices`` @ HAMi v2.10.0 (key in use
since hami-2.3; the same grammar since 2024), summarised in the team's HAMi fixture README,
section 3, with real values in ``tests/fixtures/hami/pod-annotations.observed.yaml``::

    <ctr0>;<ctr1>;...            one ';'-TERMINATED segment per container, init containers
                                 first, then regular containers, including containers that
                                 asked for no GPU (empty segment)
    <ctr> = <dev>:<dev>:...      each device ':'-TERMINATED
    <dev> = uuid,type,usedmem,usedcores
            uuid       GPU UUID from NVML (GPU-xxxxxxxx-...)
            type       device type keyword, "NVIDIA" for NVIDIA GPUs
            usedmem    device memory given to the container, MiB
            usedcores  share of the GPU's SMs, percent; 0 = no core limit

Quirks accepted, as HAMi's own decoder accepts them: a missing final ``;`` (the text after the
last ``;`` is then one more segment), and the empty records ``,,0,0:`` HAMi v2.5 wrote for
containers without a GPU (issue #991) -- they are dropped, leaving that container's list empty.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from operator_agent.hami import HamiDecodeError

__all__ = [
    "HAMI_POD_DEVICES_ALLOCATED_ANNOTATION",
    "allocated_device_uuids",
    "decode_pod_devices",
    "pod_annotations",
]

HAMI_POD_DEVICES_ALLOCATED_ANNOTATION = "hami.io/vgpu-devices-allocated"
"""Pod annotation written by ``hami-scheduler`` at bind time: the GPUs allocated to each container."""

_CONTAINER_SEPARATOR = ";"  # HAMi OnePodMultiContainerSplitSymbol
_DEVICE_TERMINATOR = ":"  # HAMi OneContainerMultiDeviceSplitSymbol
_INT_RE = re.compile(r"[0-9]+\Z")
_INT32_MAX = 2**31 - 1  # HAMi parses usedmem/usedcores with strconv.ParseInt(s, 10, 32)


def decode_pod_devices(annotation_value: str) -> list[list[dict[str, Any]]]:
    """Decode a ``hami.io/vgpu-devices-allocated`` value.

    Args:
        annotation_value: the raw annotation value, e.g.
            ``";GPU-9b90...,NVIDIA,6144,30:;"`` (container 0 without GPU, container 1 with one).

    Returns:
        One list per container segment, in annotation order (init containers first), each a list of
        ``{"uuid": str, "type": str, "memory_mib": int, "cores": int}`` (``memory_mib`` in MiB,
        ``cores`` in percent of one GPU, 0 = no core limit). ``""`` gives ``[]``.

    Raises:
        HamiDecodeError: a device record does not have 4 fields, or its memory/cores are not
            non-negative integers that fit a Go ``int32``.
    """
    if not annotation_value:
        return []
    segments = annotation_value.split(_CONTAINER_SEPARATOR)
    if segments[-1] == "":
        segments.pop()  # the terminator of the last segment
    containers: list[list[dict[str, Any]]] = []
    for position, segment in enumerate(segments):
        devices: list[dict[str, Any]] = []
        for record in segment.split(_DEVICE_TERMINATOR):
            if record == "":
                continue  # the terminator of the last device, or an empty segment
            devices_entry = _decode_device(record, position)
            if devices_entry is not None:
                devices.append(devices_entry)
        containers.append(devices)
    return containers


def allocated_device_uuids(pod: Mapping[str, Any] | Any) -> list[str]:
    """GPU UUIDs HAMi allocated to a pod, from its ``hami.io/vgpu-devices-allocated`` annotation.

    Args:
        pod: the Pod as the apiserver serves it (JSON dict) or a ``kubernetes.client.V1Pod``.

    Returns:
        Unique UUIDs in order of first appearance over all containers (two containers may share a
        GPU); ``[]`` when the pod has no such annotation (not bound yet, or not a HAMi pod).

    Raises:
        HamiDecodeError: the annotation is malformed (see ``decode_pod_devices``).
    """
    value = pod_annotations(pod).get(HAMI_POD_DEVICES_ALLOCATED_ANNOTATION)
    if not value:
        return []
    seen: dict[str, None] = {}
    for container in decode_pod_devices(value):
        for device in container:
            seen.setdefault(device["uuid"], None)
    return list(seen)


def pod_annotations(pod: Mapping[str, Any] | Any) -> Mapping[str, str]:
    """``metadata.annotations`` of a Pod JSON dict or ``V1Pod`` (``{}`` when there are none)."""
    if isinstance(pod, Mapping):
        return (pod.get("metadata") or {}).get("annotations") or {}
    metadata = getattr(pod, "metadata", None)
    return (getattr(metadata, "annotations", None) or {}) if metadata is not None else {}


def _decode_device(record: str, position: int) -> dict[str, Any] | None:
    """Decode ``uuid,type,usedmem,usedcores``; ``None`` for HAMi v2.5's empty ``,,0,0`` record."""
    fields = record.split(",")
    if len(fields) != 4:
        raise HamiDecodeError(
            f"container {position}: device record {_snippet(record)!r} has {len(fields)} fields, "
            "expected 4 (uuid,type,usedmem,usedcores)"
        )
    uuid, device_type, memory, cores = fields
    numbers = []
    for name, raw in (("usedmem", memory), ("usedcores", cores)):
        if not _INT_RE.match(raw) or int(raw) > _INT32_MAX:
            raise HamiDecodeError(
                f"container {position}: device record {_snippet(record)!r}: {name} {raw!r} is not a non-negative int32"
            )
        numbers.append(int(raw))
    if uuid == "":
        return None
    return {"uuid": uuid, "type": device_type, "memory_mib": numbers[0], "cores": numbers[1]}


def _snippet(text: str, limit: int = 80) -> str:
    """``text`` shortened for an error message."""
    return text if len(text) <= limit else text[:limit] + "…"
