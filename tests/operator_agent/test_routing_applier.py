"""Session routing through the operator (operator_agent.sessions.routing_applier) against the Kubernetes API emulator.

The emulator is seeded like tests/operator_agent/test_sessions.py plus the upstream Gateway API and Envoy Gateway CRDs
of tests/fixtures/crds (it serves any CRD created in it); Kopf runs for real in a thread (``run_sessions``). The
objects the operator writes are read back and validated against those CRDs' schemas (tests/operator_agent/crd_schema).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import kubernetes
import pytest

from contract import CONNECT_EXT_AUTHZ_PATH, ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX
from demo import fleet
from demo.emulator import EmulatedCluster
from tests.helpers import wait_for
from tests.operator_agent import crd_schema
from tests.operator_agent.test_sessions import (  # noqa: F401 - fixtures
    APISERVER_TOKEN,
    CLUSTER,
    api_client_for,
    apply_session,
    control_plane,
    delete_session,
    gshare_session,
    named,
    seed,
    session_object,
    start_operator,
)

EXT_AUTH_URL = "https://gshare.example.com" + CONNECT_EXT_AUTHZ_PATH
GATEWAY_KINDS = [  # (plural, group, version) of what a gateway-api session gets
    ("httproutes", "gateway.networking.k8s.io", "v1"),
    ("backends", "gateway.envoyproxy.io", "v1alpha1"),
    ("securitypolicies", "gateway.envoyproxy.io", "v1alpha1"),
    ("backendtrafficpolicies", "gateway.envoyproxy.io", "v1alpha1"),
]
INGRESS = ("ingresses", "networking.k8s.io", "v1")


def upstream_crds() -> list[dict]:
    return [crd_schema.load_crd(name) for name in crd_schema.crd_files()]


@pytest.fixture
def gateway_cluster() -> Iterator[EmulatedCluster]:
    with EmulatedCluster(seed() + upstream_crds(), version=fleet.cluster_version(CLUSTER), token=APISERVER_TOKEN,
                         pod_startup_seconds=0.2) as running:
        yield running


@pytest.fixture
def plain_cluster() -> Iterator[EmulatedCluster]:
    with EmulatedCluster(seed(), version=fleet.cluster_version(CLUSTER), token=APISERVER_TOKEN,
                         pod_startup_seconds=0.2) as running:
        yield running


def gateway_session(session_id: str, **spec) -> dict:
    return gshare_session(session_id, **{"routing": ROUTING_GATEWAY_API, "extAuthUrl": EXT_AUTH_URL,
                                         "gateway": {"name": "gshare-sessions", "namespace": "gshare-system"}, **spec})


def ingress_session(session_id: str) -> dict:
    return gshare_session(session_id, routing=ROUTING_INGRESS_NGINX, extAuthUrl=EXT_AUTH_URL,
                          gateway={"name": "gshare-sessions", "namespace": "gshare-system"})


def routing_of(cluster: EmulatedCluster, name: str) -> dict[str, dict | None]:
    """Kind plural -> the session's object of that kind (or None)."""
    return {plural: named(cluster.objects_of(plural, group, version), name)
            for plural, group, version in [*GATEWAY_KINDS, INGRESS]}


