"""Label and field selectors (apimachinery's grammar) for list, watch and deletecollection."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from demo.emulator.errors import ApiError


@dataclass(frozen=True)
class LabelRequirement:
    """One requirement of a label selector.

    Attributes:
        key: label key.
        op: one of ``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!``, ``>``, ``<``.
        values: compared values (one for ``=``/``!=``/``>``/``<``, none for ``exists``/``!``).
    """

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label dict satisfies this requirement (apimachinery ``labels.Requirement.Matches``)."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present:
            return False
        try:
            number = int(value or "")
        except ValueError:
            return False
        return number > int(self.values[0]) if self.op == ">" else number < int(self.values[0])


_LABEL_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_TERM = re.compile(rf"\s*(?P<key>{_LABEL_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*")
_CMP_TERM = re.compile(rf"\s*(?P<key>{_LABEL_KEY})\s*(?P<op>==|!=|=|>|<)\s*(?P<value>{_LABEL_VALUE})\s*")
_EXISTS_TERM = re.compile(rf"\s*(?P<neg>!)?\s*(?P<key>{_LABEL_KEY})\s*")


def _split_top_level(text: str) -> list[str]:
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return terms


def parse_label_selector(text: str) -> list[LabelRequirement]:
    """Parse a Kubernetes label selector string.

    Args:
        text: e.g. ``gpu=on,tier in (a,b),!legacy`` (``=``/``==``, ``!=``, ``in``, ``notin``, existence
            ``key``, non-existence ``!key``, integer ``>``/``<``); empty means "everything".

    Returns:
        The requirements, all of which must match (AND).

    Raises:
        ApiError: ``400 BadRequest`` naming the term that does not parse.
    """
    requirements: list[LabelRequirement] = []
    if not text.strip():
        return requirements
    for term in _split_top_level(text):
        if match := _SET_TERM.fullmatch(term):
            values = tuple(v.strip() for v in match["values"].split(",") if v.strip())
            if not values:
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {term.strip()!r}: values are required")
            requirements.append(LabelRequirement(match["key"], match["op"], values))
        elif match := _CMP_TERM.fullmatch(term):
            op = "=" if match["op"] == "==" else match["op"]
            if op in (">", "<") and not re.fullmatch(r"-?\d+", match["value"]):
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {term.strip()!r}: not an integer")
            requirements.append(LabelRequirement(match["key"], op, (match["value"],)))
        elif match := _EXISTS_TERM.fullmatch(term):
            requirements.append(LabelRequirement(match["key"], "!" if match["neg"] else "exists"))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: found {term.strip()!r}")
    return requirements


@dataclass(frozen=True)
class FieldRequirement:
    """One requirement of a field selector.

    Attributes:
        field: dotted field path, e.g. ``spec.nodeName``.
        negate: True for ``!=``.
        value: compared value (missing fields compare as ``""``; booleans as ``true``/``false``).
    """

    field: str
    negate: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether an object satisfies this requirement."""
        current: Any = obj
        for part in self.field.split("."):
            current = current.get(part) if isinstance(current, Mapping) else None
        if isinstance(current, bool):
            actual = "true" if current else "false"
        elif current is None:
            actual = "false" if self.field == "spec.unschedulable" else ""
        else:
            actual = str(current)
        return (actual != self.value) if self.negate else (actual == self.value)


def parse_field_selector(text: str, allowed: Iterable[str] = ("metadata.name", "metadata.namespace")) -> list[
        FieldRequirement]:
    """Parse a Kubernetes field selector string.

    Args:
        text: e.g. ``spec.nodeName=gpu-h100-01,status.phase!=Succeeded`` (``=``, ``==``, ``!=``).
        allowed: the field paths this resource supports.

    Returns:
        The requirements, all of which must match (AND).

    Raises:
        ApiError: ``400 BadRequest`` for an unparseable term or an unsupported field
            (``field label not supported: <field>``, as the apiserver answers).
    """
    allowed = set(allowed)
    requirements: list[FieldRequirement] = []
    if not text.strip():
        return requirements
    for term in text.split(","):
        match = re.fullmatch(r"\s*([^=!\s]+)\s*(==|!=|=)\s*(.*?)\s*", term)
        if not match:
            raise ApiError(400, "BadRequest", f"invalid selector: {text!r}; can't understand {term!r}")
        name, op, value = match.groups()
        if name not in allowed:
            raise ApiError(400, "BadRequest", f'field label not supported: {name}')
        requirements.append(FieldRequirement(name, op == "!=", value))
    return requirements


@dataclass(frozen=True)
class Selection:
    namespace: str | None = None
    name: str | None = None
    labels: tuple[LabelRequirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.name is not None and meta.get("name") != self.name:
            return False
        labels = meta.get("labels") or {}
        return all(r.matches(labels) for r in self.labels) and all(r.matches(obj) for r in self.fields)
