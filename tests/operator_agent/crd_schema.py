"""Validate an object against the ``openAPIV3Schema`` of an upstream CRD copied in ``tests/fixtures/crds``.

The apiserver's structural-schema rules, translated to JSON Schema (``jsonschema``) where a validator can check them:

* an object with ``properties`` and no ``x-kubernetes-preserve-unknown-fields`` accepts no other field
  (``additionalProperties: false``): the apiserver would prune such a field silently, so a builder that writes one has
  a bug the apiserver would hide;
* ``x-kubernetes-int-or-string`` -> integer or string; ``nullable`` -> also ``null``;
* ``format: int32``/``int64`` -> the integer's range; ``x-kubernetes-list-type: set`` -> unique items, ``map`` -> unique
  ``x-kubernetes-list-map-keys``;
* ``metadata`` (``type: object`` in every CRD) -> the ObjectMeta fields builders write, ``name`` a DNS-1123 subdomain.

CEL rules (``x-kubernetes-validations``) are not evaluated; tests assert what they would check where it matters.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "crds"

_DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_OBJECT_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS1123_SUBDOMAIN},
        "namespace": {"type": "string", "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["apiVersion", "kind", "name", "uid"],
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": {"type": "string"},
                           "uid": {"type": "string"}, "controller": {"type": "boolean"},
                           "blockOwnerDeletion": {"type": "boolean"}}}},
    },
}
_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}

_format_checker = jsonschema.FormatChecker()


def _in_range(name: str):
    low, high = _RANGES[name]

    def check(value: object) -> bool:
        return not isinstance(value, int) or isinstance(value, bool) or low <= value <= high

    return check


for _name in _RANGES:
    _format_checker.checks(_name)(_in_range(_name))


def _unique_keys(validator, keys, instance, schema):
    if not isinstance(instance, list):
        return
    seen = set()
    for item in instance:
        key = tuple(item.get(k) for k in keys) if isinstance(item, Mapping) else (item,)
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate list-map key {dict(zip(keys, key, strict=True))}")
        seen.add(key)


_Validator = jsonschema.validators.extend(jsonschema.Draft7Validator, {"x-list-map-keys": _unique_keys})


def to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A structural ``openAPIV3Schema`` (or a part of one) as a JSON Schema with the rules of the module docstring."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("description", "default", "example", "x-kubernetes-validations", "x-kubernetes-map-type",
                   "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-preserve-unknown-fields",
                   "x-kubernetes-int-or-string", "x-kubernetes-embedded-resource", "nullable"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, Mapping):
            out[key] = to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema and not preserve:
        out["additionalProperties"] = False
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        out["uniqueItems"] = True
    elif list_type == "map":
        out["x-list-map-keys"] = list(schema.get("x-kubernetes-list-map-keys") or [])
    return out


@functools.cache
def load_crd(file_name: str) -> dict[str, Any]:
    """The CRD in ``tests/fixtures/crds/<file_name>``."""
    return yaml.safe_load((CRD_DIR / file_name).read_text(encoding="utf-8"))


def crd_files() -> list[str]:
    """File names of every CRD in ``tests/fixtures/crds``."""
    return sorted(p.name for p in CRD_DIR.glob("*.yaml"))


@functools.cache
def _validator(group: str, kind: str, version: str) -> jsonschema.protocols.Validator:
    for file_name in crd_files():
        crd = load_crd(file_name)
        names = crd["spec"]["names"]
        if crd["spec"]["group"] != group or names["kind"] != kind:
            continue
        for served in crd["spec"]["versions"]:
            if served["name"] == version and served.get("served"):
                schema = to_json_schema(served["schema"]["openAPIV3Schema"])
                schema.setdefault("properties", {})["metadata"] = _OBJECT_META
                schema.setdefault("required", [])
                schema["required"] = sorted({*schema["required"], "apiVersion", "kind", "metadata", "spec"})
                _Validator.check_schema(schema)
                return _Validator(schema, format_checker=_format_checker)
        raise LookupError(f"{kind}.{group} has no served version {version}")
    raise LookupError(f"no CRD of {kind}.{group} in {CRD_DIR}")


def validate(obj: Mapping[str, Any]) -> None:
    """Validate ``obj`` against the CRD of its ``apiVersion`` and ``kind``.

    Raises:
        jsonschema.ValidationError: the first violation (``best_match``).
        LookupError: no CRD of that kind, or the version is not served.
    """
    group, _, version = obj["apiVersion"].rpartition("/")
    validator = _validator(group, obj["kind"], version)
    error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if error is not None:
        raise error


def errors(obj: Mapping[str, Any]) -> list[str]:
    """Every violation of ``obj`` as ``"<path>: <message>"`` (empty when valid)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    validator = _validator(group, obj["kind"], version)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]