def test_gateway_api_session_gets_its_route_and_policies_and_follows_mode_switches(
        gateway_cluster, control_plane, start_operator):  # noqa: F811 - fixtures
    cluster = gateway_cluster
    start_operator(cluster)
    session_id, name = "ses_gatewayapi000001", "ses-gatewayapi000001"
    gss = apply_session(cluster, gateway_session(session_id))
    owner = {"apiVersion": "gshare.io/v1alpha1", "kind": "GShareSession", "name": name,
             "uid": gss["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    found = wait_for(what="the gateway-api objects", check=lambda: (
        lambda objs: all(objs[p] for p, _, _ in GATEWAY_KINDS) and objs)(routing_of(cluster, name)))
    assert found["ingresses"] is None
    for plural, _, _ in GATEWAY_KINDS:
        obj = found[plural]
        assert obj["metadata"]["ownerReferences"] == [owner], plural
        stored = {k: v for k, v in obj.items() if k != "status"}
        stored["metadata"] = {k: obj["metadata"][k] for k in ("name", "namespace", "labels", "ownerReferences")}
        assert crd_schema.errors(stored) == [], plural
    route = found["httproutes"]
    assert route["spec"]["hostnames"] == ["lab-c1.gshare.localhost"]
    assert route["spec"]["parentRefs"][0]["name"] == "gshare-sessions"
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == name
    assert found["backends"]["spec"]["endpoints"] == [{"fqdn": {"hostname": "gshare.example.com", "port": 443}}]
    assert found["securitypolicies"]["spec"]["extAuth"]["http"]["path"] == CONNECT_EXT_AUTHZ_PATH
    assert found["backendtrafficpolicies"]["spec"]["timeout"]["http"]["streamIdleTimeout"] == "1h"
    wait_for(what="Running", check=lambda: "Running" in control_plane.phases(session_id))
    assert control_plane.reports(session_id)[-1]["message"] == ""

    # The cluster moves to ingress-nginx: the control plane re-applies the session.
    apply_session(cluster, ingress_session(session_id))
    wait_for(what="the switch to ingress-nginx", check=lambda: (
        lambda objs: objs["ingresses"] and not any(objs[p] for p, _, _ in GATEWAY_KINDS))(routing_of(cluster, name)))
    ingress = routing_of(cluster, name)["ingresses"]
    assert ingress["metadata"]["ownerReferences"] == [owner]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-url"] == \
        "https://gshare.example.com/internal/connect/verify"

    # And back.
    apply_session(cluster, gateway_session(session_id))
    wait_for(what="the switch back to gateway-api", check=lambda: (
        lambda objs: not objs["ingresses"] and all(objs[p] for p, _, _ in GATEWAY_KINDS))(routing_of(cluster, name)))
    assert session_object(cluster, name)["status"]["phase"] == "Running"  # the pod was never touched

    delete_session(cluster, name)
    wait_for(what="routing objects collected with their session",
             check=lambda: not any(routing_of(cluster, name).values()))


def test_a_session_without_routing_keeps_its_ingress(gateway_cluster, control_plane, start_operator):  # noqa: F811
    cluster = gateway_cluster
    start_operator(cluster)
    session_id, name = "ses_noroutingfield01", "ses-noroutingfield01"
    apply_session(cluster, gshare_session(session_id))  # a GShareSession written before spec.routing existed
    wait_for(what="the ingress", check=lambda: routing_of(cluster, name)["ingresses"])
    apply_session(cluster, gshare_session(session_id, image="quay.io/jupyter/base-notebook:2025-01-06"))  # re-reconciled
    time.sleep(1.0)
    assert not any(routing_of(cluster, name)[p] for p, _, _ in GATEWAY_KINDS)
    # The other mode's objects are deleted once (the first reconcile after start), not at every reconcile.
    deletes = [r["path"] for r in cluster.requests_seen() if r["method"] == "DELETE"]
    for plural, group, version in GATEWAY_KINDS:
        assert deletes.count(f"/apis/{group}/{version}/namespaces/gshare-sessions/{plural}/{name}") == 1, deletes


def test_gateway_api_without_its_crds_says_so_on_the_session(plain_cluster, control_plane, start_operator):  # noqa: F811
    cluster = plain_cluster
    start_operator(cluster)
    session_id, name = "ses_nogatewaycrds001", "ses-nogatewaycrds001"
    apply_session(cluster, gateway_session(session_id))
    report = wait_for(what="a report naming the missing CRD", check=lambda: [
        r for r in control_plane.reports(session_id) if "does not serve backends.gateway.envoyproxy.io/v1alpha1" in r["message"]])
    assert "attach_cluster --routing gateway-api" in report[-1]["message"]
    # Not a crash loop: the pod is still created and runs, the message stays while the CRDs are missing.
    wait_for(what="Running with the message", check=lambda: [
        r for r in control_plane.reports(session_id) if r["phase"] == "Running" and "backends" in r["message"]])
    assert session_object(cluster, name)["status"]["message"].startswith("routing: this cluster does not serve")
    assert named(cluster.objects_of("services"), name) is not None

    # Switching the session to ingress-nginx clears it.
    apply_session(cluster, ingress_session(session_id))
    wait_for(what="the ingress", check=lambda: named(cluster.objects_of(*INGRESS), name))
    wait_for(what="the message cleared", check=lambda: control_plane.reports(session_id)[-1]["message"] == "")


def test_unusable_ext_auth_url_is_reported_not_retried(gateway_cluster, control_plane, start_operator):  # noqa: F811
    cluster = gateway_cluster
    start_operator(cluster)
    session_id, name = "ses_badextauthurl001", "ses-badextauthurl001"
    apply_session(cluster, gateway_session(session_id, extAuthUrl="https://user:pw@gshare.example.com/x"))
    wait_for(what="the refusal in the status", check=lambda: "carries credentials" in (
        (session_object(cluster, name) or {}).get("status", {}).get("message") or ""))
    assert not any(routing_of(cluster, name).values())
    with api_client_for(cluster) as api:  # the GShareSession is still there and reconciled (no Kopf error loop)
        kubernetes.client.CustomObjectsApi(api).get_namespaced_custom_object(
            "gshare.io", "v1alpha1", "gshare-sessions", "gsharesessions", name)


