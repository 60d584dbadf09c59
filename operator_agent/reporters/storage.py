"""Volume sync: what this cluster knows about gShare storage, sent with ``POST /internal/v1/storage``.

Every ``GSHARE_VOLUME_SYNC_INTERVAL`` seconds (default 60) the operator reads, through the apiserver:

* every ``CSIStorageCapacity`` object (``storage.k8s.io/v1``, all namespaces: the CSI driver's
  external-provisioner publishes them in its own namespace);
* every ``StorageClass`` (its name: the control plane uses a pool here only where its StorageClass exists);
* the PersistentVolumeClaims of the session namespace labelled ``gshare.io/volume-id`` (the volumes this
  cluster holds), the Events about them and, for pods mounting them that are stuck in ``ContainerCreating``,
  the pods' ``FailedMount`` Events;
* every Node's ``status.capacity["ephemeral-storage"]`` (its system drive, a capacity stand-in);

and reports (shape in ``contract.STORAGE_PATH``)::

    {"read_at": "2026-11-29T16:00:00.123456Z",
     "storage_classes": [{"storage_class": "gshare-nfs", "capacity_bytes": 1722936950784, "objects": 2}],
     "existing_storage_classes": ["gshare-nfs", "local-path"],
     "volumes": [{"volume_id": "vol_...", "claim_name": "gshare-vol-...", "phase": "Bound",
                  "volume_name": "pvc-...", "message": ""}],
     "nodes": [{"name": "gpu-h100-01", "disk_bytes": 1888223903744}]}

Rules (pure functions, tested on real object shapes in ``tests/fixtures/k8s-objects``):

* ``storage_classes``: one entry per StorageClass named by a CSIStorageCapacity object, plus the operator's own
  ``GSHARE_VOLUME_STORAGE_CLASS`` (``capacity_bytes: null, objects: 0`` when nothing names it). Several objects
  of one class are one per topology segment and all describe the same storage server, so ``capacity_bytes`` is
  the **largest** ``capacity`` among them, never their sum. Objects without ``capacity`` are counted in
  ``objects`` but give no value (``null`` when none has one); ``capacity: 0`` is a value (the segment has no room
  left: it never lowers the largest). Quantities (``1643124Mi``, ``102752488Ki``, ``100Gi``, plain bytes) are
  converted to bytes as ``resource.Quantity.Value()`` does (rounded up).
* ``volumes``: ``phase`` is the PVC's ``status.phase`` (``Pending`` before it has one), ``volume_name`` its
  ``spec.volumeName`` (``""`` while unbound). ``message``: when a pod mounting the PVC is stuck in
  ``ContainerCreating``, that pod's newest ``FailedMount`` Event naming the volume (e.g. a node without an NFS
  client: ``MountVolume.MountDevice failed for volume "pvc-…" : … mount failed …``); otherwise, for a PVC that
  is not ``Bound``, the newest Event about the PVC (``ProvisioningFailed``: ``storageclass.storage.k8s.io "x"
  not found``, ``ExternalProvisioning``: ``Waiting for a volume to be created …``, ``ClaimLost`` …); else ``""``.
  Events are matched to the current object by ``involvedObject.uid`` when both carry one (a PVC deleted and
  created again under the same name does not inherit its predecessor's events).
* ``existing_storage_classes``: the names of every StorageClass, sorted. Left out of the report when they cannot be
  listed (e.g. 403 from an older chart's RBAC): the control plane then knows nothing, rather than "none".
* ``nodes``: every Node that has an ``ephemeral-storage`` capacity, in bytes.
* One entry per volume id: should two PVCs carry the same ``gshare.io/volume-id``, the ``Bound`` one (else the newest)
  is reported and the other logged. Should the control plane refuse the report with 403 ``forbidden_cluster_scope``
  (a PVC here names a volume it says another cluster holds), it is sent again without ``volumes``, so capacity and
  node disks still arrive.

Why a plain loop in its own thread and not a Kopf timer (the same reasoning as the inventory loop in
``operator_agent.main``): Kopf timers are per-object handlers, while this report is one cluster-wide snapshot
read with a handful of ``list`` calls; a timer would need a Kopf-managed dummy object to hang on and would
stop whenever Kopf is not running (``operator_agent.sessions`` starts Kopf only once the GShareSession CRD is
served), whereas capacity and node disks matter before any session exists. The tick runs in its own thread
(``run_volume_sync``) with its own ``ControlPlaneClient`` (a ``requests.Session`` is not shared between
threads) built on the same ``TokenSource`` as the other loops, so token handling (newest token, 401 fallback,
rotation without restart) and backoff are the same code; a slow or failing volume report never delays the
inventory.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from contract import (
    FORBIDDEN_CLUSTER_SCOPE,
    VOLUME_ID_LABEL,
    VOLUME_PHASE_BOUND,
    VOLUME_PHASE_PENDING,
    rfc3339,
)
from contract.quantity import parse_quantity
from operator_agent import kube
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import (
    ControlPlaneClient,
    ControlPlaneError,
    ControlPlaneRejected,
    ControlPlaneUnavailable,
)
from operator_agent.loop import every

__all__ = [
    "MAX_MESSAGE_CHARS",
    "collect_storage",
    "existing_storage_classes",
    "node_disks",
    "parse_quantity",
    "report_storage",
    "run_volume_sync",
    "storage_class_readings",
    "session_volume_wait",
    "storage_report",
    "volume_reports",
    "volume_wait_message",
]

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 2000
"""Volume messages are cut to this many characters."""

LIST_PAGE_SIZE = 500
"""Objects per ``list`` page (``limit``/``continue`` pagination)."""

FAILED_MOUNT_REASON = "FailedMount"
"""Reason of the kubelet's Warning Event when it cannot mount a pod's volume."""

CONTAINER_CREATING = "ContainerCreating"
"""Waiting reason of a pod's containers while the kubelet prepares the pod (mounts its volumes first)."""

