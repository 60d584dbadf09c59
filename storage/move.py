"""Moving a volume to another cluster: its data stays on the shared pool, its PVC changes cluster.

A volume's PVC lives on one cluster at a time (``Volume.cluster``) and keeps its sessions there. When no
live session mounts it and its pool is shared with cluster B, ``volume_move`` hands it to B through the
two apiservers, without copying or deleting data:

1. on A, read the PVC ``volume.claim_name`` (namespace ``GSHARE_SESSION_NAMESPACE``) and the
   PersistentVolume bound to it; its source is the volume on the pool: CSI (``driver`` and
   ``volumeHandle``, plus ``volumeAttributes``/``fsType``) or NFS (``server`` and ``path``);
2. on B, create a PersistentVolume ``gshare-<volume id>-<B id, 8 characters>`` with that source,
   capacity (raised to the quota if smaller), access modes, StorageClass and mount options, ``persistentVolumeReclaimPolicy: Retain``
   and a ``claimRef`` to the PVC about to be made, then that PVC with ``spec.volumeName`` set to it (so
   B's provisioner creates nothing), labelled like the operator's PVCs;
3. on A, set the old PersistentVolume's reclaim policy to ``Retain`` (and check it took) before deleting
   A's PVC: the PV is then ``Released``, never deleted, and nothing on the pool is removed;
4. record ``cluster = B``, ``status = pending`` (B's operator reports the PVC bound), ``pv_name``.

The volume is marked ``moving`` first (its own transaction; sessions refuse it meanwhile) under a
PostgreSQL advisory lock held for the whole move, so two moves of one volume never interleave and a
move that died half-way (its lock went with its connection) is taken over by the next. Every create
accepts an object that already exists when it is the same one, so a failed move is retried as is. On a
failure the volume keeps its cluster and its status, and the error says what was done and the fix.

Behind ``GSHARE_VOLUME_MOVE_ENABLED`` (default off until tested against a real CSI driver).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from django.conf import settings
from django.db import connection, transaction

from audit.services import Action, audit_record
from clusters.errors import CLUSTER_UNAVAILABLE, CLUSTER_UNREACHABLE
from clusters.models import Cluster
from clusters.probe import ClusterUnreachable
from contract import VOLUME_ID_LABEL, VOLUME_MANAGED_BY, VOLUME_NAME_LABEL
from core.exceptions import ApplicationError, Conflict, NotFound
from kube import KubeError, KubeGateway, parse_quantity
from kube.gateway import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from storage.capacity import pool_clusters, pools_usability
from storage.errors import (
    VOLUME_ALREADY_THERE,
    VOLUME_IN_USE,
    VOLUME_MOVE_FAILED,
    VOLUME_MOVING,
    VOLUME_NOT_BOUND,
    VOLUME_NOT_FOUND,
    VOLUME_NOT_MOUNTABLE,
    VOLUME_NOT_PLACED,
    VOLUME_POOL_NOT_SHARED,
    VOLUME_SOURCE_UNSUPPORTED,
)
from storage.exceptions import VolumeDeleting
from storage.models import Volume
from storage.services import volume_move_check_enabled

logger = logging.getLogger(__name__)

#: Label key whose value is ``VOLUME_MANAGED_BY`` on a volume's PVC (the operator's ``session_pvc`` puts the same).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

#: First key of the advisory lock a move holds (the second is the volume's pk).
_LOCK_CLASS = 0x67536D76  # "gSmv"

class VolumeMoveFailed(ApplicationError):
    """502: an apiserver refused a step of the move; the detail says what was done and the fix."""

    code = VOLUME_MOVE_FAILED
    status = 502


def moved_pv_name(volume: Volume, cluster: Cluster) -> str:
    """Name of the PersistentVolume a move creates on ``cluster``: ``gshare-<volume id, - for _>-<8 chars of the cluster id>``."""
    return f"gshare-{volume.public_id.replace('_', '-')}-{cluster.public_id.split('_', 1)[-1][:8]}"


def volume_labels(volume: Volume) -> dict[str, str]:
    """The labels of a volume's PVC and of the PersistentVolume a move creates."""
    return {MANAGED_BY_LABEL: VOLUME_MANAGED_BY, VOLUME_ID_LABEL: volume.public_id, VOLUME_NAME_LABEL: volume.name}


