"""The volume-sync report (operator_agent.reporters.storage): pure functions on real object shapes, then against the emulator.

CSIStorageCapacity and Node inputs are the fixtures of ``tests/fixtures/k8s-objects/`` (provenance in its README);
PVC, Event and Pod inputs are written the way the apiserver serves them (``kubectl get -o json``).
"""

from __future__ import annotations

import copy
import datetime
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes
import pytest
import yaml

from contract import STORAGE_PATH, VOLUME_ID_LABEL, VOLUME_PHASES
from demo import fleet
from demo.emulator import EmulatedCluster
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.reporters.storage import (
    collect_storage,
    existing_storage_classes,
    node_disks,
    parse_quantity,
    report_storage,
    run_volume_sync,
    session_volume_wait,
    storage_class_readings,
    storage_report,
    volume_reports,
    volume_wait_message,
)
from tests.helpers import wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s-objects"
NAMESPACE = "gshare-sessions"
MI = 2**20
KI = 2**10
READ_AT = datetime.datetime(2026, 11, 29, 16, 0, 0, 123456, tzinfo=datetime.UTC)


def capacity_list() -> list[dict]:
    return json.loads((FIXTURES / "csistoragecapacitylist.json").read_text(encoding="utf-8"))["items"]


def capacity_yaml(name: str) -> dict:
    return yaml.safe_load((FIXTURES / name).read_text(encoding="utf-8"))


def node_fixture() -> dict:
    return json.loads((FIXTURES / "node.gpu-8xh100.hami-v2.10.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- quantities


@pytest.mark.parametrize(("quantity", "expected"), [
    ("1643124Mi", 1643124 * MI),  # the real proxmox object
    ("102752488Ki", 102752488 * KI),
    ("100Gi", 100 * 2**30),
    ("3456144729715", 3456144729715),  # plain bytes (a node's allocatable ephemeral-storage)
    ("0", 0),
    ("1.5Gi", 3 * 2**29),
    ("2G", 2 * 10**9),
    ("12e6", 12_000_000),
    ("1500m", 2),  # Quantity.Value() rounds up
    (4096, 4096),
])
def test_parse_quantity(quantity, expected):
    assert parse_quantity(quantity) == expected


@pytest.mark.parametrize("bad", ["", "Gi", "ten", "1GiB", "1 Gi", True])
def test_parse_quantity_refuses_what_is_not_a_quantity(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


# --------------------------------------------------------------------------- storage classes


def test_capacity_list_fixture():
    readings = {r["storage_class"]: r for r in storage_class_readings(capacity_list())}
    assert readings["csi-proxmox"] == {"storage_class": "csi-proxmox", "capacity_bytes": 1643124 * MI, "objects": 1}
    # zfs-local-dataset: 102752488Ki, "0" and one object without capacity: the largest value, all three counted.
    assert readings["zfs-local-dataset"] == {"storage_class": "zfs-local-dataset", "capacity_bytes": 102752488 * KI,
                                             "objects": 3}
    assert list(readings) == sorted(readings)


def test_several_segments_of_one_class_are_one_server_largest_not_sum():
    real = capacity_yaml("csistoragecapacity.proxmox.real.yaml")
    second = copy.deepcopy(real)
    second["metadata"]["name"] = "csisc-b4x7q"
    second["nodeTopology"]["matchLabels"]["topology.kubernetes.io/zone"] = "pve-3"
    second["capacity"] = "1642872Mi"
    [reading] = storage_class_readings([second, real])
    assert reading == {"storage_class": "csi-proxmox", "capacity_bytes": 1643124 * MI, "objects": 2}
    assert reading["capacity_bytes"] != (1643124 + 1642872) * MI


def test_objects_without_capacity_are_counted_but_give_no_value():
    local = capacity_yaml("csistoragecapacity.local-node.maxvolumesize.yaml")
    del local["capacity"]  # maximumVolumeSize is not a capacity
    [reading] = storage_class_readings([local])
    assert reading == {"storage_class": "zfs-local-dataset", "capacity_bytes": None, "objects": 1}


def test_zero_capacity_is_a_value_that_never_lowers_the_largest():
    items = [i for i in capacity_list() if i["storageClassName"] == "zfs-local-dataset"]
    zero = [i for i in items if i.get("capacity") == "0"]
    assert storage_class_readings(zero) == [{"storage_class": "zfs-local-dataset", "capacity_bytes": 0, "objects": 1}]
    assert storage_class_readings(items)[0]["capacity_bytes"] == 102752488 * KI


def test_a_capacity_that_is_not_a_quantity_is_ignored_and_logged(caplog):
    broken = capacity_yaml("csistoragecapacity.proxmox.real.yaml")
    broken["capacity"] = "lots"
    assert storage_class_readings([broken]) == [{"storage_class": "csi-proxmox", "capacity_bytes": None, "objects": 1}]
    assert "csi-proxmox/csisc-2r9fp" in caplog.text and "'lots'" in caplog.text


def test_own_storage_class_is_always_listed():
    readings = storage_class_readings(capacity_list(), own_class="gshare-nfs")
    assert {"storage_class": "gshare-nfs", "capacity_bytes": None, "objects": 0} in readings
    # named by objects already: listed once, with its reading
    again = storage_class_readings(capacity_list(), own_class="csi-proxmox")
    assert [r["storage_class"] for r in again].count("csi-proxmox") == 1
    assert storage_class_readings([], own_class=None) == []


# --------------------------------------------------------------------------- nodes


def test_node_disks_from_the_node_fixture():
    node = node_fixture()
    bare = {"metadata": {"name": "no-capacity"}, "status": {}}
    [disk] = node_disks([node, bare])
    assert disk == {"name": node["metadata"]["name"], "disk_bytes": 3750157048 * KI}


def test_node_disks_sorted_by_name():
    a, b = node_fixture(), node_fixture()
    a["metadata"]["name"], b["metadata"]["name"] = "gpu-b", "gpu-a"
    b["status"]["capacity"]["ephemeral-storage"] = "1Ti"
    assert node_disks([a, b]) == [{"name": "gpu-a", "disk_bytes": 2**40}, {"name": "gpu-b", "disk_bytes": 3750157048 * KI}]


# --------------------------------------------------------------------------- volumes


def pvc(name: str, *, volume_id: str | None = "vol_a1", phase: str | None = "Bound", volume_name: str = "",
        uid: str = "") -> dict:
    obj = {
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid or f"uid-{name}",
                     "labels": {"app.kubernetes.io/managed-by": "gshare"}},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}},
                 "storageClassName": "gshare-nfs", "volumeMode": "Filesystem"},
        "status": {},
    }
    if volume_id:
        obj["metadata"]["labels"][VOLUME_ID_LABEL] = volume_id
    if volume_name:
        obj["spec"]["volumeName"] = volume_name
    if phase:
        obj["status"]["phase"] = phase
    return obj


