"""The session reconcile (operator_agent.sessions, operator_agent.reporters.status) against a real Kubernetes API emulator and a loopback control plane.

The emulator (``demo.emulator.EmulatedCluster``, seeded with the demo cluster ``lab-c1``, the
GShareSession CRD of the chart and the session namespace) plays scheduler and kubelet
(``pod_startup_seconds``) and the garbage collector (``ownerReferences``). The control plane is
a small ``http.server`` on 127.0.0.1 recording ``POST /internal/v1/status``. Kopf runs for real
in a thread (``run_sessions``), exactly as ``python -m operator_agent`` runs it.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import pytest
import yaml

from contract import (
    FORBIDDEN_CLUSTER_SCOPE,
    GSHARE_API_GROUP,
    GSHARE_API_VERSION,
    GSHARE_SESSION_PLURAL,
    SESSION_ID_LABEL,
    SESSION_NAMESPACE_DEFAULT,
    STATUS_PATH,
)
from demo import fleet
from demo.emulator import EmulatedCluster
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.hami_pods import HAMI_POD_DEVICES_ALLOCATED_ANNOTATION, allocated_device_uuids
from operator_agent.reporters.status import (
    StatusReporter,
    next_observed_at,
    session_status_from_pod,
    status_report,
)
from operator_agent.sessions.kopf_handlers import connection_info, run_sessions
from tests.helpers import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = REPO_ROOT / "charts" / "gshare-operator" / "crds" / "gsharesessions.gshare.io.yaml"
NAMESPACE = SESSION_NAMESPACE_DEFAULT
CLUSTER = "lab-c1"
APISERVER_TOKEN = "emulator-token"
OPERATOR_TOKEN = "operator-token-value"
WAIT = 20.0


# --------------------------------------------------------------------------- loopback control plane


@dataclass
class FakeControlPlane:
    """Records every request; answers 200 ``{"applied": n}`` unless a scripted reply is queued."""

    url: str = ""
    requests: list = field(default_factory=list)
    script: deque = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reports(self, session: str | None = None) -> list[dict]:
        """Reports of the accepted (2xx) ``POST /internal/v1/status`` calls, in arrival order."""
        with self.lock:
            accepted = [r for r in self.requests if r["path"] == STATUS_PATH and r["status"] < 300]
        found = [report for r in accepted for report in r["body"]["reports"]]
        return [r for r in found if session is None or r["session"] == session]

    def phases(self, session: str) -> list[str]:
        return [r["phase"] for r in self.reports(session)]


@pytest.fixture
def control_plane() -> Iterator[FakeControlPlane]:
    state = FakeControlPlane()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            with state.lock:
                status, reply = state.script.popleft() if state.script else (200, None)
                if reply is None:
                    # Its own time, as the control plane answers it: the operator caps its reports' observed_at at it.
                    now = datetime.datetime.now(datetime.UTC).isoformat()
                    reply = {"applied": len(body["reports"]), "ignored": 0, "server_time": now}
                state.requests.append({"path": self.path, "authorization": self.headers.get("Authorization"),
                                       "body": body, "status": status})
            payload = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- emulated cluster + operator


def seed(*, with_crd: bool = True) -> list[dict]:
    """The demo cluster, its session namespace and (unless ``with_crd`` is false) the chart's GShareSession CRD."""
    objects = [o for o in fleet.cluster_objects(CLUSTER) if o["kind"] != "CustomResourceDefinition"]
    if not any(o["kind"] == "Namespace" and o["metadata"]["name"] == NAMESPACE for o in objects):
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    if with_crd:
        objects.append(yaml.safe_load(CRD_FILE.read_text(encoding="utf-8")))
    return objects


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    with EmulatedCluster(seed(), version=fleet.cluster_version(CLUSTER), token=APISERVER_TOKEN,
                         pod_startup_seconds=0.2) as running:
        yield running


def api_client_for(cluster: EmulatedCluster) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config_dict(cluster.kubeconfig(CLUSTER))


