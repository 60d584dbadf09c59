"""attach reaches the control plane only over its API: no attach module imports the database layer (import-linter's
``attach-over-the-api`` contract forbids the apps; it cannot name a part of Django, so this test does)."""

from __future__ import annotations

import ast
from pathlib import Path

import attach

FORBIDDEN = ("django.db",)


def _imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_attach_module_imports_the_database():
    root = Path(attach.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 10  # the package and its steps were found
    found = {
        f"{path.relative_to(root.parent)}: {name}"
        for path in files
        for name in _imported(ast.parse(path.read_text(), str(path)))
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)
    }
    assert not found