def event(kind: str, name: str, reason: str, message: str, at: str, *, uid: str | None = None, rv: str = "1",
          event_type: str = "Warning") -> dict:
    return {
        "metadata": {"name": f"{name}.{rv}", "namespace": NAMESPACE, "resourceVersion": rv, "creationTimestamp": at},
        "involvedObject": {"kind": kind, "namespace": NAMESPACE, "name": name, "uid": uid if uid is not None else f"uid-{name}",
                           "apiVersion": "v1"},
        "reason": reason, "message": message, "firstTimestamp": at, "lastTimestamp": at, "count": 1,
        "type": event_type, "source": {"component": "kubelet"},
    }


def pod(name: str, claims: list[str], *, waiting: str | None = "ContainerCreating", phase: str = "Pending") -> dict:
    statuses = []
    if waiting:
        statuses = [{"name": "session", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": waiting}}}]
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"},
        "spec": {"nodeName": "gpu-h100-01", "containers": [{"name": "session", "image": "x"}],
                 "volumes": [{"name": f"vol-{c.removeprefix('gshare-vol-')}", "persistentVolumeClaim": {"claimName": c}}
                             for c in claims]},
        "status": {"phase": phase, "containerStatuses": statuses},
    }


NO_NFS = ('MountVolume.MountDevice failed for volume "pvc-1" : rpc error: code = Internal desc = {"code":32,"stdout":"",'
          '"stderr":"/usr/local/bin/mount: illegal option -- o\\nmount: /var/lib/kubelet/plugins/kubernetes.io/csi/'
          'org.democratic-csi.nfs/abc/globalmount: bad option; for several filesystems (e.g. nfs, cifs) you might need '
          'a /sbin/mount.<type> helper program.\\n","timeout":false}')
TIMED_OUT = ("Unable to attach or mount volumes: unmounted volumes=[vol-a], unattached volumes=[vol-a]: timed out "
             "waiting for the condition")


def test_bound_pvc_has_no_message_and_its_volume_name():
    [report] = volume_reports([pvc("gshare-vol-a", volume_name="pvc-1")], [], [])
    assert report == {"volume_id": "vol_a1", "claim_name": "gshare-vol-a", "phase": "Bound", "volume_name": "pvc-1",
                      "message": ""}
    assert report["phase"] in VOLUME_PHASES


def test_pending_pvc_reports_its_newest_event():
    events = [
        event("PersistentVolumeClaim", "gshare-vol-a", "ExternalProvisioning",
              "Waiting for a volume to be created either by the external provisioner 'org.democratic-csi.nfs' or "
              "manually by the system administrator.", "2026-11-29T15:59:00Z", rv="10", event_type="Normal"),
        event("PersistentVolumeClaim", "gshare-vol-a", "ProvisioningFailed",
              'storageclass.storage.k8s.io "nfs-a" not found', "2026-11-29T15:59:30Z", rv="11"),
    ]
    [report] = volume_reports([pvc("gshare-vol-a", phase="Pending")], list(reversed(events)), [])
    assert (report["phase"], report["volume_name"]) == ("Pending", "")
    assert report["message"] == 'storageclass.storage.k8s.io "nfs-a" not found'


def test_same_second_events_are_ordered_by_resource_version():
    events = [event("PersistentVolumeClaim", "gshare-vol-a", "A", "first", "2026-11-29T15:59:00Z", rv="9"),
              event("PersistentVolumeClaim", "gshare-vol-a", "B", "second", "2026-11-29T15:59:00Z", rv="12")]
    assert volume_reports([pvc("gshare-vol-a", phase="Pending")], events, [])[0]["message"] == "second"


def test_events_of_a_previous_pvc_with_the_same_name_are_ignored():
    old = event("PersistentVolumeClaim", "gshare-vol-a", "ProvisioningFailed", "old claim", "2026-11-29T15:59:00Z",
                uid="uid-of-the-deleted-one")
    assert volume_reports([pvc("gshare-vol-a", phase="Pending")], [old], [])[0]["message"] == ""


def test_pvc_without_status_is_pending_and_unlabelled_pvcs_are_not_volumes():
    reports = volume_reports([pvc("gshare-vol-b", phase=None), pvc("other-app-data", volume_id=None)], [], [])
    assert [(r["claim_name"], r["phase"]) for r in reports] == [("gshare-vol-b", "Pending")]


def test_lost_pvc_reports_the_claim_lost_event():
    lost = event("PersistentVolumeClaim", "gshare-vol-a", "ClaimLost",
                 "Bound claim has lost its PersistentVolume. Data on the volume is lost!", "2026-11-29T15:59:00Z")
    [report] = volume_reports([pvc("gshare-vol-a", phase="Lost", volume_name="pvc-1")], [lost], [])
    assert (report["phase"], report["volume_name"]) == ("Lost", "pvc-1")
    assert report["message"].startswith("Bound claim has lost its PersistentVolume")


def test_pod_stuck_in_container_creating_gives_its_failed_mount_message():
    claim = pvc("gshare-vol-a", volume_name="pvc-1")
    events = [event("Pod", "ses-1", "FailedMount", NO_NFS, "2026-11-29T15:58:00Z", rv="20"),
              event("Pod", "ses-1", "FailedMount", TIMED_OUT, "2026-11-29T16:00:00Z", rv="21"),
              event("Pod", "ses-1", "Scheduled", "Successfully assigned gshare-sessions/ses-1 to gpu-h100-01",
                    "2026-11-29T15:57:00Z", rv="19", event_type="Normal")]
    [report] = volume_reports([claim], events, [pod("ses-1", ["gshare-vol-a"])])
    assert report["phase"] == "Bound"  # the claim is bound: it is the mount that fails
    assert report["message"] == NO_NFS  # the MountVolume.* cause wins over the newer "timed out" summary


def test_only_the_generic_failed_mount_when_that_is_all_there_is():
    events = [event("Pod", "ses-1", "FailedMount", TIMED_OUT, "2026-11-29T16:00:00Z")]
    [report] = volume_reports([pvc("gshare-vol-a", volume_name="pvc-1")], events, [pod("ses-1", ["gshare-vol-a"])])
    assert report["message"] == TIMED_OUT


def test_failed_mount_goes_to_the_volume_it_names():
    claims = [pvc("gshare-vol-a", volume_name="pvc-1"), pvc("gshare-vol-b", volume_id="vol_b2", volume_name="pvc-2")]
    events = [event("Pod", "ses-1", "FailedMount", NO_NFS, "2026-11-29T15:58:00Z")]
    reports = {r["claim_name"]: r for r in volume_reports(claims, events, [pod("ses-1", ["gshare-vol-a", "gshare-vol-b"])])}
    assert reports["gshare-vol-a"]["message"] == NO_NFS
    assert reports["gshare-vol-b"]["message"] == ""
    named_by_pod_volume = event("Pod", "ses-1", "FailedMount", TIMED_OUT.replace("vol-a", "vol-b"), "2026-11-29T16:00:00Z")
    reports = {r["claim_name"]: r for r in volume_reports(claims, [named_by_pod_volume],
                                                          [pod("ses-1", ["gshare-vol-a", "gshare-vol-b"])])}
    assert (reports["gshare-vol-a"]["message"], reports["gshare-vol-b"]["message"]) == ("", named_by_pod_volume["message"])


@pytest.mark.parametrize("stuck", [
    pod("ses-1", ["gshare-vol-a"], waiting=None, phase="Running"),
    pod("ses-1", ["gshare-vol-a"], waiting="ImagePullBackOff"),
    pod("ses-1", ["gshare-vol-other"]),
], ids=["running", "other-waiting-reason", "other-claim"])
def test_failed_mount_only_from_pods_mounting_it_and_stuck_creating(stuck):
    events = [event("Pod", "ses-1", "FailedMount", NO_NFS, "2026-11-29T15:58:00Z")]
    assert volume_reports([pvc("gshare-vol-a", volume_name="pvc-1")], events, [stuck])[0]["message"] == ""


def test_long_messages_are_cut():
    events = [event("PersistentVolumeClaim", "gshare-vol-a", "ProvisioningFailed", "x" * 5000, "2026-11-29T15:59:00Z")]
    message = volume_reports([pvc("gshare-vol-a", phase="Pending")], events, [])[0]["message"]
    assert len(message) == 2000 and message.endswith("…")


def test_report_shape():
    report = storage_report(read_at=READ_AT, capacities=capacity_list(), pvcs=[pvc("gshare-vol-a", volume_name="pvc-1")],
                            events=[], pods=[], nodes=[node_fixture()], own_class="gshare-nfs")
    assert list(report) == ["read_at", "storage_classes", "volumes", "nodes"]
    assert report["read_at"] == "2026-11-29T16:00:00.123456Z"
    assert [r["storage_class"] for r in report["storage_classes"]] == ["csi-proxmox", "gshare-nfs", "zfs-local-dataset"]
    assert report["volumes"][0]["volume_id"] == "vol_a1"
    assert report["nodes"][0]["disk_bytes"] == 3750157048 * KI
    json.dumps(report)
    # With the StorageClasses listed they are named (sorted, each once); not listed, the key is left out (unknown).
    classes = [{"metadata": {"name": n}} for n in ("local-path", "gshare-nfs", "local-path")]
    listed = storage_report(read_at=READ_AT, capacities=[], pvcs=[], events=[], pods=[], nodes=[], classes=classes)
    assert list(listed) == ["read_at", "storage_classes", "existing_storage_classes", "volumes", "nodes"]
    assert listed["existing_storage_classes"] == existing_storage_classes(classes) == ["gshare-nfs", "local-path"]
    assert existing_storage_classes([]) == []


# --------------------------------------------------------------------------- against the emulator


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    hosts = fleet.cluster_hosts("lab-c1", **{"gpu-h100-01": {"mount_nfs": None}, "gpu-v100-01": {"mount_nfs": None}})
    with EmulatedCluster(fleet.cluster_objects("lab-c1"), version=fleet.cluster_version("lab-c1"),
                         pod_startup_seconds=0.1, hosts=hosts) as running:
        yield running


def create_claim(core, name: str, volume_id: str, storage_class: str = "gshare-nfs") -> None:
    core.create_namespaced_persistent_volume_claim(NAMESPACE, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {VOLUME_ID_LABEL: volume_id, "app.kubernetes.io/managed-by": "gshare"}},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class,
                 "resources": {"requests": {"storage": "10Gi"}}}})


