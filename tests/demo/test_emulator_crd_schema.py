"""Custom resources checked against their CRD's schema by the emulator (``demo.emulator.schema``), with the real CRDs:
Gateway API v1.6.1 and Envoy Gateway v1.9.0 (``tests/fixtures/crds/``) and gShare's GShareSession.

No Django here: the emulator is driven over HTTP as a client would.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import yaml

from demo.emulator import EmulatedCluster

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "fixtures" / "crds"
ROUTES = "/apis/gateway.networking.k8s.io/v1/namespaces/team-a/httproutes"
BACKENDS = "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/team-a/backends"
POLICIES = "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/team-a/securitypolicies"
SESSIONS = "/apis/gshare.io/v1alpha1/namespaces/team-a/gsharesessions"
WIDGETS = "/apis/example.com/v1/namespaces/team-a/widgets"

WIDGET_CRD = {  # the schema keywords the real CRDs above do not exercise
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {"group": "example.com", "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object",
                 "properties": {"spec": {"type": "object", "properties": {
                     "size": {"x-kubernetes-int-or-string": True},
                     "note": {"type": "string", "nullable": True},
                     "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                              "properties": {"level": {"type": "integer", "default": 3}}},
                     "address": {"type": "string", "format": "ipv4"},
                     "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
                 }}}}}}]},
}


def _crds() -> list[dict]:
    docs = [yaml.safe_load(path.read_text(encoding="utf-8")) for path in sorted(CRDS.glob("*.yaml"))]
    docs.append(yaml.safe_load((ROOT / "charts/gshare-operator/crds/gsharesessions.gshare.io.yaml").read_text()))
    return [*docs, WIDGET_CRD]


@pytest.fixture(scope="module")
def cluster():
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    with EmulatedCluster([namespace, *_crds()]) as running:
        yield running


def _route(name: str = "ses-1", **spec_extra) -> dict:
    """An HTTPRoute as the operator writes it for a session (the brief's contract)."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name},
        "spec": {
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gshare-sessions",
                            "namespace": "gshare-system"}],
            "hostnames": ["sessions.lab-c2.example"],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/s/ses_1/"}}],
                       "backendRefs": [{"name": "ses-1", "port": 8888}]}],
            **spec_extra,
        },
    }


def _post(cluster, path: str, body: dict, **params) -> requests.Response:
    return requests.post(cluster.url + path, json=body, params=params, timeout=10)


def _causes(response: requests.Response) -> dict[str, tuple[str, str]]:
    status = response.json()
    assert response.status_code == 422, status
    assert status["kind"] == "Status" and status["reason"] == "Invalid" and status["code"] == 422
    return {c["field"]: (c["reason"], c["message"]) for c in status["details"]["causes"]}


def test_a_session_route_is_accepted_pruned_and_defaulted(cluster):
    body = _route()
    body["spec"]["unknownField"] = {"x": 1}
    body["spec"]["rules"][0]["backendRefs"][0]["bogus"] = True
    answer = _post(cluster, ROUTES, body)
    assert answer.status_code == 201, answer.text
    spec = answer.json()["spec"]
    assert "unknownField" not in spec
    assert spec["rules"][0]["backendRefs"] == [{"name": "ses-1", "port": 8888, "group": "", "kind": "Service",
                                                "weight": 1}]
    stored = requests.get(f"{cluster.url}{ROUTES}/ses-1", timeout=10).json()
    assert stored["spec"] == spec


def test_a_route_without_rules_gets_the_schemas_default_rule(cluster):
    body = _route("defaults")
    del body["spec"]["rules"]
    spec = _post(cluster, ROUTES, body).json()["spec"]
    assert spec["rules"] == [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}]


def test_each_kind_of_violation_is_refused_with_its_cause(cluster):
    body = _route("bad")
    rule = body["spec"]["rules"][0]
    rule["matches"][0]["path"]["type"] = "Prefix"  # enum
    rule["backendRefs"][0].update(name="", port=70000)  # minLength, maximum
    body["spec"]["hostnames"] = ["Not_A_Host"]  # pattern
    del body["spec"]["parentRefs"][0]["name"]  # required
    body["spec"]["rules"].append({"backendRefs": [{"name": "x", "port": "8888"}]})  # type
    answer = _post(cluster, ROUTES, body)
    causes = _causes(answer)
    assert causes["spec.rules[0].matches[0].path.type"] == (
        "FieldValueNotSupported", 'Unsupported value: "Prefix": supported values: "Exact", "PathPrefix", '
        '"RegularExpression"')
    assert causes["spec.rules[0].backendRefs[0].name"] == (
        "FieldValueInvalid", 'Invalid value: "": spec.rules[0].backendRefs[0].name in body should be at least 1 '
        "chars long")
    assert causes["spec.rules[0].backendRefs[0].port"] == (
        "FieldValueInvalid", "Invalid value: 70000: spec.rules[0].backendRefs[0].port in body should be less than or "
        "equal to 65535")
    assert causes["spec.hostnames[0]"][0] == "FieldValueInvalid"
    assert "spec.hostnames[0] in body should match '^(\\*\\.)?[a-z0-9]" in causes["spec.hostnames[0]"][1]
    assert causes["spec.parentRefs[0].name"] == ("FieldValueRequired", "Required value")
    assert causes["spec.rules[1].backendRefs[0].port"] == (
        "FieldValueTypeInvalid", 'Invalid value: "string": spec.rules[1].backendRefs[0].port in body must be of type '
        'integer: "string"')
    status = answer.json()
    assert status["message"].startswith('HTTPRoute.gateway.networking.k8s.io "bad" is invalid: [')
    assert status["details"]["name"] == "bad" and status["details"]["kind"] == "HTTPRoute"
    assert status["details"]["group"] == "gateway.networking.k8s.io"
    assert requests.get(f"{cluster.url}{ROUTES}/bad", timeout=10).status_code == 404


