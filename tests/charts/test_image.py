"""The one image both charts run: same repository and version in both, and every container command is an
entry point the project (as the Dockerfile copies it) actually has. No Docker engine is needed."""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import get_commands

from tests.charts.rendering import (
    CONTROL_PLANE_CHART,
    CONTROL_PLANE_FULL_VALUES,
    OPERATOR_CHART,
    OPERATOR_VALUES,
    ROOT,
    chart_defaults,
    chart_metadata,
    containers,
    render_control_plane,
    render_operator,
)

ALL_CONTAINERS = [
    *(c for _, c in containers(render_control_plane(CONTROL_PLANE_FULL_VALUES))),
    *(c for _, c in containers(render_operator(OPERATOR_VALUES))),
]


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip().lstrip("/") for line in lines if line.strip() and not line.lstrip().startswith("#")]


def excluded_from_image(path: str) -> bool:
    """Whether a repository path is left out of the build context by .dockerignore (no ``!`` patterns are used)."""
    for pattern in dockerignore_patterns():
        assert not pattern.startswith("!"), "update excluded_from_image for exception patterns"
        bare = pattern.removeprefix("**/")
        parts = path.split("/")
        candidates = [path] if bare == pattern else ["/".join(parts[i:]) for i in range(len(parts))]
        for candidate in candidates:
            if fnmatch.fnmatch(candidate, bare) or candidate.startswith(bare.rstrip("/") + "/"):
                return True
    return False


def test_both_charts_default_to_the_same_image_and_version():
    control_plane, operator = chart_defaults(CONTROL_PLANE_CHART)["image"], chart_defaults(OPERATOR_CHART)["image"]
    assert control_plane["repository"] == operator["repository"]
    assert control_plane["tag"] == operator["tag"] == ""  # both follow appVersion
    assert chart_metadata(CONTROL_PLANE_CHART)["appVersion"] == chart_metadata(OPERATOR_CHART)["appVersion"]
    images = {c["image"] for c in [*(c for _, c in containers(render_control_plane())), *(c for _, c in containers(render_operator()))]}
    assert images == {f"{control_plane['repository']}:{chart_metadata(CONTROL_PLANE_CHART)['appVersion']}"}


def test_operator_chart_version_is_bumped():
    assert chart_metadata(OPERATOR_CHART)["version"] == "0.2.0"


@pytest.mark.parametrize("container", ALL_CONTAINERS, ids=lambda c: c["name"])
def test_container_command_is_an_entry_point_of_the_project(container):
    command = container["command"]
    executable, args = command[0], command[1:]
    if executable == "nginx":  # the api pod's proxy (gshare/front_proxy.py): Debian's package, installed by the Dockerfile
        assert re.search(r"apt-get install [^\n]*\bnginx\b", (ROOT / "Dockerfile").read_text()), "the Dockerfile installs no nginx"
        assert args[:2] == ["-e", "stderr"] and "-c" in args
        return
    assert (Path(sys.executable).parent / executable).exists(), f"{executable} is not installed by requirements.txt"
    if executable == "gunicorn":
        module = importlib.import_module(args[0])
        assert callable(module.application), f"{args[0]} has no WSGI application"
    elif executable == "celery":
        assert args[0] == "-A"
        app = importlib.import_module(f"{args[1]}.celery").app
        assert app.main == args[1]
        for arg in args:
            if arg.startswith("--scheduler="):
                scheduler = arg.split("=", 1)[1]
                module, _, attr = scheduler.partition(":")
                assert getattr(importlib.import_module(module), attr)
                assert scheduler == settings.CELERY_BEAT_SCHEDULER
    elif executable == "python" and args[0] == "-m":
        assert importlib.util.find_spec(f"{args[1]}.__main__") is not None, f"python -m {args[1]} has no __main__"
    elif executable == "python" and args[0] == "manage.py":
        assert (ROOT / "manage.py").exists()
        assert args[1] in get_commands(), f"manage.py has no command {args[1]}"
    else:
        pytest.fail(f"unexpected command {command}")


@pytest.mark.parametrize("path", [
    "requirements.txt", "manage.py", "gshare/wsgi.py", "gshare/celery.py", "operator_agent/__main__.py",
    "identity/management/commands/import_signing_key.py", "console/templates", "charts/gshare-operator/Chart.yaml",
    "charts/gshare-operator/crds/gsharesessions.gshare.io.yaml",
])
def test_the_build_context_keeps_what_the_charts_run(path):
    """charts/gshare-operator stays in the image: attaching a cluster installs it from there."""
    assert (ROOT / path).exists()
    assert not excluded_from_image(path)


@pytest.mark.parametrize("path", [".venv/bin/python", ".gshare/encryption.key", "staticfiles/admin/css/base.css", "gshare/__pycache__/x.pyc", ".git/HEAD"])
def test_the_build_context_leaves_out_local_state(path):
    assert excluded_from_image(path)


def test_the_image_collects_static_files_for_whitenoise():
    dockerfile = (ROOT / "Dockerfile").read_text()
    if "whitenoise.middleware.WhiteNoiseMiddleware" in settings.MIDDLEWARE:
        assert "manage.py collectstatic --noinput" in dockerfile
    user = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert user and user[-1].split(":")[0] == "65532"  # the UID the charts' securityContext requires
