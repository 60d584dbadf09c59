"""Decoding the Kubernetes protobuf wire format for the emulator (``application/vnd.kubernetes.protobuf``).

client-go's typed clientsets send built-in objects as protobuf when the caller asks for it; Helm's release
storage driver does so for the ``Secret`` (and ``ConfigMap``) objects that hold its release records, so
the emulator must read those bodies to let a real Helm engine install charts into it. Only the kinds
Helm's storage writes are declared here; any other protobuf body is refused by the emulator with
``415 UnsupportedMediaType``, as before.

Format (k8s.io/apimachinery ``runtime/serializer/protobuf``): the 4-byte magic ``k8s\\x00``, then a
``runtime.Unknown`` message (``typeMeta`` = 1 {apiVersion = 1, kind = 2}, ``raw`` = 2, ``contentEncoding``
= 3, ``contentType`` = 4) whose ``raw`` is the object's own message. Field numbers are those of
``k8s.io/api/core/v1/generated.proto`` (``Secret``: metadata 1, data 2, type 3, stringData 4,
immutable 5; ``ConfigMap``: metadata 1, data 2, binaryData 3, immutable 4) and
``k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`` (``ObjectMeta``: name 1, generateName 2,
namespace 3, uid 5, resourceVersion 6, generation 7, creationTimestamp 8 (``Time``: seconds 1, nanos 2),
labels 11, annotations 12, finalizers 14). Fields not declared here (ownerReferences, managedFields) are
dropped: the messages are built with Google's ``protobuf`` runtime from descriptors, not hand-parsed.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

_F = descriptor_pb2.FieldDescriptorProto


def _field(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int, *, repeated: bool = False,
           type_name: str | None = None) -> None:
    field = message.field.add(name=name, number=number, type=kind,
                              label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name:
        field.type_name = type_name


def _map(message: descriptor_pb2.DescriptorProto, name: str, number: int, value_kind: int) -> None:
    entry_name = "".join(part.capitalize() for part in name.split("_")) + "Entry"
    entry = message.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, value_kind)
    _field(message, name, number, _F.TYPE_MESSAGE, repeated=True, type_name=f".k8semu.{message.name}.{entry_name}")


def _build_pool() -> descriptor_pool.DescriptorPool:
    proto = descriptor_pb2.FileDescriptorProto(name="k8semu.proto", package="k8semu", syntax="proto2")
    type_meta = proto.message_type.add(name="TypeMeta")
    _field(type_meta, "apiVersion", 1, _F.TYPE_STRING)
    _field(type_meta, "kind", 2, _F.TYPE_STRING)
    unknown = proto.message_type.add(name="Unknown")
    _field(unknown, "typeMeta", 1, _F.TYPE_MESSAGE, type_name=".k8semu.TypeMeta")
    _field(unknown, "raw", 2, _F.TYPE_BYTES)
    _field(unknown, "contentEncoding", 3, _F.TYPE_STRING)
    _field(unknown, "contentType", 4, _F.TYPE_STRING)
    time = proto.message_type.add(name="Time")
    _field(time, "seconds", 1, _F.TYPE_INT64)
    _field(time, "nanos", 2, _F.TYPE_INT32)
    meta = proto.message_type.add(name="ObjectMeta")
    for name, number in (("name", 1), ("generateName", 2), ("namespace", 3), ("uid", 5), ("resourceVersion", 6)):
        _field(meta, name, number, _F.TYPE_STRING)
    _field(meta, "generation", 7, _F.TYPE_INT64)
    _field(meta, "creationTimestamp", 8, _F.TYPE_MESSAGE, type_name=".k8semu.Time")
    _map(meta, "labels", 11, _F.TYPE_STRING)
    _map(meta, "annotations", 12, _F.TYPE_STRING)
    _field(meta, "finalizers", 14, _F.TYPE_STRING, repeated=True)
    secret = proto.message_type.add(name="Secret")
    _field(secret, "metadata", 1, _F.TYPE_MESSAGE, type_name=".k8semu.ObjectMeta")
    _map(secret, "data", 2, _F.TYPE_BYTES)
    _field(secret, "type", 3, _F.TYPE_STRING)
    _map(secret, "stringData", 4, _F.TYPE_STRING)
    _field(secret, "immutable", 5, _F.TYPE_BOOL)
    config_map = proto.message_type.add(name="ConfigMap")
    _field(config_map, "metadata", 1, _F.TYPE_MESSAGE, type_name=".k8semu.ObjectMeta")
    _map(config_map, "data", 2, _F.TYPE_STRING)
    _map(config_map, "binaryData", 3, _F.TYPE_BYTES)
    _field(config_map, "immutable", 4, _F.TYPE_BOOL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


_POOL = _build_pool()


def _message(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"k8semu.{name}"))


_KINDS = {("v1", "Secret"): "Secret", ("v1", "ConfigMap"): "ConfigMap"}


class UnsupportedProtobuf(ValueError):
    """The body is not the Kubernetes protobuf envelope, or holds a kind this module does not declare."""


def decode_object(body: bytes) -> dict[str, Any]:
    """Decode one protobuf-encoded object into the dict its JSON form would give.

    Args:
        body: the request body as sent with ``Content-Type: application/vnd.kubernetes.protobuf``.

    Returns:
        ``{"apiVersion", "kind", "metadata": {...}, ...}`` with ``bytes`` values base64-encoded, as in JSON.

    Raises:
        UnsupportedProtobuf: no ``k8s\\x00`` magic, an undecodable envelope, or a kind other than v1
            ``Secret``/``ConfigMap``.
    """
    if not body.startswith(MAGIC):
        raise UnsupportedProtobuf("the body does not start with the Kubernetes protobuf magic k8s\\x00")
    envelope = _message("Unknown")()
    try:
        envelope.ParseFromString(body[len(MAGIC):])
    except Exception as exc:  # google.protobuf.message.DecodeError
        raise UnsupportedProtobuf(f"undecodable protobuf envelope: {exc}") from None
    api_version, kind = envelope.typeMeta.apiVersion, envelope.typeMeta.kind
    name = _KINDS.get((api_version, kind))
    if name is None:
        raise UnsupportedProtobuf(f"protobuf bodies of {api_version}/{kind} are not supported by the emulator: send JSON")
    message = _message(name)()
    try:
        message.ParseFromString(envelope.raw)
    except Exception as exc:
        raise UnsupportedProtobuf(f"undecodable {kind}: {exc}") from None
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": _metadata(message.metadata)}
    if name == "Secret":
        if message.data:
            obj["data"] = {k: base64.b64encode(v).decode() for k, v in message.data.items()}
        if message.stringData:
            obj["stringData"] = dict(message.stringData)
        if message.HasField("type"):
            obj["type"] = message.type
    else:
        if message.data:
            obj["data"] = dict(message.data)
        if message.binaryData:
            obj["binaryData"] = {k: base64.b64encode(v).decode() for k, v in message.binaryData.items()}
    if message.HasField("immutable"):
        obj["immutable"] = message.immutable
    return obj


def _metadata(meta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("name", "generateName", "namespace", "uid", "resourceVersion"):
        if meta.HasField(key) and getattr(meta, key):
            out[key] = getattr(meta, key)
    if meta.HasField("generation"):
        out["generation"] = meta.generation
    if meta.HasField("creationTimestamp") and meta.creationTimestamp.seconds:
        stamp = datetime.datetime.fromtimestamp(meta.creationTimestamp.seconds, datetime.UTC)
        out["creationTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    if meta.labels:
        out["labels"] = dict(meta.labels)
    if meta.annotations:
        out["annotations"] = dict(meta.annotations)
    if meta.finalizers:
        out["finalizers"] = list(meta.finalizers)
    return out