# --------------------------------------------------------------------------- report (pure)

#: Largest byte count the report carries (``capacity_bytes`` and ``disk_bytes`` are int64 in the contract): one object
#: with a larger (or a negative) quantity would get the whole report refused, so it is left out like an unreadable one.
_MAX_BYTES = 2**63 - 1


def _byte_count(raw: Any) -> int:
    """``raw`` (a quantity) as bytes; ValueError when it is not a quantity or not a byte count from 0 to ``_MAX_BYTES``."""
    value = parse_quantity(raw)
    if not 0 <= value <= _MAX_BYTES:
        raise ValueError(f"{raw!r} is not a byte count from 0 to 2**63 - 1")
    return value


def storage_class_readings(capacities: Iterable[Mapping[str, Any]], *, own_class: str | None = None) -> list[dict]:
    """``storage_classes`` of the report from CSIStorageCapacity objects (JSON, as the apiserver serves them).

    Args:
        capacities: CSIStorageCapacity objects (``storageClassName``, ``capacity`` at top level).
        own_class: ``GSHARE_VOLUME_STORAGE_CLASS``, listed even when no object names it; None: no such class.

    Returns:
        ``[{"storage_class", "capacity_bytes": largest capacity or None, "objects": count}]`` sorted by class.
        A ``capacity`` that is not a quantity, or not a byte count the report can carry (negative, beyond int64), is
        logged and ignored like a missing one.
    """
    largest: dict[str, int | None] = {}
    counts: dict[str, int] = defaultdict(int)
    for obj in capacities:
        storage_class = obj.get("storageClassName")
        if not storage_class:
            continue
        counts[storage_class] += 1
        largest.setdefault(storage_class, None)
        raw = obj.get("capacity")
        if raw is None or raw == "":
            continue
        try:
            value = _byte_count(raw)
        except ValueError:
            meta = obj.get("metadata") or {}
            logger.warning("CSIStorageCapacity %s/%s: capacity %r is not a byte count, ignored", meta.get("namespace"),
                           meta.get("name"), raw)
            continue
        current = largest[storage_class]
        largest[storage_class] = value if current is None else max(current, value)
    if own_class and own_class not in counts:
        largest[own_class] = None
        counts[own_class] = 0
    return [{"storage_class": name, "capacity_bytes": largest[name], "objects": counts[name]}
            for name in sorted(largest)]