@pytest.fixture
def gateway_api_only_cluster() -> Iterator[EmulatedCluster]:
    crds = [crd for crd in upstream_crds() if crd["spec"]["group"] == "gateway.networking.k8s.io"]
    with EmulatedCluster(seed() + crds, version=fleet.cluster_version(CLUSTER), token=APISERVER_TOKEN,
                         pod_startup_seconds=0.2) as running:
        yield running


def test_a_route_is_never_written_without_its_auth_policy(gateway_api_only_cluster, control_plane, start_operator):  # noqa: F811
    # The Gateway API is installed but Envoy Gateway is not: an HTTPRoute alone would route anyone to the session.
    cluster = gateway_api_only_cluster
    start_operator(cluster)
    session_id, name = "ses_noenvoygateway01", "ses-noenvoygateway01"
    apply_session(cluster, gateway_session(session_id))
    wait_for(what="the missing Backend kind on the session", check=lambda: "does not serve backends.gateway.envoyproxy.io" in (
        (session_object(cluster, name) or {}).get("status", {}).get("message") or ""))
    time.sleep(0.5)
    assert named(cluster.objects_of("httproutes", "gateway.networking.k8s.io", "v1"), name) is None


def _fallback(cluster: EmulatedCluster) -> dict[str, dict | None]:
    found = {plural: named(cluster.objects_of(plural, group, version), "gshare-session-ended")
             for plural, group, version in [*GATEWAY_KINDS, INGRESS]}
    found["services"] = named(cluster.objects_of("services", "", "v1"), "gshare-session-ended")
    return found


def test_the_cluster_gets_a_fallback_route_for_s_in_its_mode_that_outlives_sessions(
        gateway_cluster, control_plane, start_operator):  # noqa: F811 - fixtures
    cluster = gateway_cluster
    start_operator(cluster)
    session_id, name = "ses_fallbackroute001", "ses-fallbackroute001"
    apply_session(cluster, gateway_session(session_id))
    found = wait_for(what="the gateway-api fallback", check=lambda: (
        lambda objs: objs["httproutes"] and objs["backends"] and objs)(_fallback(cluster)))
    route, backend = found["httproutes"], found["backends"]
    for obj in (route, backend):
        assert "ownerReferences" not in obj["metadata"]  # no session owns it: it outlives them all
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "session-ended"
        stored = {k: v for k, v in obj.items() if k != "status"}
        stored["metadata"] = {k: obj["metadata"][k] for k in ("name", "namespace", "labels")}
        assert crd_schema.errors(stored) == [], obj["kind"]
    # Below every session's /s/<id>/ (a longer PathPrefix), unguarded (no SecurityPolicy), to the control plane.
    assert route["spec"]["hostnames"] == ["lab-c1.gshare.localhost"]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/s/"}}]
    assert [{k: ref[k] for k in ("group", "kind", "name")} for ref in rule["backendRefs"]] == [
        {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": "gshare-session-ended"}]
    assert backend["spec"]["endpoints"] == [{"fqdn": {"hostname": "gshare.example.com", "port": 443}}]
    assert found["securitypolicies"] is None and found["ingresses"] is None and found["services"] is None

    # The cluster moves to ingress-nginx: an Ingress /s/ to an ExternalName Service; the Gateway API objects go.
    apply_session(cluster, ingress_session(session_id))
    found = wait_for(what="the ingress-nginx fallback", check=lambda: (
        lambda objs: objs["ingresses"] and objs["services"] and not objs["httproutes"] and not objs["backends"] and objs)(
        _fallback(cluster)))
    service, ingress = found["services"], found["ingresses"]
    assert (service["spec"]["type"], service["spec"]["externalName"]) == ("ExternalName", "gshare.example.com")
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "lab-c1.gshare.localhost"
    assert rule["http"]["paths"] == [{"path": "/s/", "pathType": "Prefix",
                                      "backend": {"service": {"name": "gshare-session-ended", "port": {"name": "http"}}}}]
    assert "nginx.ingress.kubernetes.io/auth-url" not in (ingress["metadata"].get("annotations") or {})

    delete_session(cluster, name)
    wait_for(what="the session's objects collected", check=lambda: not routing_of(cluster, name)["ingresses"])
    assert _fallback(cluster)["ingresses"] is not None  # the fallback stays for the stopped session's URL
