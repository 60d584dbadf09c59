"""Server-side apply in the emulator: field ownership (``managedFields``) and the removal of fields a manager stops
applying, driven by the official ``kubernetes`` client over HTTP.

No Django here: run with ``pytest -p no:django tests/demo``.
"""

from __future__ import annotations

import kubernetes
import pytest

from demo.emulator import BEFORE_FIRST_APPLY, EmulatedCluster
from demo.emulator.apply import describe

NS = "team-a"
APPLY = "application/apply-patch+yaml"


@pytest.fixture(scope="module")
def cluster():
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}, "status": {"phase": "Active"}}]
    with EmulatedCluster(namespaces) as running:
        yield running


@pytest.fixture(scope="module")
def core(cluster):
    api = kubernetes.config.new_client_from_config_dict(cluster.kubeconfig("apply"))
    yield kubernetes.client.CoreV1Api(api)
    api.close()


def config_map(name: str, data: dict, labels: dict | None = None) -> dict:
    metadata: dict = {"name": name, "namespace": NS}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def apply(core, body: dict, manager: str, **kwargs):
    return core.patch_namespaced_config_map(body["metadata"]["name"], NS, body, field_manager=manager,
                                            _content_type=APPLY, **kwargs)


def stored(cluster, name: str) -> dict:
    return next(o for o in cluster.objects_of("configmaps") if o["metadata"]["name"] == name)


def test_a_field_the_manager_stops_applying_is_removed(core, cluster):
    apply(core, config_map("drop", {"a": "1", "b": "2"}, labels={"keep": "x", "go": "y"}), "manager-a")
    applied = apply(core, config_map("drop", {"a": "1"}, labels={"keep": "x"}), "manager-a")
    assert applied.data == {"a": "1"}
    assert applied.metadata.labels == {"keep": "x"}
    assert describe(stored(cluster, "drop")) == {"manager-a/Apply": ["data.a", "metadata.labels.keep"]}


def test_managed_fields_are_fields_v1_per_manager(core, cluster):
    apply(core, config_map("fields", {"a": "1"}, labels={"app": "x"}), "manager-a")
    entry = stored(cluster, "fields")["metadata"]["managedFields"]
    assert [(e["manager"], e["operation"], e["fieldsType"]) for e in entry] == [("manager-a", "Apply", "FieldsV1")]
    assert entry[0]["fieldsV1"] == {"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}


def test_a_field_another_manager_also_applies_is_kept(core, cluster):
    apply(core, config_map("shared", {"a": "1", "b": "2"}), "manager-a")
    apply(core, config_map("shared", {"b": "2"}), "manager-b")
    applied = apply(core, config_map("shared", {"a": "1"}), "manager-a")
    assert applied.data == {"a": "1", "b": "2"}
    assert describe(stored(cluster, "shared")) == {"manager-a/Apply": ["data.a"], "manager-b/Apply": ["data.b"]}
    applied = apply(core, config_map("shared", {}), "manager-b")  # now only manager-b owned b: it goes
    assert applied.data == {"a": "1"}


def test_fields_set_by_a_patch_are_not_removed_by_an_apply(core, cluster):
    apply(core, config_map("patched", {"a": "1", "b": "2"}), "manager-a")
    core.patch_namespaced_config_map("patched", NS, {"data": {"b": "3", "c": "4"}}, field_manager="editor")
    applied = apply(core, config_map("patched", {"a": "1"}), "manager-a")
    assert applied.data == {"a": "1", "b": "3", "c": "4"}  # b changed hands when the patch changed it
    assert describe(stored(cluster, "patched")) == {"manager-a/Apply": ["data.a"], "editor/Update": ["data.b", "data.c"]}


def test_a_patch_without_a_field_manager_is_owned_by_the_client(core, cluster):
    apply(core, config_map("anonymous", {"a": "1"}), "manager-a")
    core.patch_namespaced_config_map("anonymous", NS, {"data": {"b": "2"}})
    owners = describe(stored(cluster, "anonymous"))
    assert owners.pop("manager-a/Apply") == ["data.a"]
    assert list(owners.values()) == [["data.b"]]  # the client's User-Agent product, e.g. OpenAPI-Generator/Update
    assert list(owners)[0].endswith("/Update") and list(owners)[0] != "/Update"


def test_fields_set_before_the_first_apply_are_kept(core, cluster):
    core.create_namespaced_config_map(NS, config_map("created", {"a": "1", "b": "2"}))
    apply(core, config_map("created", {"a": "1", "c": "3"}), "manager-a")
    applied = apply(core, config_map("created", {"c": "3"}), "manager-a")
    assert applied.data == {"a": "1", "b": "2", "c": "3"}  # a and b were there before: before-first-apply owns them
    owners = describe(stored(cluster, "created"))
    assert owners == {f"{BEFORE_FIRST_APPLY}/Update": ["data.a", "data.b"], "manager-a/Apply": ["data.c"]}


def test_a_value_the_apply_changes_is_taken_from_the_other_owners(core, cluster):
    core.create_namespaced_config_map(NS, config_map("taken", {"a": "1"}))
    apply(core, config_map("taken", {"a": "2"}), "manager-a", force=True)
    applied = apply(core, config_map("taken", {}), "manager-a")
    assert not applied.data  # a was manager-a's alone once it changed it
    assert describe(stored(cluster, "taken")) == {"manager-a/Apply": ["data"]}  # the empty map it applied


def test_conflicts_are_not_reported_with_or_without_force(core):
    apply(core, config_map("conflict", {"a": "1"}), "manager-a")
    assert apply(core, config_map("conflict", {"a": "2"}), "manager-b").data == {"a": "2"}
    assert apply(core, config_map("conflict", {"a": "3"}), "manager-a", force=True).data == {"a": "3"}


def test_lists_are_owned_whole(core, cluster):
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ports", "namespace": NS},
               "spec": {"ports": [{"name": "http", "port": 80}, {"name": "ssh", "port": 22}], "selector": {"a": "b"}}}
    core.patch_namespaced_service("ports", NS, service, field_manager="manager-a", _content_type=APPLY)
    service["spec"] = {"ports": [{"name": "http", "port": 80}]}
    applied = core.patch_namespaced_service("ports", NS, service, field_manager="manager-a", _content_type=APPLY)
    assert [p.name for p in applied.spec.ports] == ["http"] and applied.spec.selector is None
    assert applied.spec.cluster_ip  # set by the server, owned by nobody, never removed
    fields = next(e for e in applied.metadata.managed_fields if e.manager == "manager-a").fields_v1
    assert fields == {"f:spec": {"f:ports": {}}}


def test_a_no_op_apply_writes_nothing(core):
    first = apply(core, config_map("same", {"a": "1"}), "manager-a")
    again = apply(core, config_map("same", {"a": "1"}), "manager-a")
    assert again.metadata.resource_version == first.metadata.resource_version