def test_collect_storage_from_the_emulated_fleet(cluster):
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
    core = kubernetes.client.CoreV1Api(api)
    create_claim(core, "gshare-vol-good", "vol_good")
    create_claim(core, "gshare-vol-nosc", "vol_nosc", storage_class="nfs-a")
    wait_for(lambda: any(p["metadata"]["name"] == "gshare-vol-good" and p["status"]["phase"] == "Bound"
                         for p in cluster.objects_of("persistentvolumeclaims")))
    core.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ses-x"},
        "spec": {"nodeSelector": {"gpu": "on"}, "containers": [{"name": "session", "image": "x",
                                                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                 "volumes": [{"name": "vol-good", "persistentVolumeClaim": {"claimName": "gshare-vol-good"}}]}})
    wait_for(lambda: any(e["reason"] == "FailedMount" for e in cluster.objects_of("events")))

    report = collect_storage(api, namespace=NAMESPACE, own_class="gshare-nfs", request_timeout=5,
                             clock=lambda: READ_AT)
    api.close()
    assert report["read_at"] == "2026-11-29T16:00:00.123456Z"
    # lab-c1 publishes two segments of the shared pool: 1643124Mi and 1642872Mi -> the largest
    assert report["storage_classes"] == [{"storage_class": "gshare-nfs", "capacity_bytes": 1643124 * MI, "objects": 2}]
    volumes = {v["claim_name"]: v for v in report["volumes"]}
    good, nosc = volumes["gshare-vol-good"], volumes["gshare-vol-nosc"]
    assert (good["volume_id"], good["phase"]) == ("vol_good", "Bound") and good["volume_name"].startswith("pvc-")
    assert good["message"].startswith(f'MountVolume.MountDevice failed for volume "{good["volume_name"]}"')
    assert "you might need a /sbin/mount.<type> helper program." in good["message"]
    assert nosc == {"volume_id": "vol_nosc", "claim_name": "gshare-vol-nosc", "phase": "Pending", "volume_name": "",
                    "message": 'storageclass.storage.k8s.io "nfs-a" not found'}
    assert [n["name"] for n in report["nodes"]] == sorted(n.name for n in fleet.cluster_spec("lab-c1").nodes)
    assert all(n["disk_bytes"] == 3750157048 * KI for n in report["nodes"])
    assert report["existing_storage_classes"] == [fleet.STORAGE_CLASS]


