"""The emulator's PV controller, CSI provisioner and kubelet-mount stand-ins, driven by the official client.

A StorageClass whose provisioner is a CSI driver provisions PVCs (PV ``pvc-<uid>``, bound both ways); a PVC naming an
existing PV (``spec.volumeName``, as after a volume move) is bound to it; a missing StorageClass leaves the PVC
``Pending`` with the PV controller's real ``ProvisioningFailed`` message; reclaim policies apply when a PVC goes; Pods
wait for their PVCs to be bound and, on a node whose host has no NFS client, stay in ``ContainerCreating`` with the
kubelet's ``FailedMount`` Event. Also: the demo fleet's storage seeds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import kubernetes
import pytest

from demo import fleet
from demo.emulator import (
    EmulatedCluster,
    external_provisioning_message,
    nfs_mount_failure_message,
    storage_class_not_found_message,
)
from tests.helpers import wait_for

NS = "gshare-sessions"
CLUSTER = "lab-c1"
NO_NFS = {"gpu-h100-01": {"mount_nfs": None}, "gpu-v100-01": {"mount_nfs": None}}
HELPER = "bad option; for several filesystems (e.g. nfs, cifs) you might need a /sbin/mount.<type> helper program."


@pytest.fixture
def start() -> Iterator:
    started: list[EmulatedCluster] = []

    def start_cluster(hosts: dict | None = None, extra: list[dict] | None = None) -> tuple[EmulatedCluster, kubernetes.client.CoreV1Api]:
        running = EmulatedCluster(fleet.cluster_objects(CLUSTER) + (extra or []), version=fleet.cluster_version(CLUSTER),
                                  pod_startup_seconds=0.05, hosts=hosts).start()
        started.append(running)
        api = kubernetes.config.new_client_from_config_dict(running.kubeconfig(CLUSTER))
        return running, kubernetes.client.CoreV1Api(api)

    yield start_cluster
    for running in started:
        running.stop()


def claim_body(name: str, *, storage_class: str | None = fleet.STORAGE_CLASS, size: str = "10Gi",
               volume_name: str | None = None) -> dict:
    spec: dict = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    if volume_name:
        spec["volumeName"] = volume_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def pv_body(name: str, *, claim: str | None = None, policy: str = "Retain", size: str = "10Gi",
            storage_class: str = fleet.STORAGE_CLASS, source: dict | None = None) -> dict:
    spec: dict = {"accessModes": ["ReadWriteMany"], "capacity": {"storage": size},
                  "persistentVolumeReclaimPolicy": policy, "storageClassName": storage_class,
                  **(source or {"csi": {"driver": fleet.CSI_DRIVER, "volumeHandle": f"{name}-handle", "fsType": "nfs"}})}
    if claim:
        spec["claimRef"] = {"namespace": NS, "name": claim}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def pod_body(name: str, claims: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"gpu": "on"},
                     "containers": [{"name": "session", "image": "quay.io/jupyter/base-notebook:2024-12-02",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "volumes": [{"name": f"vol-{i}", "persistentVolumeClaim": {"claimName": c}}
                                 for i, c in enumerate(claims)]}}


def get(cluster: EmulatedCluster, plural: str, name: str) -> dict | None:
    return next((o for o in cluster.objects_of(plural) if o["metadata"]["name"] == name), None)


def phase_of(cluster: EmulatedCluster, plural: str, name: str) -> str | None:
    return ((get(cluster, plural, name) or {}).get("status") or {}).get("phase")


def events_about(cluster: EmulatedCluster, name: str) -> list[dict]:
    return [e for e in cluster.objects_of("events") if e["involvedObject"]["name"] == name]


# --------------------------------------------------------------------------- PV controller + CSI provisioner


def test_csi_storage_class_provisions_and_binds(start):
    cluster, core = start()
    created = core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-a"))
    assert created.status.phase == "Pending"  # the apiserver resets status; the controller moves it on
    uid = created.metadata.uid
    claim = wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-a") == "Bound"
                     and get(cluster, "persistentvolumeclaims", "gshare-vol-a"))
    pv = get(cluster, "persistentvolumes", f"pvc-{uid}")
    assert claim["spec"]["volumeName"] == f"pvc-{uid}"
    assert claim["status"] == {"phase": "Bound", "accessModes": ["ReadWriteMany"], "capacity": {"storage": "10Gi"}}
    assert claim["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"] == "yes"
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] == fleet.CSI_DRIVER
    spec = pv["spec"]
    assert spec["csi"]["driver"] == fleet.CSI_DRIVER and spec["csi"]["fsType"] == "nfs" and spec["csi"]["volumeHandle"]
    assert spec["capacity"] == {"storage": "10Gi"} and spec["accessModes"] == ["ReadWriteMany"]
    assert spec["storageClassName"] == fleet.STORAGE_CLASS
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"  # the class's
    assert spec["mountOptions"] == ["noatime", "nfsvers=4"]
    assert {k: spec["claimRef"][k] for k in ("kind", "namespace", "name", "uid")} == {
        "kind": "PersistentVolumeClaim", "namespace": NS, "name": "gshare-vol-a", "uid": uid}
    assert pv["status"]["phase"] == "Bound"
    assert pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == fleet.CSI_DRIVER
    reasons = [(e["reason"], e["type"]) for e in events_about(cluster, "gshare-vol-a")]
    assert reasons == [("ExternalProvisioning", "Normal"), ("Provisioning", "Normal"), ("ProvisioningSucceeded", "Normal")]
    first = events_about(cluster, "gshare-vol-a")[0]
    assert first["message"] == external_provisioning_message(fleet.CSI_DRIVER)
    assert first["source"] == {"component": "persistentvolume-controller"}
    assert first["involvedObject"]["uid"] == uid
    # the official client reads them back (typed models)
    assert core.read_persistent_volume(f"pvc-{uid}").spec.csi.driver == fleet.CSI_DRIVER
    assert core.read_namespaced_persistent_volume_claim("gshare-vol-a", NS).status.phase == "Bound"


def test_missing_storage_class_leaves_the_claim_pending_with_the_real_event(start):
    cluster, core = start()
    core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-x", storage_class="nfs-a"))
    [event] = wait_for(what="ProvisioningFailed", check=lambda: events_about(cluster, "gshare-vol-x"))
    assert (event["type"], event["reason"]) == ("Warning", "ProvisioningFailed")
    assert event["message"] == storage_class_not_found_message("nfs-a") == 'storageclass.storage.k8s.io "nfs-a" not found'
    listed = core.list_namespaced_event(NS, field_selector="involvedObject.kind=PersistentVolumeClaim").items
    assert [e.reason for e in listed] == ["ProvisioningFailed"]
    time.sleep(0.3)
    assert phase_of(cluster, "persistentvolumeclaims", "gshare-vol-x") == "Pending"
    assert len(events_about(cluster, "gshare-vol-x")) == 1  # not repeated by every pass
    # the class appears: the claim is provisioned
    kubernetes.client.StorageV1Api(core.api_client).create_storage_class(
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "nfs-a"},
         "provisioner": fleet.CSI_DRIVER, "reclaimPolicy": "Retain"})
    wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-x") == "Bound")


def test_default_storage_class_is_given_to_a_claim_naming_none(start):
    default = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
               "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
               "provisioner": "org.democratic-csi.nfs"}
    cluster, core = start(extra=[default])
    core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-d", storage_class=None))
    assert get(cluster, "persistentvolumeclaims", "gshare-vol-d")["spec"]["storageClassName"] == "standard"
    wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-d") == "Bound")


def test_prebound_claim_is_bound_to_its_volume(start):
    """A moved volume: a Retain PV pre-bound to the claim (claimRef without uid) and the claim naming it."""
    cluster, core = start()
    core.create_persistent_volume(pv_body("gshare-vol-moved", claim="gshare-vol-m", size="20Gi"))
    wait_for(what="Available", check=lambda: phase_of(cluster, "persistentvolumes", "gshare-vol-moved") == "Available")
    created = core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-m", volume_name="gshare-vol-moved"))
    wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-m") == "Bound")
    pv = get(cluster, "persistentvolumes", "gshare-vol-moved")
    assert pv["status"]["phase"] == "Bound" and pv["spec"]["claimRef"]["uid"] == created.metadata.uid
    claim = get(cluster, "persistentvolumeclaims", "gshare-vol-m")
    assert claim["status"]["capacity"] == {"storage": "20Gi"}
    assert [pv["metadata"]["name"] for pv in cluster.objects_of("persistentvolumes")] == ["gshare-vol-moved"]  # nothing provisioned
    assert events_about(cluster, "gshare-vol-m") == []


def test_claim_named_by_an_available_volume_is_bound_without_volume_name(start):
    cluster, core = start()
    core.create_persistent_volume(pv_body("gshare-vol-pre", claim="gshare-vol-p"))
    core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-p"))
    claim = wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-p") == "Bound"
                     and get(cluster, "persistentvolumeclaims", "gshare-vol-p"))
    assert claim["spec"]["volumeName"] == "gshare-vol-pre"
    assert claim["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"] == "yes"


def test_prebound_claim_refused_when_the_volume_is_someone_elses_or_does_not_fit(start):
    cluster, core = start()
    core.create_persistent_volume(pv_body("pv-other", claim="someone-else"))
    core.create_persistent_volume(pv_body("pv-small", size="1Gi"))
    core.create_persistent_volume(pv_body("pv-class", storage_class="other-class"))
    core.create_namespaced_persistent_volume_claim(NS, claim_body("c-other", volume_name="pv-other"))
    core.create_namespaced_persistent_volume_claim(NS, claim_body("c-small", volume_name="pv-small"))
    core.create_namespaced_persistent_volume_claim(NS, claim_body("c-class", volume_name="pv-class"))
    core.create_namespaced_persistent_volume_claim(NS, claim_body("c-nopv", volume_name="pv-missing"))
    messages = wait_for(what="refusals", check=lambda: (m := {n: [(e["reason"], e["message"]) for e in events_about(cluster, n)]
                                                  for n in ("c-other", "c-small", "c-class")}) and all(m.values()) and m)
    assert messages == {
        "c-other": [("FailedBinding", 'volume "pv-other" already bound to a different claim.')],
        "c-small": [("VolumeMismatch", 'Cannot bind to requested volume "pv-small": requested PV is too small')],
        "c-class": [("VolumeMismatch", 'Cannot bind to requested volume "pv-class": storageClassName does not match')],
    }
    for name in ("c-other", "c-small", "c-class", "c-nopv"):
        assert phase_of(cluster, "persistentvolumeclaims", name) == "Pending"
    assert events_about(cluster, "c-nopv") == []  # requested and not found: waits quietly, as the PV controller does


@pytest.mark.parametrize(("policy", "after"), [("Delete", None), ("Retain", "Released")])
def test_deleting_a_claim_applies_the_reclaim_policy(start, policy, after):
    extra = [{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "nfs-keep"},
              "provisioner": fleet.CSI_DRIVER, "reclaimPolicy": policy}]
    cluster, core = start(extra=extra)
    created = core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-r", storage_class="nfs-keep"))
    name = f"pvc-{created.metadata.uid}"
    wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumes", name) == "Bound")
    assert get(cluster, "persistentvolumes", name)["spec"]["persistentVolumeReclaimPolicy"] == policy
    core.delete_namespaced_persistent_volume_claim("gshare-vol-r", NS)
    if after is None:
        wait_for(what="PV deleted", check=lambda: get(cluster, "persistentvolumes", name) is None)
    else:
        wait_for(what="PV released", check=lambda: phase_of(cluster, "persistentvolumes", name) == after)
        pv = get(cluster, "persistentvolumes", name)
        assert pv["spec"]["claimRef"]["uid"] == created.metadata.uid  # kept: a new claim of that name cannot take it
        core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-r", volume_name=name, storage_class="nfs-keep"))
        [refusal] = wait_for(what="FailedBinding", check=lambda: events_about(cluster, "gshare-vol-r")[-1:] if any(
            e["reason"] == "FailedBinding" for e in events_about(cluster, "gshare-vol-r")) else None)
        assert refusal["message"] == f'volume "{name}" already bound to a different claim.'


def test_retain_after_a_patch_keeps_the_data_of_a_delete_class(start):
    """The move's step on the old cluster: set the bound PV's policy to Retain, then delete the claim."""
    cluster, core = start()
    created = core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-mv"))
    name = f"pvc-{created.metadata.uid}"
    wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumes", name) == "Bound")
    core.patch_persistent_volume(name, {"spec": {"persistentVolumeReclaimPolicy": "Retain"}})
    core.delete_namespaced_persistent_volume_claim("gshare-vol-mv", NS)
    wait_for(what="Released", check=lambda: phase_of(cluster, "persistentvolumes", name) == "Released")


def test_bound_claim_whose_volume_is_deleted_is_lost(start):
    cluster, core = start()
    created = core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-l"))
    wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-l") == "Bound")
    core.delete_persistent_volume(f"pvc-{created.metadata.uid}")
    wait_for(what="Lost", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-l") == "Lost")
    lost = [e for e in events_about(cluster, "gshare-vol-l") if e["reason"] == "ClaimLost"]
    assert [(e["type"], e["message"]) for e in lost] == [
        ("Warning", "Bound claim has lost its PersistentVolume. Data on the volume is lost!")]


# --------------------------------------------------------------------------- pods and their volumes


def test_pod_waits_for_its_claim_to_be_bound(start):
    cluster, core = start()
    core.create_namespaced_pod(NS, pod_body("p-missing", ["gshare-vol-later"]))
    pod = wait_for(what="unschedulable", check=lambda: (get(cluster, "pods", "p-missing") or {}).get("status", {}).get("conditions")
                   and get(cluster, "pods", "p-missing"))
    [scheduled] = pod["status"]["conditions"]
    assert (scheduled["type"], scheduled["status"], scheduled["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert scheduled["message"] == ('0/3 nodes are available: persistentvolumeclaim "gshare-vol-later" not found. '
                                    "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
    core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-later", storage_class="not-yet"))
    wait_for(what="unbound message", check=lambda: "pod has unbound immediate PersistentVolumeClaims" in json.dumps(
        get(cluster, "pods", "p-missing")["status"]))
    assert get(cluster, "pods", "p-missing")["status"]["conditions"][0]["message"] == (
        "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
        "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
    assert not (get(cluster, "pods", "p-missing").get("spec") or {}).get("nodeName")
    kubernetes.client.StorageV1Api(core.api_client).create_storage_class(
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "not-yet"},
         "provisioner": fleet.CSI_DRIVER})
    wait_for(what="Running once bound", check=lambda: phase_of(cluster, "pods", "p-missing") == "Running")


def test_pod_without_nfs_client_stays_container_creating_with_failed_mount(start):
    cluster, core = start(hosts=fleet.cluster_hosts(CLUSTER, **NO_NFS))
    created = core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-n"))
    wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-n") == "Bound")
    pod = core.create_namespaced_pod(NS, pod_body("p-nfs", ["gshare-vol-n"]))
    [event] = wait_for(what="FailedMount", check=lambda: [e for e in events_about(cluster, "p-nfs") if e["reason"] == "FailedMount"])
    stored = get(cluster, "pods", "p-nfs")
    assert stored["status"]["phase"] == "Pending" and stored["spec"]["nodeName"] == "gpu-h100-01"
    [status] = stored["status"]["containerStatuses"]
    assert status["state"] == {"waiting": {"reason": "ContainerCreating"}} and status["ready"] is False
    assert "podIP" not in stored["status"]
    ready = next(c for c in stored["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ContainersNotReady")
    pv = get(cluster, "persistentvolumes", f"pvc-{created.metadata.uid}")
    assert (event["type"], event["source"]) == ("Warning", {"component": "kubelet", "host": "gpu-h100-01"})
    assert event["involvedObject"]["uid"] == pod.metadata.uid
    assert event["message"] == nfs_mount_failure_message(pv, pod.metadata.uid)
    assert event["message"].startswith(f'MountVolume.MountDevice failed for volume "{pv["metadata"]["name"]}" : rpc error: '
                                       'code = Internal desc = {"code":32,"stdout":"","stderr":"/usr/local/bin/mount: '
                                       "illegal option -- o\\nmount: /var/lib/kubelet/plugins/kubernetes.io/csi/"
                                       "org.democratic-csi.nfs/")
    assert f"/globalmount: {HELPER}" in event["message"]
    body = json.loads(event["message"].split("desc = ", 1)[1])
    assert body == {"code": 32, "stdout": "", "stderr": body["stderr"], "timeout": False}
    time.sleep(0.3)
    assert len([e for e in events_about(cluster, "p-nfs") if e["reason"] == "FailedMount"]) == 1
    assert phase_of(cluster, "pods", "p-nfs") == "Pending"

    # nfs-common installed on the node: the kubelet's next try mounts it and the pod runs
    cluster.set_host("gpu-h100-01", {**fleet.cluster_hosts(CLUSTER)["gpu-h100-01"]})
    wait_for(what="Running", check=lambda: phase_of(cluster, "pods", "p-nfs") == "Running", timeout=15)


def test_in_tree_nfs_volume_message(start):
    cluster, core = start(hosts=fleet.cluster_hosts(CLUSTER, **NO_NFS))
    source = {"nfs": {"server": "10.0.0.50", "path": "/export/gshare"}, "mountOptions": ["nfsvers=4.1"]}
    core.create_persistent_volume(pv_body("pv-nfs", claim="gshare-vol-i", source=source))
    core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-i", volume_name="pv-nfs"))
    wait_for(what="Bound", check=lambda: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-i") == "Bound")
    pod = core.create_namespaced_pod(NS, pod_body("p-intree", ["gshare-vol-i"]))
    [event] = wait_for(what="FailedMount", check=lambda: [e for e in events_about(cluster, "p-intree") if e["reason"] == "FailedMount"])
    target = f"/var/lib/kubelet/pods/{pod.metadata.uid}/volumes/kubernetes.io~nfs/pv-nfs"
    assert event["message"] == (
        'MountVolume.SetUp failed for volume "pv-nfs" : mount failed: exit status 32\n'
        "Mounting command: mount\n"
        f"Mounting arguments: -t nfs -o nfsvers=4.1 10.0.0.50:/export/gshare {target}\n"
        f"Output: mount: {target}: {HELPER}\n")


def test_nodes_with_an_nfs_client_or_without_host_facts_mount_fine(start):
    for hosts in (fleet.cluster_hosts(CLUSTER), None):
        cluster, core = start(hosts=hosts)
        core.create_namespaced_persistent_volume_claim(NS, claim_body("gshare-vol-ok"))
        wait_for(what="Bound", check=lambda cluster=cluster: phase_of(cluster, "persistentvolumeclaims", "gshare-vol-ok") == "Bound")
        core.create_namespaced_pod(NS, pod_body("p-ok", ["gshare-vol-ok"]))
        wait_for(what="Running", check=lambda cluster=cluster: phase_of(cluster, "pods", "p-ok") == "Running")
        assert not [e for e in events_about(cluster, "p-ok") if e["reason"] == "FailedMount"]


def test_pods_without_volumes_are_unchanged(start):
    cluster, core = start(hosts=fleet.cluster_hosts(CLUSTER, **NO_NFS))
    body = pod_body("p-plain", [])
    del body["spec"]["volumes"]
    core.create_namespaced_pod(NS, body)
    wait_for(what="Running", check=lambda: phase_of(cluster, "pods", "p-plain") == "Running")
    assert cluster.objects_of("events") == []


# --------------------------------------------------------------------------- the demo fleet's storage seeds


@pytest.mark.parametrize("name", [spec.name for spec in fleet.FLEET])
def test_fleet_seeds_the_shared_nfs_pool(name):
    objects = fleet.cluster_objects(name)
    [storage_class] = [o for o in objects if o["kind"] == "StorageClass"]
    assert storage_class["metadata"]["name"] == fleet.STORAGE_CLASS == "gshare-nfs"
    assert storage_class["provisioner"] == fleet.CSI_DRIVER == "org.democratic-csi.nfs"
    assert "nfsvers=4" in storage_class["mountOptions"]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "CSIDriver"] == [fleet.CSI_DRIVER]
    capacities = [o for o in objects if o["kind"] == "CSIStorageCapacity"]
    assert {(o["metadata"]["namespace"], o["storageClassName"]) for o in capacities} == {("democratic-csi", "gshare-nfs")}
    template = fleet.csi_storage_capacities(fleet.cluster_spec(name))
    assert capacities == template and len({o["metadata"]["name"] for o in capacities}) == len(capacities)
    for obj in capacities:  # the real object's shape
        assert set(obj) == {"apiVersion", "kind", "metadata", "capacity", "nodeTopology", "storageClassName"}
        assert obj["metadata"]["labels"]["csi.storage.k8s.io/drivername"] == fleet.CSI_DRIVER
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    with EmulatedCluster(objects, version=fleet.cluster_version(name)) as cluster:
        api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig(name))
        storage = kubernetes.client.StorageV1Api(api)
        listed = storage.list_csi_storage_capacity_for_all_namespaces().items
        assert sorted(c.capacity for c in listed) == sorted(o["capacity"] for o in capacities)
        assert storage.read_storage_class(fleet.STORAGE_CLASS).provisioner == fleet.CSI_DRIVER
        api.close()


def test_lab_c1_has_two_segments_of_one_server_and_lab_c2_one():
    c1 = [o["capacity"] for o in fleet.cluster_objects("lab-c1") if o["kind"] == "CSIStorageCapacity"]
    c2 = [o["capacity"] for o in fleet.cluster_objects("lab-c2") if o["kind"] == "CSIStorageCapacity"]
    assert c1 == ["1643124Mi", "1642872Mi"] and c2 == ["1643124Mi"]


def test_fleet_objects_stay_fresh_copies():
    first = fleet.storage_objects(fleet.cluster_spec("lab-c1"))
    first[2]["capacity"] = "1Mi"
    first[1]["mountOptions"].append("soft")
    again = fleet.storage_objects(fleet.cluster_spec("lab-c1"))
    assert (again[2]["capacity"], again[1]["mountOptions"]) == ("1643124Mi", ["noatime", "nfsvers=4"])

