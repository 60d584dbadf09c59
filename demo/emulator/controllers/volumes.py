"""Stand-ins for kube-controller-manager's PersistentVolume controller and a CSI driver's external-provisioner.

Always on, ~``volume_controller_seconds`` (0.1 s) after a PVC, PV or StorageClass change: a PVC whose StorageClass's
provisioner is a CSI driver gets PV ``pvc-<PVC uid>`` (``csi`` driver/new volume handle/``fsType`` from the class,
``nfs`` by default; capacity = request; the class's reclaim policy, ``Delete`` by default, and mount options;
``claimRef``) and both are ``Bound``, with the ``ExternalProvisioning``, ``Provisioning`` and ``ProvisioningSucceeded``
Events; a PVC naming a PV (``spec.volumeName``, e.g. pre-bound after a volume move) or named by an ``Available`` PV's
``claimRef`` is bound to it, or gets the controller's ``FailedBinding`` (``volume "x" already bound to a different
claim.``) or ``VolumeMismatch`` Warning; a PVC whose StorageClass does not exist stays ``Pending`` with
``ProvisioningFailed`` ``storageclass.storage.k8s.io "<name>" not found``; a deleted PVC's PV is deleted (``Delete``)
or ``Released`` (``Retain``, ``claimRef`` kept); a ``Bound`` PVC whose PV is gone is ``Lost`` (``ClaimLost``).

Texts are what the real components print (found in public cluster output, see each constant); the emulator fills in
names, uids and paths. ``tests/demo/test_emulator_volumes.py`` covers them. The kubelet's side (mounting an NFS
volume) is in ``kubelet``, with ``nfs_mount_failure_message`` from here.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
import secrets
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from contract.quantity import parse_quantity
from demo.emulator.common import timestamp
from demo.emulator.controllers import Controller, DelayedPass
from demo.emulator.store import StoreEvent

if TYPE_CHECKING:
    from demo.emulator.server import KubeApiEmulator

logger = logging.getLogger(__name__)

PV_CONTROLLER = "persistentvolume-controller"
"""Event source of kube-controller-manager's PersistentVolume controller."""

PROVISIONED_BY_ANNOTATION = "pv.kubernetes.io/provisioned-by"
"""PV annotation naming the provisioner that created it (external-provisioner writes the driver name)."""

NFS_HELPER_MISSING = "bad option; for several filesystems (e.g. nfs, cifs) you might need a /sbin/mount.<type> helper program."
"""util-linux ``mount(8)`` (2.3x) on a host without ``mount.nfs`` (verbatim in the kubelet's FailedMount event quoted in
kubernetes-sigs/provider-aws-test-infra PR #232, 2023)."""

DEMOCRATIC_CSI_MOUNT_WRAPPER = "/usr/local/bin/mount: illegal option -- o"
"""First stderr line of every failed mount run by democratic-csi's node plugin (its ``mount`` wrapper; verbatim in
democratic-csi issues #234, #445, #494)."""

CLAIM_LOST_MESSAGE = "Bound claim has lost its PersistentVolume. Data on the volume is lost!"
"""Warning ``ClaimLost`` of the PV controller (``pkg/controller/volume/persistentvolume/pv_controller.go``)."""


def storage_class_not_found_message(name: str) -> str:
    """The PV controller's ``ProvisioningFailed`` Event for a PVC naming a StorageClass that does not exist."""
    return f'storageclass.storage.k8s.io "{name}" not found'


def external_provisioning_message(provisioner: str) -> str:
    """The PV controller's ``ExternalProvisioning`` Event while a CSI driver's external-provisioner is to create the PV
    (Kubernetes 1.28+ wording, as ``kubectl describe pvc`` shows it)."""
    return (f"Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the "
            "system administrator. If volume creation is delayed, please verify that the provisioner is running and "
            "correctly registered.")


