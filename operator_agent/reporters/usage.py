"""Usage metering: a sample per allocated GPU of every Running session, an on-disk queue, ``POST /internal/v1/usage``.

Every ``GSHARE_USAGE_INTERVAL`` seconds (default 60) the usage thread (``run_usage``) does one tick:

1. **Sample.** It lists the GShareSessions of the session namespace and the session Pods (label
   ``app.kubernetes.io/managed-by=gshare-operator``), the same objects the status reports come from, and derives each
   session's phase and GPUs with the status code itself (``operator_agent.reporters.status.session_status_from_pod``: the
   Pod's phase, ``devices`` = the GPU UUIDs of HAMi's ``hami.io/vgpu-devices-allocated`` annotation). A session is
   metered while that phase is ``Running`` (a Pod in phase ``Unknown`` keeps the phase it had, so a node that stops
   reporting is metered until it comes back or the Pod is gone). For each such session it appends one sample per GPU
   covering the window from the end of that session's previous window to *now*; a GShareSession being deleted
   (``deletionTimestamp``: the session was stopped) is no longer metered.

   * First window of a session (no previous end known): from ``max(session start, now - interval, queue created)``,
     the session start being the earliest ``startedAt`` of its containers (``status.startTime`` when none has
     one). *Queue created* is when the queue file was created: a fresh file (first install, or an ``emptyDir`` lost
     with its pod) never back-fills time an earlier operator may already have reported, so losing the state costs
     at most a gap, never a double charge.
   * A session whose Pod ended (``Succeeded``/``Failed``) gets a last window up to its containers' latest
     ``finishedAt``, then nothing more. A session deleted between two ticks is not metered after the last tick;
     the control plane bills the held time no sample covered (before the first tick, after the last) itself, from
     the session's reservation to its end, so nothing here needs to reach for it.
   * Windows of a session never overlap and leave no gap: each starts exactly where the previous one ended (epoch
     milliseconds), and none is longer than ``USAGE_MAX_WINDOW_SECONDS`` (600 s): a longer stretch (a slow tick,
     an apiserver outage, an operator restart) is split into consecutive windows of at most 600 s.
   * ``sample_id`` = ``<session_id>:<device_uuid>:<window end, epoch ms>`` (``sample_id``): deterministic, and
     unique per cluster because session ids are unique and the window ends of one session strictly increase.
   * ``gpu_util_percent`` and ``memory_used_mib`` are ``null``: nothing the operator reads measures them. The
     HAMi allocation says what a container *may* use (its ``gpumem`` limit), not what it uses, and reporting the
     limit as usage would be a lie. The honest sources are DCGM (``dcgm-exporter``) or HAMi's vGPU monitor
     (``hami-device-plugin``'s metrics port, ``vGPU_device_memory_usage_in_bytes``) on each node; neither is read
     here (and the emulated clusters have neither). Billing does not need them: it charges the allocation's share.

   The samples and the session's new window end are written in **one** SQLite transaction (``synchronous=FULL``)
   before anything is sent: a crash leaves either both or neither, so a restart neither samples a window twice nor
   skips one -- time that passed while the operator was down is covered by the next tick, split into 600 s windows.

2. **Send.** Queued samples go out oldest first, at most ``USAGE_MAX_SAMPLES_PER_CALL`` (5,000) per call, through
   ``ControlPlaneClient`` (token handling and retries with backoff). They leave the queue only when the control
   plane has answered for them:

   * 200: the batch is removed (ingestion is idempotent on ``(cluster, sample_id)``: a batch whose answer was lost
     is sent again, harmlessly);
   * 400 ``invalid_usage_sample`` with ``index``: that one sample is dropped with an error log naming it, the rest
     is sent again at once (nothing of a refused batch is stored): a poison sample cannot block the queue;
   * 403 ``forbidden_cluster_scope``: a batch of several sessions is sent again session by session, and the samples
     of a session refused on its own are dropped with an error log (a foreign GShareSession cannot block ours);
   * 5xx, 429, timeouts, connection errors (after the client's retries), 401, an unreadable token, and any other
     refusal (404 from a control plane without the route, a 400 without ``index``): everything is kept and the next
     tick tries again.

3. **Bound.** The queue holds at most ``GSHARE_USAGE_QUEUE_MAX`` samples (default 200,000); beyond it the *oldest*
   are dropped, with an error log counting them and naming the time they covered.

Queue storage: Python's standard-library ``sqlite3``, not a queue library. ``persist-queue`` (PyPI, well kept, also
SQLite underneath) was the candidate; its ``SQLiteAckQueue`` pops and acknowledges one item per call (an ``UPDATE`` and
commit each: 5,000 round trips per batch), has no size bound (dropping the oldest would mean reaching into its table),
pickles items by default, and keeps its table to itself -- so the samples and the per-session window ends could not
be written in one transaction, which is exactly what makes a restart exact. Its own SQLite layer is a thin wrapper
over ``sqlite3``; used directly, the whole queue is three small tables in one file in WAL mode: ``samples`` (ordered by
an ``AUTOINCREMENT`` insertion id, ``sample_id`` unique), ``cursors`` (per session: where its last window ended) and
``meta`` (the cluster id, when the file was created). No new dependency, and ``sqlite3`` is as well kept as Python.
A file written for another cluster is refused (its samples would be that cluster's).

Why a plain loop in its own thread and not a Kopf timer per GShareSession: the sending is one cluster-wide queue
anyway (batches mix sessions), a tick reads every session with two ``list`` calls instead of a ``GET`` per session,
and a single thread is the only writer of the SQLite file (Kopf runs handlers in a thread pool). It has its own
``ControlPlaneClient`` and apiserver client (not shared between threads), on the shared ``TokenSource``.
"""