def node_disks(nodes: Iterable[Mapping[str, Any]]) -> list[dict]:
    """``nodes`` of the report: ``[{"name", "disk_bytes"}]`` from ``status.capacity["ephemeral-storage"]``, by name.

    Nodes without that capacity (or with one that is not a quantity, or not a byte count from 0 to 2**63 - 1) are left out.
    """
    found = []
    for node in nodes:
        name = (node.get("metadata") or {}).get("name")
        raw = ((node.get("status") or {}).get("capacity") or {}).get("ephemeral-storage")
        if not name or raw is None:
            continue
        try:
            found.append({"name": name, "disk_bytes": _byte_count(raw)})
        except ValueError:
            logger.warning("node %s: ephemeral-storage capacity %r is not a byte count, ignored", name, raw)
    return sorted(found, key=lambda entry: entry["name"])


def volume_reports(pvcs: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
                   pods: Iterable[Mapping[str, Any]]) -> list[dict]:
    """``volumes`` of the report (see the module docstring for ``phase`` and ``message``).

    Args:
        pvcs: PersistentVolumeClaims of the session namespace; those without ``gshare.io/volume-id`` are skipped.
        events: core/v1 Events of the namespace (those about other objects are ignored).
        pods: Pods of the namespace (those mounting no listed PVC are ignored).

    Returns:
        ``[{"volume_id", "claim_name", "phase", "volume_name", "message"}]`` sorted by claim name.
    """
    by_object: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("kind") and involved.get("name"):
            by_object[(involved["kind"], involved["name"])].append(event)
    stuck_by_claim: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for pod in pods:
        if _stuck_creating(pod):
            for claim in _pod_claims(pod):
                stuck_by_claim[claim].append(pod)
    reports = []
    for pvc in pvcs:
        meta = pvc.get("metadata") or {}
        volume_id = (meta.get("labels") or {}).get(VOLUME_ID_LABEL)
        if not volume_id or not meta.get("name"):
            continue
        name = meta["name"]
        phase = (pvc.get("status") or {}).get("phase") or VOLUME_PHASE_PENDING
        volume_name = (pvc.get("spec") or {}).get("volumeName") or ""
        message = _mount_failure(stuck_by_claim.get(name, []), name, volume_name, by_object)
        if not message and phase != VOLUME_PHASE_BOUND:
            newest = _newest(_about(by_object.get(("PersistentVolumeClaim", name), []), meta.get("uid")))
            message = (newest or {}).get("message") or ""
        reports.append({"volume_id": volume_id, "claim_name": name, "phase": phase, "volume_name": volume_name,
                        "message": _cut(message), "_created": _parse_time(meta.get("creationTimestamp")) or _EPOCH})
    return sorted(_one_per_volume(reports), key=lambda report: report["claim_name"])


def _one_per_volume(reports: list[dict]) -> list[dict]:
    """One report per volume id (the control plane refuses a report listing a volume twice): a ``Bound`` claim wins,
    then the newest; the others are logged."""
    chosen: dict[str, dict] = {}
    for report in sorted(reports, key=lambda r: (r["phase"] == VOLUME_PHASE_BOUND, r["_created"], r["claim_name"]),
                         reverse=True):
        kept = chosen.setdefault(report["volume_id"], report)
        if kept is not report:
            logger.warning("volume %s has several PVCs (%s, %s): reporting %s", report["volume_id"], kept["claim_name"],
                           report["claim_name"], kept["claim_name"])
    return [{k: v for k, v in report.items() if k != "_created"} for report in chosen.values()]


def existing_storage_classes(classes: Iterable[Mapping[str, Any]]) -> list[str]:
    """``existing_storage_classes`` of the report: the names of StorageClass objects (JSON), sorted, each once."""
    return sorted({name for obj in classes if (name := (obj.get("metadata") or {}).get("name"))})