def nfs_mount_failure_message(pv: Mapping[str, Any], pod_uid: str) -> str:
    """The kubelet's ``FailedMount`` Event for an NFS PersistentVolume on a host without an NFS client (``mount.nfs``).

    * CSI volume (democratic-csi, which stages NFS volumes): ``MountVolume.MountDevice failed for volume "<pv>" : rpc
      error: code = Internal desc = {"code":32,"stdout":"","stderr":"<wrapper line>\\nmount: <staging path>: bad
      option; …helper program.\\n","timeout":false}`` -- the kubelet's prefix (democratic-csi issue #189), the node
      plugin's gRPC error body (issue #494) and mount(8)'s line (above), assembled: the staging path is the kubelet's
      ``plugins/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount``.
    * in-tree ``nfs`` volume: ``MountVolume.SetUp failed for volume "<pv>" : mount failed: exit status 32`` then the
      ``Mounting command``/``Mounting arguments``/``Output`` lines, as in provider-aws-test-infra PR #232.
    """
    name = pv["metadata"]["name"]
    spec = pv.get("spec") or {}
    csi = spec.get("csi")
    if csi:
        handle = hashlib.sha256(str(csi.get("volumeHandle") or "").encode("utf-8")).hexdigest()
        staging = f"/var/lib/kubelet/plugins/kubernetes.io/csi/{csi.get('driver')}/{handle}/globalmount"
        body = json.dumps({"code": 32, "stdout": "",
                           "stderr": f"{DEMOCRATIC_CSI_MOUNT_WRAPPER}\nmount: {staging}: {NFS_HELPER_MISSING}\n",
                           "timeout": False}, separators=(",", ":"))
        return f'MountVolume.MountDevice failed for volume "{name}" : rpc error: code = Internal desc = {body}'
    nfs = spec.get("nfs") or {}
    target = f"/var/lib/kubelet/pods/{pod_uid}/volumes/kubernetes.io~nfs/{name}"
    options = ",".join(spec.get("mountOptions") or [])
    arguments = "-t nfs" + (f" -o {options}" if options else "") + f" {nfs.get('server')}:{nfs.get('path')} {target}"
    return (f'MountVolume.SetUp failed for volume "{name}" : mount failed: exit status 32\n'
            f"Mounting command: mount\nMounting arguments: {arguments}\nOutput: mount: {target}: {NFS_HELPER_MISSING}\n")


def _is_external_provisioner(provisioner: str) -> bool:
    """A CSI driver's name (provisioned by its external-provisioner), not an in-tree ``kubernetes.io/...`` plugin."""
    return bool(provisioner) and not provisioner.startswith("kubernetes.io/")


def is_nfs_volume(pv: Mapping[str, Any]) -> bool:
    """Whether mounting the PV needs the host's NFS client: an in-tree ``nfs`` volume, or a CSI volume of an NFS driver
    (``fsType: nfs`` or a driver named ``...nfs...``, e.g. ``org.democratic-csi.nfs``, ``nfs.csi.k8s.io``)."""
    spec = pv.get("spec") or {}
    if spec.get("nfs"):
        return True
    csi = spec.get("csi") or {}
    driver = str(csi.get("driver") or "").lower()
    return str(csi.get("fsType") or "").lower() == "nfs" or "nfs" in re.split(r"[._/-]", driver)


def _with_phase(pv: Mapping[str, Any], phase: str) -> dict[str, Any]:
    """A copy of a PV with ``status.phase`` (and ``lastPhaseTransitionTime`` when it changes)."""
    new = copy.deepcopy(dict(pv))
    status = new.setdefault("status", {})
    if status.get("phase") != phase:
        status["phase"] = phase
        status["lastPhaseTransitionTime"] = timestamp()
    return new