def pv_source(pv: dict) -> dict | None:
    """The storage source of a PersistentVolume: ``{"csi": {...}}`` (driver, volumeHandle, and
    volumeAttributes/fsType/readOnly when set) or ``{"nfs": {...}}`` (server, path, readOnly), or None
    for any other kind of source (which a move cannot carry)."""
    spec = pv.get("spec") or {}
    csi = spec.get("csi")
    if csi and csi.get("driver") and csi.get("volumeHandle"):
        keep = ("driver", "volumeHandle", "volumeAttributes", "fsType", "readOnly")
        return {"csi": {k: csi[k] for k in keep if csi.get(k) not in (None, {}, "")}}
    nfs = spec.get("nfs")
    if nfs and nfs.get("server") and nfs.get("path"):
        return {"nfs": {k: nfs[k] for k in ("server", "path", "readOnly") if nfs.get(k) is not None}}
    return None


def _source_key(source: dict | None) -> tuple | None:
    """What identifies the data behind a source: (driver, handle) or (server, path)."""
    if not source:
        return None
    if "csi" in source:
        return ("csi", source["csi"].get("driver"), source["csi"].get("volumeHandle"))
    return ("nfs", source["nfs"].get("server"), source["nfs"].get("path").rstrip("/") or "/")


def moved_persistent_volume(*, old_pv: dict, name: str, namespace: str, claim_name: str, labels: dict, request: str) -> dict:
    """The PersistentVolume a move creates on the target: ``old_pv``'s source, capacity, access modes,
    StorageClass, mount options and volume mode, ``Retain``, pre-bound to ``namespace/claim_name``.

    The capacity is the old one, raised to ``request`` (the PVC's request, the quota) when that is larger,
    since a PVC is never bound to a smaller PersistentVolume (the quota was raised after provisioning).

    Raises:
        ValueError: ``old_pv`` has neither a CSI nor an NFS source.
    """
    source = pv_source(old_pv)
    if source is None:
        raise ValueError("the PersistentVolume has neither a CSI nor an NFS source")
    old = old_pv.get("spec") or {}
    capacity = dict(old.get("capacity") or {})
    try:
        if parse_quantity(capacity.get("storage") or 0) < parse_quantity(request):
            capacity["storage"] = request
    except ValueError:
        capacity["storage"] = request
    spec: dict = {
        "capacity": capacity,
        "accessModes": list(old.get("accessModes") or ["ReadWriteMany"]),
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": old.get("storageClassName") or "",
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim_name},
        **source,
    }
    if old.get("mountOptions"):
        spec["mountOptions"] = list(old["mountOptions"])
    if old.get("volumeMode"):
        spec["volumeMode"] = old["volumeMode"]
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "labels": dict(labels)}, "spec": spec}


def moved_claim(*, volume: Volume, pv_name: str, storage_class: str, namespace: str, labels: dict) -> dict:
    """The PVC a move creates on the target, bound in advance to ``pv_name`` (``spec.volumeName``)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": volume.claim_name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": f"{volume.quota_gb}Gi"}},
            "volumeName": pv_name,
        },
    }


@contextlib.contextmanager
def _move_lock(volume: Volume) -> Iterator[None]:
    """Hold the volume's move lock (a session-level PostgreSQL advisory lock) or refuse at once.

    Raises:
        Conflict: 409 ``volume_moving`` when another move of this volume holds it.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LOCK_CLASS, volume.pk])
        (got,) = cursor.fetchone()
    if not got:
        raise Conflict(
            f"Volume {volume.name} ({volume.public_id}) is being moved right now: wait for that move to finish.",
            code=VOLUME_MOVING,
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_LOCK_CLASS, volume.pk])