def storage_report(*, read_at: datetime.datetime, capacities: Iterable[Mapping[str, Any]],
                   pvcs: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
                   pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]],
                   own_class: str | None = None, classes: Iterable[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The body of ``POST /internal/v1/storage`` from the objects read at ``read_at`` (see the module docstring).

    ``classes``: the StorageClass objects, or None when they could not be listed (``existing_storage_classes`` is
    then left out).
    """
    report: dict[str, Any] = {
        "read_at": rfc3339.format_utc(read_at, timespec="microseconds"),
        "storage_classes": storage_class_readings(capacities, own_class=own_class),
    }
    if classes is not None:
        report["existing_storage_classes"] = existing_storage_classes(classes)
    report["volumes"] = volume_reports(pvcs, events, pods)
    report["nodes"] = node_disks(nodes)
    return report


def _pod_claims(pod: Mapping[str, Any]) -> list[str]:
    return [claim for volume in (pod.get("spec") or {}).get("volumes") or []
            if (claim := (volume.get("persistentVolumeClaim") or {}).get("claimName"))]


def _pod_volume_names(pod: Mapping[str, Any], claim: str) -> list[str]:
    return [volume.get("name") or "" for volume in (pod.get("spec") or {}).get("volumes") or []
            if (volume.get("persistentVolumeClaim") or {}).get("claimName") == claim]


def _stuck_creating(pod: Mapping[str, Any]) -> bool:
    """Whether the kubelet has the pod but its containers are not created: ``Pending`` on a node, waiting in
    ``ContainerCreating`` (or with no container status yet)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or not (pod.get("spec") or {}).get("nodeName"):
        return False
    containers = list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])
    if not containers:
        return True
    return any(((c.get("state") or {}).get("waiting") or {}).get("reason") == CONTAINER_CREATING for c in containers)


def _mount_failure(pods: list[Mapping[str, Any]], claim: str, volume_name: str,
                   by_object: Mapping[tuple[str, str], list[Mapping[str, Any]]]) -> str:
    """The newest ``FailedMount`` message, among stuck pods mounting ``claim``, that is about this volume."""
    candidates = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        failed = [e for e in _about(by_object.get(("Pod", meta.get("name") or ""), []), meta.get("uid"))
                  if e.get("reason") == FAILED_MOUNT_REASON and e.get("message")]
        pod_volumes = _pod_volume_names(pod, claim)
        about_this = [e for e in failed if _names_volume(e["message"], volume_name, pod_volumes)]
        if not about_this and len(_pod_claims(pod)) == 1:
            about_this = failed  # the pod mounts nothing else: whatever it cannot mount is this volume
        candidates.extend(about_this)
    # The kubelet also repeats "Unable to attach or mount volumes: ... timed out waiting for the condition";
    # the MountVolume.* event says why, so it wins when there is one.
    causes = [e for e in candidates if str(e["message"]).startswith(("MountVolume.", "MapVolume."))]
    newest = _newest(causes or candidates)
    return str((newest or {}).get("message") or "")


def _names_volume(message: str, volume_name: str, pod_volumes: list[str]) -> bool:
    """Whether a kubelet mount message is about this volume: it quotes the PV name (``for volume "pvc-…"``) or
    lists one of the pod volumes using the claim (``unmounted volumes=[vol-datasets …]``)."""
    if volume_name and f'"{volume_name}"' in message:
        return True
    return any(re.search(rf"volumes=\[[^\]]*(?<![\w.-]){re.escape(name)}(?![\w.-])", message)
               for name in pod_volumes if name)


def _about(events: list[Mapping[str, Any]], uid: str | None) -> list[Mapping[str, Any]]:
    """The events about the current object: an event naming another uid is about a predecessor of that name."""
    return [e for e in events if not uid or not (e.get("involvedObject") or {}).get("uid")
            or e["involvedObject"]["uid"] == uid]