def operator_config(tmp_path: Path, control_plane: FakeControlPlane, **overrides: Any) -> OperatorConfig:
    token = tmp_path / "internal-jwt"
    token.write_text(OPERATOR_TOKEN)
    values = {"cluster_id": "clu_test", "control_plane_url": control_plane.url, "token_file": str(token),
              "http_timeout": 5.0, "backoff_max": 1.0, "reconcile_interval": 0.5, "session_namespace": NAMESPACE}
    values.update(overrides)
    return OperatorConfig(**values)


class Operator:
    """``run_sessions`` in a thread, as ``python -m operator_agent`` runs it."""

    def __init__(self, cluster: EmulatedCluster, config: OperatorConfig):
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.api_client = api_client_for(cluster)
        self.client = ControlPlaneClient(config, sleep=self.stop.wait, stopped=self.stop.is_set)
        self.thread = threading.Thread(target=run_sessions, args=(config, self.api_client, self.client, self.stop),
                                       kwargs={"ready": self.ready}, daemon=True)

    def start(self) -> Operator:
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the session reconciler did not stop"
        self.client.session.close()
        self.api_client.close()


@pytest.fixture
def start_operator(tmp_path, control_plane) -> Iterator[Callable[..., Operator]]:
    started: list[Operator] = []

    def start(cluster: EmulatedCluster, **overrides: Any) -> Operator:
        operator = Operator(cluster, operator_config(tmp_path, control_plane, **overrides)).start()
        started.append(operator)
        assert operator.ready.wait(WAIT), "Kopf did not start"
        return operator

    yield start
    for operator in started:
        if operator.thread.is_alive():
            operator.close()


def gshare_session(session_id: str, **spec: Any) -> dict:
    name = session_id.replace("_", "-")
    return {
        "apiVersion": f"{GSHARE_API_GROUP}/{GSHARE_API_VERSION}",
        "kind": "GShareSession",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {SESSION_ID_LABEL: session_id, "gshare.io/cluster-id": "clu_test"}},
        "spec": {
            "sessionId": session_id,
            "owner": "alice",
            "image": "quay.io/jupyter/base-notebook:2024-12-02",
            "gpus": 1,
            "gpuMemoryMiB": 8192,
            "gpuCores": 30,
            "port": 8888,
            "host": "lab-c1.gshare.localhost",
            "path": f"/s/{session_id}/",
            "authUrl": "https://gshare.example.com/internal/connect/verify",
            **spec,
        },
    }


def apply_session(cluster: EmulatedCluster, body: dict) -> dict:
    """Server-side apply, as the control plane applies GShareSessions; returns the stored object."""
    with api_client_for(cluster) as api:
        kubernetes.client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GSHARE_API_GROUP, GSHARE_API_VERSION, NAMESPACE, GSHARE_SESSION_PLURAL, body["metadata"]["name"], body,
            field_manager="gshare-control-plane", force=True, _content_type="application/apply-patch+yaml",
        )
    return session_object(cluster, body["metadata"]["name"])


def delete_session(cluster: EmulatedCluster, name: str) -> None:
    with api_client_for(cluster) as api:
        kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GSHARE_API_GROUP, GSHARE_API_VERSION, NAMESPACE, GSHARE_SESSION_PLURAL, name
        )


def named(objects: list[dict], name: str) -> dict | None:
    return next((o for o in objects if o["metadata"]["name"] == name and o["metadata"].get("namespace") == NAMESPACE),
                None)


def children(cluster: EmulatedCluster, name: str) -> tuple[dict | None, dict | None, dict | None]:
    return (
        named(cluster.objects_of("pods"), name),
        named(cluster.objects_of("services"), name),
        named(cluster.objects_of("ingresses", "networking.k8s.io"), name),
    )


def session_object(cluster: EmulatedCluster, name: str) -> dict | None:
    return named(cluster.objects_of(GSHARE_SESSION_PLURAL, GSHARE_API_GROUP, GSHARE_API_VERSION), name)


# --------------------------------------------------------------------------- end to end


