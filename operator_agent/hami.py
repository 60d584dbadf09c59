"""Decoder for HAMi's node-registration annotation (``hami.io/node-nvidia-register``).

``hami-device-plugin`` writes one record per physical NVIDIA GPU on the Node; this module
turns the value into ``HamiDevice`` objects. Every encoding HAMi (and its predecessor
``4pd.io/k8s-vgpu-scheduler``) has shipped is accepted:

=========== ===================================== =============================================================
encoding    writers                               source
=========== ===================================== =============================================================
``json``    HAMi v2.8.0 … v2.10.x                 ``pkg/device/devices.go`` MarshalNodeDevices @ v2.8.0 … v2.10.0
                                                  (v2.8–v2.9 add ``"devicepairscore":{}``; v2.10 adds
                                                  ``migProfiles``)
``legacy9`` HAMi v2.5.0 … v2.7.1                  ``pkg/util/util.go`` EncodeNodeDevices @ v2.5.0/v2.6.0,
                                                  ``pkg/device/devices.go`` EncodeNodeDevices @ v2.7.0
``legacy7`` HAMi master 2023-12 … v2.4.1          ``pkg/util/util.go`` EncodeNodeDevices @ 5ba2177b … v2.4.1
``legacy6`` 4pd k8s-vgpu-scheduler v2.3.x         ``pkg/util/util.go`` EncodeNodeDevices @ f7039ec7
``legacy5`` 4pd k8s-vgpu-scheduler v2.2.9         ``pkg/util/util.go`` EncodeNodeDevices @ 70f4d461
=========== ===================================== =============================================================

The 8-field records of the unreleased commit 68d90378 (2024-12-13 … 12-16) are refused.

Legacy grammar: ``<dev>:<dev>:…<dev>:`` -- each record is *terminated* by ``:`` and its
fields are ``,``-separated; the model name contains spaces but never ``,`` or ``:``.
Field order per encoding:

* legacy9: ``id,count,devmem,devcore,type,numa,health,index,mode``
* legacy7: ``id,count,devmem,devcore,type,numa,health``
* legacy6: ``id,count,devmem,devcore,type,health``
* legacy5: ``id,count,devmem,type,health``

JSON grammar: an array of objects with keys ``id, index, count, devmem, devcore, type,
numa, mode, [migProfiles], health`` produced by Go ``encoding/json`` with ``omitempty`` on
every key, so a missing ``index``/``numa``/``count``/``devmem``/``devcore`` means 0, a missing
``health`` means ``false`` and a missing ``mode`` means unset. Unknown keys are ignored.

Units (identical in every encoding): ``devmem`` is MiB (NVML total / 1024 / 1024 ×
``deviceMemoryScaling``, so it may exceed the physical memory); ``devcore`` is percent of
one GPU (100 = the whole GPU, > 100 when over-subscribed); ``count`` is the split count
(maximum number of pods sharing the GPU).

Validation beyond the grammar: every number must fit a Go ``int32`` (as HAMi's own parser
requires), the split count must be at least 1 and the model must not be empty -- a record
failing these could not be scheduled by HAMi and would be refused by the control plane.

Records are not in index order (the device plugin iterates a Go map): key devices by
``uuid`` (or ``index`` where the encoding carries it), never by position. Devices are
returned in annotation order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from contract import HAMI_NODE_REGISTER_ANNOTATIONS

__all__ = [
    "ENCODINGS",
    "HamiDecodeError",
    "HamiDevice",
    "decode_node_register",
    "node_register_annotation",
    "strip_model_prefix",
]

ENCODINGS = ("json", "legacy9", "legacy7", "legacy6", "legacy5")
"""Values of ``HamiDevice.encoding``."""

POSITIONAL_INDEX_ENCODINGS = frozenset({"legacy7", "legacy6", "legacy5"})
"""Encodings that carry no NVML index: ``HamiDevice.index`` is the record's position there."""

_MODEL_PREFIX = "NVIDIA-"
_LEGACY_FIELD_COUNTS = {9: "legacy9", 7: "legacy7", 6: "legacy6", 5: "legacy5"}
_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
# Go strconv.ParseBool accepts exactly these spellings.
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_MAX_SNIPPET = 80
_INT32_MAX = 2**31 - 1  # HAMi parses every number as a Go int32 (strconv.ParseInt(s, 10, 32))


class HamiDecodeError(ValueError):
    """The annotation value is not a node-registration value any HAMi version wrote.

    The message names the offending record (its 0-based position and, when known, its UUID).
    """


