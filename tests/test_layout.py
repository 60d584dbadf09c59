"""The layout rules import-linter cannot see (docs/architecture.md, "Layers"): no module reaches into another's
private names, an import inside a function says why it is not at the top, and no file outgrows a reader.

The layers themselves, and which package may import which, are import-linter's contracts (`make lint`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Every first-party package: the control plane's, the wire contract, attach and the operator, the demo.
PACKAGES = ("contract", "core", "kube", "attach", "identity", "audit", "clusters", "billing", "storage", "sessions",
            "console", "metrics", "gshare", "operator_agent", "demo")
MAX_LINES = 900


def _sources() -> list[Path]:
    files = []
    for package in PACKAGES:
        files += [path for path in (ROOT / package).rglob("*.py") if "migrations" not in path.parts]
    return sorted(files)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _first_party(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in PACKAGES


SOURCES = _sources()


def test_the_packages_hold_sources():
    assert len(SOURCES) > 100, [str(path) for path in SOURCES[:5]]


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_module_imports_another_modules_private_names(path):
    """``from pkg.mod import _name`` ties the importer to what ``pkg.mod`` may change at will: make the name public
    (and document it) or move the code that needs it next to it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = _module(path)
    private = [
        f"line {node.lineno}: from {node.module} import {alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _first_party(node.module) and node.module != own
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert not private, private


def _comment_heads_block(lines: list[str], index: int) -> bool:
    """True when a comment opens the run of imports (blank lines allowed) that holds ``lines[index]``."""
    for line in reversed(lines[:index]):
        stripped = line.strip()
        if stripped.startswith("#"):
            return True
        if stripped and not stripped.startswith(("from ", "import ")):
            return False
    return False


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_an_import_inside_a_function_says_why(path):
    """A first-party import inside a function hides a dependency from the reader and from import-linter's layer
    order at a glance; where one is right (an ``AppConfig.ready``, a command that must start without Django), a
    comment on the line or just above it gives the reason."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    unexplained = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            if not any(_first_party(name) for name in names):
                continue
            here = lines[node.lineno - 1]
            if "#" not in here and not _comment_heads_block(lines, node.lineno - 1):
                unexplained.append(f"line {node.lineno} in {function.name}(): {here.strip()}")
    assert not unexplained, unexplained


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_file_outgrows_a_reader(path):
    count = len(path.read_text().splitlines())
    assert count <= MAX_LINES, f"{count} lines: split it along what it does"