def test_session_lifecycle(cluster, control_plane, start_operator):
    start_operator(cluster)
    session_id, name = "ses_lifecycle0000001", "ses-lifecycle0000001"
    gss = apply_session(cluster, gshare_session(session_id))

    pod, service, ingress = wait_for(what="pod, service and ingress", check=lambda: all(children(cluster, name)) and children(cluster, name))
    owner = {"apiVersion": "gshare.io/v1alpha1", "kind": "GShareSession", "name": name,
             "uid": gss["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    for obj in (pod, service, ingress):
        assert obj["metadata"]["ownerReferences"] == [owner]
        assert obj["metadata"]["labels"][SESSION_ID_LABEL] == session_id
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "30"}
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert service["spec"]["selector"] == {SESSION_ID_LABEL: session_id}
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/auth-url"] == "https://gshare.example.com/internal/connect/verify"
    assert annotations["nginx.ingress.kubernetes.io/auth-always-set-cookie"] == "true"
    assert ingress["spec"]["rules"][0]["host"] == "lab-c1.gshare.localhost"

    # Pending (pod created) then Running (the emulator's kubelet started it on a gpu=on node).
    wait_for(what="a Running report", check=lambda: "Running" in control_plane.phases(session_id))
    phases = control_plane.phases(session_id)
    assert phases[0] == "Pending"
    assert phases[-1] == "Running"
    running = control_plane.reports(session_id)[-1]
    assert running["node"] == "gpu-h100-01"  # the first Ready node with gpu=on, by name
    assert set(running) == {"session", "phase", "node", "devices", "message", "observed_at"}
    assert running["message"] == ""
    observed = [r["observed_at"] for r in control_plane.reports(session_id)]
    assert observed == sorted(observed) and len(set(observed)) == len(observed)  # strictly increasing
    assert all(r["authorization"] == f"Bearer {OPERATOR_TOKEN}" for r in control_plane.requests)

    status = wait_for(what="status Running", check=lambda: (session_object(cluster, name) or {}).get("status", {}).get("phase") == "Running"
                      and session_object(cluster, name)["status"])
    assert status["node"] == "gpu-h100-01"
    assert status["observedAt"] == running["observed_at"]
    # Devices: HAMi's allocation annotation when the emulator writes one (else none yet).
    pod = children(cluster, name)[0]
    if HAMI_POD_DEVICES_ALLOCATED_ANNOTATION in (pod["metadata"].get("annotations") or {}):
        expected = allocated_device_uuids(pod)
        assert expected
        wait_for(what="devices reported", check=lambda: control_plane.reports(session_id)[-1]["devices"] == expected)
        assert wait_for(what="devices in status", check=lambda: session_object(cluster, name)["status"]["devices"] == expected)
    else:
        assert running["devices"] == []

    # Nothing changes: nothing more is reported.
    count = len(control_plane.reports(session_id))
    time.sleep(1.5)
    assert len(control_plane.reports(session_id)) == count

    delete_session(cluster, name)
    wait_for(what="children deleted", check=lambda: children(cluster, name) == (None, None, None))
    wait_for(what="a Terminated report", check=lambda: control_plane.phases(session_id)[-1:] == ["Terminated"])
    time.sleep(1.0)
    assert control_plane.phases(session_id).count("Terminated") == 1
    terminated = control_plane.reports(session_id)[-1]
    assert terminated["observed_at"] > running["observed_at"]


def test_gpu_models_reach_hami_and_the_emulated_scheduler_honours_them(cluster, control_plane, start_operator):
    """``spec.gpuModels`` becomes HAMi's ``nvidia.com/use-gputype`` on the pod; lab-c1's HAMi (emulated) then passes
    over gpu-h100-01, the node it picks otherwise, for the V100 node."""
    start_operator(cluster)
    session_id, name = "ses_gpumodels0000001", "ses-gpumodels0000001"
    apply_session(cluster, gshare_session(session_id, gpuModels=["Tesla V100-PCIE-32GB"]))
    pod = wait_for(what="the pod", check=lambda: children(cluster, name)[0])
    assert pod["metadata"]["annotations"]["nvidia.com/use-gputype"] == "Tesla V100-PCIE-32GB"
    wait_for(what="a Running report", check=lambda: "Running" in control_plane.phases(session_id))
    assert control_plane.reports(session_id)[-1]["node"] == "gpu-v100-01"


def test_cpu_and_memory_become_the_pods_requests_limits_and_shm(cluster, control_plane, start_operator):
    """``spec.cpuMillicores``/``spec.memoryMiB`` become the container's requests = limits and a memory-backed ``/dev/shm``
    of half the memory, read back from the emulated cluster; a session without them keeps the old pod (no requests, no
    shm volume)."""
    start_operator(cluster)
    session_id, name = "ses_cpumemory0000001", "ses-cpumemory0000001"
    apply_session(cluster, gshare_session(session_id, cpuMillicores=500, memoryMiB=3073))
    old_id, old_name = "ses_cpumemoryold0001", "ses-cpumemoryold0001"
    apply_session(cluster, gshare_session(old_id))
    pod = wait_for(what="the pod", check=lambda: children(cluster, name)[0])
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "3073Mi"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "30",
                                                 "cpu": "500m", "memory": "3073Mi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{3073 * 512}Ki"}} in pod["spec"]["volumes"]
    assert pod["status"]["qosClass"] == "Guaranteed"  # requests = limits for cpu and memory
    wait_for(what="a Running report", check=lambda: "Running" in control_plane.phases(session_id))
    old = wait_for(what="the old-shape pod", check=lambda: children(cluster, old_name)[0])
    (old_container,) = old["spec"]["containers"]
    assert "requests" not in old_container["resources"] and "volumes" not in old["spec"]
    assert "volumeMounts" not in old_container