@dataclass(frozen=True)
class HamiDevice:
    """One physical GPU as registered by HAMi on a node.

    Attributes:
        uuid: GPU UUID from NVML (``GPU-xxxxxxxx-…``); the stable key of the device.
        index: NVML device index. For ``legacy7``/``legacy6``/``legacy5`` records, which carry
            no index, this is the record's position in the annotation -- a last resort that
            need not match NVML (see the module docstring); trust ``uuid`` instead.
        model: GPU model with HAMi's single ``NVIDIA-`` type prefix removed
            (``NVIDIA-NVIDIA H100 80GB HBM3`` -> ``NVIDIA H100 80GB HBM3``, ``NVIDIA-Tesla T4`` -> ``Tesla T4``).
        memory_mib: registered device memory in MiB (already multiplied by ``deviceMemoryScaling``).
        split_count: maximum number of pods that may share this GPU (HAMi ``deviceSplitCount``).
        cores: core capacity in percent of one GPU (100 = whole GPU; ``legacy5`` has no such
            field and reports 100).
        numa: NUMA node (0 when unknown or not carried by the encoding).
        health: whether HAMi considers the GPU healthy.
        mode: ``hami-core``, ``mig`` or ``mps``; ``None`` when the encoding carries no mode
            (legacy 5/6/7) or the JSON element omits it.
        encoding: one of ``ENCODINGS``: the format this record was decoded from.
    """

    uuid: str
    index: int
    model: str
    memory_mib: int
    split_count: int
    cores: int
    numa: int
    health: bool
    mode: str | None
    encoding: str


def strip_model_prefix(hami_type: str) -> str:
    """Return HAMi's ``type`` field without one leading ``NVIDIA-``.

    Up to v2.7 HAMi wrote ``"NVIDIA-" + NVML name``; from v2.8 (commit e9ddf86d) only when the
    NVML name does not already start with ``NVIDIA``. Removing a single prefix maps both
    generations of the same GPU to one model string.
    """
    if hami_type.startswith(_MODEL_PREFIX):
        return hami_type[len(_MODEL_PREFIX):]
    return hami_type


def node_register_annotation(annotations: Mapping[str, str] | None) -> str | None:
    """Return the node-registration annotation value, or ``None`` when the node has none.

    ``hami.io/node-nvidia-register`` wins over the pre-HAMi ``4pd.io/node-nvidia-register``
    when both are present (a node upgraded in place may keep the stale legacy key).
    """
    if not annotations:
        return None
    for key in HAMI_NODE_REGISTER_ANNOTATIONS:
        value = annotations.get(key)
        if value is not None:
            return value
    return None


def decode_node_register(value: str) -> list[HamiDevice]:
    """Decode a ``hami.io/node-nvidia-register`` (or ``4pd.io/…``) annotation value.

    A value starting with ``[`` (or ``{``, to report a non-array clearly) is decoded as JSON
    (HAMi ``pkg/device/devices.go`` MarshalNodeDevices/UnMarshalNodeDevices @ v2.8.0 … v2.10.0);
    anything else as the legacy ``:``-terminated record string (HAMi ``pkg/util/util.go``
    EncodeNodeDevices @ 70f4d461, f7039ec7, v2.4.1, v2.5.0, and ``pkg/device/devices.go`` @ v2.7.0).
    Surrounding whitespace is ignored; an empty value means no GPU is registered and yields ``[]``.

    Raises:
        HamiDecodeError: the value is malformed; the message names the offending record.
    """
    if not isinstance(value, str):
        raise HamiDecodeError(f"annotation value must be a string, got {type(value).__name__}")
    text = value.strip()
    if not text:
        return []
    if text[0] in "[{":
        devices = _decode_json(text)
    else:
        devices = _decode_legacy(text)
    _check_unique_uuids(devices)
    return devices


# ----------------------------------------------------------------------------- JSON (v2.8+)