def _claim_ref_names(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """Whether a PV is pre-bound to this claim: ``claimRef`` naming its namespace and name, without a uid or with its uid."""
    ref = (pv.get("spec") or {}).get("claimRef") or {}
    meta = claim["metadata"]
    return ((ref.get("namespace"), ref.get("name")) == (meta.get("namespace"), meta["name"])
            and ref.get("uid") in (None, "", meta.get("uid")))


def _binding_refusal(claim: Mapping[str, Any], pv: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why the PV controller will not bind ``claim`` to the PV it asks for (``(reason, message)`` of its Warning), or
    None: claimed by another PVC (``claimRef`` naming another claim or uid: ``FailedBinding``), or not satisfying the
    claim (``VolumeMismatch``: StorageClass, size, access modes)."""
    meta = claim["metadata"]
    name = pv["metadata"]["name"]
    spec = pv.get("spec") or {}
    ref = spec.get("claimRef") or {}
    phase = (pv.get("status") or {}).get("phase")
    other = ref and ((ref.get("namespace"), ref.get("name")) != (meta.get("namespace"), meta["name"])
                     or (ref.get("uid") and ref["uid"] != meta.get("uid")))
    if other or (phase == "Bound" and ref.get("uid") != meta.get("uid")):
        return "FailedBinding", f'volume "{name}" already bound to a different claim.'
    claim_spec = claim.get("spec") or {}
    mismatch = None
    if (claim_spec.get("storageClassName") or "") != (spec.get("storageClassName") or ""):
        mismatch = "storageClassName does not match"
    else:
        try:
            too_small = parse_quantity((spec.get("capacity") or {}).get("storage") or 0) < parse_quantity(
                ((claim_spec.get("resources") or {}).get("requests") or {}).get("storage") or 0)
        except ValueError:
            too_small = False
        if too_small:
            mismatch = "requested PV is too small"
        elif not set(claim_spec.get("accessModes") or ()) <= set(spec.get("accessModes") or ()):
            mismatch = "incompatible accessMode"
    if mismatch:
        return "VolumeMismatch", f'Cannot bind to requested volume "{name}": {mismatch}'
    return None


class VolumeControllers(Controller):
    """The PV controller and CSI external-provisioner stand-ins of one emulator (see the module docstring)."""

    def __init__(self, api: KubeApiEmulator) -> None:
        super().__init__(api)
        self._pass = DelayedPass(api, self._volume_controller_pass, lambda: api.volume_controller_seconds,
                                 name="emulated-pv-controller", what="PV controller")

    def on_event(self, event: StoreEvent) -> None:
        """Kick a pass on a PVC, PV or StorageClass change."""
        if event.kind in (("", "persistentvolumeclaims"), ("", "persistentvolumes"),
                          ("storage.k8s.io", "storageclasses")):
            self.kick()

    def start(self) -> None:
        """Seeded claims and volumes are bound and provisioned like created ones."""
        if any(self.api.live_objects(self.api.served("", "v1", plural))
               for plural in ("persistentvolumeclaims", "persistentvolumes")):
            self.kick()

    def kick(self) -> None:
        """Schedule a pass ``volume_controller_seconds`` from now (see ``DelayedPass.kick``); in the emulator's loop."""
        self._pass.kick()

    async def _volume_controller_pass(self) -> None:
        """One pass of kube-controller-manager's PV controller with a CSI external-provisioner (see the module docstring).

        Volumes first: a PV whose bound claim (``claimRef.uid``) is gone is deleted (reclaim policy ``Delete``) or
        ``Released`` (``Retain``); a new PV without a claim, or pre-bound to one (``claimRef`` without uid), becomes
        ``Available``. Then claims: a ``Bound`` claim whose PV is gone is ``Lost``; a pending claim naming a PV
        (``spec.volumeName``) or named by an ``Available`` PV's ``claimRef`` is bound to it (or gets the controller's
        Warning why not); any other pending claim is provisioned from its StorageClass when the class's provisioner is
        a CSI driver (``ProvisioningFailed`` when the class does not exist).
        """
        pvcs = self.api.served("", "v1", "persistentvolumeclaims")
        pvs = self.api.served("", "v1", "persistentvolumes")
        classes = self.api.served("storage.k8s.io", "v1", "storageclasses")
        claims = {c["metadata"]["uid"]: c for c in self.api.live_objects(pvcs)}
        for pv in self.api.live_objects(pvs):
            meta = pv["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            phase = (pv.get("status") or {}).get("phase")
            if ref.get("uid") and ref["uid"] not in claims:
                if phase == "Released" or phase == "Failed":
                    continue
                if (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Delete":
                    await self.api.delete_object(pvs, None, meta["name"], dry_run=False)  # the provisioner deletes it
                else:
                    await self.api.write_object(pvs, _with_phase(pv, "Released"), pv)
            elif not ref.get("uid") and phase in (None, "", "Pending"):
                await self.api.write_object(pvs, _with_phase(pv, "Available"), pv)
        for claim in self.api.live_objects(pvcs):
            meta = claim["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            spec = claim.get("spec") or {}
            phase = (claim.get("status") or {}).get("phase") or "Pending"
            if phase == "Bound":
                if spec.get("volumeName") and self.api.get_object(pvs, None, spec["volumeName"]) is None:
                    lost = copy.deepcopy(claim)
                    lost.setdefault("status", {})["phase"] = "Lost"
                    await self.api.write_object(pvcs, lost, claim)
                    await self.api.record_event_once(lost, reason="ClaimLost", message=CLAIM_LOST_MESSAGE,
                                                     event_type="Warning", component=PV_CONTROLLER)
                continue
            if phase != "Pending":
                continue
            if spec.get("volumeName"):
                pv = self.api.get_object(pvs, None, spec["volumeName"])
                if pv is not None:  # else: requested and not found, tried again on the next change
                    await self._bind_or_refuse(claim, pv, by_controller=False)
                continue
            prebound = next((pv for pv in self.api.live_objects(pvs) if _claim_ref_names(pv, claim)
                             and (pv.get("status") or {}).get("phase") in ("Available", "Pending", None)), None)
            if prebound is not None:
                await self._bind_or_refuse(claim, prebound, by_controller=True)
                continue
            class_name = spec.get("storageClassName")
            if not class_name:  # "" or none: static binding only, not emulated beyond the two cases above
                continue
            storage_class = self.api.get_object(classes, None, class_name)
            if storage_class is None:
                await self.api.record_event_once(claim, reason="ProvisioningFailed",
                                                 message=storage_class_not_found_message(class_name),
                                                 event_type="Warning", component=PV_CONTROLLER)
                continue
            if _is_external_provisioner(str(storage_class.get("provisioner") or "")):
                await self._provision(claim, storage_class)

    async def _bind_or_refuse(self, claim: dict[str, Any], pv: dict[str, Any], *, by_controller: bool) -> None:
        refusal = _binding_refusal(claim, pv)
        if refusal is None:
            await self._bind(claim, pv, by_controller=by_controller)
        else:
            await self.api.record_event_once(claim, reason=refusal[0], message=refusal[1], event_type="Warning",
                                             component=PV_CONTROLLER)

    async def _bind(self, claim: dict[str, Any], pv: dict[str, Any], *, by_controller: bool,
                    provisioner: str | None = None) -> None:
        """Bind both ways, as the PV controller does: the PV's ``claimRef`` (with the claim's uid) and ``Bound``, then
        the claim's ``volumeName``, bind annotations and ``status`` (``Bound``, capacity and access modes of the PV)."""
        pvs = self.api.served("", "v1", "persistentvolumes")
        pvcs = self.api.served("", "v1", "persistentvolumeclaims")
        meta = claim["metadata"]
        bound_pv = copy.deepcopy(pv)
        bound_pv.setdefault("spec", {})["claimRef"] = {
            "kind": "PersistentVolumeClaim", "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
            "apiVersion": "v1", "resourceVersion": meta["resourceVersion"]}
        bound_pv = _with_phase(bound_pv, "Bound")
        if bound_pv != pv:
            await self.api.write_object(pvs, bound_pv, pv)
        bound = copy.deepcopy(claim)
        bound.setdefault("spec", {})["volumeName"] = pv["metadata"]["name"]
        annotations = bound["metadata"].setdefault("annotations", {})
        annotations["pv.kubernetes.io/bind-completed"] = "yes"
        if by_controller:
            annotations["pv.kubernetes.io/bound-by-controller"] = "yes"
        if provisioner:
            annotations["volume.beta.kubernetes.io/storage-provisioner"] = provisioner
            annotations["volume.kubernetes.io/storage-provisioner"] = provisioner
        pv_spec = bound_pv.get("spec") or {}
        bound["status"] = {"phase": "Bound", "accessModes": list(pv_spec.get("accessModes") or []),
                           "capacity": dict(pv_spec.get("capacity") or {})}
        await self.api.write_object(pvcs, bound, claim)

    async def _provision(self, claim: dict[str, Any], storage_class: Mapping[str, Any]) -> None:
        """The CSI driver's external-provisioner: create PV ``pvc-<claim uid>`` (``csi`` with the driver, a new volume
        handle and ``fsType`` from the class's parameters, ``nfs`` by default; capacity = the request; the class's
        reclaim policy and mount options) and bind it, with the events ``kubectl describe pvc`` shows."""
        pvs = self.api.served("", "v1", "persistentvolumes")
        meta = claim["metadata"]
        provisioner = str(storage_class["provisioner"])
        await self.api.record_event(claim, reason="ExternalProvisioning", event_type="Normal", component=PV_CONTROLLER,
                                    message=external_provisioning_message(provisioner))
        component = f"{provisioner}_{provisioner.rsplit('.', 1)[-1]}-csi-controller-0_{uuid.uuid4()}"
        await self.api.record_event(claim, reason="Provisioning", event_type="Normal", component=component,
                                    message=f'External provisioner is provisioning volume for claim "{meta["namespace"]}/'
                                            f'{meta["name"]}"')
        name = f"pvc-{meta['uid']}"
        existing = self.api.get_object(pvs, None, name)
        if existing is None:
            parameters = storage_class.get("parameters") or {}
            spec = claim.get("spec") or {}
            pv_spec: dict[str, Any] = {
                "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
                "capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage") or "0"},
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": meta["namespace"], "name": meta["name"],
                             "uid": meta["uid"], "apiVersion": "v1", "resourceVersion": meta["resourceVersion"]},
                "csi": {"driver": provisioner, "volumeHandle": name if "democratic-csi" in provisioner else str(uuid.uuid4()),
                        "fsType": parameters.get("fsType") or parameters.get("csi.storage.k8s.io/fstype") or "nfs",
                        "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity":
                                             f"{int(time.time() * 1000)}-{secrets.randbelow(10000)}-{provisioner}"}},
                "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
                "storageClassName": storage_class["metadata"]["name"],
                "volumeMode": spec.get("volumeMode") or "Filesystem",
            }
            if storage_class.get("mountOptions"):
                pv_spec["mountOptions"] = list(storage_class["mountOptions"])
            existing = self.api.build_object(pvs, {
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {PROVISIONED_BY_ANNOTATION: provisioner}},
                "spec": pv_spec, "status": {"phase": "Pending"}}, None, keep_status=True)
            await self.api.add_object(pvs, existing)
        await self.api.record_event(claim, reason="ProvisioningSucceeded", event_type="Normal", component=component,
                                    message=f"Successfully provisioned volume {name}")
        await self._bind(claim, existing, by_controller=True, provisioner=provisioner)