def test_deleted_pod_fails_the_session_and_is_not_recreated(cluster, control_plane, start_operator):
    start_operator(cluster)
    session_id, name = "ses_podgone000000001", "ses-podgone000000001"
    apply_session(cluster, gshare_session(session_id))
    wait_for(what="Running", check=lambda: "Running" in control_plane.phases(session_id))

    with api_client_for(cluster) as api:
        kubernetes.client.CoreV1Api(api).delete_namespaced_pod(name, NAMESPACE)
    wait_for(what="a Failed report", check=lambda: control_plane.phases(session_id)[-1:] == ["Failed"])
    failed = control_plane.reports(session_id)[-1]
    assert "disappeared" in failed["message"]
    assert failed["node"] == "gpu-h100-01"
    assert session_object(cluster, name)["status"]["phase"] == "Failed"
    time.sleep(1.0)
    assert children(cluster, name)[0] is None  # restartPolicy Never: a session that ended is over


def test_restart_resends_current_status_and_keeps_the_pod(cluster, control_plane, start_operator):
    first = start_operator(cluster)
    session_id, name = "ses_restart000000001", "ses-restart000000001"
    apply_session(cluster, gshare_session(session_id))
    wait_for(what="Running", check=lambda: "Running" in control_plane.phases(session_id))
    pod_uid = children(cluster, name)[0]["metadata"]["uid"]
    last = control_plane.reports(session_id)[-1]
    first.close()

    before = len(control_plane.reports(session_id))
    start_operator(cluster)
    wait_for(what="the status sent again", check=lambda: len(control_plane.reports(session_id)) > before)
    again = control_plane.reports(session_id)[-1]
    assert again == last  # same observed_at: the control plane ignores it as already applied
    assert children(cluster, name)[0]["metadata"]["uid"] == pod_uid


def test_spec_change_reapplies_service_and_ingress(cluster, control_plane, start_operator):
    start_operator(cluster)
    session_id, name = "ses_update0000000001", "ses-update0000000001"
    apply_session(cluster, gshare_session(session_id))
    wait_for(what="ingress", check=lambda: children(cluster, name)[2])
    apply_session(cluster, gshare_session(session_id, authUrl="https://other.example.com/internal/connect/verify"))
    wait_for(what="new auth-url", check=lambda: children(cluster, name)[2]["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-url"]
             == "https://other.example.com/internal/connect/verify")


