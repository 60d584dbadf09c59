"""The error codes registry: docs/errors.md lists exactly the codes the system answers, and every code comes from it.

The codes answered are the constants of each app's ``errors`` module (less its ``UNANSWERED``), the contract's
``ERROR_CODES``, and the codes of the bodies the api's nginx answers itself (``gshare.front_proxy`` for the demo and
the tests, the chart's proxy configuration). ``attach.errors`` holds the attach command's own codes, which it prints
and no route answers, so docs/errors.md does not list them.
"""

from __future__ import annotations

import ast
import importlib
import re

from django.conf import settings

import contract
from core import errors as core_errors
from gshare.front_proxy import PROXY_ERRORS
from tests.helpers import ROOT

#: The packages of the control plane and the attach command: every code they answer or print comes from an errors
#: module or the contract.
PACKAGES = ("attach", "audit", "billing", "clusters", "console", "core", "gshare", "identity", "kube", "metrics", "sessions", "storage")
#: Errors modules whose codes no route answers (see the module docstring).
NOT_ANSWERED_MODULES = ("attach.errors",)
_CODE = re.compile(r"[a-z][a-z0-9_]*")


def _errors_modules() -> list[str]:
    return sorted(f"{path.parent.name}.errors" for path in ROOT.glob("*/errors.py") if path.parent.name in PACKAGES)


def _codes(module_name: str) -> dict[str, str]:
    """``{constant name: code}`` of an errors module: its upper-case string constants that read as a code."""
    module = importlib.import_module(module_name)
    return {name: value for name, value in vars(module).items()
            if name.isupper() and not name.startswith("_") and isinstance(value, str) and _CODE.fullmatch(value)}


def _answered() -> set[str]:
    codes = set(contract.ERROR_CODES)
    for module_name in _errors_modules():
        if module_name not in NOT_ANSWERED_MODULES:
            module = importlib.import_module(module_name)
            codes |= set(_codes(module_name).values()) - getattr(module, "UNANSWERED", frozenset())
    codes |= {code for _status, code, _detail in PROXY_ERRORS}
    for template in (ROOT / "charts").glob("*/templates/*.yaml"):
        codes |= set(re.findall(r'"code": "([a-z_]+)"', template.read_text()))
    return codes


def _documented() -> set[str]:
    """The backticked codes of the ``code`` column of every table of docs/errors.md."""
    codes: set[str] = set()
    column = None
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if column is None:
            column = cells.index("code") if "code" in cells else -1
        elif column >= 0 and not set(cells[column]) <= set("-: "):
            codes |= set(re.findall(r"`([a-z_]+)`", cells[column]))
    return codes


def test_docs_list_exactly_the_codes_answered():
    answered, documented = _answered(), _documented()
    assert answered == documented, (
        f"answered but not in docs/errors.md: {sorted(answered - documented)}; "
        f"in docs/errors.md but answered by nothing: {sorted(documented - answered)}"
    )


def test_each_code_is_defined_once():
    owners: dict[str, list[str]] = {}
    for name in ("FORBIDDEN_CLUSTER_SCOPE", "INVENTORY_SNAPSHOT_REQUIRED", "REPORT_FROM_FUTURE", "TOKEN_INVALID",
                 "CLUSTER_DEREGISTERED", "TOKEN_REVOKED", "INVALID_USAGE_SAMPLE"):
        assert getattr(contract, name) in contract.ERROR_CODES
    for code in contract.ERROR_CODES:
        owners.setdefault(code, []).append("contract")
    for module_name in _errors_modules():
        for name, code in _codes(module_name).items():
            owners.setdefault(code, []).append(f"{module_name}.{name}")
    assert not {code: where for code, where in owners.items() if len(where) > 1}


def _inline_codes(path) -> list[str]:
    """``code="..."`` keywords, ``code = "..."`` class attributes and ``{"code": "..."}`` bodies in one module.
    A Django field validator's ``code`` is Django's (the API answers ``invalid_request`` with the field's message), so
    validators keep theirs."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if not func.endswith("Validator"):
                found += [f"code={k.value.value!r}" for k in node.keywords
                          if k.arg == "code" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)]
        elif isinstance(node, ast.ClassDef):
            found += [f"code = {stmt.value.value!r}" for stmt in node.body
                      if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "code" for t in stmt.targets)
                      and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)]
        elif isinstance(node, ast.Dict):
            found += [f'"code": {value.value!r}' for key, value in zip(node.keys, node.values, strict=True)
                      if isinstance(key, ast.Constant) and key.value == "code" and isinstance(value, ast.Constant)
                      and isinstance(value.value, str)]
    return [f"{path.relative_to(ROOT)}:{item}" for item in found]


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "errors.py" and "migrations" not in path.parts:
                yield path


def test_no_code_is_written_inline():
    inline = [item for path in _modules() for item in _inline_codes(path)]
    assert not inline, f"use a constant of the app's errors module (or the contract's): {inline}"


def test_unanswered_codes_stay_unanswered():
    """The base classes' default codes are never answered: every direct raise of those classes names its code."""
    from clusters.services import ClusterPrerequisiteMissing
    from core.exceptions import ApplicationError, Conflict

    unanswered = core_errors.UNANSWERED | importlib.import_module("clusters.errors").UNANSWERED
    defaults = {cls.__name__: cls.code for cls in (ApplicationError, Conflict, ClusterPrerequisiteMissing)}
    assert set(defaults.values()) <= unanswered
    bare = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if func in defaults and not any(k.arg == "code" for k in node.keywords):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno} {func}")
                if func in ("AuthenticationFailed", "Throttled"):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno} {func}")
            elif isinstance(node, ast.Name) and node.id == "throttle_classes":
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno} throttle_classes")
    assert not bare, f"these would answer a code docs/errors.md does not list: {bare}"
    assert not settings.REST_FRAMEWORK.get("DEFAULT_THROTTLE_CLASSES")
