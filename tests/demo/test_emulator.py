"""The Kubernetes API emulator (``demo.emulator``) driven by the official ``kubernetes`` client.

No Django here: run with ``pytest -p no:django tests/demo``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from demo.emulator import EmulatedCluster, parse_field_selector, parse_label_selector
from tests.helpers import serve_seed, wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "emulator-test-token"
VERSION = {  # the shape of demo/data/k8s-objects/version.k3s-v1.34.1+k3s1.json
    "major": "1", "minor": "34", "emulationMajor": "1", "emulationMinor": "34", "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "33", "gitVersion": "v1.34.1+k3s1",
    "gitCommit": "24fc436e6ea59c56ebc37727baa4e6c9a201ee01", "gitTreeState": "clean",
    "buildDate": "2025-09-22T21:39:43Z", "goVersion": "go1.24.6", "compiler": "gc", "platform": "linux/amd64",
}


def _namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "status": {"phase": "Active"}}


def _node(name: str, labels: dict, ready: str = "True") -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"conditions": [{"type": "Ready", "status": ready}], "capacity": {"nvidia.com/gpu": "10"}},
    }


def _pod(name: str, namespace: str, node: str, phase: str, labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]}, "status": {"phase": phase},
    }


def seed() -> list[dict]:
    """A small cluster: 3 nodes (2 GPU), RuntimeClass nvidia, HAMi's DaemonSet, 3 pods."""
    daemonset = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "hami-device-plugin", "namespace": "kube-system",
                     "labels": {"app.kubernetes.io/component": "hami-device-plugin", "app.kubernetes.io/name": "hami"}},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/component": "hami-device-plugin"}},
                 "template": {"metadata": {"labels": {"app.kubernetes.io/component": "hami-device-plugin"}},
                              "spec": {"containers": [{"name": "device-plugin",
                                                       "image": "projecthami/hami:v2.10.0"}]}}},
        "status": {"currentNumberScheduled": 2, "desiredNumberScheduled": 2, "numberMisscheduled": 0, "numberReady": 2},
    }
    return [
        _namespace("default"), _namespace("kube-system"), _namespace("team-a"),
        _node("gpu-a", {"gpu": "on", "tier": "gold"}),
        _node("gpu-b", {"gpu": "on", "tier": "silver"}),
        _node("cpu-c", {"tier": "bronze"}, ready="False"),
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"},
        daemonset,
        _pod("train-1", "team-a", "gpu-a", "Running", {"app": "train"}),
        _pod("train-2", "team-a", "gpu-b", "Pending", {"app": "train"}),
        _pod("infer-1", "default", "gpu-a", "Succeeded", {"app": "infer"}),
    ]


@pytest.fixture
def cluster():
    with EmulatedCluster(seed(), version=VERSION, token=TOKEN) as running:
        yield running


@pytest.fixture
def api(cluster):
    client = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("test"))
    yield client
    client.close()


@pytest.fixture
def core(api):
    return kubernetes.client.CoreV1Api(api)