def test_operator_waits_for_the_crd_and_stops_cleanly(tmp_path, control_plane, caplog):
    with EmulatedCluster(seed(with_crd=False), version=fleet.cluster_version(CLUSTER), token=APISERVER_TOKEN) as bare:
        operator = Operator(bare, operator_config(tmp_path, control_plane)).start()
        try:
            with caplog.at_level(logging.WARNING, logger="operator_agent.sessions"):
                wait_for(what="the CRD warning", check=lambda: "GShareSession CRD" in caplog.text)
            assert not operator.ready.is_set()
        finally:
            operator.close()


# --------------------------------------------------------------------------- status mapping (pure)


def pod_json(phase: str, **status: Any) -> dict:
    return {"metadata": {"name": "ses-x", "annotations": {}}, "spec": {"nodeName": "gpu-h100-01"},
            "status": {"phase": phase, **status}}


def test_status_mapping():
    assert session_status_from_pod(None, None) is None
    assert session_status_from_pod(None, {}) is None
    pending = session_status_from_pod({"metadata": {}, "spec": {}, "status": {"phase": "Pending"}}, {})
    assert pending == {"phase": "Pending", "node": "", "devices": [], "message": ""}
    running = session_status_from_pod(pod_json("Running"), {"phase": "Pending"})
    assert running == {"phase": "Running", "node": "gpu-h100-01", "devices": [], "message": ""}
    assert session_status_from_pod(pod_json("Succeeded"), {"phase": "Running"})["phase"] == "Succeeded"


