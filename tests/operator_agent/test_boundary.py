"""The operator never loads Django or a control-plane app (docs/architecture.md: the boundary is enforced)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "django",
    "environ",
    "rest_framework",
    "celery",
    "gshare",
    "clusters",
    "sessions",
    "storage",
    "billing",
    "demo",
)


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_importing_the_operator_does_not_load_django():
    result = run_python("import operator_agent, operator_agent.main, sys; assert 'django' not in sys.modules")
    assert result.returncode == 0, result.stderr


def test_no_operator_module_loads_a_forbidden_package():
    code = f"""
import importlib, pkgutil, sys
import operator_agent
for info in pkgutil.walk_packages(operator_agent.__path__, "operator_agent."):
    if info.name != "operator_agent.__main__":  # importing __main__ would start the operator
        importlib.import_module(info.name)
loaded = sorted({{name.split(".")[0] for name in sys.modules}} & set({FORBIDDEN!r}))
assert not loaded, loaded
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def test_import_linter_contract_is_kept():
    executable = Path(sys.executable).with_name("lint-imports")
    command = str(executable) if executable.exists() else shutil.which("lint-imports")
    assert command, "lint-imports is not installed (pip install -r requirements-dev.txt)"
    result = subprocess.run([command], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "operator_agent imports neither Django nor the control plane KEPT" in result.stdout
