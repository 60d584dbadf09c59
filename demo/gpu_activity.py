"""Drive a demo session's GPUs: ``python -m demo.gpu_activity ses_... busy|idle`` (docs/idle.md).

The demo's HAMi stand-in (``demo.emulator.controllers.hami_monitor``) reports a new session's GPUs idle (no kernel
since its pod started). This command finds the session's cluster through the demo's API (the state file written by
``manage.py demo``) and sets its pod busy or idle through that cluster's emulator control API
(``demo.emulator.activity``), so the operator's next reading of HAMi's vGPU monitor shows it. ``--idle-timeout``
smoke runs (``idle_smoke``) use the same path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import requests

from contract import SESSION_NAMESPACE_DEFAULT, session_object_name
from core.home import gshare_home
from demo.emulator.activity import control_request


class GpuActivityError(RuntimeError):
    """The session, its cluster or its emulator could not be found or did not answer."""


def set_session_activity(state: dict[str, Any], session_id: str, activity: str) -> dict[str, Any]:
    """Mark the pod of demo session ``session_id`` ``busy`` or ``idle`` on its emulated cluster.

    Args:
        state: the demo's state (``manage.py demo``'s state file: ``url``, ``api_token``, ``clusters`` with
            ``name``, ``emulator_url`` and ``emulator_token_file``).
        session_id: ``ses_...``.
        activity: ``busy`` or ``idle``.

    Returns:
        The emulator's answer (the pod, its state and GPU readings).

    Raises:
        GpuActivityError: the session is unknown, has no cluster yet, or the emulator refused.
    """
    response = requests.get(f"{state['url']}/api/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {state['api_token']}"},
                            timeout=10)
    if response.status_code != 200:
        raise GpuActivityError(f"the demo's API answered {response.status_code} for {session_id}: {response.text[:200]}")
    name = response.json().get("cluster_name")
    cluster = next((c for c in state["clusters"] if c["name"] == name), None)
    if cluster is None:
        raise GpuActivityError(f"session {session_id} is on no demo cluster yet (cluster {name!r}); wait until it is Running")
    token = Path(cluster["emulator_token_file"]).read_text(encoding="utf-8").strip()
    path = f"/emulator/v1/gpu-activity/namespaces/{SESSION_NAMESPACE_DEFAULT}/pods/{session_object_name(session_id)}"
    status, body = control_request(cluster["emulator_url"], path, {"state": activity}, token=token)
    if status != 200:
        raise GpuActivityError(f"the emulator of {name} answered {status}: {body}")
    return body


def idle_smoke(state: dict[str, Any], *, idle_timeout: int, check_children) -> dict[str, Any]:
    """The ``--smoke --idle-timeout`` check: one session per cluster; the first marked busy, the second left idle.
    The idle one must show its warning (``idle_since``, ``stops_at``), then stop with ``stop_reason`` ``idle`` and an
    ``end`` ledger entry with its idle credits; the busy one must still run, with known activity. Both are stopped
    at the end.

    Args:
        state: the demo's state (as for ``set_session_activity``).
        idle_timeout: the demo policy's timeout, seconds.
        check_children: called while waiting (raises when a demo process died).

    Returns:
        ``{"busy": {"id", "phase", "utilization_percent"}, "idle": {"id", "stop_reason", "message", "idle_since",
        "stops_at", "idle_credits"}}``.

    Raises:
        GpuActivityError: a step did not happen in time.
    """
    headers = {"Authorization": f"Bearer {state['api_token']}"}
    api = f"{state['url']}/api/v1/sessions"
    made = []
    for cluster in state["clusters"][:2]:
        response = requests.post(api, headers=headers, timeout=30, json={
            "name": f"idle-smoke-{cluster['name']}", "image": "quay.io/jupyter/base-notebook:2024-12-02", "gpus": 1,
            "gpu_memory_mib": 2048, "gpu_cores": 20, "cluster": cluster["id"]})
        if response.status_code != 201:
            raise GpuActivityError(f"starting a session on {cluster['name']} answered {response.status_code}: {response.text[:300]}")
        made.append(response.json()["id"])

    def get(session_id: str) -> dict:
        return requests.get(f"{api}/{session_id}", headers=headers, timeout=10).json()

    def wait(what: str, check, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            check_children()
            time.sleep(0.5)
        raise GpuActivityError(f"{what} did not happen within {timeout:g} s")

    busy_id, idle_id = made
    for session_id in made:
        wait(f"session {session_id} Running", lambda s=session_id: get(s)["phase"] == "Running", 90)
    set_session_activity(state, busy_id, "busy")
    budget = idle_timeout * 2 + 60
    warned = wait(f"the idle warning of {idle_id}", lambda: (b := get(idle_id))["stops_at"] and b, budget)
    stopped = wait(f"the idle stop of {idle_id}", lambda: (b := get(idle_id))["stop_reason"] == "idle" and b, budget)
    ledger = f"{state['url']}/api/v1/billing/ledger"
    end = wait(f"the end entry of {idle_id}", lambda: next(
        (e for e in requests.get(ledger, params={"session": idle_id}, headers=headers, timeout=10).json()["results"] if e["kind"] == "end"),
        None), 30)
    busy = get(busy_id)
    gpus = busy["activity"]["gpus"]
    if busy["phase"] != "Running" or busy["stop_reason"] or busy["activity"]["state"] != "ok" or not gpus or not gpus[0]["utilization_percent"]:
        raise GpuActivityError(f"the busy session {busy_id} should run with known, non-zero GPU activity: {json.dumps(busy)[:600]}")
    for session_id in made:
        requests.delete(f"{api}/{session_id}", headers=headers, timeout=30)
    return {
        "busy": {"id": busy_id, "phase": busy["phase"], "utilization_percent": gpus[0]["utilization_percent"]},
        "idle": {"id": idle_id, "stop_reason": stopped["stop_reason"], "message": stopped["message"],
                 "idle_since": warned["idle_since"], "stops_at": warned["stops_at"], "idle_credits": end["idle_credits"],
                 "end_reason": end["reason"], "charged_while_idle": str(Decimal(end["idle_credits"]))},
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m demo.gpu_activity SESSION busy|idle [--state-file PATH]``; 0 when done, 1 on a refusal."""
    parser = argparse.ArgumentParser(prog="python -m demo.gpu_activity", description="mark a demo session's GPUs busy or idle")
    parser.add_argument("session", help="the session id (ses_...)")
    parser.add_argument("activity", choices=("busy", "idle"))
    parser.add_argument("--state-file", type=Path, default=None, help="the demo's state file (default .gshare/demo/state.json)")
    args = parser.parse_args(argv)
    path = args.state_file or gshare_home() / "demo" / "state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"gpu_activity: cannot read the demo's state file {path} ({exc}); is `make demo` running?", file=sys.stderr)
        return 1
    try:
        answer = set_session_activity(state, args.session, args.activity)
    except (GpuActivityError, requests.RequestException, OSError) as exc:
        print(f"gpu_activity: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