def raw(cluster: EmulatedCluster, path: str, *, method: str = "GET", body: object = None,
        content_type: str = "application/json", token: str | None = TOKEN) -> tuple[int, dict]:
    """Call the emulator without the client library; returns ``(status, JSON body)``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(cluster.url + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def names(items) -> list[str]:
    return [item.metadata.name for item in items]


# --------------------------------------------------------------------------- version and discovery


def test_version_is_the_configured_document(cluster, api):
    info = kubernetes.client.VersionApi(api).get_code()
    assert (info.git_version, info.major, info.minor) == ("v1.34.1+k3s1", "1", "34")
    assert raw(cluster, "/version") == (200, VERSION)


def test_partial_version_is_completed_for_the_client():
    with EmulatedCluster([], version={"major": "1", "minor": "32", "gitVersion": "v1.32.3"}) as running:
        api = kubernetes.config.new_client_from_config_dict(running.kubeconfig("partial"))
        info = kubernetes.client.VersionApi(api).get_code()
        assert info.git_version == "v1.32.3" and info.platform  # missing keys filled from kmock's default
        api.close()


def test_discovery_lists_groups_kinds_scopes_and_verbs(api):
    assert kubernetes.client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = {g.name: g for g in kubernetes.client.ApisApi(api).get_api_versions().groups}
    for group in ("apps", "batch", "node.k8s.io", "storage.k8s.io", "apiextensions.k8s.io",
                  "rbac.authorization.k8s.io", "networking.k8s.io"):
        assert groups[group].preferred_version.group_version == f"{group}/v1"

    core = {r.name: r for r in kubernetes.client.CoreV1Api(api).get_api_resources().resources}
    expected_core = {"nodes": ("Node", False), "namespaces": ("Namespace", False), "pods": ("Pod", True),
                     "services": ("Service", True), "secrets": ("Secret", True), "configmaps": ("ConfigMap", True),
                     "persistentvolumeclaims": ("PersistentVolumeClaim", True),
                     "persistentvolumes": ("PersistentVolume", False), "events": ("Event", True)}
    for plural, (kind, namespaced) in expected_core.items():
        assert (core[plural].kind, core[plural].namespaced) == (kind, namespaced), plural
        assert {"get", "list", "watch", "create", "patch", "delete"} <= set(core[plural].verbs)
    assert core["pods/status"].verbs == ["get", "patch", "update"]

    def resources(api_class):
        return {r.name: (r.kind, r.namespaced) for r in api_class(api).get_api_resources().resources}

    assert resources(kubernetes.client.AppsV1Api)["daemonsets"] == ("DaemonSet", True)
    assert resources(kubernetes.client.AppsV1Api)["deployments"] == ("Deployment", True)
    assert resources(kubernetes.client.NodeV1Api)["runtimeclasses"] == ("RuntimeClass", False)
    assert resources(kubernetes.client.StorageV1Api)["storageclasses"] == ("StorageClass", False)
    assert resources(kubernetes.client.StorageV1Api)["csistoragecapacities"] == ("CSIStorageCapacity", True)
    assert resources(kubernetes.client.ApiextensionsV1Api)["customresourcedefinitions"] == (
        "CustomResourceDefinition", False)
    assert resources(kubernetes.client.RbacAuthorizationV1Api)["clusterroles"] == ("ClusterRole", False)
    assert resources(kubernetes.client.BatchV1Api)["jobs"] == ("Job", True)


def test_dynamic_client_resolves_kinds(api):
    dynamic = kubernetes.dynamic.DynamicClient(api)
    nodes = dynamic.resources.get(api_version="v1", kind="Node")
    assert {n.metadata.name for n in nodes.get(label_selector="gpu=on").items} == {"gpu-a", "gpu-b"}
    assert dynamic.resources.get(api_version="apps/v1", kind="DaemonSet").namespaced


def test_unknown_group_and_resource_are_404_status(cluster):
    assert raw(cluster, "/apis/example.com/v1")[0] == 404
    code, body = raw(cluster, "/api/v1/widgets")
    assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound")


# --------------------------------------------------------------------------- reads and selectors


def test_list_has_kind_api_version_resource_version_and_object_metadata(cluster, core):
    code, body = raw(cluster, "/api/v1/nodes")
    assert code == 200
    assert (body["kind"], body["apiVersion"]) == ("NodeList", "v1")
    assert int(body["metadata"]["resourceVersion"]) >= len(seed())
    for item in body["items"]:
        meta = item["metadata"]
        assert meta["uid"] and meta["resourceVersion"].isdigit() and meta["creationTimestamp"].endswith("Z")
    assert [i["metadata"]["name"] for i in body["items"]] == ["cpu-c", "gpu-a", "gpu-b"]  # sorted like etcd keys
    node = raw(cluster, "/api/v1/nodes/gpu-a")[1]
    assert (node["apiVersion"], node["kind"]) == ("v1", "Node")
    assert core.read_node("gpu-a").metadata.labels["tier"] == "gold"


@pytest.mark.parametrize(("selector", "expected"), [
    ("gpu=on", ["gpu-a", "gpu-b"]),
    ("gpu==on", ["gpu-a", "gpu-b"]),
    ("gpu!=on", ["cpu-c"]),
    ("gpu", ["gpu-a", "gpu-b"]),
    ("!gpu", ["cpu-c"]),
    ("tier in (gold,bronze)", ["cpu-c", "gpu-a"]),
    ("tier notin (gold,bronze)", ["gpu-b"]),
    ("gpu=on,tier in (silver)", ["gpu-b"]),
    ("", ["cpu-c", "gpu-a", "gpu-b"]),
])
def test_label_selectors(core, selector, expected):
    assert names(core.list_node(label_selector=selector).items) == expected


def test_field_selectors(core):
    assert names(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-a").items) == ["infer-1", "train-1"]
    assert names(core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items) == ["train-1"]
    assert names(core.list_pod_for_all_namespaces(field_selector="status.phase!=Running").items) == [
        "infer-1", "train-2"]
    assert names(core.list_pod_for_all_namespaces(field_selector="metadata.namespace=team-a").items) == [
        "train-1", "train-2"]
    assert names(core.list_namespaced_pod("team-a", field_selector="metadata.name=train-2").items) == ["train-2"]
    assert names(core.list_node(field_selector="metadata.name=gpu-b").items) == ["gpu-b"]
    assert names(core.list_namespaced_pod("team-a", label_selector="app=train",
                                          field_selector="spec.nodeName=gpu-b").items) == ["train-2"]


def test_unsupported_field_and_bad_label_selector_are_400(core):
    with pytest.raises(ApiException) as exc:
        core.list_node(field_selector="spec.nodeName=gpu-a")  # nodes have no spec.nodeName field label
    assert exc.value.status == 400 and status_of(exc.value)["message"] == "field label not supported: spec.nodeName"
    with pytest.raises(ApiException) as exc:
        core.list_node(label_selector="tier in (gold")
    assert (exc.value.status, status_of(exc.value)["reason"]) == (400, "BadRequest")


def test_selector_parsers():
    requirements = parse_label_selector("a=b, c!=d, e, !f, g in (h, i), j notin (k)")
    assert [(r.key, r.op, r.values) for r in requirements] == [
        ("a", "=", ("b",)), ("c", "!=", ("d",)), ("e", "exists", ()), ("f", "!", ()), ("g", "in", ("h", "i")),
        ("j", "notin", ("k",))]
    assert [(f.field, f.negate, f.value) for f in parse_field_selector("metadata.name!=x")] == [
        ("metadata.name", True, "x")]


def test_read_runtime_class_and_list_daemon_sets_for_all_namespaces(api):
    assert kubernetes.client.NodeV1Api(api).read_runtime_class("nvidia").handler == "nvidia"
    daemonsets = kubernetes.client.AppsV1Api(api).list_daemon_set_for_all_namespaces().items
    assert [(d.metadata.namespace, d.metadata.name) for d in daemonsets] == [("kube-system", "hami-device-plugin")]
    assert daemonsets[0].metadata.labels["app.kubernetes.io/component"] == "hami-device-plugin"
    assert names(kubernetes.client.AppsV1Api(api).list_namespaced_daemon_set("default").items) == []


def test_pagination_with_limit_and_continue(core):
    first = core.list_node(limit=2)
    assert names(first.items) == ["cpu-c", "gpu-a"] and first.metadata.remaining_item_count == 1
    second = core.list_node(limit=2, _continue=first.metadata._continue)
    assert names(second.items) == ["gpu-b"] and not second.metadata._continue


# --------------------------------------------------------------------------- writes


def test_create_fills_metadata_and_a_duplicate_is_409_already_exists(core):
    body = {"metadata": {"name": "cm1"}, "data": {"k": "v"}}
    created = core.create_namespaced_config_map("team-a", body)
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    assert (created.api_version, created.kind, created.metadata.namespace) == ("v1", "ConfigMap", "team-a")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("team-a", body)
    assert exc.value.status == 409
    assert status_of(exc.value) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 409,
        "reason": "AlreadyExists", "message": 'configmaps "cm1" already exists',
        "details": {"name": "cm1", "kind": "configmaps"},
    }


def test_create_in_a_missing_namespace_is_404(core):
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("nope", {"metadata": {"name": "x"}})
    assert (exc.value.status, status_of(exc.value)["message"]) == (404, 'namespaces "nope" not found')


def test_generate_name(core):
    created = core.create_namespaced_config_map("team-a", {"metadata": {"generateName": "session-"}})
    assert created.metadata.name.startswith("session-") and len(created.metadata.name) == len("session-") + 5


def test_merge_and_strategic_merge_and_json_patch(core):
    core.create_namespaced_config_map("team-a", {"metadata": {"name": "cm", "labels": {"a": "1", "b": "2"}},
                                                 "data": {"x": "1"}})
    merged = core.patch_namespaced_config_map("cm", "team-a", {"metadata": {"labels": {"a": None, "c": "3"}}},
                                              _content_type="application/merge-patch+json")
    assert merged.metadata.labels == {"b": "2", "c": "3"}
    strategic = core.patch_namespaced_config_map("cm", "team-a", {"data": {"y": "2"}})  # client default: SMP
    assert strategic.data == {"x": "1", "y": "2"}
    patched = core.patch_namespaced_config_map("cm", "team-a", [{"op": "replace", "path": "/data/x", "value": "9"}])
    assert patched.data == {"x": "9", "y": "2"}
    assert int(patched.metadata.resource_version) > int(merged.metadata.resource_version)
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_config_map("missing", "team-a", {"data": {}})
    assert status_of(exc.value)["reason"] == "NotFound"


def test_patch_node_labels_and_status_subresource(core):
    node = core.patch_node("gpu-b", {"metadata": {"labels": {"gpu": "off"}}, "status": {"capacity": {"x": "1"}}})
    assert node.metadata.labels["gpu"] == "off"
    assert "x" not in node.status.capacity  # the main resource ignores status, as the apiserver does
    node = core.patch_node_status("gpu-b", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert node.status.conditions[0].status == "False"
    assert names(core.list_node(label_selector="gpu=on").items) == ["gpu-a"]


def test_replace_with_a_stale_resource_version_is_409_conflict(core):
    current = core.read_namespaced_pod("train-1", "team-a")
    current.metadata.labels = {"app": "train", "v": "2"}
    replaced = core.replace_namespaced_pod("train-1", "team-a", current)
    assert replaced.metadata.labels["v"] == "2"
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("train-1", "team-a", current)  # still carries the old resourceVersion
    assert (exc.value.status, status_of(exc.value)["reason"]) == (409, "Conflict")


def test_server_side_apply_creates_then_merges(core, cluster):
    manifest = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sess", "namespace": "team-a"},
                "spec": {"ports": [{"port": 8888}], "selector": {"app": "train"}}}
    created = core.patch_namespaced_service("sess", "team-a", manifest, field_manager="gshare",
                                            _content_type="application/apply-patch+yaml")
    assert created.spec.cluster_ip and created.metadata.managed_fields[0].manager == "gshare"
    manifest["metadata"]["labels"] = {"gshare.io/session": "s1"}
    applied = core.patch_namespaced_service("sess", "team-a", manifest, field_manager="gshare",
                                            _content_type="application/apply-patch+yaml")
    assert applied.metadata.labels == {"gshare.io/session": "s1"}
    assert (applied.metadata.uid, applied.spec.cluster_ip) == (created.metadata.uid, created.spec.cluster_ip)
    assert [m.manager for m in applied.metadata.managed_fields] == ["gshare"]
    assert [s["metadata"]["name"] for s in cluster.objects_of("services")] == ["sess"]
    with pytest.raises(ApiException) as exc:  # apply needs a field manager
        core.patch_namespaced_service("sess", "team-a", manifest, _content_type="application/apply-patch+yaml")
    assert exc.value.status == 422


def test_apply_accepts_a_yaml_body(cluster):
    yaml_body = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\ndata:\n  k: v\n"
    request = urllib.request.Request(cluster.url + "/api/v1/namespaces/team-a/configmaps/from-yaml?fieldManager=t",
                                     data=yaml_body.encode(), method="PATCH")
    request.add_header("Content-Type", "application/apply-patch+yaml")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201 and json.loads(response.read())["data"] == {"k": "v"}


def test_delete_returns_status_then_404_not_found(core):
    core.create_namespaced_config_map("team-a", {"metadata": {"name": "gone"}})
    deleted = core.delete_namespaced_config_map("gone", "team-a")  # the v33+ client returns a plain dict here
    assert (deleted["kind"], deleted["status"], deleted["details"]["name"]) == ("Status", "Success", "gone")
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("gone", "team-a")
    assert exc.value.status == 404
    assert status_of(exc.value) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 404,
        "reason": "NotFound", "message": 'configmaps "gone" not found',
        "details": {"name": "gone", "kind": "configmaps"},
    }
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_config_map("gone", "team-a")
    assert status_of(exc.value)["reason"] == "NotFound"
    with pytest.raises(ApiException) as exc:
        kubernetes.client.NodeV1Api(core.api_client).read_runtime_class("missing")
    assert status_of(exc.value)["message"] == 'runtimeclasses.node.k8s.io "missing" not found'


def test_finalizers_delay_deletion_until_removed(core):
    core.create_namespaced_config_map("team-a", {"metadata": {"name": "held", "finalizers": ["gshare.io/cleanup"]}})
    pending = core.delete_namespaced_config_map("held", "team-a")  # a pending deletion returns the object
    assert pending["metadata"]["deletionTimestamp"]
    assert core.read_namespaced_config_map("held", "team-a").metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("held", "team-a", {"metadata": {"finalizers": None}},
                                     _content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("held", "team-a")
    assert exc.value.status == 404


def test_deleting_an_owner_or_a_namespace_deletes_dependents(core):
    owner = core.create_namespaced_config_map("team-a", {"metadata": {"name": "owner"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map("team-a", {"metadata": {"name": "child", "ownerReferences": [reference]}})
    core.delete_namespaced_config_map("owner", "team-a")
    assert names(core.list_namespaced_config_map("team-a").items) == []
    core.delete_namespace("team-a")
    assert names(core.list_pod_for_all_namespaces().items) == ["infer-1"]


def test_custom_resource_definition_serves_its_resource_with_status_subresource(api, cluster):
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gsharesessions.gshare.io"},
        "spec": {"group": "gshare.io", "scope": "Namespaced",
                 "names": {"plural": "gsharesessions", "singular": "gsharesession", "kind": "GShareSession"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
    }
    created = kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
    assert {c.type: c.status for c in created.status.conditions}["Established"] == "True"
    groups = [g.name for g in kubernetes.client.ApisApi(api).get_api_versions().groups]
    assert "gshare.io" in groups
    custom = kubernetes.client.CustomObjectsApi(api)
    args = ("gshare.io", "v1alpha1", "team-a", "gsharesessions")
    obj = custom.create_namespaced_custom_object(*args, {"apiVersion": "gshare.io/v1alpha1", "kind": "GShareSession",
                                                         "metadata": {"name": "s1"}, "spec": {"gpus": 1},
                                                         "status": {"phase": "dropped"}})
    assert "status" not in obj and obj["metadata"]["generation"] == 1
    obj = custom.patch_namespaced_custom_object_status(*args, "s1", {"status": {"phase": "Running"}})
    assert obj["status"] == {"phase": "Running"} and obj["metadata"]["generation"] == 1
    obj = custom.patch_namespaced_custom_object(*args, "s1", {"spec": {"gpus": 2}})
    assert obj["spec"] == {"gpus": 2} and obj["metadata"]["generation"] == 2
    listed = custom.list_namespaced_custom_object(*args)
    assert listed["kind"] == "GShareSessionList" and listed["items"][0]["kind"] == "GShareSession"
    assert cluster.objects_of("gsharesessions", "gshare.io", "v1alpha1")[0]["status"] == {"phase": "Running"}
    deleted = custom.delete_namespaced_custom_object(*args, "s1")
    assert deleted["metadata"]["name"] == "s1"  # custom resources return the deleted object
    assert custom.list_namespaced_custom_object(*args)["items"] == []


# --------------------------------------------------------------------------- watch


def _collect(stream_factory, events: list, started: threading.Event) -> threading.Thread:
    """Consume a watch in a thread; ``Watch.stop()`` or a stopped server ends it (the client may then raise)."""

    def run():
        try:
            for event in stream_factory():
                events.append((event["type"], event["object"].metadata.name))
                started.set()
        except (urllib3.exceptions.HTTPError, OSError):
            pass  # Watch.stop() closes the response under the reading thread

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_watch_with_label_selector_sends_transitions(core):
    watch = kubernetes.watch.Watch()
    events: list = []
    started = threading.Event()
    thread = _collect(lambda: watch.stream(core.list_node, label_selector="gpu=on", timeout_seconds=10),
                      events, started)
    assert started.wait(10)
    wait_for(lambda: len(events) == 2)
    assert sorted(events) == [("ADDED", "gpu-a"), ("ADDED", "gpu-b")]
    core.patch_node("gpu-a", {"metadata": {"annotations": {"x": "1"}}})         # stays in: MODIFIED
    core.patch_node("gpu-b", {"metadata": {"labels": {"gpu": "off"}}})          # leaves: DELETED
    core.patch_node("cpu-c", {"metadata": {"labels": {"gpu": "on"}}})           # enters: ADDED
    core.patch_node("gpu-b", {"metadata": {"annotations": {"ignored": "1"}}})   # outside: nothing
    core.delete_node("gpu-a")                                                   # DELETED
    wait_for(lambda: len(events) == 6)
    watch.stop()
    thread.join(15)
    assert events[2:] == [("MODIFIED", "gpu-a"), ("DELETED", "gpu-b"), ("ADDED", "cpu-c"), ("DELETED", "gpu-a")]


def test_watch_with_field_selector_and_resource_version(core):
    listed = core.list_namespaced_pod("team-a", field_selector="spec.nodeName=gpu-a")
    core.patch_namespaced_pod_status("train-1", "team-a", {"status": {"phase": "Succeeded"}})
    core.create_namespaced_pod("team-a", _pod("train-3", "team-a", "gpu-b", "Pending"))  # other node: filtered
    core.create_namespaced_pod("team-a", _pod("train-4", "team-a", "gpu-a", "Pending"))
    # From the list's resourceVersion: only what happened since, no synthetic ADDED of existing pods.
    events = [(e["type"], e["object"].metadata.name, e["object"].status.phase)
              for e in kubernetes.watch.Watch().stream(core.list_namespaced_pod, "team-a",
                                                       field_selector="spec.nodeName=gpu-a",
                                                       resource_version=listed.metadata.resource_version,
                                                       timeout_seconds=1)]
    assert events == [("MODIFIED", "train-1", "Succeeded"), ("ADDED", "train-4", "Pending")]


def test_watch_ends_at_timeout_seconds(core):
    started = time.monotonic()
    events = list(kubernetes.watch.Watch().stream(core.list_namespace, timeout_seconds=1))
    assert 0.9 <= time.monotonic() - started < 5
    assert [e["object"].metadata.name for e in events] == ["default", "kube-system", "team-a"]


# --------------------------------------------------------------------------- auth, threads, lifecycle


def test_requests_without_the_token_are_401_status(cluster):
    for token in (None, "wrong"):
        code, body = raw(cluster, "/api/v1/nodes", token=token)
        assert code == 401
        assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "Unauthorized", "reason": "Unauthorized", "code": 401}
    config = cluster.kubeconfig("bad")
    config["users"][0]["user"]["token"] = "wrong"
    with pytest.raises(ApiException) as exc:
        kubernetes.client.VersionApi(kubernetes.config.new_client_from_config_dict(config)).get_code()
    assert exc.value.status == 401


def test_kubeconfig_shape(cluster):
    config = cluster.kubeconfig("lab")
    assert config["current-context"] == "lab"
    assert config["clusters"] == [{"name": "lab", "cluster": {"server": cluster.url}}]
    assert config["users"] == [{"name": "lab", "user": {"token": TOKEN}}]
    assert cluster.url.startswith("http://127.0.0.1:")


def test_add_from_another_thread_reaches_watchers_and_objects_of(cluster, core):
    watch = kubernetes.watch.Watch()
    events: list = []
    started = threading.Event()
    thread = _collect(lambda: watch.stream(core.list_node, label_selector="gpu=on", timeout_seconds=10),
                      events, started)
    assert started.wait(10)
    stored = cluster.add(_node("gpu-late", {"gpu": "on"}))
    assert stored["metadata"]["uid"] and stored["metadata"]["resourceVersion"]
    wait_for(lambda: ("ADDED", "gpu-late") in events)
    watch.stop()
    thread.join(15)
    assert [n["metadata"]["name"] for n in cluster.objects_of("nodes")] == ["cpu-c", "gpu-a", "gpu-b", "gpu-late"]
    assert cluster.objects_of("runtimeclasses", "node.k8s.io")[0]["handler"] == "nvidia"


def test_stop_is_prompt_with_an_open_watch():
    running = EmulatedCluster(seed(), version=VERSION).start()
    api = kubernetes.config.new_client_from_config_dict(running.kubeconfig("w"))
    core = kubernetes.client.CoreV1Api(api)
    started = threading.Event()
    thread = _collect(lambda: kubernetes.watch.Watch().stream(core.list_node, _request_timeout=30), [], started)
    assert started.wait(10)
    began = time.monotonic()
    running.stop()
    assert time.monotonic() - began < 5
    thread.join(0.1)
    api.close()


def test_only_loopback_addresses_are_served():
    with pytest.raises(ValueError, match="loopback"):
        EmulatedCluster([], host="0.0.0.0").start()


def test_seed_objects_need_a_served_kind():
    with pytest.raises(ValueError, match="create its CRD first"):
        EmulatedCluster([{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}]).start()


def test_cli_serves_a_seed_until_sigterm(tmp_path):
    seed_path = tmp_path / "seed.json"
    seed_path.write_text(json.dumps({"version": VERSION, "objects": seed()}))
    token_path = tmp_path / "token"
    token_path.write_text(TOKEN + "\n")
    process, info = serve_seed(tmp_path, seed_path, "--token-file", str(token_path))
    try:
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        assert info["pid"] == process.pid and info["url"].startswith("http://127.0.0.1:")
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "cli",
                  "clusters": [{"name": "cli", "cluster": {"server": info["url"]}}],
                  "users": [{"name": "cli", "user": {"token": TOKEN}}],
                  "contexts": [{"name": "cli", "context": {"cluster": "cli", "user": "cli"}}]}
        api = kubernetes.config.new_client_from_config_dict(config)
        assert kubernetes.client.VersionApi(api).get_code().git_version == "v1.34.1+k3s1"
        assert names(kubernetes.client.CoreV1Api(api).list_node(label_selector="gpu=on").items) == ["gpu-a", "gpu-b"]
        api.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_modules_do_not_import_django():
    code = "import sys, demo.emulator, demo.fleet; assert 'django' not in sys.modules, 'django imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_requests_seen(cluster, core):
    assert cluster.requests_seen() == []
    core.list_node(label_selector="gpu=on")
    assert cluster.requests_seen() == [{"method": "GET", "path": "/api/v1/nodes", "query": {"labelSelector": "gpu=on"}}]


def test_pods_stay_pending_unless_the_kubelet_stand_in_is_enabled(core):
    core.create_namespaced_pod("team-a", {"metadata": {"name": "idle"},
                                          "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    time.sleep(0.3)
    assert core.read_namespaced_pod("idle", "team-a").status.phase == "Pending"


def test_pod_startup_stand_in_binds_and_runs_pods():
    with EmulatedCluster(seed(), version=VERSION, pod_startup_seconds=0.1) as running:
        api = kubernetes.config.new_client_from_config_dict(running.kubeconfig("kubelet"))
        core = kubernetes.client.CoreV1Api(api)
        containers = [{"name": "jupyter", "image": "jupyter/base-notebook"}]
        core.create_namespaced_pod("team-a", {"metadata": {"name": "sel"},
                                              "spec": {"nodeSelector": {"tier": "silver"}, "containers": containers}})
        core.create_namespaced_pod("team-a", {"metadata": {"name": "nowhere"},
                                              "spec": {"nodeSelector": {"tier": "none"}, "containers": containers}})
        core.create_namespaced_pod("team-a", {"metadata": {"name": "pinned"},
                                              "spec": {"nodeName": "gpu-a", "containers": containers}})
        wait_for(lambda: core.read_namespaced_pod("sel", "team-a").status.phase == "Running")
        wait_for(lambda: core.read_namespaced_pod("pinned", "team-a").status.phase == "Running")
        selected = core.read_namespaced_pod("sel", "team-a")
        assert selected.spec.node_name == "gpu-b" and selected.status.pod_ip
        assert selected.status.container_statuses[0].ready
        assert {c.type: c.status for c in selected.status.conditions}["Ready"] == "True"
        assert core.read_namespaced_pod("pinned", "team-a").spec.node_name == "gpu-a"
        wait_for(lambda: core.read_namespaced_pod("nowhere", "team-a").status.conditions is not None)
        stuck = core.read_namespaced_pod("nowhere", "team-a")
        assert stuck.status.phase == "Pending" and stuck.status.conditions[0].reason == "Unschedulable"
        api.close()