def test_counts_and_minimums_are_refused(cluster):
    body = _route("counts", hostnames=[f"h{i}.example" for i in range(17)])
    body["spec"]["rules"][0]["backendRefs"][0]["port"] = 0
    causes = _causes(_post(cluster, ROUTES, body))
    assert causes["spec.hostnames"] == ("FieldValueTooMany", "Too many: 17: must have at most 16 items")
    assert "should be greater than or equal to 1" in causes["spec.rules[0].backendRefs[0].port"][1]
    assert len(causes) == 2


def test_dry_run_is_validated_too(cluster):
    body = _route("dry")
    body["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Nope"
    assert "spec.rules[0].matches[0].path.type" in _causes(_post(cluster, ROUTES, body, dryRun="All"))


def test_patches_replaces_and_applies_are_validated(cluster):
    assert _post(cluster, ROUTES, _route("patched")).status_code == 201
    url = f"{cluster.url}{ROUTES}/patched"
    merge = {"spec": {"hostnames": ["UPPER"]}}
    answer = requests.patch(url, json=merge, headers={"Content-Type": "application/merge-patch+json"}, timeout=10)
    assert "spec.hostnames[0]" in _causes(answer)
    json_patch = [{"op": "replace", "path": "/spec/rules/0/backendRefs/0/port", "value": -1}]
    answer = requests.patch(url, json=json_patch, headers={"Content-Type": "application/json-patch+json"}, timeout=10)
    assert "spec.rules[0].backendRefs[0].port" in _causes(answer)
    current = requests.get(url, timeout=10).json()
    current["spec"]["parentRefs"][0]["kind"] = ""
    answer = requests.put(url, json=current, timeout=10)
    assert "spec.parentRefs[0].kind" in _causes(answer)
    applied = _route("patched")
    applied["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Glob"
    answer = requests.patch(url, data=yaml.safe_dump(applied), params={"fieldManager": "test", "force": "true"},
                            headers={"Content-Type": "application/apply-patch+yaml"}, timeout=10)
    assert "spec.rules[0].matches[0].path.type" in _causes(answer)
    # a valid merge patch with an unknown field: stored pruned
    answer = requests.patch(url, json={"spec": {"hostnames": ["ok.example"], "extra": 1}},
                            headers={"Content-Type": "application/merge-patch+json"}, timeout=10)
    assert answer.status_code == 200 and answer.json()["spec"]["hostnames"] == ["ok.example"]
    assert "extra" not in answer.json()["spec"]
    assert requests.get(url, timeout=10).json()["spec"]["rules"][0]["backendRefs"][0]["port"] == 8888


def test_the_status_subresource_is_validated(cluster):
    assert _post(cluster, ROUTES, _route("status")).status_code == 201
    url = f"{cluster.url}{ROUTES}/status/status"
    parent = {"parentRef": {"name": "gshare-sessions", "namespace": "gshare-system"},
              "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
              "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                              "observedGeneration": 1, "lastTransitionTime": "yesterday"}]}
    answer = requests.patch(url, json={"status": {"parents": [parent]}},
                            headers={"Content-Type": "application/merge-patch+json"}, timeout=10)
    field = "status.parents[0].conditions[0].lastTransitionTime"
    assert _causes(answer)[field] == (
        "FieldValueInvalid", f'Invalid value: "yesterday": {field} in body must be of type date-time: "yesterday"')
    parent["conditions"][0]["lastTransitionTime"] = "2026-12-06T00:00:00Z"
    answer = requests.patch(url, json={"status": {"parents": [parent]}},
                            headers={"Content-Type": "application/merge-patch+json"}, timeout=10)
    assert answer.status_code == 200, answer.text


def test_envoy_gateway_backend_and_security_policy_as_the_operator_writes_them(cluster):
    backend = {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "Backend", "metadata": {"name": "ses-1"},
               "spec": {"endpoints": [{"fqdn": {"hostname": "gshare.example", "port": 8000}}]}}
    answer = _post(cluster, BACKENDS, backend)
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"]["type"] == "Endpoints"  # the schema's default
    bad = {**backend, "metadata": {"name": "bad"},
           "spec": {"endpoints": [{"ip": {"address": "not-an-ip", "port": 8000}}]}}
    assert "spec.endpoints[0].ip.address" in _causes(_post(cluster, BACKENDS, bad))
    policy = {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "SecurityPolicy", "metadata": {"name": "ses-1"},
              "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "ses-1"}],
                       "extAuth": {"http": {"backendRefs": [{"group": "gateway.envoyproxy.io", "kind": "Backend",
                                                              "name": "ses-1"}],
                                            "path": "/internal/connect/ext-authz",
                                            "headersToBackend": ["x-auth-request-user"]},
                                   "headersToExtAuth": ["cookie", "authorization", "x-forwarded-proto"],
                                   "failOpen": False}}}
    answer = _post(cluster, POLICIES, policy)
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"]["extAuth"]["http"]["backendRefs"][0]["weight"] == 1
    bad = {**policy, "metadata": {"name": "bad"}, "spec": {**policy["spec"], "targetRefs": [{"name": "ses-1"}]}}
    causes = _causes(_post(cluster, POLICIES, bad))
    assert causes["spec.targetRefs[0].group"] == ("FieldValueRequired", "Required value")
    assert causes["spec.targetRefs[0].kind"] == ("FieldValueRequired", "Required value")


def _session(name: str, **spec_extra) -> dict:
    return {"apiVersion": "gshare.io/v1alpha1", "kind": "GShareSession", "metadata": {"name": name},
            "spec": {"sessionId": "ses_" + name.split("-")[1], "owner": "alice", "image": "quay.io/jupyter/base",
                     "gpus": 1, "host": "sessions.lab-c1.example", "path": "/s/x/",
                     "authUrl": "http://127.0.0.1:8000/internal/connect/verify", **spec_extra}}


def test_gshare_sessions_are_defaulted_and_checked(cluster):
    answer = _post(cluster, SESSIONS, _session("ses-abc1"))
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"]["port"] == 8888 and answer.json()["spec"]["routing"] == "ingress-nginx"
    causes = _causes(_post(cluster, SESSIONS, _session("ses-abc2", sessionId="SES", gpus=0, routing="istio",
                                                      gateway={"name": "g"})))
    assert set(causes) == {"spec.sessionId", "spec.gpus", "spec.routing", "spec.gateway.namespace"}


def test_int_or_string_nullable_preserve_unknown_fields_and_formats(cluster):
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"},
            "spec": {"size": "10%", "note": None, "free": {"anything": [1, {"x": 2}]}, "address": "10.0.0.1",
                     "labels": {"a": "xyz"}, "gone": True}}
    answer = _post(cluster, WIDGETS, body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"] == {"size": "10%", "note": None, "free": {"anything": [1, {"x": 2}], "level": 3},
                                     "address": "10.0.0.1", "labels": {"a": "xyz"}}
    body["metadata"]["name"] = "w2"
    body["spec"] = {"size": 3, "free": {"level": None}}  # a null that is not nullable is pruned, then defaulted
    assert _post(cluster, WIDGETS, body).json()["spec"] == {"size": 3, "free": {"level": 3}}
    body["metadata"]["name"] = "w3"
    body["spec"] = {"size": 1.5, "address": "300.1.1.1", "labels": {"a": "long"}}
    causes = _causes(_post(cluster, WIDGETS, body))
    assert set(causes) == {"spec.size", "spec.address", "spec.labels.a"}
    assert causes["spec.labels.a"] == ("FieldValueTooLong", "Too long: may not be more than 3 bytes")
    assert causes["spec.address"][1] == 'Invalid value: "300.1.1.1": spec.address in body must be of type ipv4: ' \
                                        '"300.1.1.1"'


def test_a_seed_object_the_schema_refuses_is_an_error():
    bad = _route("seeded")
    bad["metadata"]["namespace"] = "team-a"
    bad["spec"]["hostnames"] = ["Bad_Host"]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    with pytest.raises(ValueError, match="spec.hostnames"):
        EmulatedCluster([namespace, *_crds(), bad]).start()


def test_duplicates_in_list_type_sets_and_maps_are_refused(cluster):
    body = _route("dupes", hostnames=["a.example", "a.example"])  # listType atomic: duplicates allowed
    body["spec"]["rules"][0]["filters"] = [{"type": "RequestHeaderModifier",
                                            "requestHeaderModifier": {"remove": ["x-a", "x-b", "x-a"]}}]
    causes = _causes(_post(cluster, ROUTES, body))
    assert causes == {"spec.rules[0].filters[0].requestHeaderModifier.remove[2]": (
        "FieldValueDuplicate", 'Duplicate value: "x-a"')}
    gateway = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "g"},
               "spec": {"gatewayClassName": "eg", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80},
                                                                {"name": "http", "protocol": "HTTP", "port": 81}]}}
    answer = _post(cluster, "/apis/gateway.networking.k8s.io/v1/namespaces/team-a/gateways", gateway)
    assert _causes(answer)["spec.listeners[1]"] == (
        "FieldValueDuplicate", 'Duplicate value: map[string]interface {}{"name":"http"}')
