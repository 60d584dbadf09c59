"""What the operator builds for the control plane is valid against the shared schemas of ``contract``."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from contract import rfc3339
from operator_agent.reporters.inventory import node_to_snapshot
from operator_agent.reporters.status import next_observed_at, session_status_from_pod, status_report
from operator_agent.reporters.storage import storage_report
from operator_agent.reporters.usage import SessionUsage, format_ms, plan_samples
from tests import contract
from tests.operator_agent.test_storage import READ_AT, capacity_list, node_fixture, pvc

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s-objects"
T0 = 1_764_432_000_000  # 2025-11-29T16:00:00Z


@pytest.mark.parametrize("name", ["node.gpu-8xh100.hami-v2.10.json", "node.gpu-8xh100.hami-v2.5-v2.7.json"])
def test_inventory_snapshot_matches_the_schema(name):
    node = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    body = {"nodes": [node_to_snapshot(node)]}
    assert body["nodes"][0]["devices"], "the fixture registers GPUs"
    assert contract.problems(contract.INVENTORY, body) == []


@pytest.mark.parametrize("pod", [
    None,
    {"metadata": {}, "spec": {}, "status": {"phase": "Pending"}},
    {"metadata": {"name": "ses-x", "annotations": {}}, "spec": {"nodeName": "gpu-h100-01"}, "status": {"phase": "Running"}},
    {"metadata": {}, "spec": {}, "status": {"phase": "Failed", "message": "x" * 5000}},
], ids=["gone", "pending", "running", "failed-long-message"])
def test_status_report_matches_the_schema(pod):
    status = session_status_from_pod(pod, {"phase": "Pending"}) or {}
    status["observedAt"] = next_observed_at(None, datetime.datetime(2026, 11, 29, 16, tzinfo=datetime.UTC))
    body = {"reports": [status_report("ses_abc123", status)]}
    assert contract.problems(contract.STATUS, body) == []


def test_storage_report_matches_the_schema():
    classes = [{"metadata": {"name": n}} for n in ("local-path", "gshare-nfs")]
    report = storage_report(read_at=READ_AT, capacities=capacity_list(), pvcs=[pvc("gshare-vol-a", volume_name="pvc-1"),
                            pvc("gshare-vol-b", volume_id="vol_b2", phase="Pending")],
                            events=[], pods=[], nodes=[node_fixture()], own_class="gshare-nfs", classes=classes)
    assert report["volumes"] and report["nodes"] and report["storage_classes"]
    assert contract.problems(contract.STORAGE_REPORT, report) == []


def test_usage_samples_match_the_schema():
    running = [SessionUsage("ses_a", ("GPU-c15bf6bc-3faf-3140-4788-0e1dcb7af8c2", "GPU-b"), started_ms=T0 - 3600_000)]
    samples, _ = plan_samples(running, {"ses_a": T0 - 1500_000}, now_ms=T0, interval_ms=60_000)
    assert len(samples) == 6  # 25 minutes: three windows of at most 10 minutes, two GPUs
    assert contract.problems(contract.USAGE, {"samples": samples}) == []


@pytest.mark.parametrize("epoch_ms", [0, T0, T0 + 123, 253_402_300_799_999])
def test_operator_times_read_back(epoch_ms):
    text = format_ms(epoch_ms)
    assert rfc3339.parse(text) == datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=epoch_ms)


def test_the_schema_checks_times_with_the_shared_reader():
    report = {"session": "ses_a", "phase": "Running", "observed_at": "2026-11-29T16:00:00"}  # no zone
    assert contract.problems(contract.STATUS, {"reports": [report]}) == ["reports/0/observed_at: '2026-11-29T16:00:00' is not a 'date-time'"]
