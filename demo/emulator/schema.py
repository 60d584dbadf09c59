"""Custom resources checked against their CRD's ``openAPIV3Schema`` as the apiserver does for structural schemas
(apiextensions-apiserver: pruning, defaulting, then validation; Kubernetes docs "Extend the Kubernetes API with
CustomResourceDefinitions", sections "Field pruning", "Defaulting" and "Validation").

On every create, replace, patch and apply of a custom resource (main resource and ``status`` subresource), for the
version the request uses:

1. **pruning**: fields the schema does not declare are dropped, not refused (``x-kubernetes-preserve-unknown-fields:
   true`` keeps them below that node, ``x-kubernetes-embedded-resource`` keeps ``apiVersion``/``kind``/``metadata``,
   ``x-kubernetes-int-or-string`` values are leaves); a ``null`` for a property that is not ``nullable`` is dropped
   too (then defaulted, as the apiserver does since 1.20); the root's ``apiVersion``, ``kind`` and ``metadata`` are
   never pruned;
2. **defaulting**: a missing property with a ``default`` gets a copy of it, and defaulting goes on inside it;
3. **validation** with ``jsonschema`` (Draft 4, whose boolean ``exclusiveMinimum``/``exclusiveMaximum`` are OpenAPI
   v3.0's): ``type`` (``nullable`` adds ``null``; ``x-kubernetes-int-or-string`` is integer or string), ``required``,
   ``enum``, ``pattern``, ``minLength``/``maxLength``, ``minimum``/``maximum``, ``multipleOf``,
   ``minItems``/``maxItems``, ``minProperties``/``maxProperties``, ``allOf``/``anyOf``/``oneOf``/``not`` and the
   formats the apiserver checks (``FORMATS``; others such as ``int32`` are ignored, as there). A refused object is
   answered ``422 Invalid`` with the apiserver's ``details.causes`` (``reason``, ``message``, ``field`` such as
   ``spec.rules[0].matches``) and message (``HTTPRoute.gateway.networking.k8s.io "x" is invalid: spec...: ...``),
   built as apiextensions-apiserver's ``kubeOpenAPIResultToFieldErrors`` builds them from kube-openapi's errors.

``x-kubernetes-list-type`` ``set`` and ``map`` lists are checked for duplicates too (``FieldValueDuplicate``).

Not emulated: CEL rules (``x-kubernetes-validations`` are not evaluated), validation ratcheting of unchanged fields
on update, ``metadata`` validation beyond what the rest of the emulator does, ``fieldValidation=Strict`` (unknown
fields are always pruned, never refused, and no warning is sent; a real apiserver also refuses a server-side apply
configuration naming an undeclared field, ``field not declared in schema``, where this one prunes it), conversion
between versions (each version is checked against its own schema).
"""

from __future__ import annotations

import base64
import copy
import datetime
import functools
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema

from demo.emulator.errors import ApiError

_KEYWORDS = ("type", "enum", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
             "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "minProperties", "maxProperties", "required",
             "format")
_HOSTNAME = re.compile(r"^[a-zA-Z0-9]([-a-zA-Z0-9]{0,62})?(\.[a-zA-Z0-9]([-a-zA-Z0-9]{0,62})?)*\.?$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h|d|w))+$")


def _ip(version: int) -> Any:
    def check(value: str) -> bool:
        try:
            return ipaddress.ip_address(value).version == version
        except ValueError:
            return False
    return check


def _cidr(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return "/" in value


def _byte(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except ValueError:
        return False
    return True


def _date_time(value: str) -> bool:
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return "T" in value.upper()


def _date(value: str) -> bool:
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


#: The string formats the apiserver checks (kube-openapi's strfmt registry as apiextensions-apiserver's
#: ``supportedFormats`` narrows it; the common ones), as predicates on the string.
FORMATS: dict[str, Any] = {
    "ipv4": _ip(4), "ipv6": _ip(6), "cidr": _cidr, "hostname": lambda v: len(v) <= 255 and bool(_HOSTNAME.match(v)),
    "uuid": lambda v: bool(_UUID.match(v)), "byte": _byte, "date-time": _date_time, "datetime": _date_time,
    "date": _date, "duration": lambda v: bool(_DURATION.match(v)),
}

_FORMAT_CHECKER = jsonschema.FormatChecker(formats=())
for _name, _check in FORMATS.items():
    _FORMAT_CHECKER.checks(_name)(lambda value, _check=_check: not isinstance(value, str) or _check(value))


def _required(validator: Any, required: Any, instance: Any, schema: Any) -> Iterable[jsonschema.ValidationError]:
    """Draft 4's ``required`` with the missing property on the error's path (the apiserver names the field)."""
    if validator.is_type(instance, "object"):
        for prop in required:
            if prop not in instance:
                yield jsonschema.ValidationError("Required value", path=[prop])


_Validator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"required": _required})