@transaction.atomic
def _begin(*, volume: Volume, target: Cluster) -> tuple[Volume, str]:
    """Check the preconditions on the locked row and mark the volume ``moving``.

    Returns:
        ``(volume with pool and cluster, status to restore on failure)``.
    """
    volume = Volume.objects.select_for_update(of=("self",)).select_related("pool", "cluster").get(pk=volume.pk)
    if volume.status == Volume.Status.DELETED:
        raise NotFound(f"Volume {volume.public_id} was deleted.", code=VOLUME_NOT_FOUND)
    if volume.status == Volume.Status.DELETING:
        raise VolumeDeleting(f"Volume {volume.name} ({volume.public_id}) is being deleted: there is nothing left to move.")
    live = volume.sessions.live().order_by("pk").values_list("public_id", flat=True)[:3]
    if live:
        raise Conflict(
            f"Volume {volume.name} is mounted by live session(s) {', '.join(live)}: stop them (`DELETE /api/v1/sessions/<id>`), "
            "then move it.",
            code=VOLUME_IN_USE,
        )
    if volume.cluster is None:
        raise Conflict(
            f"Volume {volume.name} has no PVC on any cluster yet, so there is nothing to move: it is created on the cluster "
            "the next session that mounts it lands on (pin that session to the cluster you want).",
            code=VOLUME_NOT_PLACED,
        )
    if volume.cluster_id == target.pk:
        raise Conflict(f"Volume {volume.name} is already on cluster {target.name}: nothing to do.", code=VOLUME_ALREADY_THERE)
    if target.status == Cluster.Status.DEREGISTERED:
        raise Conflict(
            f"Cluster {target.name} is deregistered and cannot take volumes: pick a registered cluster.",
            code=CLUSTER_UNAVAILABLE,
        )
    if target.pk not in pool_clusters(volume.pool):
        raise Conflict(
            f"Storage pool {volume.pool.name} ({volume.pool.public_id}) of volume {volume.name} is not shared with cluster "
            f"{target.name}: ask an administrator to share it (`PATCH /api/v1/storage/pools/{volume.pool.public_id}`), or "
            "pick a cluster it is shared with.",
            code=VOLUME_POOL_NOT_SHARED,
        )
    use = pools_usability([volume.pool])[volume.pool.pk].use_on(target.pk)
    if use is not None and not use.usable:
        raise Conflict(
            f"Volume {volume.name} ({volume.public_id}) cannot be mounted on cluster {target.name}: {use.reason}. Fix: ask an "
            f"administrator to create StorageClass {volume.pool.storage_class} on {target.name} (docs/storage.md), then move it, "
            f"or pick a cluster where pool {volume.pool.name} is usable (`GET /api/v1/storage/pools/{volume.pool.public_id}`: usable_on).",
            code=VOLUME_NOT_MOUNTABLE,
        )
    if not volume.claim_name:
        raise Conflict(f"Volume {volume.name} has no PVC name recorded: nothing to move.", code=VOLUME_NOT_PLACED)
    # A volume left "moving" by a move that died (its advisory lock is gone, we hold it now): the operator's
    # next report sets the real status, so restore to pending.
    previous = Volume.Status.PENDING if volume.status == Volume.Status.MOVING else volume.status
    volume.status = Volume.Status.MOVING
    volume.save(update_fields=["status"])
    return volume, previous


def _restore(*, volume: Volume, previous: str) -> None:
    Volume.objects.filter(pk=volume.pk, status=Volume.Status.MOVING).update(status=previous)


@transaction.atomic
def _finish(*, volume: Volume, target: Cluster, pv_name: str, source: Cluster) -> Volume:
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    volume.cluster = target
    volume.status = Volume.Status.PENDING
    volume.pv_name = pv_name
    volume.status_message = f"Moved from cluster {source.name}; waiting for the operator of {target.name} to report the PVC."
    volume.save(update_fields=["cluster", "status", "pv_name", "status_message"])
    audit_record(action=Action.VOLUME_MOVE, obj=volume, cluster=target, changes={"cluster": (source, target)}, details={"pv_name": pv_name})
    return volume