from __future__ import annotations

import datetime
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract import (
    FORBIDDEN_CLUSTER_SCOPE,
    GSHARE_API_GROUP,
    GSHARE_API_VERSION,
    GSHARE_SESSION_PLURAL,
    INVALID_USAGE_SAMPLE,
    PHASE_FAILED,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    USAGE_MAX_SAMPLES_PER_CALL,
    USAGE_MAX_WINDOW_SECONDS,
    rfc3339,
    session_object_name,
)
from operator_agent import kube
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import (
    ControlPlaneClient,
    ControlPlaneError,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
)
from operator_agent.loop import every
from operator_agent.manifests.session import MANAGED_BY, MANAGED_BY_LABEL
from operator_agent.reporters.status import session_status_from_pod

__all__ = [
    "MAX_WINDOW_MS",
    "QueueError",
    "SessionUsage",
    "UsageQueue",
    "UsageSampler",
    "UsageSender",
    "format_ms",
    "observe_sessions",
    "parse_time_ms",
    "plan_samples",
    "queue_stats",
    "run_usage",
    "sample_id",
    "split_window",
]

logger = logging.getLogger(__name__)

MAX_WINDOW_MS = USAGE_MAX_WINDOW_SECONDS * 1000
"""Longest window of one sample, in milliseconds."""

SCHEMA_VERSION = 1
"""``PRAGMA user_version`` of the queue file."""

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)

