"""The demo's queue scene: lab-c2's H20s are all held by a long session, so a researcher asking for an H20 waits in the
fleet's queue and sees her place, the estimated start (the long session's time limit), why, and the alternatives.

``queue_scene`` sets it up through the public API, as a user would; with ``release=True`` (``make demo
DEMO_ARGS=--smoke``) it then stops the long session and waits until the queue has started the researcher's session on
the freed H20s, which shows a release admitting the head of the queue end to end (worker, beat, operator).
"""

from __future__ import annotations

import time

import requests

#: The long session holding every H20 of lab-c2 (its owner is the demo's admin).
FILLER = {"name": "h20-training-run", "image": "quay.io/jupyter/pytorch-notebook:cuda12-2024-12-02", "gpus": 8,
          "gpu_models": ["H20"], "runtime_hours": 8}
#: What the researcher asks for: two H20s, waiting in the queue if none is free.
WAITER = {"name": "h20-finetune", "image": "quay.io/jupyter/pytorch-notebook:cuda12-2024-12-02", "gpus": 2, "gpu_models": ["H20"],
          "runtime_hours": 2, "queue": True}


class QueueSceneError(RuntimeError):
    """The scene did not come out as the demo shows it (the message says what was answered)."""


def queue_scene(*, url: str, admin_token: str, researcher_token: str, cluster_id: str, release: bool = False,
                timeout: float = 90.0) -> dict:
    """Fill lab-c2's H20s and queue the researcher's H20 request; with ``release``, stop the filler and wait for the
    queue to start the researcher's session.

    Args:
        url: the control plane's public URL.
        admin_token, researcher_token: API tokens (``Bearer``) of the admin and of the researcher.
        cluster_id: lab-c2's id (``clu_...``), where the filler is pinned.
        release: stop the filler afterwards and wait for the admission.
        timeout: seconds to wait for each phase.

    Returns:
        ``{"filler": {...}, "queued": {...}}`` as the API answered them (``"admitted"`` too with ``release``).

    Raises:
        QueueSceneError: an answer was not the expected one.
    """
    api = f"{url}/api/v1/sessions"
    admin = {"Authorization": f"Bearer {admin_token}"}
    researcher = {"Authorization": f"Bearer {researcher_token}"}
    filler = requests.post(api, headers=admin, json={**FILLER, "cluster": cluster_id}, timeout=30)
    if filler.status_code != 201:
        raise QueueSceneError(f"starting {FILLER['name']} answered {filler.status_code}: {filler.text[:300]}")
    filler = filler.json()
    queued = requests.post(api, headers=researcher, json=WAITER, timeout=30)
    if queued.status_code != 201 or queued.json()["phase"] != "Queued":
        raise QueueSceneError(f"queueing {WAITER['name']} answered {queued.status_code}: {queued.text[:300]}")
    queued = queued.json()
    if queued["estimated_start"] is None or filler["id"] not in queued["waiting_for"]:
        raise QueueSceneError(f"{queued['id']} is queued without the expected estimate: {queued['waiting_for']!r}")
    scene = {"filler": filler, "queued": queued}
    if not release:
        return scene
    stopped = requests.delete(f"{api}/{filler['id']}", headers=admin, timeout=30)
    if stopped.status_code != 202:
        raise QueueSceneError(f"stopping {filler['id']} answered {stopped.status_code}: {stopped.text[:300]}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = requests.get(f"{api}/{queued['id']}", headers=researcher, timeout=10).json()
        if body["phase"] in ("Scheduled", "Starting", "Running"):
            scene["admitted"] = body
            requests.delete(f"{api}/{queued['id']}", headers=researcher, timeout=30)
            return scene
        if body["phase"] in ("Terminated", "Failed"):
            raise QueueSceneError(f"{queued['id']} left the queue unstarted: {body['message']}")
        time.sleep(0.5)
    raise QueueSceneError(f"{queued['id']} was not started within {timeout:g} s of {filler['id']}'s stop")