def _newest(events: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return max(events, key=_event_order, default=None)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _event_order(event: Mapping[str, Any]) -> tuple[datetime.datetime, int]:
    """When an event last happened (``series.lastObservedTime``, ``lastTimestamp``, ``eventTime``,
    ``firstTimestamp``, ``metadata.creationTimestamp``: the latest present), then its ``resourceVersion``."""
    moments = [_parse_time((event.get("series") or {}).get("lastObservedTime")), _parse_time(event.get("lastTimestamp")),
               _parse_time(event.get("eventTime")), _parse_time(event.get("firstTimestamp")),
               _parse_time((event.get("metadata") or {}).get("creationTimestamp"))]
    present = [moment for moment in moments if moment is not None]
    revision = str((event.get("metadata") or {}).get("resourceVersion") or "")
    return (max(present) if present else _EPOCH, int(revision) if revision.isdigit() else 0)


def _parse_time(value: Any) -> datetime.datetime | None:
    return rfc3339.parse(value, naive_as_utc=True)


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


_CLASS_NOT_FOUND = re.compile(r'storageclass\.storage\.k8s\.io "([^"]+)" not found')


def volume_wait_message(volumes: Iterable[Mapping[str, Any]], pvcs: Mapping[str, Mapping[str, Any] | None],
                        events: Iterable[Mapping[str, Any]], missing_classes: Iterable[str] = ()) -> str:
    """Which volumes a session waits for and why: what its status message says while its PVCs are not bound.

    Args:
        volumes: the GShareSession's ``spec.volumes`` (``volumeId``, ``name``, ``claimName``, ``storageClassName``).
        pvcs: claim name -> the PVC as JSON, or None when it does not exist.
        events: Events about those PVCs (others are ignored).
        missing_classes: StorageClasses read and found absent on this cluster.

    Returns:
        For each volume whose PVC is missing or not ``Bound``: ``volume <name> (<volumeId>): PVC <claim> is
        <phase>: storageclass "x" not found on this cluster`` when its StorageClass is missing, else ``...: <newest
        event about it> (<reason>)`` when there is one; joined with ``"; "``; ``""`` when every PVC is bound.
    """
    missing = set(missing_classes)
    by_claim: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("kind") == "PersistentVolumeClaim" and involved.get("name"):
            by_claim[involved["name"]].append(event)
    waits = []
    for volume in volumes:
        claim = volume.get("claimName") or ""
        pvc = pvcs.get(claim)
        phase = ((pvc or {}).get("status") or {}).get("phase") or VOLUME_PHASE_PENDING
        if pvc is not None and phase == VOLUME_PHASE_BOUND:
            continue
        text = f"volume {volume.get('name')} ({volume.get('volumeId')}): PVC {claim} "
        text += "does not exist yet" if pvc is None else f"is {phase}"
        newest = _newest(_about(by_claim.get(claim, []), ((pvc or {}).get("metadata") or {}).get("uid")))
        storage_class = _claim_class(volume, pvc)
        if storage_class in missing:
            text += f': storageclass "{storage_class}" not found on this cluster'
        elif newest and newest.get("message"):
            message = _CLASS_NOT_FOUND.sub(r'storageclass "\1" not found on this cluster', str(newest["message"]))
            text += f": {message}" + (f" ({newest['reason']})" if newest.get("reason") else "")
        waits.append(text)
    return _cut("; ".join(waits))


def _claim_class(volume: Mapping[str, Any], pvc: Mapping[str, Any] | None) -> str:
    return str(((pvc or {}).get("spec") or {}).get("storageClassName") or volume.get("storageClassName") or "")


def session_volume_wait(api_client: kube.ApiClient, namespace: str, volumes: Iterable[Mapping[str, Any]],
                        **kwargs: Any) -> str:
    """``volume_wait_message`` of a session's ``spec.volumes``: reads each PVC and, for one not bound, its StorageClass
    (a 404 is the reason, at once, without waiting for the PV controller's event) and the Events about it
    (``kwargs``: e.g. ``_request_timeout``).

    Raises:
        kube.ApiException (other than 404; a 403 on the StorageClass is ignored), or a transport error
        (``kube.apiserver_call`` makes it ``KubeUnavailable``): a read failed.
    """
    core = kube.core_v1(api_client)
    storage = kube.storage_v1(api_client)
    volumes = list(volumes)
    pvcs: dict[str, dict | None] = {}
    events: list[dict] = []
    classes: dict[str, bool] = {}
    for volume in volumes:
        claim = volume.get("claimName") or ""
        if not claim or claim in pvcs:
            continue
        try:
            response = core.read_namespaced_persistent_volume_claim(claim, namespace, _preload_content=False, **kwargs)
            try:
                pvcs[claim] = json.loads(response.data or b"{}")
            finally:
                response.release_conn()
        except kube.ApiException as exc:
            if exc.status != 404:
                raise
            pvcs[claim] = None
        if ((pvcs[claim] or {}).get("status") or {}).get("phase") == VOLUME_PHASE_BOUND:
            continue
        events += _list_all(core.list_namespaced_event, namespace,
                            field_selector=f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={claim}", **kwargs)
        storage_class = _claim_class(volume, pvcs[claim])
        if storage_class and storage_class not in classes:
            classes[storage_class] = _storage_class_exists(storage, storage_class, kwargs)
    return volume_wait_message(volumes, pvcs, events, missing_classes=[name for name, found in classes.items() if not found])


def _storage_class_exists(storage: kube.StorageV1Api, name: str, kwargs: Mapping[str, Any]) -> bool:
    """False only when the apiserver answers 404 (a 403 from an older chart's RBAC: assumed present)."""
    try:
        storage.read_storage_class(name, _preload_content=False, **kwargs).release_conn()
    except kube.ApiException as exc:
        if exc.status == 404:
            return False
        if exc.status != 403:
            raise
    return True


# --------------------------------------------------------------------------- reading the cluster


def collect_storage(api_client: kube.ApiClient, *, namespace: str, own_class: str | None = None,
                    request_timeout: float | None = None,
                    clock: Callable[[], datetime.datetime] | None = None) -> dict[str, Any]:
    """Read the cluster and return the ``POST /internal/v1/storage`` body (``storage_report``).

    Lists CSIStorageCapacity objects in all namespaces (a cluster that does not serve them, before 1.24,
    has none), every StorageClass (a refused list leaves ``existing_storage_classes`` out), the PVCs of
    ``namespace`` labelled ``gshare.io/volume-id`` and, when there are any, the namespace's PVC Events,
    FailedMount Events and Pods, and every Node; a warning is logged when ``own_class`` does not exist.
    Objects are read as the apiserver's JSON (no client models), so the pure functions see exactly what the
    fixtures hold.

    Raises:
        kube.ApiException, or a transport error (``kube.apiserver_call`` makes it ``KubeUnavailable``): a list
        failed (e.g. 403: RBAC).
    """
    read_at = (clock or (lambda: datetime.datetime.now(datetime.UTC)))()
    core = kube.core_v1(api_client)
    storage = kube.storage_v1(api_client)
    timeout = {} if request_timeout is None else {"_request_timeout": request_timeout}
    try:
        capacities = _list_all(storage.list_csi_storage_capacity_for_all_namespaces, **timeout)
    except kube.ApiException as exc:
        if exc.status != 404:
            raise
        capacities = []  # storage.k8s.io/v1 CSIStorageCapacity is served from Kubernetes 1.24
    pvcs = _list_all(core.list_namespaced_persistent_volume_claim, namespace, label_selector=VOLUME_ID_LABEL, **timeout)
    events: list[dict] = []
    pods: list[dict] = []
    if pvcs:
        events = _list_all(core.list_namespaced_event, namespace,
                           field_selector="involvedObject.kind=PersistentVolumeClaim", **timeout)
        events += _list_all(core.list_namespaced_event, namespace,
                            field_selector=f"involvedObject.kind=Pod,reason={FAILED_MOUNT_REASON}", **timeout)
        pods = _list_all(core.list_namespaced_pod, namespace, **timeout)
    nodes = _list_all(core.list_node, **timeout)
    classes = _list_storage_classes(storage, timeout)
    if own_class:
        if classes is None:
            _check_own_class(storage, own_class, timeout)
        elif own_class not in existing_storage_classes(classes):
            _warn_own_class_missing(own_class)
    return storage_report(read_at=read_at, capacities=capacities, pvcs=pvcs, events=events, pods=pods, nodes=nodes,
                          own_class=own_class, classes=classes)


def _list_storage_classes(storage: kube.StorageV1Api, timeout: Mapping[str, Any]) -> list[dict] | None:
    """Every StorageClass, or None when the apiserver refuses the list (403: an older chart's RBAC): then nothing is
    reported about them, which the control plane reads as "unknown", never as "none"."""
    try:
        return _list_all(storage.list_storage_class, **timeout)
    except kube.ApiException as exc:
        if exc.status not in (403, 404):
            raise
        logger.warning("volume sync: cannot list StorageClasses (%s %s): the control plane is not told which exist here; "
                       "grant the operator `list` on storageclasses.storage.k8s.io (charts/gshare-operator)", exc.status, exc.reason)
        return None


def _warn_own_class_missing(own_class: str) -> None:
    logger.warning("GSHARE_VOLUME_STORAGE_CLASS names StorageClass %s, which does not exist on this cluster: "
                   "PVCs of volumes on it stay Pending until it is created (or the setting is corrected)", own_class)


def _check_own_class(storage: kube.StorageV1Api, own_class: str, timeout: Mapping[str, Any]) -> None:
    """Log a warning when ``GSHARE_VOLUME_STORAGE_CLASS`` names a StorageClass this cluster does not have (its
    volumes' PVCs would stay ``Pending``). Other failures (e.g. 403 from an older chart's RBAC) are not this tick's
    business: logged at debug level."""
    try:
        response = storage.read_storage_class(own_class, _preload_content=False, **timeout)
        response.release_conn()
    except kube.ApiException as exc:
        if exc.status == 404:
            _warn_own_class_missing(own_class)
        else:
            logger.debug("cannot read StorageClass %s: %s %s", own_class, exc.status, exc.reason)


def _list_all(method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict]:
    """Every item of a ``list_*`` call as JSON dicts, following ``continue`` tokens."""
    items: list[dict] = []
    continue_token = None
    while True:
        page_kwargs = dict(kwargs, limit=LIST_PAGE_SIZE, _preload_content=False)
        if continue_token:
            page_kwargs["_continue"] = continue_token
        response = method(*args, **page_kwargs)
        try:
            body = json.loads(response.data or b"{}")
        finally:
            response.release_conn()
        items.extend(body.get("items") or [])
        continue_token = (body.get("metadata") or {}).get("continue")
        if not continue_token:
            return items


# --------------------------------------------------------------------------- the tick


def report_storage(api_client: kube.ApiClient, client: ControlPlaneClient, config: OperatorConfig) -> bool:
    """One volume-sync tick: read the cluster, POST the report. ``True`` on success; never raises for I/O failures."""
    try:
        with kube.apiserver_call():
            report = collect_storage(api_client, namespace=config.session_namespace,
                                     own_class=config.volume_storage_class, request_timeout=config.http_timeout)
    except kube.ApiException as exc:
        logger.warning("volume sync: cannot read storage objects from the apiserver: %s %s", exc.status, exc.reason)
        return False
    except kube.KubeUnavailable as exc:
        logger.warning("volume sync: cannot reach the apiserver: %s", exc)
        return False
    try:
        try:
            client.post_storage(report)
        except ControlPlaneRejected as exc:
            if exc.code != FORBIDDEN_CLUSTER_SCOPE or not report["volumes"]:
                raise
            # A PVC here names a volume the control plane says another cluster holds (e.g. left behind by a move):
            # the whole report was refused. Capacity and node disks must still arrive: send them without volumes.
            logger.error("volume sync: the control plane refused the volume statuses (%s); reporting capacity and "
                         "node disks without them: %s", exc.code, exc.detail)
            report = {**report, "volumes": []}
            client.post_storage(report)
    except ControlPlaneUnavailable as exc:
        logger.warning("volume sync not reported: %s", exc)
        return False
    except ControlPlaneError:
        # 401/403/4xx and token-file problems were logged by the client with code and detail.
        return False
    waiting = [v for v in report["volumes"] if v["phase"] != VOLUME_PHASE_BOUND or v["message"]]
    logger.info("volume sync reported: %d storage classes, %d volumes (%d not ready), %d nodes",
                len(report["storage_classes"]), len(report["volumes"]), len(waiting), len(report["nodes"]))
    return True


def run_volume_sync(config: OperatorConfig, api_client: kube.ApiClient, client: ControlPlaneClient,
                    stop: threading.Event) -> None:
    """Report every ``config.volume_sync_interval`` seconds (start to start, first at once) until ``stop`` is set.

    Args:
        config: operator settings (interval, namespace, own StorageClass, timeouts).
        api_client: client of the data-plane apiserver (not shared with another thread).
        client: control-plane client (its own ``requests`` session, the shared ``TokenSource``).
        stop: set to stop; a wait between ticks ends at once.
    """
    every(config.volume_sync_interval, lambda: report_storage(api_client, client, config), stop, logger=logger,
          what="volume sync tick")