def _decode_json(text: str) -> list[HamiDevice]:
    """Decode the JSON array of HAMi ``DeviceInfo`` objects (MarshalNodeDevices @ v2.8.0 … v2.10.0)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HamiDecodeError(f"annotation is not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise HamiDecodeError(f"JSON annotation must be an array, got {type(data).__name__}")
    return [_decode_json_element(position, element) for position, element in enumerate(data)]


def _decode_json_element(position: int, element: object) -> HamiDevice:
    """Decode one ``DeviceInfo`` object; every key is Go ``omitempty`` (missing = zero value)."""
    if not isinstance(element, dict):
        raise HamiDecodeError(f"record {position}: expected a JSON object, got {type(element).__name__}")
    uuid = element.get("id")
    if not isinstance(uuid, str) or not uuid:
        raise HamiDecodeError(f"record {position}: missing or empty \"id\" (GPU UUID)")
    where = f"record {position} ({uuid})"

    def integer(key: str, *, minimum: int = 0) -> int:
        raw = element.get(key, 0)
        if raw is None:
            raw = 0
        # bool is an int subclass in Python; JSON true/false is not a number in Go.
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise HamiDecodeError(f"{where}: \"{key}\" must be an integer, got {raw!r}")
        if not minimum <= raw <= _INT32_MAX:
            raise HamiDecodeError(f"{where}: \"{key}\" must be between {minimum} and {_INT32_MAX}, got {raw}")
        return raw

    hami_type = element.get("type", "")
    if not isinstance(hami_type, str):
        raise HamiDecodeError(f"{where}: \"type\" must be a string, got {hami_type!r}")
    health = element.get("health", False)
    if health is None:
        health = False
    if not isinstance(health, bool):
        raise HamiDecodeError(f"{where}: \"health\" must be a boolean, got {health!r}")
    mode = element.get("mode")
    if mode is not None and not isinstance(mode, str):
        raise HamiDecodeError(f"{where}: \"mode\" must be a string, got {mode!r}")

    model = strip_model_prefix(hami_type)
    if not model:
        raise HamiDecodeError(f"{where}: missing or empty \"type\" (GPU model)")
    return HamiDevice(
        uuid=uuid,
        index=integer("index"),
        model=model,
        memory_mib=integer("devmem"),
        split_count=integer("count", minimum=1),
        cores=integer("devcore"),
        numa=integer("numa", minimum=-_INT32_MAX - 1),
        health=health,
        mode=mode or None,
        encoding="json",
    )


# ----------------------------------------------------------------------------- legacy strings (≤ v2.7)


def _decode_legacy(text: str) -> list[HamiDevice]:
    """Decode ``<dev>:<dev>:…:`` (EncodeNodeDevices, ``pkg/util/util.go`` @ 70f4d461 … v2.6.x, devices.go @ v2.7)."""
    records = text.split(":")
    if records[-1] != "":
        position = len(records) - 1
        raise HamiDecodeError(
            f"record {position} ({_snippet(records[-1])!r}): not terminated by ':' (truncated annotation?)"
        )
    devices: list[HamiDevice] = []
    for position, record in enumerate(records[:-1]):
        if record == "":
            # HAMi's DecodeNodeDevices skips empty records too.
            continue
        devices.append(_decode_legacy_record(position, len(devices), record))
    return devices


def _decode_legacy_record(position: int, ordinal: int, record: str) -> HamiDevice:
    """Decode one ``,``-separated legacy record; ``ordinal`` is the positional index fallback."""
    fields = record.split(",")
    uuid = fields[0].strip()
    where = f"record {position} ({uuid or _snippet(record)!r})"
    encoding = _LEGACY_FIELD_COUNTS.get(len(fields))
    if encoding is None:
        if len(fields) == 8:
            raise HamiDecodeError(
                f"{where}: 8-field records (unreleased HAMi commit 68d90378, 2024-12) are not supported"
            )
        raise HamiDecodeError(f"{where}: expected 5, 6, 7 or 9 ','-separated fields, got {len(fields)}")
    if not uuid:
        raise HamiDecodeError(f"{where}: empty GPU UUID")

    def integer(value: str, name: str, *, minimum: int = 0) -> int:
        if not _INT_RE.match(value):
            raise HamiDecodeError(f"{where}: {name} {value!r} is not an integer")
        number = int(value)
        if not minimum <= number <= _INT32_MAX:
            raise HamiDecodeError(f"{where}: {name} must be between {minimum} and {_INT32_MAX}, got {number}")
        return number

    def boolean(value: str) -> bool:
        if value in _GO_TRUE:
            return True
        if value in _GO_FALSE:
            return False
        raise HamiDecodeError(f"{where}: health {value!r} is not a boolean")

    split_count = integer(fields[1], "count", minimum=1)
    memory_mib = integer(fields[2], "devmem")
    numa = 0
    mode: str | None = None
    index = ordinal  # last resort for encodings without an index; see POSITIONAL_INDEX_ENCODINGS
    if encoding == "legacy5":  # id,count,devmem,type,health
        cores = 100  # v2.2.9 had no core scaling: every GPU is one whole GPU
        hami_type, health = fields[3], boolean(fields[4])
    elif encoding == "legacy6":  # id,count,devmem,devcore,type,health
        cores = integer(fields[3], "devcore")
        hami_type, health = fields[4], boolean(fields[5])
    else:  # legacy7 / legacy9: id,count,devmem,devcore,type,numa,health[,index,mode]
        cores = integer(fields[3], "devcore")
        hami_type = fields[4]
        numa = integer(fields[5], "numa", minimum=-_INT32_MAX - 1)
        health = boolean(fields[6])
        if encoding == "legacy9":
            index = integer(fields[7], "index")
            mode = fields[8] or None
    model = strip_model_prefix(hami_type)
    if not model:
        raise HamiDecodeError(f"{where}: empty type (GPU model)")
    return HamiDevice(
        uuid=uuid,
        index=index,
        model=model,
        memory_mib=memory_mib,
        split_count=split_count,
        cores=cores,
        numa=numa,
        health=health,
        mode=mode,
        encoding=encoding,
    )


# ----------------------------------------------------------------------------- helpers


def _check_unique_uuids(devices: list[HamiDevice]) -> None:
    """Refuse a value that lists one GPU twice: devices are keyed by UUID downstream."""
    seen: set[str] = set()
    for position, device in enumerate(devices):
        if device.uuid in seen:
            raise HamiDecodeError(f"device {position} ({device.uuid}): GPU UUID listed more than once")
        seen.add(device.uuid)


def _snippet(text: str) -> str:
    """Shorten ``text`` for an error message."""
    return text if len(text) <= _MAX_SNIPPET else text[:_MAX_SNIPPET] + "…"
