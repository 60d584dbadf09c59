"""The simulated fleet of ``bench/fleet.py``: operators, the apiserver they share, researchers, the clock and the tally.

Every request the simulation sends is built here, in one place per route, from the operator's own code where it has
one: inventory snapshots by ``operator_agent.reporters.inventory.node_to_snapshot`` from Node JSON carrying HAMi's
``hami.io/node-nvidia-register`` annotation (the v2.10 JSON encoding), usage windows by
``operator_agent.reporters.usage.plan_samples``, status reports by ``operator_agent.reporters.status.status_report``, and every operator
call through ``operator_agent.control_plane_client.ControlPlaneClient`` with the cluster's real operator token in a file
(``max_attempts=1``: a retry would hide an error). The researchers' calls use ``http.client`` with an API token.

Not a benchmark itself: ``bench/fleet.py`` imports it.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

import contract
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient, ControlPlaneError
from operator_agent.reporters.inventory import InventoryState, node_to_snapshot, send_inventory
from operator_agent.reporters.status import status_report
from operator_agent.reporters.usage import SessionUsage, format_ms, plan_samples

#: (model as HAMi registers it, devmem MiB after HAMi's scaling, credits per GPU-hour): one model per cluster, in turn.
MODELS = [("NVIDIA H100 80GB HBM3", 81559, "2.500000"), ("NVIDIA A100-SXM4-80GB", 81920, "1.800000"),
          ("NVIDIA A100-PCIE-40GB", 40960, "1.200000"), ("NVIDIA L4", 23034, "0.400000")]
GPUS_PER_NODE = 8
SPLIT_COUNT = 10
#: (weight, gpus, gpu_memory_mib or None, gpu_cores or None): what researchers ask for.
REQUEST_MIX = [(45, 1, None, None), (10, 2, None, None), (5, 4, None, None), (2, 8, None, None),
               (25, 1, 8192, 25), (13, 1, 16384, 50)]
#: Refusals of ``POST /api/v1/sessions`` that a busy fleet answers by design; any other non-2xx is an error.
EXPECTED_CREATE_REFUSALS = {(409, "no_capacity"), (403, "quota_exceeded"), (403, "queue_limit_reached")}


#: ``value``: the wall time (``time.monotonic``) a scheduled call was due, set by ``bench/fleet.py``'s scheduler in the
#: thread running it. Operators stamp with the simulated time of that moment, so a call sent late (the control plane
#: fell behind) carries the windows it would have carried on time, as the operator's queue would send them.
CALL_DUE = threading.local()


class SimClock:
    """The fleet's clock: ``speed`` times faster than the wall clock, ``offset_s`` seconds off it at the start.

    Operators stamp usage windows with it, and status reports with it capped at the wall clock (the control plane's
    time, as the real operator does). The control plane's own clock is the wall clock and it
    accepts a window ending at most ``billing.usage.CLOCK_SKEW_SECONDS`` (300 s) ahead of it and beginning at most as
    long before its session was created: a clock that starts ``(speed - 1) * duration / 2`` behind the wall clock and
    ends as far ahead stays inside both for a run of ``duration`` wall seconds (``bench/fleet.py`` checks the bound).
    """

    def __init__(self, *, speed: float, offset_s: float):
        self.speed = speed
        self._wall0 = time.time()
        self._mono0: float | None = None
        self._offset = offset_s

    def start(self, at: float) -> None:
        """Run from the monotonic instant ``at`` (the measured part's start), ``offset_s`` off the wall clock then. Until
        then the clock stands still: a setup of any length (attach, seeding) does not push the run's end further ahead
        of the wall clock than the bound ``bench/fleet.py`` checks."""
        self._wall0 = time.time() + (at - time.monotonic())
        self._mono0 = at

    def now_ms(self) -> int:
        """Simulated now (when the running call was due, see ``CALL_DUE``), epoch milliseconds."""
        due = getattr(CALL_DUE, "value", None)
        moment = time.monotonic() if due is None else due
        elapsed = 0.0 if self._mono0 is None else max(0.0, moment - self._mono0)
        return int((self._wall0 + self._offset + self.speed * elapsed) * 1000)

    def iso(self) -> str:
        """Simulated now as RFC 3339 UTC with milliseconds."""
        return format_ms(self.now_ms())


class Tally:
    """Per path: latencies (seconds) of every answer, expected refusals by code, errors (first few kept in full)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.latencies: dict[str, list[float]] = defaultdict(list)
        self.refused: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.errors: dict[str, int] = defaultdict(int)
        self.error_samples: list[str] = []
        self.items: dict[str, int] = defaultdict(int)  # samples, reports, nodes sent per path
        self.lag: list[float] = []  # seconds each scheduled call started late
        self.dropped = 0  # scheduled calls not started by the end of the run (plus a grace): the control plane fell behind
        self.created: dict[str, float] = {}  # session id -> perf_counter of its 201
        self.stopped: dict[str, float] = {}  # session id -> perf_counter of its 202
        self._early: dict[tuple[str, str], float] = {}  # (path, session id) -> seen before its request was answered

    def ok(self, path: str, seconds: float, items: int = 0) -> None:
        with self._lock:
            self.latencies[path].append(seconds)
            self.items[path] += items

    def refusal(self, path: str, seconds: float, code: str) -> None:
        with self._lock:
            self.latencies[path].append(seconds)
            self.refused[path][code] += 1

    def error(self, path: str, message: str) -> None:
        with self._lock:
            self.errors[path] += 1
            if len(self.error_samples) < 10:
                self.error_samples.append(f"{path}: {message[:400]}")

    def mark(self, marks: dict[str, float], session_id: str, at: float, path: str) -> None:
        """Note when a session's request was sent (``at``, perf_counter): the worker's apply or delete is timed from it
        (``since``), also when the worker was faster than the answer to that request."""
        with self._lock:
            seen = self._early.pop((path, session_id), None)
            if seen is None:
                marks[session_id] = at
            else:
                self.latencies[path].append(seen - at)

    def since(self, marks: dict[str, float], session_id: str, path: str) -> None:
        """Tally the time from ``marks[session_id]`` to now under ``path`` (the worker's apply and delete)."""
        with self._lock:
            mark = marks.pop(session_id, None)
            if mark is None:
                self._early[(path, session_id)] = time.perf_counter()
            else:
                self.latencies[path].append(time.perf_counter() - mark)

    def drop(self) -> None:
        with self._lock:
            self.dropped += 1

    def late(self, seconds: float) -> None:
        with self._lock:
            self.lag.append(seconds)


# --------------------------------------------------------------------------- the shared apiserver stand-in


@dataclass
class Applied:
    """A GShareSession the control plane applied to a cluster, as its operator sees it."""

    session_id: str
    gpus: int
    node: str | None = None
    devices: tuple[str, ...] = ()
    reported: str | None = None  # last phase sent in a status report
    due: str | None = None  # phase to report next
    started_ms: int | None = None
    whole: bool = False  # its GPUs were taken from the free ones (and go back when it is deleted)


class Apiserver:
    """The clusters' apiservers, one loopback HTTP server: ``<url>/c/<n>`` is cluster ``n``'s.

    Answers what the control plane's worker sends (``kube.gateway``): the server-side apply of a GShareSession
    (``PATCH``, the object back) and its delete (``DELETE``, a ``Status``; 404 when gone); anything else 404 like an
    apiserver without that object. Each apply is handed to the cluster's simulated operator (``SimCluster.applied``).
    """

    def __init__(self):
        self.clusters: dict[int, SimCluster] = {}
        self.calls: dict[str, int] = defaultdict(int)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self):
                parts = self.path.split("?", 1)[0].split("/")
                # /c/<n>/apis/gshare.io/v1alpha1/namespaces/<ns>/gsharesessions/<name>
                if len(parts) >= 3 and parts[1] == "c" and parts[2].isdigit():
                    cluster = owner.clusters.get(int(parts[2]))
                    if cluster is not None and contract.GSHARE_SESSION_PLURAL in parts and parts[-2] == contract.GSHARE_SESSION_PLURAL:
                        return cluster, parts[-1]
                return None, None

            def _not_found(self) -> None:
                self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                                   "message": "not found"})

            def do_PATCH(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                cluster, name = self._route()
                owner.calls["apply"] += 1
                if cluster is None:
                    return self._not_found()
                cluster.applied(body)
                self._answer(200, {**body, "metadata": {**body.get("metadata", {}), "uid": f"uid-{name}", "resourceVersion": "1"}})

            def do_DELETE(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                cluster, name = self._route()
                owner.calls["delete"] += 1
                if cluster is None or not cluster.deleted(name):
                    return self._not_found()
                self._answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200})

            def do_GET(self):
                owner.calls["get"] += 1
                self._not_found()

            do_POST = do_PUT = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, index: int) -> str:
        """A kubeconfig for cluster ``index`` (plain HTTP on loopback, a bearer token the stand-in does not check)."""
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": f"{self.url}/c/{index}"}}],
            "users": [{"name": "bench", "user": {"token": "bench-not-checked"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        })


# --------------------------------------------------------------------------- simulated operators


def hami_node(name: str, cluster_index: int, node_index: int, *, model: str, memory_mib: int) -> dict:
    """A GPU Node as the apiserver serves it: ``gpu=on``, Ready, HAMi v2.10's JSON registration of 8 GPUs."""
    register = [{"id": f"GPU-{cluster_index:04x}{node_index:04x}-{i:04x}-4000-8000-{cluster_index:06x}{node_index:06x}", "index": i,
                 "count": SPLIT_COUNT, "devmem": memory_mib, "devcore": 100, "type": model, "numa": i // 4, "mode": "hami-core",
                 "health": True}
                for i in range(GPUS_PER_NODE)]
    return {
        "metadata": {"name": name, "labels": {contract.GPU_NODE_LABEL_KEY: contract.GPU_NODE_LABEL_VALUE,
                                              "nvidia.com/gpu.product": model.replace(" ", "-")},
                     "annotations": {contract.HAMI_NODE_REGISTER_ANNOTATION: json.dumps(register, separators=(",", ":"))}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


@dataclass
class SimCluster:
    """One cluster's operator: its GPU nodes, the GShareSessions applied to it, its three report loops' state."""

    index: int
    public_id: str
    token_file: str
    nodes: list[dict]
    clock: SimClock
    tally: Tally
    control_plane_url: str
    usage_interval_ms: int
    rng: random.Random
    sessions: dict[str, Applied] = field(default_factory=dict)
    cursors: dict[str, int] = field(default_factory=dict)
    free: list[tuple[str, str]] = field(default_factory=list)  # (node, GPU uuid) nothing runs on, HAMi's pick order
    lock: threading.Lock = field(default_factory=threading.Lock)
    turn: int = 0

    def __post_init__(self):
        self.snapshot = {"nodes": [node_to_snapshot(node) for node in self.nodes]}
        self.inventory_state = InventoryState()
        self.all_gpus = [(node["name"], device["uuid"]) for node in self.snapshot["nodes"] for device in node["devices"]]
        self.free = list(self.all_gpus)
        config = OperatorConfig(cluster_id=self.public_id, control_plane_url=self.control_plane_url, token_file=self.token_file,
                                http_timeout=60.0)
        # One client per report loop, as the operator has (a requests.Session is not shared between threads).
        self.clients = {path: ControlPlaneClient(config, session=requests.Session(), max_attempts=1)
                        for path in ("inventory", "status", "usage")}

    # -- what the apiserver stand-in hands over

    def applied(self, manifest: dict) -> None:
        """A GShareSession was applied: HAMi places its Pod on free GPUs (whole GPUs here), reported Pending then Running."""
        spec = manifest.get("spec") or {}
        session_id = spec.get("sessionId")
        with self.lock:
            if not session_id or session_id in self.sessions:
                return
            gpus = int(spec.get("gpus") or 1)
            if spec.get("gpuMemoryMiB") is None:  # whole GPUs: free ones of one node, as HAMi would pick them
                node = self.free[0][0] if self.free else None
                picked = [uuid for name, uuid in self.free if name == node][:gpus]
            else:
                node, picked = None, []
            whole = len(picked) == gpus
            if whole:
                self.free = [(n, u) for n, u in self.free if u not in picked]
            else:  # a share, or no node with enough free GPUs in this operator's view: a node's GPUs, nodes in turn
                self.turn = (self.turn + 1) % len(self.all_gpus)
                node, _ = self.all_gpus[self.turn]
                picked = [u for n, u in self.all_gpus if n == node][:gpus]
            self.tally.since(self.tally.created, session_id, "apply (worker)")
            self.sessions[session_id] = Applied(session_id, gpus, node=node, devices=tuple(picked), due=contract.PHASE_PENDING,
                                             whole=whole)

    def deleted(self, name: str) -> bool:
        """The GShareSession ``name`` was deleted: no longer reported nor metered; its GPUs are free again."""
        with self.lock:
            for session_id, applied in list(self.sessions.items()):
                if contract.session_object_name(session_id) == name:
                    del self.sessions[session_id]
                    self.tally.since(self.tally.stopped, session_id, "delete (worker)")
                    self.cursors.pop(session_id, None)
                    if applied.whole:
                        self.free.extend((applied.node, uuid) for uuid in applied.devices)
                    return True
        return False

    # -- the report loops (one call each; ``bench/fleet.py`` schedules them)

    def _call(self, path: str, send, items: int) -> bool:
        started = time.perf_counter()
        try:
            send()
        except ControlPlaneError as exc:
            self.tally.error(path, f"cluster {self.index}: {exc.status} {exc.code}: {exc}")
            return False
        self.tally.ok(path, time.perf_counter() - started, items)
        return True

    def inventory_tick(self, *, change: bool) -> None:
        """``PUT /internal/v1/inventory`` as the operator sends it (``operator_agent.reporters.inventory.send_inventory``): digest-only
        while nothing changed, the full snapshot after a change (``change``: one node's readiness flipped first)."""
        if change:
            node = self.rng.choice(self.snapshot["nodes"])
            node["ready"] = not node["ready"]
        snapshot = {"nodes": self.snapshot["nodes"]}
        started = time.perf_counter()
        try:
            answer = send_inventory(self.clients["inventory"], snapshot, state=self.inventory_state)
        except ControlPlaneError as exc:
            self.tally.error("inventory", f"cluster {self.index}: {exc.status} {exc.code}: {exc}")
            return
        path = "inventory (digest only)" if answer.get("unchanged") else "inventory (full)"
        self.tally.ok(path, time.perf_counter() - started, 0 if answer.get("unchanged") else len(self.snapshot["nodes"]))

    def has_due_reports(self) -> bool:
        """Whether a session changed phase since the last status report."""
        with self.lock:
            return any(s.due is not None for s in self.sessions.values())

    def status_tick(self) -> None:
        """``POST /internal/v1/status`` with the sessions whose phase changed since the last report (nothing when none)."""
        with self.lock:
            due = [s for s in self.sessions.values() if s.due is not None]
            now_ms = self.clock.now_ms()
            # As the real operator (operator_agent/clock.py): a status report is never stamped later than the control
            # plane's time, which refuses one from beyond GSHARE_CLOCK_SKEW_TOLERANCE ahead (report_from_future).
            reports = [status_body_report(s, min(now_ms, int(time.time() * 1000))) for s in due]
        if not reports:
            return
        if self._call("status", lambda: self.clients["status"].request("POST", contract.STATUS_PATH, json_body={"reports": reports}),
                      len(reports)):
            with self.lock:
                for s in due:
                    s.reported = s.due
                    if s.due == contract.PHASE_PENDING:
                        s.due = contract.PHASE_RUNNING  # the Pod starts by the next report
                    else:
                        s.due = None
                        s.started_ms = s.started_ms or now_ms

    def usage_tick(self) -> None:
        """``POST /internal/v1/usage``: one window per Running session GPU since its last one (``plan_samples``)."""
        with self.lock:
            metered = [SessionUsage(session_id=s.session_id, devices=s.devices, started_ms=s.started_ms)
                       for s in self.sessions.values() if s.reported == contract.PHASE_RUNNING and s.devices]
            samples, ends = plan_samples(metered, self.cursors, now_ms=self.clock.now_ms(), interval_ms=self.usage_interval_ms)
        if not samples:
            return
        for chunk in range(0, len(samples), contract.USAGE_MAX_SAMPLES_PER_CALL):
            batch = samples[chunk:chunk + contract.USAGE_MAX_SAMPLES_PER_CALL]
            if not self._call("usage", lambda batch=batch: self.clients["usage"].post_usage(batch), len(batch)):
                return  # the cursors stay: the same windows go again next tick, as the operator's queue would send them
        with self.lock:
            for session_id, end in ends.items():
                if session_id in self.sessions:
                    self.cursors[session_id] = end


def status_body_report(applied: Applied, now_ms: int) -> dict:
    """One report of ``POST /internal/v1/status`` for ``applied``'s due phase (``operator_agent.reporters.status.status_report``)."""
    return status_report(applied.session_id, {"phase": applied.due, "node": applied.node, "devices": list(applied.devices),
                                              "message": "", "observedAt": format_ms(now_ms)})


# --------------------------------------------------------------------------- researchers


@dataclass
class Researcher:
    """A user of the public API with an API token and credits."""

    name: str
    token: str
    live: list[str] = field(default_factory=list)


#: The baseline row of the report: ``/internal/ping`` on the same gunicorn during the run.
BASELINE = "ping (baseline)"


def api_call(port: int, method: str, path: str, token: str, body: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
    """One public API call on a fresh connection (gunicorn's sync workers close each one): status and decoded body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {"code": "not_json", "detail": raw[:200].decode(errors="replace")}
        return response.status, decoded if isinstance(decoded, dict) else {}
    finally:
        conn.close()


def session_request(rng: random.Random) -> dict:
    """The body of ``POST /api/v1/sessions``: a draw from ``REQUEST_MIX``."""
    _, gpus, memory, cores = rng.choices(REQUEST_MIX, weights=[m[0] for m in REQUEST_MIX])[0]
    body = {"image": "quay.io/jupyter/pytorch-notebook:cuda12-2024-11-25", "gpus": gpus}
    if memory is not None:
        body.update(gpu_memory_mib=memory, gpu_cores=cores)
    return body


def create_session(port: int, researcher: Researcher, rng: random.Random, tally: Tally, body: dict | None = None) -> str | None:
    """``POST /api/v1/sessions`` (``body``, else a draw of ``session_request``); the new session's id, or None when refused
    (expected refusals are tallied as such). A session the queue kept (``Queued``) is tallied under ``create (queued)``."""
    started = time.perf_counter()
    try:
        status, body = api_call(port, "POST", "/api/v1/sessions", researcher.token, body or session_request(rng))
    except (OSError, http.client.HTTPException) as exc:
        tally.error("create", f"{type(exc).__name__}: {exc}")
        return None
    elapsed = time.perf_counter() - started
    if status == 201 and body.get("phase") == "Queued":
        tally.ok("create (queued)", elapsed, 1)  # applied once the queue starts it: no apply latency to mark
        return body["id"]
    if status == 201:
        tally.ok("create", elapsed, 1)
        tally.mark(tally.created, body["id"], started, "apply (worker)")
        return body["id"]
    if (status, body.get("code")) in EXPECTED_CREATE_REFUSALS:
        tally.refusal("create", elapsed, f"{status} {body.get('code')}")
        return None
    tally.error("create", f"{status} {body.get('code')}: {str(body.get('detail'))[:300]}")
    return None


def stop_session(port: int, researcher: Researcher, session_id: str, tally: Tally) -> None:
    """``DELETE /api/v1/sessions/<id>`` (202)."""
    started = time.perf_counter()
    try:
        status, body = api_call(port, "DELETE", f"/api/v1/sessions/{session_id}", researcher.token)
    except (OSError, http.client.HTTPException) as exc:
        tally.error("stop", f"{type(exc).__name__}: {exc}")
        return
    if status == 202:
        tally.ok("stop", time.perf_counter() - started, 1)
        tally.mark(tally.stopped, session_id, started, "delete (worker)")
    else:
        tally.error("stop", f"{status} {body.get('code')}: {str(body.get('detail'))[:300]}")


def ping(port: int, tally: Tally) -> None:
    """``GET /internal/ping`` (no database, no auth: 204), tallied under ``BASELINE``: the same server's floor, so each path's
    p50 can be read as a multiple of it."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/internal/ping")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        tally.error(BASELINE, f"{type(exc).__name__}: {exc}")
        return
    finally:
        conn.close()
    if status == 204:
        tally.ok(BASELINE, time.perf_counter() - started)
    else:
        tally.error(BASELINE, f"{status}")


def read(port: int, researcher: Researcher, name: str, url: str, tally: Tally) -> None:
    """A researcher's ``GET`` of ``url`` (their sessions, their account), tallied under ``name``; 200 expected."""
    started = time.perf_counter()
    try:
        status, body = api_call(port, "GET", url, researcher.token)
    except (OSError, http.client.HTTPException) as exc:
        tally.error(name, f"{type(exc).__name__}: {exc}")
        return
    if status == 200:
        tally.ok(name, time.perf_counter() - started, 1)
    else:
        tally.error(name, f"{status} {body.get('code')}: {str(body.get('detail'))[:300]}")