def to_json_schema(node: Mapping[str, Any], *, root: bool = False) -> dict[str, Any]:
    """A Draft 4 JSON Schema equivalent to a structural schema node, for validation only (see the module docstring).

    Args:
        node: an ``openAPIV3Schema`` node.
        root: the node is the object's root (its ``metadata`` is validated elsewhere).
    """
    out: dict[str, Any] = {k: copy.deepcopy(node[k]) for k in _KEYWORDS if k in node}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    properties = node.get("properties")
    if isinstance(properties, Mapping):
        out["properties"] = {k: ({"type": "object"} if root and k == "metadata" else to_json_schema(v))
                             for k, v in properties.items()}
    if isinstance(node.get("items"), Mapping):
        out["items"] = to_json_schema(node["items"])
    if isinstance(node.get("additionalProperties"), Mapping):
        out["additionalProperties"] = to_json_schema(node["additionalProperties"])
    for key in ("allOf", "anyOf", "oneOf"):  # under allOf: int-or-string's own anyOf may be there already
        if isinstance(node.get(key), list):
            converted = [to_json_schema(s) for s in node[key]]
            if key == "allOf":
                out.setdefault("allOf", []).extend(converted)
            else:
                out.setdefault("allOf", []).append({key: converted})
    if isinstance(node.get("not"), Mapping):
        out["not"] = to_json_schema(node["not"])
    return out


def prune(value: Any, node: Mapping[str, Any], *, root: bool = False) -> Any:
    """``value`` without the fields ``node`` does not declare (and non-nullable ``null`` properties); in place for
    objects and lists, returns the value."""
    if node.get("x-kubernetes-int-or-string"):
        return value
    if isinstance(value, dict):
        properties = node.get("properties") or {}
        extra = node.get("additionalProperties")
        keep_unknown = bool(node.get("x-kubernetes-preserve-unknown-fields"))
        embedded = node.get("x-kubernetes-embedded-resource")
        for key in list(value):
            if (root or embedded) and key in ("apiVersion", "kind", "metadata"):
                continue
            child = properties.get(key)
            if child is None and isinstance(extra, Mapping):
                child = extra
            if child is None:
                if not keep_unknown and extra is not True:
                    del value[key]
            elif value[key] is None and not child.get("nullable"):
                del value[key]
            else:
                value[key] = prune(value[key], child)
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for i, item in enumerate(value):
            value[i] = prune(item, node["items"])
    return value


def apply_defaults(value: Any, node: Mapping[str, Any], *, root: bool = False) -> Any:
    """``value`` with defaults filled in for missing properties, recursively; in place, returns the value."""
    if isinstance(value, dict):
        properties = node.get("properties") or {}
        for key, child in properties.items():
            if root and key == "metadata":
                continue
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                value[key] = apply_defaults(value[key], child)
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key in value:
                if key not in properties:
                    value[key] = apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for i, item in enumerate(value):
            value[i] = apply_defaults(item, node["items"])
    return value


def field_path(parts: Iterable[str | int]) -> str:
    """``["spec", "rules", 0, "matches"]`` -> ``spec.rules[0].matches``."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _go_value(value: Any) -> str:
    """A bad value as apimachinery's ``field.Error`` prints it (``%q`` strings, ``%v`` numbers and booleans)."""
    if value is None:
        return '"null"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _cause(error: jsonschema.ValidationError) -> dict[str, str]:
    """One ``details.causes`` entry for a jsonschema error, with kube-openapi's wording (``errors`` package)."""
    path = field_path(error.absolute_path)
    kind, value, bound = error.validator, error.instance, error.validator_value
    if kind == "required":
        return {"reason": "FieldValueRequired", "message": "Required value", "field": path}
    if kind == "enum":
        allowed = ", ".join(json.dumps(v if isinstance(v, str) else json.dumps(v)) for v in bound)
        return {"reason": "FieldValueNotSupported",
                "message": f"Unsupported value: {_go_value(value)}: supported values: {allowed}", "field": path}
    if kind == "maxLength":
        return {"reason": "FieldValueTooLong", "message": f"Too long: may not be more than {bound} bytes",
                "field": path}
    if kind in ("maxItems", "maxProperties"):
        what = "items" if kind == "maxItems" else "properties"
        return {"reason": "FieldValueTooMany", "message": f"Too many: {len(value)}: must have at most {bound} {what}",
                "field": path}
    if kind == "type":
        wanted = bound if isinstance(bound, str) else ",".join(b for b in bound if b != "null")
        actual = _json_type(value)
        return {"reason": "FieldValueTypeInvalid",
                "message": f'Invalid value: "{actual}": {path} in body must be of type {wanted}: "{actual}"',
                "field": path}
    detail = {
        "pattern": f"should match '{bound}'",
        "minLength": f"should be at least {bound} chars long",
        "minItems": f"should have at least {bound} items",
        "minProperties": f"should have at least {bound} properties",
        "minimum": f"should be greater than {'' if error.schema.get('exclusiveMinimum') else 'or equal to '}{bound}",
        "maximum": f"should be less than {'' if error.schema.get('exclusiveMaximum') else 'or equal to '}{bound}",
        "multipleOf": f"should be a multiple of {bound}",
        "format": f"must be of type {bound}: {_go_value(value)}",
        "anyOf": "must validate at least one schema (anyOf)",
        "oneOf": "must validate one and only one schema (oneOf)",
        "not": "must not validate the schema (not)",
    }.get(str(kind), error.message)
    shown = value if isinstance(value, (str, int, float, bool)) or value is None else ""
    return {"reason": "FieldValueInvalid", "message": f"Invalid value: {_go_value(shown)}: {path} in body {detail}",
            "field": path}