def test_a_cluster_attached_without_storage_reports_no_storage_class(caplog):
    objects = [o for o in fleet.cluster_objects("lab-c2") if o["kind"] != "StorageClass"]
    with EmulatedCluster(objects, version=fleet.cluster_version("lab-c2")) as bare:
        api = kubernetes.config.new_client_from_config_dict(bare.kubeconfig("lab-c3"))
        with caplog.at_level("WARNING", logger="operator_agent.reporters.storage"):
            report = collect_storage(api, namespace=NAMESPACE, own_class=fleet.STORAGE_CLASS)
        api.close()
        paths = [r["path"] for r in bare.requests_seen()]
    assert report["existing_storage_classes"] == []  # listed, and none: not "unknown"
    assert f"StorageClass {fleet.STORAGE_CLASS}, which does not exist" in caplog.text
    assert "/apis/storage.k8s.io/v1/storageclasses" in paths
    assert not [p for p in paths if p.startswith("/apis/storage.k8s.io/v1/storageclasses/")]  # the list answers it


def test_collect_storage_without_volumes_reads_no_events_or_pods(cluster):
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
    report = collect_storage(api, namespace=NAMESPACE, own_class=None)
    api.close()
    assert report["volumes"] == []
    paths = [r["path"] for r in cluster.requests_seen()]
    assert not [p for p in paths if p.endswith(("/events", "/pods"))]
    assert "/apis/storage.k8s.io/v1/csistoragecapacities" in paths