def test_status_mapping_messages():
    unschedulable = pod_json("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                     "message": "0/3 nodes are available"}])
    assert session_status_from_pod(unschedulable, {})["message"] == "not scheduled (Unschedulable): 0/3 nodes are available"
    pulling = pod_json("Pending", containerStatuses=[{"name": "session", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}])
    assert session_status_from_pod(pulling, {})["message"] == "container session is waiting: ImagePullBackOff: Back-off pulling image"
    crashed = pod_json("Failed", containerStatuses=[{"name": "session", "state": {"terminated": {
        "exitCode": 137, "reason": "OOMKilled"}}}])
    assert session_status_from_pod(crashed, {"phase": "Running"}) == {
        "phase": "Failed", "node": "gpu-h100-01", "devices": [], "message": "container session exited with code 137 (OOMKilled)"}
    evicted = pod_json("Failed", reason="Evicted", message="The node was low on resource: memory.")
    assert session_status_from_pod(evicted, {})["message"] == "Evicted: The node was low on resource: memory."


def test_status_mapping_unknown_and_missing_pod():
    unknown = session_status_from_pod(pod_json("Unknown"), {"phase": "Running", "node": "gpu-h100-01"})
    assert unknown["phase"] == "Running"
    assert "Unknown" in unknown["message"]
    gone = session_status_from_pod(None, {"phase": "Running", "node": "gpu-h100-01", "devices": ["GPU-a"]}, pod_name="pod ns/p")
    assert gone == {"phase": "Failed", "node": "gpu-h100-01", "devices": ["GPU-a"],
                    "message": "pod ns/p disappeared before it ended (deleted or evicted)"}


def test_terminal_phases_are_final():
    for phase in ("Succeeded", "Failed", "Terminated"):
        previous = {"phase": phase, "node": "n", "devices": [], "message": "m"}
        assert session_status_from_pod(pod_json("Running"), previous) == previous
        assert session_status_from_pod(None, previous) == previous


def test_devices_come_from_hamis_allocation():
    pod = pod_json("Running")
    pod["metadata"]["annotations"] = {HAMI_POD_DEVICES_ALLOCATED_ANNOTATION: "GPU-a,NVIDIA,8192,30:;"}
    assert session_status_from_pod(pod, {})["devices"] == ["GPU-a"]
    pod["metadata"]["annotations"] = {HAMI_POD_DEVICES_ALLOCATED_ANNOTATION: "garbage,"}
    assert session_status_from_pod(pod, {})["devices"] == []  # logged, not raised


def test_observed_at_strictly_increases():
    now = datetime.datetime(2026, 11, 29, 16, 0, 0, tzinfo=datetime.UTC)
    assert next_observed_at(None, now) == "2026-11-29T16:00:00.000000Z"
    assert next_observed_at("2026-11-29T16:00:00.000000Z", now) == "2026-11-29T16:00:00.000001Z"
    assert next_observed_at("2026-11-29T17:00:00Z", now) == "2026-11-29T17:00:00.000001Z"  # clock behind
    assert next_observed_at("2026-11-29T15:00:00Z", now) == "2026-11-29T16:00:00.000000Z"


# --------------------------------------------------------------------------- reporter against the loopback control plane


def report(session: str, phase: str, observed_at: str, **extra: Any) -> dict:
    return status_report(session, {"phase": phase, "observedAt": observed_at, **extra})


def reporter_for(tmp_path: Path, control_plane: FakeControlPlane) -> StatusReporter:
    config = operator_config(tmp_path, control_plane)
    return StatusReporter(ControlPlaneClient(config, max_attempts=1))


def test_reporter_sends_only_changes(tmp_path, control_plane):
    reporter = reporter_for(tmp_path, control_plane)
    reporter.observe(report("ses_a", "Pending", "2026-11-29T16:00:00.000001Z"))
    reporter.observe(report("ses_b", "Running", "2026-11-29T16:00:00.000002Z", node="gpu-1"))
    assert reporter.flush()
    assert [r["session"] for r in control_plane.reports()] == ["ses_a", "ses_b"]
    assert control_plane.reports()[1] == {"session": "ses_b", "phase": "Running", "node": "gpu-1", "devices": [],
                                          "message": "", "observed_at": "2026-11-29T16:00:00.000002Z"}
    # Same essence again (a resync): nothing to send.
    reporter.observe(report("ses_a", "Pending", "2026-11-29T16:00:00.000001Z"))
    assert reporter.pending() == []
    assert reporter.flush()
    assert len(control_plane.requests) == 1
    reporter.observe(report("ses_a", "Running", "2026-11-29T16:00:01Z", node="gpu-1"))
    assert reporter.flush()
    assert [r["phase"] for r in control_plane.reports("ses_a")] == ["Pending", "Running"]


def test_reporter_keeps_reports_while_the_control_plane_is_down(tmp_path, control_plane):
    reporter = reporter_for(tmp_path, control_plane)
    control_plane.script.append((503, {"code": "unavailable", "detail": "down"}))
    reporter.observe(report("ses_a", "Pending", "2026-11-29T16:00:00Z"))
    assert not reporter.flush()
    assert len(reporter.pending()) == 1
    assert reporter.flush()
    assert control_plane.phases("ses_a") == ["Pending"]


def test_reporter_isolates_a_refused_report(tmp_path, control_plane):
    reporter = reporter_for(tmp_path, control_plane)
    refusal = {"code": FORBIDDEN_CLUSTER_SCOPE, "detail": "ses_z is not a session of this cluster"}
    control_plane.script.extend([(403, refusal), (200, None), (403, refusal)])
    reporter.observe(report("ses_a", "Running", "2026-11-29T16:00:00.000001Z"))
    reporter.observe(report("ses_z", "Running", "2026-11-29T16:00:00.000002Z"))
    assert reporter.flush()  # the batch, then ses_a alone (accepted), then ses_z alone (dropped)
    assert [len(r["body"]["reports"]) for r in control_plane.requests] == [2, 1, 1]
    assert control_plane.phases("ses_a") == ["Running"]
    assert reporter.pending() == []


def test_reporter_token_refused_retries_later(tmp_path, control_plane):
    reporter = reporter_for(tmp_path, control_plane)
    control_plane.script.append((401, {"code": "token_invalid", "detail": "expired"}))
    reporter.observe(report("ses_a", "Pending", "2026-11-29T16:00:00Z"))
    assert not reporter.flush()
    assert reporter.auth_failed
    assert reporter.flush()
    assert not reporter.auth_failed


def test_terminated_is_reported_once(tmp_path, control_plane):
    reporter = reporter_for(tmp_path, control_plane)
    reporter.observe(report("ses_a", "Running", "2026-11-29T16:00:00Z", node="gpu-1", devices=["GPU-a"]))
    assert reporter.flush()
    reporter.terminated("ses_a")
    reporter.terminated("ses_a")
    reporter.observe(report("ses_a", "Running", "2026-11-29T16:00:05Z"))  # a late event: ignored
    assert reporter.flush()
    terminated = control_plane.reports("ses_a")[-1]
    assert terminated["phase"] == "Terminated"
    assert terminated["node"] == "gpu-1" and terminated["devices"] == ["GPU-a"]
    assert terminated["observed_at"] > "2026-11-29T16:00:00Z"
    assert control_plane.phases("ses_a") == ["Running", "Terminated"]
    assert reporter.pending() == []


def test_reporter_batches_at_most_500(tmp_path, control_plane):
    reporter = reporter_for(tmp_path, control_plane)
    for i in range(501):
        reporter.observe(report(f"ses_{i:05d}", "Pending", f"2026-11-29T16:00:00.{i:06d}Z"))
    assert reporter.flush()
    assert [len(r["body"]["reports"]) for r in control_plane.requests] == [500, 1]


# --------------------------------------------------------------------------- configuration and login


def test_config_reads_session_settings():
    base = {"GSHARE_CLUSTER_ID": "clu_x", "GSHARE_CONTROL_PLANE_URL": "https://cp.example.com"}
    config = OperatorConfig.from_environ(base)
    assert (config.session_namespace, config.reconcile_interval) == ("gshare-sessions", 2.0)
    config = OperatorConfig.from_environ({**base, "GSHARE_SESSION_NAMESPACE": "gpu-sessions", "GSHARE_RECONCILE_INTERVAL": "0.5"})
    assert (config.session_namespace, config.reconcile_interval) == ("gpu-sessions", 0.5)
    from operator_agent.config import ConfigError

    with pytest.raises(ConfigError, match="GSHARE_SESSION_NAMESPACE"):
        OperatorConfig.from_environ({**base, "GSHARE_SESSION_NAMESPACE": "Not_A_Namespace"})
    with pytest.raises(ConfigError, match="GSHARE_RECONCILE_INTERVAL"):
        OperatorConfig.from_environ({**base, "GSHARE_RECONCILE_INTERVAL": "0"})


def test_connection_info_from_kubeconfig():
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:6443"}}],
        "users": [{"name": "c", "user": {"token": "abc"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "c"}}],
    }
    with kubernetes.config.new_client_from_config_dict(kubeconfig) as api:
        info = connection_info(api.configuration)
    assert isinstance(info, kopf.ConnectionInfo)
    assert (info.server, info.scheme, info.token) == ("http://127.0.0.1:6443", "Bearer", "abc")


