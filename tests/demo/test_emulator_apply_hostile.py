"""The emulator's server-side apply given managed fields a client wrote itself (not a list, entries of the wrong
shape), another field manager, ``force=false`` and an apply configuration whose ``metadata`` is not an object: a 4xx
or a correct answer, never a 500, and the object stays readable and appliable."""

from __future__ import annotations

import json

import pytest
import requests

APPLY = "application/apply-patch+yaml"
MANAGED_FIELDS = {
    "int": 5, "text": "abc", "ints": [1, 2], "dict": {"a": 1},
    "fields-text": [{"manager": "m", "operation": "Apply", "fieldsV1": "x"}],
    "fields-list": [{"manager": "m", "operation": "Apply", "fieldsV1": [1]}],
    "fields-odd": [{"manager": "m", "operation": "Apply", "fieldsV1": {"f:data": 5, "k:x": 1, ".": {}}}],
    "odd-keys": [{"manager": 5, "operation": ["Apply"], "subresource": {}, "fieldsV1": {"f:data": {"f:a": {}}}}],
}


@pytest.fixture
def emulator(fleet_cluster):
    emulated = fleet_cluster(objects=[{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}])
    session = requests.Session()
    session.headers["Authorization"] = "Bearer emulator-token"
    return emulated.url + "/api/v1/namespaces/default/configmaps", session


def test_managed_fields_a_client_wrote_never_make_a_later_write_fail(emulator):
    base, http = emulator
    for name, managed in MANAGED_FIELDS.items():
        cm = f"cm-{name}"
        created = http.post(base, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm, "managedFields": managed},
                                        "data": {"a": "1"}}, timeout=10)
        if created.status_code >= 400:
            assert created.status_code < 500, (name, created.text[:300])
            continue
        writes = [
            ("PATCH", f"{base}/{cm}?fieldManager=x&force=true", APPLY,
             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm, "managedFields": managed}, "data": {"b": "2"}}),
            ("PATCH", f"{base}/{cm}", "application/merge-patch+json", {"metadata": {"managedFields": managed}, "data": {"c": "3"}}),
            ("PATCH", f"{base}/{cm}?fieldManager=y&force=false", APPLY,
             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm}, "data": {"d": "4"}}),
        ]
        for method, url, content_type, body in writes:
            answer = http.request(method, url, data=json.dumps(body), headers={"Content-Type": content_type}, timeout=10)
            assert answer.status_code < 500, (name, url, answer.text[:300])
        read = http.get(f"{base}/{cm}", timeout=10)
        assert read.status_code == 200
        assert read.json()["data"].get("d") == "4", (name, read.json()["data"])


@pytest.mark.parametrize("metadata", [[1], "x", 5, None])
def test_an_apply_configuration_whose_metadata_is_not_an_object_is_a_400(emulator, metadata):
    base, http = emulator
    assert http.post(base, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}, timeout=10).status_code == 201
    for url in (f"{base}/cm?fieldManager=x", f"{base}/new?fieldManager=x"):
        answer = http.patch(url, data=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}),
                            headers={"Content-Type": APPLY}, timeout=10)
        assert answer.status_code == 400, answer.text[:300]
        assert answer.json()["kind"] == "Status"


def test_a_deeply_nested_object_is_refused_with_a_4xx(emulator):
    """copy.deepcopy raised RecursionError (a 500) on a document nested about 900 deep."""
    base, http = emulator
    text = '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep"}, "extra": ' + '{"a": ' * 900 + "1" + "}" * 900 + "}"
    answer = http.post(base, data=text, headers={"Content-Type": "application/json"}, timeout=10)
    assert answer.status_code == 422 and answer.json()["kind"] == "Status", answer.text[:300]
    assert http.get(f"{base}/deep", timeout=10).status_code == 404  # nothing half-stored