def volume_move(*, volume: Volume, cluster: Cluster) -> Volume:
    """Hand ``volume`` to ``cluster``: a pre-bound PersistentVolume and PVC there, the old PVC released (see the module).

    Enabled by ``GSHARE_VOLUME_MOVE_ENABLED``. Idempotent and recoverable: a move that failed half-way is
    retried as is (objects it already made are reused); the volume keeps its cluster and status until the
    new PVC exists and the old one is gone.

    Args:
        volume: the volume to move.
        cluster: the target cluster B.

    Returns:
        The volume, now on ``cluster`` with status ``pending`` and ``pv_name`` the new PersistentVolume.

    Raises:
        Conflict: 409 ``volume_move_disabled`` (the setting is off); ``volume_moving`` (another move of it
            runs); ``volume_in_use`` (a live session mounts it); ``volume_not_placed`` (it has no PVC yet:
            nothing to move); ``volume_already_there``; ``cluster_unavailable`` (the target is deregistered);
            ``volume_pool_not_shared`` (its pool is not shared with the target); ``volume_not_mountable`` (the
            pool's StorageClass is missing on the target, as its operator listed them);
            ``volume_not_bound`` (the PVC on A is not bound to a PersistentVolume yet);
            ``volume_source_unsupported`` (A's PersistentVolume is neither CSI nor NFS).
        NotFound: 404 ``volume_not_found`` (it was deleted).
        VolumeMoveFailed: 502 ``volume_move_failed``: an apiserver refused a step (the detail says which,
            what was done, and the fix).
        ClusterUnreachable: 504 ``cluster_unreachable``: an apiserver did not answer within
            ``GSHARE_PROBE_TIMEOUT`` (the detail says which and what was done).
    """
    volume_move_check_enabled()
    with _move_lock(volume):
        volume, previous = _begin(volume=volume, target=cluster)
        source = volume.cluster
        try:
            pv_name = _Move(volume=volume, source=source, target=cluster).run()
        except BaseException:
            _restore(volume=volume, previous=previous)
            raise
        volume = _finish(volume=volume, target=cluster, pv_name=pv_name, source=source)
    logger.info("volume %s moved from cluster %s to %s (PV %s)", volume.public_id, source.name, cluster.name, pv_name)
    return volume


