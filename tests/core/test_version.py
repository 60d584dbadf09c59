"""One release number for the control plane, the operator and both charts (core/version.py)."""

import yaml

import operator_agent
from core.version import GSHARE_VERSION, compatible
from tests.helpers import ROOT


def test_every_part_carries_the_same_release():
    for chart in ("gshare", "gshare-operator"):
        assert yaml.safe_load((ROOT / "charts" / chart / "Chart.yaml").read_text())["appVersion"] == GSHARE_VERSION
    assert operator_agent.__version__ == GSHARE_VERSION


def test_releases_work_together_within_a_minor_version():
    assert compatible("0.2.0", "0.2.7") and compatible("v1.4.0", "1.4.2")
    assert not compatible("0.2.0", "0.3.0") and not compatible("1.2.0", "2.2.0")
