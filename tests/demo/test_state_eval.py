"""The documented line that runs a bare cluster's attach command from the demo's state file reads the state file the
demo was started with (``STATE``, for ``--state-file``), not the default path; README.md and docs/attach.md show the
line the demo prints."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from demo.bare_demo import STATE_EVAL
from tests.helpers import ROOT


@pytest.mark.parametrize("doc", ["README.md", "docs/attach.md"])
def test_the_docs_show_the_line_the_demo_prints(doc):
    assert STATE_EVAL in (ROOT / doc).read_text()


def test_the_line_runs_the_command_of_the_state_file_it_is_given(tmp_path: Path):
    state = tmp_path / "elsewhere" / "state.json"
    state.parent.mkdir()
    marker = tmp_path / "ran"
    state.write_text(json.dumps({"bare_clusters": [{"attach_command": f"printf 'from %s' custom-state > {marker}"}]}))
    env = {k: v for k, v in os.environ.items() if k != "STATE"} | {"STATE": str(state)}
    done = subprocess.run(["bash", "-c", STATE_EVAL], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "from custom-state"
