"""Server-side apply with field ownership: ``metadata.managedFields`` entries (``fieldsV1``) per manager, and the
removal of fields a manager stops applying, as the apiserver does (structured-merge-diff, ``fieldmanager``).

What is tracked:

* an entry per ``(manager, operation, subresource)``: ``Apply`` for server-side applies, ``Update`` for replaces and
  patches of an object that already has managed fields (creates record none, so an object never applied to keeps
  none, as before);
* the fields an entry owns are the leaves of the object: values that are not objects, empty objects, and lists;
  ``apiVersion``, ``kind`` and the server-set metadata (``name``, ``uid``, ``resourceVersion`` ...) are not owned;
* **lists are atomic**: the emulator merges a list by replacing it whole (as its merge patches do), so a list is one
  field, owned whole (``f:ports: {}``), never item by item (no ``k:{"name":...}`` keys, no granular containers,
  ports or env);
* a resource with a ``status`` subresource has its ``status`` owned through that subresource only.

An apply by manager M, to an existing object:

1. an object without managed fields first gets them: everything it holds is owned by ``before-first-apply``
   (``Update``), so the first apply removes nothing it did not set;
2. the configuration is merged into the object like a merge patch;
3. fields M's ``Apply`` entry owned before, which the configuration leaves out and no other entry owns, are removed
   (and objects left empty by that, below the top level);
4. M's ``Apply`` entry then owns exactly the configuration's fields; a field whose value the apply changed is taken
   from every other entry (conflicts are never reported: every apply acts as if ``force=true``, as the emulator
   always did), one whose value it left alone stays shared.

An update (PUT, patch) by manager U of an object with managed fields: U's ``Update`` entry gains the fields
whose value it set or changed, they are taken from every other entry, and fields the update deleted leave every entry.
Entries left owning nothing are dropped; an entry's ``time`` changes only when its fields do.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from demo.emulator.common import timestamp
from demo.emulator.patches import merge_patch

Path = tuple[str, ...]

BEFORE_FIRST_APPLY = "before-first-apply"
"""Manager of the fields an object held before its first server-side apply (the apiserver's name)."""

_SERVER_SET_METADATA = frozenset({"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                                  "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"})


def default_manager(user_agent: str) -> str:
    """The manager of a write that names none: the User-Agent up to its first ``/`` (as the apiserver does)."""
    return user_agent.split("/", 1)[0] or "unknown"


def _tracked(obj: Mapping[str, Any], subresource: str | None, status_separate: bool) -> dict[str, Any]:
    """The part of an object whose fields are owned through ``subresource``."""
    if subresource == "status":
        return {"status": obj["status"]} if "status" in obj else {}
    tracked = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    if status_separate:
        tracked.pop("status", None)
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _SERVER_SET_METADATA}
    if meta:
        tracked["metadata"] = meta
    return tracked


def field_paths(value: Any, prefix: Path = ()) -> set[Path]:
    """The owned fields (leaves) of a document: paths of map keys down to a value that is not a non-empty object."""
    if isinstance(value, Mapping) and value and all(isinstance(k, str) for k in value):
        paths: set[Path] = set()
        for key, child in value.items():
            paths |= field_paths(child, (*prefix, key))
        return paths
    return {prefix} if prefix else set()


def _above(a: Path, b: Path) -> bool:
    """Whether field ``b`` lies below field ``a``."""
    return len(a) < len(b) and b[:len(a)] == a


def _lookup(doc: Any, path: Path) -> tuple[bool, Any]:
    for key in path:
        if not isinstance(doc, Mapping) or key not in doc:
            return False, None
        doc = doc[key]
    return True, doc


def _remove(doc: dict[str, Any], path: Path) -> None:
    """Delete a field, then the objects the deletion left empty (not the top-level ones, e.g. ``spec``)."""
    parents = []
    node: Any = doc
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        parents.append((node, key))
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, key in reversed(parents[1:]):
        if parent[key] == {}:
            del parent[key]
        else:
            break


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    """``fieldsV1`` of a set of fields: ``{"f:spec": {"f:replicas": {}}}``."""
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def from_fields_v1(tree: Any, prefix: Path = ()) -> set[Path]:
    """The fields of a ``fieldsV1`` document (``k:``/``v:``/``i:`` list members count as their list, owned whole)."""
    if not isinstance(tree, Mapping):
        return set()
    paths: set[Path] = set()
    for key, child in tree.items():
        if key == ".":
            paths.add(prefix)
        elif key.startswith("f:"):
            below = from_fields_v1(child, (*prefix, key[2:]))
            paths |= below or {(*prefix, key[2:])}
        elif prefix:  # an item of a list: the emulator's lists are atomic
            paths.add(prefix)
    return paths


def _entries(obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The object's managed-field entries (copies); what a client wrote there that is not a list of objects is none."""
    meta = (obj or {}).get("metadata")
    managed = meta.get("managedFields") if isinstance(meta, Mapping) else None
    if not isinstance(managed, list):
        return []
    return [copy.deepcopy(dict(e)) for e in managed if isinstance(e, Mapping)]


def _owned(entry: Mapping[str, Any]) -> set[Path]:
    return from_fields_v1(entry.get("fieldsV1"))


def _same_entry(entry: Mapping[str, Any], manager: str, operation: str, subresource: str | None) -> bool:
    return (entry.get("manager"), entry.get("operation"), entry.get("subresource")) == (manager, operation, subresource)


def _set_owned(entry: dict[str, Any], paths: set[Path], api_version: str) -> None:
    fields = to_fields_v1(paths)
    if entry.get("fieldsV1") != fields or "time" not in entry:
        entry.update(fieldsType="FieldsV1", fieldsV1=fields, time=timestamp(), apiVersion=api_version)


def _changed(before: Any, after: Any, paths: Iterable[Path]) -> set[Path]:
    """Those of ``paths`` whose value differs between the two documents (set, changed or deleted)."""
    return {path for path in paths if _lookup(before, path) != _lookup(after, path)}


def _store_entries(obj: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    kept = [e for e in entries if e.get("fieldsV1")]
    meta = obj.setdefault("metadata", {})
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)


def _new_entry(manager: str, operation: str, subresource: str | None, api_version: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"manager": manager, "operation": operation, "apiVersion": api_version, "time": timestamp(),
                             "fieldsType": "FieldsV1", "fieldsV1": {}}
    if subresource:
        entry["subresource"] = subresource
    return entry


def applied_on_create(config: dict[str, Any], manager: str, api_version: str, subresource: str | None,
                      status_separate: bool) -> dict[str, Any]:
    """The body to create from an apply configuration: the configuration with the manager's ``Apply`` entry."""
    body = copy.deepcopy(config)
    entry = _new_entry(manager, "Apply", subresource, api_version)
    entry["fieldsV1"] = to_fields_v1(field_paths(_tracked(body, subresource, status_separate)))
    _store_entries(body, [entry])
    return body


def apply(current: Mapping[str, Any], config: Mapping[str, Any], manager: str, api_version: str,
          subresource: str | None, status_separate: bool) -> dict[str, Any]:
    """Server-side apply of ``config`` by ``manager`` to the live object ``current`` (see the module docstring).

    Args:
        current: the live object (not modified).
        config: the apply configuration (``apiVersion``, ``kind``, ``metadata.name`` and the fields M wants).
        manager: the ``fieldManager``.
        api_version: ``apiVersion`` recorded in the entry.
        subresource: ``"status"`` for an apply to the status subresource, else None.
        status_separate: the resource has a ``status`` subresource (its main resource does not own ``status``).

    Returns:
        The new object, with its ``managedFields``.
    """
    entries = _entries(current)
    if not entries:
        before = field_paths(_tracked(current, None, status_separate))
        if before:
            entry = _new_entry(BEFORE_FIRST_APPLY, "Update", None, api_version)
            entry["fieldsV1"] = to_fields_v1(before)
            entries.append(entry)
    wanted = field_paths(_tracked(config, subresource, status_separate))
    mine = next((e for e in entries if _same_entry(e, manager, "Apply", subresource)), None)
    others = [e for e in entries if e is not mine]
    owned_by_others = set().union(*(_owned(e) for e in others))
    merged = merge_patch(current, config)
    kept = wanted | owned_by_others
    for path in (_owned(mine) if mine is not None else set()) - kept:
        if not any(_above(path, other) for other in kept):  # removing it would remove a field still owned
            _remove(merged, path)
    taken = _changed(current, merged, wanted)
    for entry in others:
        owned = _owned(entry)
        if owned & taken:
            _set_owned(entry, owned - taken, str(entry.get("apiVersion") or api_version))
    if mine is None:
        mine = _new_entry(manager, "Apply", subresource, api_version)
        entries.append(mine)
    _set_owned(mine, wanted, api_version)
    _store_entries(merged, entries)
    return merged


def track_update(current: Mapping[str, Any], result: dict[str, Any], manager: str, api_version: str,
                 subresource: str | None, status_separate: bool) -> None:
    """Record an update (PUT or patch) by ``manager`` in ``result``'s managed fields, in place.

    Objects without managed fields are left without (the emulator tracks ownership once something applied).
    """
    entries = _entries(result)
    if not entries:
        return
    before = field_paths(_tracked(current, subresource, status_separate))
    after = field_paths(_tracked(result, subresource, status_separate))
    set_now = _changed(current, result, after)
    gone = before - after
    mine = next((e for e in entries if _same_entry(e, manager, "Update", subresource)), None)
    for entry in entries:
        if entry is mine:
            continue
        owned = _owned(entry)
        if owned & (set_now | gone):
            _set_owned(entry, owned - set_now - gone, str(entry.get("apiVersion") or api_version))
    if set_now or mine is not None:
        if mine is None:
            mine = _new_entry(manager, "Update", subresource, api_version)
            entries.append(mine)
        _set_owned(mine, (_owned(mine) - gone) | set_now, api_version)
    _store_entries(result, entries)


def describe(obj: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per ``manager/operation``, the dotted fields it owns (for tests and debugging)."""
    return {f"{e.get('manager')}/{e.get('operation')}": sorted(".".join(p) for p in _owned(e)) for e in _entries(obj)}


__all__ = ["BEFORE_FIRST_APPLY", "apply", "applied_on_create", "default_manager", "describe", "field_paths",
           "from_fields_v1", "to_fields_v1", "track_update"]