def _go_map(keys: Mapping[str, Any]) -> str:
    """A list-map key as Go's ``%#v`` prints a ``map[string]interface {}`` (keys sorted)."""
    inner = ", ".join(f"{json.dumps(k)}:{json.dumps(v) if isinstance(v, str) else _go_value(v)}"
                      for k, v in sorted(keys.items()))
    return f"map[string]interface {{}}{{{inner}}}"


def list_type_causes(value: Any, node: Mapping[str, Any], path: tuple[str | int, ...] = ()) -> list[dict[str, str]]:
    """Duplicates in ``x-kubernetes-list-type: set`` and ``map`` lists (apiextensions-apiserver's
    ``listtype.ValidateListSetsAndMaps``): ``Duplicate value`` on the later item."""
    causes: list[dict[str, str]] = []
    if isinstance(value, dict):
        properties = node.get("properties") or {}
        extra = node.get("additionalProperties")
        for key, child in value.items():
            schema = properties.get(key) or (extra if isinstance(extra, Mapping) else None)
            if schema is not None:
                causes += list_type_causes(child, schema, (*path, key))
    elif isinstance(value, list):
        items = node.get("items") if isinstance(node.get("items"), Mapping) else {}
        kind = node.get("x-kubernetes-list-type")
        seen: list[Any] = []
        for index, item in enumerate(value):
            if kind == "set":
                if item in seen:
                    causes.append({"reason": "FieldValueDuplicate", "field": field_path((*path, index)),
                                   "message": f"Duplicate value: {_go_value(item)}"})
                seen.append(item)
            elif kind == "map" and isinstance(item, Mapping):
                keys = {k: item.get(k) for k in node.get("x-kubernetes-list-map-keys") or [] if k in item}
                if keys in seen:
                    causes.append({"reason": "FieldValueDuplicate", "field": field_path((*path, index)),
                                   "message": f"Duplicate value: {_go_map(keys)}"})
                seen.append(keys)
            causes += list_type_causes(item, items, (*path, index))
    return causes


class CrdSchema:
    """The ``openAPIV3Schema`` of one served version of a CRD, compiled on first use and kept.

    Args:
        schema: the version's ``schema.openAPIV3Schema``.
        kind: the resource's kind (``HTTPRoute``), group (``gateway.networking.k8s.io``), for error messages.
    """

    def __init__(self, schema: Mapping[str, Any], kind: str, group: str) -> None:
        self.schema = copy.deepcopy(dict(schema))
        self.kind = kind
        self.group = group

    @functools.cached_property
    def _validator(self) -> Any:
        return _Validator(to_json_schema(self.schema, root=True), format_checker=_FORMAT_CHECKER)

    def errors(self, obj: Mapping[str, Any]) -> list[dict[str, str]]:
        """The ``details.causes`` of what is wrong with a (pruned, defaulted) object; ``[]`` when it is valid."""
        return [_cause(e) for e in self._validator.iter_errors(obj)] + list_type_causes(obj, self.schema)

    def admit(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Prune, default and validate an object about to be stored (changed in place and returned).

        Raises:
            ApiError: ``422 Invalid`` with the causes (see the module docstring).
        """
        prune(obj, self.schema, root=True)
        apply_defaults(obj, self.schema, root=True)
        causes = self.errors(obj)
        if causes:
            name = (obj.get("metadata") or {}).get("name") or ""
            what = f'{self.kind}.{self.group} "{name}" is invalid'
            listed = [f"{c['field']}: {c['message']}" for c in causes]
            message = f"{what}: {listed[0]}" if len(listed) == 1 else f"{what}: [{', '.join(listed)}]"
            raise ApiError(422, "Invalid", message, {"name": name, "group": self.group, "kind": self.kind,
                                                      "causes": causes})
        return obj


def version_schema(version: Mapping[str, Any], kind: str, group: str) -> CrdSchema | None:
    """The ``CrdSchema`` of a CRD's ``spec.versions[]`` entry, None when it has no ``openAPIV3Schema``."""
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    return CrdSchema(schema, kind, group) if isinstance(schema, Mapping) and schema else None


__all__ = ["FORMATS", "CrdSchema", "apply_defaults", "field_path", "list_type_causes", "prune", "to_json_schema",
           "version_schema"]