# --------------------------------------------------------------------------- volumes


def volume(name: str, claim: str, *, storage_class: str = fleet.STORAGE_CLASS, size: str = "10Gi") -> dict:
    return {"volumeId": f"vol_{name.replace('-', '')}", "name": name, "claimName": claim,
            "storageClassName": storage_class, "size": size, "mountPath": f"/data/{name}"}


def claims(cluster: EmulatedCluster) -> dict[str, dict]:
    return {c["metadata"]["name"]: c for c in cluster.objects_of("persistentvolumeclaims")}


def test_session_volumes_get_their_pvcs_before_the_pod_and_outlive_it(cluster, control_plane, start_operator):
    # A moved volume: the control plane made a pre-bound PV and PVC on this cluster; the operator must leave them be.
    with api_client_for(cluster) as api:
        core = kubernetes.client.CoreV1Api(api)
        core.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "gshare-vol-moved-pv"},
            "spec": {"accessModes": ["ReadWriteMany"], "capacity": {"storage": "20Gi"},
                     "csi": {"driver": fleet.CSI_DRIVER, "volumeHandle": "pvc-0f0e1b55", "fsType": "nfs"},
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": fleet.STORAGE_CLASS,
                     "claimRef": {"namespace": NAMESPACE, "name": "gshare-vol-moved"}}})
        core.create_namespaced_persistent_volume_claim(NAMESPACE, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "gshare-vol-moved", "labels": {"gshare.io/volume-id": "vol_moved"}},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": fleet.STORAGE_CLASS,
                     "volumeName": "gshare-vol-moved-pv", "resources": {"requests": {"storage": "20Gi"}}}})
    moved_before = claims(cluster)["gshare-vol-moved"]
    start_operator(cluster)
    session_id, name = "ses_volumes000000001", "ses-volumes000000001"
    apply_session(cluster, gshare_session(session_id, volumes=[volume("datasets", "gshare-vol-datasets"),
                                                               volume("moved", "gshare-vol-moved", size="20Gi")]))
    wait_for(what="Running", check=lambda: "Running" in control_plane.phases(session_id))

    found = claims(cluster)
    new = found["gshare-vol-datasets"]
    assert new["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gshare", "gshare.io/volume-id": "vol_datasets",
                                         "gshare.io/volume-name": "datasets"}
    assert "ownerReferences" not in new["metadata"]
    assert new["spec"]["storageClassName"] == fleet.STORAGE_CLASS and new["spec"]["accessModes"] == ["ReadWriteMany"]
    assert new["status"]["phase"] == "Bound"  # provisioned by the emulator's democratic-csi stand-in
    moved = found["gshare-vol-moved"]
    assert moved["spec"] == {**moved_before["spec"], "volumeName": "gshare-vol-moved-pv"}
    assert moved["metadata"]["labels"] == moved_before["metadata"]["labels"]
    assert moved["status"]["phase"] == "Bound"
    pvc_writes = [r for r in cluster.requests_seen() if "/persistentvolumeclaims" in r["path"]
                  and r["method"] in ("PATCH", "PUT", "DELETE")]
    assert pvc_writes == []  # create-if-absent only

    pod = children(cluster, name)[0]
    assert pod["spec"]["volumes"] == [
        {"name": "vol-datasets", "persistentVolumeClaim": {"claimName": "gshare-vol-datasets"}},
        {"name": "vol-moved", "persistentVolumeClaim": {"claimName": "gshare-vol-moved"}},
    ]
    assert pod["spec"]["containers"][0]["volumeMounts"] == [{"name": "vol-datasets", "mountPath": "/data/datasets"},
                                                           {"name": "vol-moved", "mountPath": "/data/moved"}]

    delete_session(cluster, name)
    wait_for(what="children deleted", check=lambda: children(cluster, name) == (None, None, None))
    time.sleep(0.5)
    assert {"gshare-vol-datasets", "gshare-vol-moved"} <= set(claims(cluster))  # volumes outlive sessions