Clock = Callable[[], int]
"""Returns the current time in epoch milliseconds."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- time and ids (pure)


def format_ms(epoch_ms: int) -> str:
    """ISO 8601 UTC with milliseconds: ``1764432000123`` -> ``2025-11-29T16:00:00.123Z``."""
    moment = _EPOCH + datetime.timedelta(milliseconds=epoch_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{epoch_ms % 1000:03d}Z"


def parse_time_ms(text: str | None) -> int | None:
    """A Kubernetes timestamp (RFC 3339, ``2026-11-29T16:00:00Z``) in epoch milliseconds; ``None`` if absent/invalid."""
    moment = rfc3339.parse(str(text), naive_as_utc=True) if text else None
    return None if moment is None else (moment - _EPOCH) // _MS


def sample_id(session_id: str, device_uuid: str, end_ms: int) -> str:
    """``<session_id>:<device_uuid>:<window end, epoch ms>``: deterministic, unique per cluster."""
    return f"{session_id}:{device_uuid}:{end_ms}"


def split_window(start_ms: int, end_ms: int, max_ms: int = MAX_WINDOW_MS) -> list[tuple[int, int]]:
    """``[start, end)`` as consecutive windows of at most ``max_ms``, the last one possibly shorter; ``[]`` if empty."""
    windows = []
    while start_ms < end_ms:
        stop = min(end_ms, start_ms + max_ms)
        windows.append((start_ms, stop))
        start_ms = stop
    return windows


# --------------------------------------------------------------------------- what to meter (pure)


@dataclass(frozen=True)
class SessionUsage:
    """A session the operator meters, as its GShareSession and Pod show it now.

    Attributes:
        session_id: ``ses_...``.
        devices: GPU UUIDs HAMi allocated to its Pod (one sample per GPU and window).
        started_ms: when its containers started (epoch ms), ``None`` when unknown.
        ended_ms: ``None`` while the session runs; when its Pod ended (``Succeeded``/``Failed``), the latest
            ``finishedAt`` of its containers (epoch ms).
    """

    session_id: str
    devices: tuple[str, ...]
    started_ms: int | None
    ended_ms: int | None = None


def pod_started_ms(pod: Mapping[str, Any]) -> int | None:
    """Earliest ``startedAt`` of the Pod's containers (running or terminated), else ``status.startTime``."""
    status = pod.get("status") or {}
    starts = []
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        for key in ("running", "terminated"):
            started = parse_time_ms((state.get(key) or {}).get("startedAt"))
            if started is not None:
                starts.append(started)
    if starts:
        return min(starts)
    return parse_time_ms(status.get("startTime"))