# --------------------------------------------------------------------------- the tick and its loop


@pytest.fixture
def control_plane() -> Iterator[dict]:
    state: dict = {"posts": [], "status": 200, "script": [], "url": ""}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            state["posts"].append({"path": self.path, "authorization": self.headers.get("Authorization"), "body": body})
            status, code = state["script"].pop(0) if state["script"] else (state["status"], "nope")
            payload = json.dumps({"code": code, "detail": "refused"} if status >= 400 else {"applied": True}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def config_for(tmp_path, control_plane, **overrides) -> OperatorConfig:
    token = tmp_path / "internal-jwt"
    token.write_text("operator-token")
    values = {"cluster_id": "clu_test", "control_plane_url": control_plane["url"], "token_file": str(token),
              "http_timeout": 5.0, "backoff_max": 0.1, "session_namespace": NAMESPACE,
              "volume_storage_class": "gshare-nfs", "volume_sync_interval": 0.2}
    values.update(overrides)
    return OperatorConfig(**values)


def test_report_storage_posts_the_report(cluster, control_plane, tmp_path):
    config = config_for(tmp_path, control_plane)
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
    client = ControlPlaneClient(config, max_attempts=1)
    assert report_storage(api, client, config) is True
    [post] = control_plane["posts"]
    assert post["path"] == STORAGE_PATH == "/internal/v1/storage"
    assert post["authorization"] == "Bearer operator-token"
    assert post["body"]["storage_classes"] == [{"storage_class": "gshare-nfs", "capacity_bytes": 1643124 * MI,
                                                "objects": 2}]
    control_plane["status"] = 403
    assert report_storage(api, client, config) is False  # refused: logged, never raised
    client.session.close()
    api.close()


def test_run_volume_sync_reports_every_interval_until_stopped(cluster, control_plane, tmp_path):
    config = config_for(tmp_path, control_plane)
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
    stop = threading.Event()
    client = ControlPlaneClient(config, sleep=stop.wait, stopped=stop.is_set, max_attempts=1)
    thread = threading.Thread(target=run_volume_sync, args=(config, api, client, stop), daemon=True)
    thread.start()
    wait_for(lambda: len(control_plane["posts"]) >= 3)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    times = [p["body"]["read_at"] for p in control_plane["posts"]]
    assert times == sorted(times) and len(set(times)) == len(times)
    client.session.close()
    api.close()


def test_a_volume_held_elsewhere_does_not_block_capacity_and_disks(cluster, control_plane, tmp_path):
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
    create_claim(kubernetes.client.CoreV1Api(api), "gshare-vol-left", "vol_left")
    config = config_for(tmp_path, control_plane)
    client = ControlPlaneClient(config, max_attempts=1)
    control_plane["script"] = [(403, "forbidden_cluster_scope")]
    assert report_storage(api, client, config) is True
    refused, resent = control_plane["posts"]
    assert [v["volume_id"] for v in refused["body"]["volumes"]] == ["vol_left"]
    assert resent["body"]["volumes"] == [] and resent["body"]["storage_classes"] == refused["body"]["storage_classes"]
    assert resent["body"]["nodes"] == refused["body"]["nodes"]
    control_plane["script"] = [(403, "forbidden_cluster_scope")] * 2
    assert report_storage(api, client, config) is False  # refused again without volumes: give up until the next tick
    control_plane["script"] = [(403, "token_scope")]
    before = len(control_plane["posts"])
    assert report_storage(api, client, config) is False
    assert len(control_plane["posts"]) == before + 1  # any other refusal is not retried
    client.session.close()
    api.close()


def test_one_report_per_volume_id():
    older = pvc("gshare-vol-old", volume_id="vol_same", phase="Pending")
    older["metadata"]["creationTimestamp"] = "2026-11-01T00:00:00Z"
    newer = pvc("gshare-vol-new", volume_id="vol_same", phase="Pending")
    newer["metadata"]["creationTimestamp"] = "2026-11-02T00:00:00Z"
    bound = pvc("gshare-vol-bound", volume_id="vol_same", volume_name="pvc-9")
    bound["metadata"]["creationTimestamp"] = "2026-10-01T00:00:00Z"
    assert [r["claim_name"] for r in volume_reports([older, newer], [], [])] == ["gshare-vol-new"]
    assert [r["claim_name"] for r in volume_reports([older, bound, newer], [], [])] == ["gshare-vol-bound"]
    assert set(volume_reports([bound], [], [])[0]) == {"volume_id", "claim_name", "phase", "volume_name", "message"}


# --------------------------------------------------------------------------- why a session waits for its volumes


def spec_volume(name: str, claim: str, storage_class: str = "gshare-nfs") -> dict:
    return {"volumeId": f"vol_{name}", "name": name, "claimName": claim, "storageClassName": storage_class,
            "size": "10Gi", "mountPath": f"/data/{name}"}


def test_volume_wait_message_names_each_volume_not_bound_and_why():
    volumes = [spec_volume("bound", "gshare-vol-bound"), spec_volume("nosc", "gshare-vol-nosc", "nfs-a"),
               spec_volume("slow", "gshare-vol-slow"), spec_volume("gone", "gshare-vol-gone")]
    pending = pvc("gshare-vol-nosc", phase="Pending")
    pending["spec"]["storageClassName"] = "nfs-a"
    pvcs = {"gshare-vol-bound": pvc("gshare-vol-bound", volume_name="pvc-1"), "gshare-vol-nosc": pending,
            "gshare-vol-slow": pvc("gshare-vol-slow", phase="Pending"), "gshare-vol-gone": None}
    events = [event("PersistentVolumeClaim", "gshare-vol-slow", "ExternalProvisioning", "Waiting for a volume to be created",
                    "2026-11-29T15:59:00Z"),
              event("PersistentVolumeClaim", "gshare-vol-nosc", "ProvisioningFailed",
                    'storageclass.storage.k8s.io "nfs-a" not found', "2026-11-29T15:59:00Z")]
    assert volume_wait_message(volumes, pvcs, events, missing_classes=["nfs-a"]) == (
        'volume nosc (vol_nosc): PVC gshare-vol-nosc is Pending: storageclass "nfs-a" not found on this cluster; '
        "volume slow (vol_slow): PVC gshare-vol-slow is Pending: Waiting for a volume to be created (ExternalProvisioning); "
        "volume gone (vol_gone): PVC gshare-vol-gone does not exist yet")
    # The PV controller's event says it too when the class was not read.
    assert volume_wait_message(volumes[1:2], pvcs, events) == (
        'volume nosc (vol_nosc): PVC gshare-vol-nosc is Pending: storageclass "nfs-a" not found on this cluster '
        "(ProvisioningFailed)")
    assert volume_wait_message(volumes[:1], pvcs, events) == ""


def test_session_volume_wait_reads_the_claims_and_their_storage_class(cluster):
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
    core = kubernetes.client.CoreV1Api(api)
    create_claim(core, "gshare-vol-good", "vol_good")
    create_claim(core, "gshare-vol-nosc", "vol_nosc", storage_class="nfs-a")
    wait_for(lambda: any(p["metadata"]["name"] == "gshare-vol-good" and p["status"]["phase"] == "Bound"
                         for p in cluster.objects_of("persistentvolumeclaims")))
    volumes = [spec_volume("good", "gshare-vol-good"), spec_volume("nosc", "gshare-vol-nosc", "nfs-a")]
    message = session_volume_wait(api, NAMESPACE, volumes, _request_timeout=5)
    assert message == 'volume nosc (vol_nosc): PVC gshare-vol-nosc is Pending: storageclass "nfs-a" not found on this cluster'
    assert session_volume_wait(api, NAMESPACE, volumes[:1]) == ""
    api.close()


def test_a_missing_own_storage_class_is_logged(cluster, caplog):
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("lab-c1"))
    with caplog.at_level("WARNING", logger="operator_agent.reporters.storage"):
        report = collect_storage(api, namespace=NAMESPACE, own_class="gshare-nsf")
        assert "StorageClass gshare-nsf, which does not exist" in caplog.text
        caplog.clear()
        collect_storage(api, namespace=NAMESPACE, own_class=fleet.STORAGE_CLASS)
        assert caplog.text == ""
    api.close()
    assert {"storage_class": "gshare-nsf", "capacity_bytes": None, "objects": 0} in report["storage_classes"]