def test_a_volume_that_cannot_bind_keeps_the_session_pending_with_the_reason(cluster, control_plane, start_operator):
    start_operator(cluster)
    session_id = "ses_unbound000000001"
    apply_session(cluster, gshare_session(session_id, volumes=[volume("data", "gshare-vol-unbound",
                                                                      storage_class="no-such-class")]))
    pending = wait_for(what="a Pending report naming the claim", check=lambda: [
        r for r in control_plane.reports(session_id) if "unbound immediate PersistentVolumeClaims" in r["message"]])
    assert pending[-1]["phase"] == "Pending"
    # Which volume it waits for and why come first (the StorageClass is read at once), then the scheduler's words.
    assert pending[-1]["message"].startswith('waiting for volume data (vol_data): PVC gshare-vol-unbound is Pending: '
                                             'storageclass "no-such-class" not found on this cluster (not scheduled '
                                             "(Unschedulable): 0/3 nodes are available: pod has unbound")
    claim = claims(cluster)["gshare-vol-unbound"]
    assert claim["status"]["phase"] == "Pending"
    events = wait_for(what="the PV controller's event", check=lambda: [
        e for e in cluster.objects_of("events") if e["involvedObject"]["name"] == "gshare-vol-unbound"])
    assert [(e["reason"], e["message"]) for e in events] == [
        ("ProvisioningFailed", 'storageclass.storage.k8s.io "no-such-class" not found')]