def pod_ended_ms(pod: Mapping[str, Any]) -> int | None:
    """Latest ``finishedAt`` of the Pod's terminated containers, ``None`` when none has one."""
    ends = [
        parse_time_ms(((container.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for container in (pod.get("status") or {}).get("containerStatuses") or []
    ]
    known = [end for end in ends if end is not None]
    return max(known) if known else None


def observe_sessions(sessions: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> tuple[
        list[SessionUsage], set[str]]:
    """The sessions to meter now, from the GShareSession objects and the session Pods (JSON dicts).

    Returns:
        ``(metered, present)``: the Running sessions with GPUs, and the Succeeded/Failed ones whose containers'
        end is known (``SessionUsage.ended_ms``); and the ids of every session that still has its GShareSession
        and Pod (whose stored window end must be kept).
    """
    pods_by_name = {(pod.get("metadata") or {}).get("name"): pod for pod in pods}
    metered: list[SessionUsage] = []
    present: set[str] = set()
    for gss in sessions:
        metadata = gss.get("metadata") or {}
        session_id = (gss.get("spec") or {}).get("sessionId")
        if not session_id:
            continue
        pod = pods_by_name.get(session_object_name(session_id))
        if pod is None:
            continue
        owners = [ref.get("uid") for ref in (pod.get("metadata") or {}).get("ownerReferences") or []]
        if metadata.get("uid") and metadata["uid"] not in owners:
            continue  # not this GShareSession's Pod (the status code ignores it too)
        present.add(session_id)
        if metadata.get("deletionTimestamp"):
            continue  # stopped: no longer metered
        status = session_status_from_pod(pod, gss.get("status"), pod_name=f"pod {metadata.get('name')}")
        if status is None or not status["devices"]:
            continue
        if status["phase"] == PHASE_RUNNING:
            ended = None
        elif status["phase"] in (PHASE_SUCCEEDED, PHASE_FAILED):
            ended = pod_ended_ms(pod)
            if ended is None:
                continue
        else:
            continue
        metered.append(SessionUsage(session_id=session_id, devices=tuple(status["devices"]),
                                    started_ms=pod_started_ms(pod), ended_ms=ended))
    return metered, present


def plan_samples(metered: Iterable[SessionUsage], cursors: Mapping[str, int], *, now_ms: int, interval_ms: int,
                 floor_ms: int = 0) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The samples of one tick and each sampled session's new window end.

    Args:
        metered: the sessions to meter (``observe_sessions``).
        cursors: per session id, where its previous window ended (epoch ms).
        now_ms: now, epoch ms.
        interval_ms: the sampling interval (bounds the first window of a session).
        floor_ms: no first window starts before this instant (when the queue file was created).

    Returns:
        ``(samples, ends)``: samples in time order (per session: window by window, one per GPU), as sent in
        ``POST /internal/v1/usage``; ``ends`` maps each session that got samples to its last window end.
    """
    samples: list[dict[str, Any]] = []
    ends: dict[str, int] = {}
    for session in metered:
        end = now_ms if session.ended_ms is None else min(session.ended_ms, now_ms)
        cursor = cursors.get(session.session_id)
        if cursor is None:
            start = max(now_ms - interval_ms, floor_ms, session.started_ms if session.started_ms is not None else 0)
        else:
            start = cursor
        windows = split_window(start, end)
        if not windows:
            continue
        for window_start, window_end in windows:
            for device in session.devices:
                samples.append({
                    "sample_id": sample_id(session.session_id, device, window_end),
                    "session_id": session.session_id,
                    "device_uuid": device,
                    "start": format_ms(window_start),
                    "end": format_ms(window_end),
                    "gpu_util_percent": None,
                    "memory_used_mib": None,
                })
        ends[session.session_id] = end
    return samples, ends


# --------------------------------------------------------------------------- the queue


class QueueError(Exception):
    """The queue file cannot be opened or used (missing directory, permissions, another cluster's file)."""


@dataclass(frozen=True)
class QueuedSample:
    """A sample in the queue: ``row`` is its insertion id, ``sample`` its JSON body."""

    row: int
    sample: dict[str, Any]

    @property
    def session_id(self) -> str:
        return self.sample["session_id"]


class UsageQueue:
    """The bounded on-disk queue of unsent samples, and each session's last window end; one SQLite file.

    Used from one thread (the connection is not shared). See the module docstring for the layout.

    Args:
        path: the SQLite file; its directory must exist.
        max_samples: most samples kept; beyond it the oldest are dropped.
        cluster_id: the cluster this file belongs to (a file of another cluster is refused).
        clock: epoch ms (recorded as the creation time of a new file).

    Raises:
        QueueError: the file cannot be opened or created, or belongs to another cluster.
    """

    def __init__(self, path: str, *, max_samples: int, cluster_id: str, clock: Clock = _now_ms):
        if max_samples < 1:
            raise ValueError("max_samples must be >= 1")
        self.path = path
        self.max_samples = max_samples
        try:
            self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise QueueError(f"cannot open the usage queue {path}: {exc}") from exc
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a sample is on disk before it is sent
            self._setup(cluster_id, clock())
        except sqlite3.Error as exc:
            self._db.close()
            raise QueueError(f"cannot use the usage queue {path}: {exc}") from exc
        except QueueError:
            self._db.close()
            raise

    def _setup(self, cluster_id: str, now_ms: int) -> None:
        with self._transaction():
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise QueueError(f"the usage queue {self.path} was written by a newer operator (schema {version})")
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS samples (id INTEGER PRIMARY KEY AUTOINCREMENT, sample_id TEXT NOT NULL UNIQUE,"
                " session_id TEXT NOT NULL, device_uuid TEXT NOT NULL, start_ms INTEGER NOT NULL, end_ms INTEGER NOT NULL,"
                " gpu_util_percent REAL, memory_used_mib INTEGER)")
            self._db.execute("CREATE TABLE IF NOT EXISTS cursors (session_id TEXT PRIMARY KEY, end_ms INTEGER NOT NULL)")
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('cluster_id', ?)", (cluster_id,))
            self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('created_ms', ?)", (str(now_ms),))
            meta = dict(self._db.execute("SELECT key, value FROM meta"))
        if meta["cluster_id"] != cluster_id:
            raise QueueError(f"the usage queue {self.path} belongs to cluster {meta['cluster_id']}, not {cluster_id}: "
                             "give each cluster's operator its own GSHARE_USAGE_QUEUE_PATH")
        self.created_ms = int(meta["created_ms"])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> UsageQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]

    def cursors(self) -> dict[str, int]:
        """Per session id, where its last sampled window ended (epoch ms)."""
        return dict(self._db.execute("SELECT session_id, end_ms FROM cursors"))

    def record(self, samples: Sequence[Mapping[str, Any]], ends: Mapping[str, int], *, forget: Iterable[str] = ()) -> int:
        """Append ``samples``, set the sessions' window ``ends`` and forget the cursors of ``forget``, in one transaction.

        Then drop the oldest samples beyond ``max_samples`` (same transaction). A ``sample_id`` already queued is
        not queued twice.

        Returns:
            How many old samples were dropped to stay within the bound (also logged as an error).
        """
        rows = [(s["sample_id"], s["session_id"], s["device_uuid"], _iso_ms(s["start"]), _iso_ms(s["end"]),
                 s.get("gpu_util_percent"), s.get("memory_used_mib")) for s in samples]
        with self._transaction():
            self._db.executemany(
                "INSERT OR IGNORE INTO samples (sample_id, session_id, device_uuid, start_ms, end_ms, gpu_util_percent,"
                " memory_used_mib) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.executemany("INSERT INTO cursors (session_id, end_ms) VALUES (?, ?) ON CONFLICT (session_id)"
                                 " DO UPDATE SET end_ms = excluded.end_ms", list(ends.items()))
            self._db.executemany("DELETE FROM cursors WHERE session_id = ?", [(s,) for s in forget])
            excess = len(self) - self.max_samples
            if excess > 0:
                first, last = self._db.execute(
                    "SELECT MIN(start_ms), MAX(end_ms) FROM (SELECT start_ms, end_ms FROM samples ORDER BY id LIMIT ?)",
                    (excess,)).fetchone()
                self._db.execute("DELETE FROM samples WHERE id IN (SELECT id FROM samples ORDER BY id LIMIT ?)", (excess,))
        if excess > 0:
            logger.error("usage queue full (GSHARE_USAGE_QUEUE_MAX=%d): dropped the %d oldest unsent samples "
                         "(windows between %s and %s); that usage will not be charged", self.max_samples, excess,
                         format_ms(first), format_ms(last))
            return excess
        return 0

    def peek(self, limit: int) -> list[QueuedSample]:
        """The ``limit`` oldest samples, oldest first."""
        cursor = self._db.execute(
            "SELECT id, sample_id, session_id, device_uuid, start_ms, end_ms, gpu_util_percent, memory_used_mib"
            " FROM samples ORDER BY id LIMIT ?", (limit,))
        return [QueuedSample(row, {"sample_id": sid, "session_id": session, "device_uuid": device,
                                   "start": format_ms(start), "end": format_ms(end), "gpu_util_percent": util,
                                   "memory_used_mib": memory})
                for row, sid, session, device, start, end, util, memory in cursor]

    def remove(self, queued: Iterable[QueuedSample]) -> None:
        """Remove samples the control plane answered for."""
        with self._transaction():
            self._db.executemany("DELETE FROM samples WHERE id = ?", [(q.row,) for q in queued])


def queue_stats(path: str, *, timeout: float = 2.0) -> tuple[int, int | None] | None:
    """How many samples wait in the queue file at ``path`` and when the oldest of them was taken, read-only.

    Opens its own read-only connection (the queue's own belongs to the usage thread), for the operator's ``/metrics``.

    Args:
        path: the queue file (``GSHARE_USAGE_QUEUE_PATH``).
        timeout: seconds to wait for the usage thread's write lock.

    Returns:
        ``(depth, oldest_end_ms)``: the number of unsent samples and the window end (epoch ms) of the oldest one
        (``None`` when the queue is empty); ``None`` when the file does not exist yet or cannot be read.
    """
    if not os.path.exists(path):
        return None
    try:
        db = sqlite3.connect(f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro", uri=True, timeout=timeout)
    except sqlite3.Error:
        return None
    try:
        depth, oldest = db.execute("SELECT COUNT(*), MIN(end_ms) FROM samples").fetchone()
    except sqlite3.Error:
        return None
    finally:
        db.close()
    return int(depth), None if oldest is None else int(oldest)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an exception) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _iso_ms(text: str) -> int:
    value = parse_time_ms(text)
    if value is None:
        raise ValueError(f"not an ISO 8601 time: {text!r}")
    return value


# --------------------------------------------------------------------------- sending


class UsageSender:
    """Sends the queue, oldest first, in batches of at most ``batch_size`` (see the module docstring for the rules).

    Args:
        client: the control-plane client (its own ``requests`` session: it is used from this thread only).
        queue: the usage queue.
        batch_size: samples per call (the contract's maximum by default).
    """

    def __init__(self, client: ControlPlaneClient, queue: UsageQueue, *, batch_size: int = USAGE_MAX_SAMPLES_PER_CALL):
        if not 1 <= batch_size <= USAGE_MAX_SAMPLES_PER_CALL:
            raise ValueError(f"batch_size must be between 1 and {USAGE_MAX_SAMPLES_PER_CALL}")
        self._client = client
        self._queue = queue
        self.batch_size = batch_size

    def flush(self) -> bool:
        """Send until the queue is empty (``True``) or the control plane cannot take more now (``False``)."""
        while True:
            batch = self._queue.peek(self.batch_size)
            if not batch:
                return True
            if not self._send(batch, split_sessions=True):
                return False

    def _send(self, batch: list[QueuedSample], *, split_sessions: bool) -> bool:
        """POST one batch; ``True`` when samples left the queue (sent or dropped), ``False`` to retry later."""
        try:
            answer = self._client.post_usage([q.sample for q in batch])
        except ControlPlaneRejected as exc:
            return self._refused(batch, exc, split_sessions=split_sessions)
        except ControlPlaneUnavailable as exc:
            logger.warning("usage not reported (%d samples queued, kept): %s", len(self._queue), exc)
            return False
        except ControlPlaneError:  # 401 or no token: logged by the client; kept for the next tick
            return False
        self._queue.remove(batch)
        accepted, duplicates = answer.get("accepted"), answer.get("duplicates")
        logger.info("usage reported: %d samples (%s accepted, %s duplicates, charged %s), %d left in the queue",
                    len(batch), accepted, duplicates, answer.get("charged"), len(self._queue))
        if isinstance(accepted, int) and isinstance(duplicates, int) and accepted + duplicates != len(batch):
            logger.warning("usage batch of %d samples answered with %d accepted + %d duplicates", len(batch), accepted,
                           duplicates)
        return True

    def _refused(self, batch: list[QueuedSample], exc: ControlPlaneRejected, *, split_sessions: bool) -> bool:
        index = exc.body.get("index")
        if exc.status == 400 and exc.code == INVALID_USAGE_SAMPLE and type(index) is int and 0 <= index < len(batch):
            poison = batch[index]
            logger.error("usage sample %s dropped: the control plane refused it (%s: %s); sample: %s",
                         poison.sample["sample_id"], exc.code, exc.detail, poison.sample)
            self._queue.remove([poison])
            return True
        if exc.status == 403 and exc.code == FORBIDDEN_CLUSTER_SCOPE:
            sessions = list(dict.fromkeys(q.session_id for q in batch))
            if split_sessions and len(sessions) > 1:
                logger.warning("usage batch of %d samples (%d sessions) refused with 403 %s; sending it session by "
                               "session", len(batch), len(sessions), exc.code)
                progress = False
                for session in sessions:
                    if not self._send([q for q in batch if q.session_id == session], split_sessions=False):
                        return progress
                    progress = True
                return progress
            logger.error("usage of session%s %s dropped (%d samples): the control plane says it is not this cluster's "
                         "(403 %s: %s)", "s" if len(sessions) > 1 else "", ", ".join(sessions), len(batch), exc.code,
                         exc.detail)
            self._queue.remove(batch)
            return True
        logger.error("usage batch of %d samples refused with %s %s; kept (%d queued), tried again next tick",
                     len(batch), exc.status, exc.code or "error", len(self._queue))
        return False


# --------------------------------------------------------------------------- sampling


class UsageSampler:
    """Reads the sessions through the apiserver and queues one tick's samples (see the module docstring).

    Args:
        api_client: client of the data-plane apiserver (not shared with another thread).
        queue: the usage queue (the cursors live there too).
        namespace: the session namespace.
        interval: the sampling interval, seconds.
        request_timeout: seconds per apiserver call.
        clock: epoch ms.
    """

    def __init__(self, api_client: kube.ApiClient, queue: UsageQueue, *, namespace: str, interval: float,
                 request_timeout: float | None = None, clock: Clock = _now_ms):
        self.core = kube.core_v1(api_client)
        self.custom = kube.custom_objects(api_client)
        self.queue = queue
        self.namespace = namespace
        self.interval_ms = max(1, round(interval * 1000))
        self._timeout: dict[str, Any] = {} if request_timeout is None else {"_request_timeout": request_timeout}
        self._clock = clock

    def read_cluster(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The GShareSessions and the session Pods of the namespace, as JSON.

        Raises:
            kube.ApiException, or a transport error (``kube.apiserver_call`` makes it ``KubeUnavailable``).
        """
        sessions = self.custom.list_namespaced_custom_object(
            GSHARE_API_GROUP, GSHARE_API_VERSION, self.namespace, GSHARE_SESSION_PLURAL, **self._timeout)
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
                                             **self._timeout)
        return list(sessions.get("items") or []), self.core.api_client.sanitize_for_serialization(pods.items)

    def tick(self) -> int | None:
        """Queue the samples of this tick; return how many, or ``None`` when the apiserver could not be read."""
        try:
            with kube.apiserver_call():
                sessions, pods = self.read_cluster()
        except kube.ApiException as exc:
            logger.warning("usage not sampled: cannot list sessions and pods (apiserver answered %s %s); the next "
                           "sample covers this interval", exc.status, exc.reason)
            return None
        except kube.KubeUnavailable as exc:
            logger.warning("usage not sampled: cannot reach the apiserver (%s); the next sample covers this interval", exc)
            return None
        return self.record(sessions, pods)

    def record(self, sessions: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> int:
        """Queue the samples the given GShareSessions and Pods imply now; return how many."""
        metered, present = observe_sessions(sessions, pods)
        cursors = self.queue.cursors()
        samples, ends = plan_samples(metered, cursors, now_ms=self._clock(), interval_ms=self.interval_ms,
                                     floor_ms=self.queue.created_ms)
        gone = [session for session in cursors if session not in present]
        if samples or ends or gone:
            self.queue.record(samples, ends, forget=gone)
        if samples:
            logger.debug("usage sampled: %d samples of %d sessions", len(samples), len(ends))
        return len(samples)


# --------------------------------------------------------------------------- the loop


def run_usage(config: OperatorConfig, api_client: kube.ApiClient, client: ControlPlaneClient,
              stop: threading.Event, *, clock: Clock = _now_ms) -> None:
    """Sample and send every ``config.usage_interval`` seconds (start to start, first at once) until ``stop`` is set.

    The queue file is opened on the first tick; while it cannot be (no such directory, permissions, another
    cluster's file), usage is neither sampled nor sent, the error is logged (again only when it changes), and every
    tick tries again. The other loops of the operator are not affected.

    Args:
        config: operator settings (interval, queue path and bound, namespace, timeouts).
        api_client: client of the data-plane apiserver (not shared with another thread).
        client: control-plane client (its own ``requests`` session, the shared ``TokenSource``).
        stop: set to stop; a wait between ticks ends at once.
        clock: epoch ms.
    """
    queue: UsageQueue | None = None
    sampler: UsageSampler | None = None
    sender: UsageSender | None = None
    last_error = None

    def tick() -> None:
        nonlocal queue, last_error, sampler, sender
        try:
            if queue is None:
                queue = UsageQueue(config.usage_queue_path, max_samples=config.usage_queue_max,
                                   cluster_id=config.cluster_id, clock=clock)
                logger.info("usage sampled every %gs into %s (%d samples queued, at most %d)", config.usage_interval,
                            os.path.abspath(config.usage_queue_path), len(queue), config.usage_queue_max)
                sampler = UsageSampler(api_client, queue, namespace=config.session_namespace,
                                       interval=config.usage_interval, request_timeout=config.http_timeout,
                                       clock=clock)
                sender = UsageSender(client, queue)
            sampler.tick()
            sender.flush()
        except QueueError as exc:
            if str(exc) != last_error:
                logger.error("usage metering off until this is fixed: %s (GSHARE_USAGE_QUEUE_PATH)", exc)
                last_error = str(exc)

    try:
        every(config.usage_interval, tick, stop, logger=logger, what="usage tick")
    finally:
        if queue is not None:
            queue.close()