class _Move:
    """The Kubernetes side of one move, recording each step done for the error details."""

    def __init__(self, *, volume: Volume, source: Cluster, target: Cluster):
        self.volume, self.source, self.target = volume, source, target
        self.namespace = settings.GSHARE_SESSION_NAMESPACE
        self.pv_name = moved_pv_name(volume, target)
        self.done: list[str] = []
        self.released = False  # A's PVC deletion was sent

    # -- plumbing

    def _fail(self, cluster: Cluster, step: str, exc: KubeError) -> ApplicationError:
        done = ("; done so far: " + "; ".join(self.done)) if self.done else "; nothing was changed"
        keep = f"The volume stays on cluster {self.source.name} with its PVC"
        if self.released and not exc.status:
            keep = (f"The volume stays recorded on cluster {self.source.name}, but the deletion of its PVC there was sent "
                    "and may have happened (its PersistentVolume is Retain: no data is lost)")
        retry = "retry the move: what is already there is reused"
        if exc.status:
            hint = {
                401: f"the cluster {cluster.name} refused the control plane's credentials: register a fresh kubeconfig, then {retry}",
                403: (f"the control plane's ServiceAccount on {cluster.name} may not manage PersistentVolumes and PVCs: grant it "
                      f"what docs/storage.md (\"Moving a volume\") lists, then {retry}"),
            }.get(exc.status, f"fix the cause on {cluster.name}, then {retry}")
            return VolumeMoveFailed(f"Moving volume {self.volume.name}: could not {step} on cluster {cluster.name} "
                                    f"({exc.status} {exc.summary}){done}. {keep}; {hint}.")
        return ClusterUnreachable(
            f"Moving volume {self.volume.name}: the apiserver of cluster {cluster.name} did not answer while trying to {step} "
            f"({exc.cause_name}){done}. {keep}; {retry} once {cluster.name} answers.",
            code=CLUSTER_UNREACHABLE,
        )

    def _call(self, cluster: Cluster, step: str, fn, *args, **kwargs):
        """Run one gateway call ``fn`` (a method of the gateway to ``cluster``); its failure becomes the move's error."""
        try:
            return fn(*args, **kwargs)
        except KubeError as exc:
            raise self._fail(cluster, step, exc) from None

    @contextlib.contextmanager
    def _gateway(self, cluster: Cluster) -> Iterator[KubeGateway]:
        """The gateway to ``cluster``, each call bounded by ``GSHARE_PROBE_TIMEOUT``."""
        try:
            kube = KubeGateway.for_cluster(cluster, call_timeout=settings.GSHARE_PROBE_TIMEOUT)
        except ApplicationError as exc:
            raise VolumeMoveFailed(
                f"Moving volume {self.volume.name}: the kubeconfig of cluster {cluster.name} cannot be used ({exc.detail}); "
                "nothing was changed on it. Update it (`PATCH /api/v1/clusters/<id>`), then retry the move."
            ) from None
        with kube:
            yield kube

    # -- the move

    def run(self) -> str:
        """Do the Kubernetes steps; return the new PersistentVolume's name on the target."""
        volume, claim = self.volume, self.volume.claim_name
        with self._gateway(self.source) as a, self._gateway(self.target) as b:
            pvc = self._call(self.source, f"read the PVC {claim}", a.get, PERSISTENT_VOLUME_CLAIMS, claim, namespace=self.namespace,
                             missing_ok=True)
            if pvc is None:
                return self._resume_after_release(b)
            old_pv_name = (pvc.get("spec") or {}).get("volumeName")
            if not old_pv_name:
                phase = (pvc.get("status") or {}).get("phase", "Pending")
                raise Conflict(
                    f"The PVC {claim} of volume {volume.name} on cluster {self.source.name} is {phase}, not bound to a "
                    "PersistentVolume: nothing was changed; wait until it is Bound (the volume's status says why it is not), "
                    "then move it.",
                    code=VOLUME_NOT_BOUND,
                )
            old_pv = self._call(self.source, f"read the PersistentVolume {old_pv_name}", a.get, PERSISTENT_VOLUMES, old_pv_name)
            source = pv_source(old_pv)
            if source is None:
                raise Conflict(
                    f"The PersistentVolume {old_pv_name} of volume {volume.name} on cluster {self.source.name} is neither "
                    "CSI nor NFS, so another cluster cannot mount the same data: nothing was changed.",
                    code=VOLUME_SOURCE_UNSUPPORTED,
                )
            self.done.append(f"read PVC {claim} and PersistentVolume {old_pv_name} on {self.source.name}")
            labels = {**((pvc.get("metadata") or {}).get("labels") or {}), **volume_labels(volume)}
            self._create_pv(b, moved_persistent_volume(
                old_pv=old_pv, name=self.pv_name, namespace=self.namespace, claim_name=claim, labels=labels,
                request=f"{volume.quota_gb}Gi"))
            storage_class = (old_pv.get("spec") or {}).get("storageClassName") or volume.pool.storage_class
            self._create_claim(b, moved_claim(volume=volume, pv_name=self.pv_name, storage_class=storage_class,
                                              namespace=self.namespace, labels=labels))
            self._retain(a, old_pv)
            self.released = True
            uid = (pvc.get("metadata") or {}).get("uid")
            self._call(self.source, f"delete the PVC {claim}", a.delete, PERSISTENT_VOLUME_CLAIMS, claim, namespace=self.namespace,
                       uid=uid)
            self.done.append(f"deleted PVC {claim} on {self.source.name} (PersistentVolume {old_pv_name} kept, Released)")
        return self.pv_name

    def _create_pv(self, b, body: dict) -> None:
        made = self._call(self.target, f"create the PersistentVolume {self.pv_name}", b.create, body, exists_ok=True)
        if made is None:  # it exists
            existing = self._call(self.target, f"read the PersistentVolume {self.pv_name}", b.get, PERSISTENT_VOLUMES, self.pv_name)
            spec = existing.get("spec") or {}
            ref = spec.get("claimRef") or {}
            if _source_key(pv_source(existing)) != _source_key(pv_source(body)) or (ref.get("namespace"), ref.get("name")) != (
                    self.namespace, self.volume.claim_name):
                raise self._conflict(f"a PersistentVolume {self.pv_name} already exists on {self.target.name} with another source "
                                     f"or claim: delete it there (`kubectl delete pv {self.pv_name}`) and retry the move")
            if ref.get("uid"):
                claim = self._call(self.target, f"read the PVC {self.volume.claim_name}", b.get, PERSISTENT_VOLUME_CLAIMS,
                                   self.volume.claim_name, namespace=self.namespace, missing_ok=True)
                if claim is None or (claim.get("metadata") or {}).get("uid") != ref["uid"]:
                    # Still bound to an earlier PVC of that name (a move to this cluster and back): free it for the new one.
                    self._call(self.target, f"free the PersistentVolume {self.pv_name}", b.patch, PERSISTENT_VOLUMES, self.pv_name,
                               {"spec": {"claimRef": {"uid": None, "resourceVersion": None}}})
            self.done.append(f"reused PersistentVolume {self.pv_name} on {self.target.name}")
        else:
            self.done.append(f"created PersistentVolume {self.pv_name} (Retain) on {self.target.name}")

    def _create_claim(self, b, body: dict) -> None:
        claim = self.volume.claim_name
        made = self._call(self.target, f"create the PVC {claim}", b.create, body, exists_ok=True)
        if made is None:  # it exists
            existing = self._call(self.target, f"read the PVC {claim}", b.get, PERSISTENT_VOLUME_CLAIMS, claim, namespace=self.namespace)
            if (existing.get("spec") or {}).get("volumeName") != self.pv_name:
                raise self._conflict(f"a PVC {claim} already exists in {self.namespace} on {self.target.name} and is not bound to "
                                     f"{self.pv_name}: delete it there if no pod uses it "
                                     f"(`kubectl -n {self.namespace} delete pvc {claim}`) and retry the move")
            self.done.append(f"reused PVC {claim} on {self.target.name}")
        else:
            self.done.append(f"created PVC {claim} bound to {self.pv_name} on {self.target.name}")

    def _retain(self, a, old_pv: dict) -> None:
        name = old_pv["metadata"]["name"]
        if (old_pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Retain":
            self.done.append(f"PersistentVolume {name} on {self.source.name} already Retain")
            return
        patched = self._call(self.source, f"set the reclaim policy of PersistentVolume {name} to Retain", a.patch, PERSISTENT_VOLUMES,
                             name, {"spec": {"persistentVolumeReclaimPolicy": "Retain"}})
        if (patched.get("spec") or {}).get("persistentVolumeReclaimPolicy") != "Retain":
            raise self._conflict(f"the PersistentVolume {name} on {self.source.name} did not keep reclaim policy Retain, so its PVC "
                                 "was not deleted; check what admission webhook rewrites it, then retry the move")
        self.done.append(f"set PersistentVolume {name} on {self.source.name} to Retain")

    def _resume_after_release(self, b) -> str:
        """A's PVC is gone: finish a move that got that far (B has the pre-bound PVC), else refuse."""
        claim = self.volume.claim_name
        there = self._call(self.target, f"read the PVC {claim}", b.get, PERSISTENT_VOLUME_CLAIMS, claim, namespace=self.namespace,
                           missing_ok=True)
        if there is not None and (there.get("spec") or {}).get("volumeName") == self.pv_name:
            self.done.append(f"found PVC {claim} already moved to {self.target.name}")
            return self.pv_name
        raise VolumeMoveFailed(
            f"Moving volume {self.volume.name}: its PVC {claim} is not on cluster {self.source.name} (namespace {self.namespace}), "
            "so there is no PersistentVolume to carry over; nothing was changed. The operator of "
            f"{self.source.name} re-creates the PVC when a session mounts the volume there; or look for a Released "
            "PersistentVolume of it there (`kubectl get pv`) and bind it again."
        )

    def _conflict(self, what: str) -> VolumeMoveFailed:
        done = ("; done so far: " + "; ".join(self.done)) if self.done else ""
        return VolumeMoveFailed(f"Moving volume {self.volume.name}: {what}{done}. The volume stays on cluster {self.source.name} "
                                "with its PVC.")

