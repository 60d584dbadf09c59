"""The session routing builders (operator_agent.manifests.routing), validated against the upstream CRD schemas of
tests/fixtures/crds (Gateway API v1.6.1, Envoy Gateway v1.9.0) and, for the Ingress, Kubernetes 1.32."""

from __future__ import annotations

import copy
import json

import jsonschema
import kubernetes_validate
import pytest

from contract import (
    CONNECT_EXT_AUTHZ_PATH,
    GATEWAY_NAME_DEFAULT,
    GATEWAY_NAMESPACE_DEFAULT,
    ROUTING_GATEWAY_API,
    ROUTING_INGRESS_NGINX,
    SESSION_ID_LABEL,
    session_object_name,
)
from operator_agent.manifests import routing
from operator_agent.manifests.routing import envoy_gateway, gateway_api, ingress_nginx
from operator_agent.manifests.routing.envoy_gateway import ext_auth_target
from tests.operator_agent import crd_schema

SESSION_ID = "ses_ab12cd34ef56gh78"
UID = "0d3f8d7e-9b0e-4c1e-a8e1-5c1f3b2a7d90"


def gss(session_id: str = SESSION_ID, **spec) -> dict:
    return {
        "apiVersion": "gshare.io/v1alpha1",
        "kind": "GShareSession",
        "metadata": {"name": session_object_name(session_id), "namespace": "gshare-sessions", "uid": UID},
        "spec": {
            "sessionId": session_id,
            "owner": "alice",
            "image": "quay.io/jupyter/base-notebook:2024-12-02",
            "gpus": 1,
            "port": 8888,
            "host": "lab-c2.gshare.example.org",
            "path": f"/s/{session_id}/",
            "authUrl": "https://gshare.example.com/internal/connect/verify",
            "routing": ROUTING_GATEWAY_API,
            "extAuthUrl": "https://gshare.example.com" + CONNECT_EXT_AUTHZ_PATH,
            "gateway": {"name": "gshare-sessions", "namespace": "gshare-system"},
            **spec,
        },
    }


LONG_ID = "ses_" + "a1b2c3d4" * 7  # 60 characters: far longer than the ids the control plane makes

EXT_AUTH_URLS = {
    "https-fqdn": "https://gshare.example.com/internal/connect/ext-authz",
    "http-fqdn-port": "http://gshare-api.gshare-system.svc.cluster.local:8000/internal/connect/ext-authz",
    "https-fqdn-port-prefix": "https://cp.example.org:8443/gshare/internal/connect/ext-authz/",
    "trailing-dot": "https://gshare.example.com./internal/connect/ext-authz",
    "upper-case-host": "HTTPS://GShare.Example.COM/internal/connect/ext-authz",
    "ipv4": "http://10.96.0.15:8000/internal/connect/ext-authz",
    "ipv6": "http://[fd00:10:96::a]:8000/internal/connect/ext-authz",
    "ipv6-loopback": "http://[::1]:8000/internal/connect/ext-authz",
    "ipv6-mapped": "http://[::ffff:192.0.2.10]/internal/connect/ext-authz",
    "ipv6-full": "http://[2001:db8:0:0:0:0:0:1]/internal/connect/ext-authz",
}

SPECS = {
    "default": gss(),
    "long-id": gss(LONG_ID),
    "port-9000": gss(port=9000),
    "port-absent": {**gss(), "spec": {k: v for k, v in gss()["spec"].items() if k != "port"}},
    "gateway-absent": {**gss(), "spec": {k: v for k, v in gss()["spec"].items() if k != "gateway"}},
    "other-gateway": gss(gateway={"name": "edge", "namespace": "envoy-gateway-system"}),
    **{f"ext-{name}": gss(extAuthUrl=url) for name, url in EXT_AUTH_URLS.items()},
}


def objects(spec_name: str) -> list[dict]:
    return routing.routing_objects(SPECS[spec_name])


@pytest.mark.parametrize("spec_name", SPECS)
def test_gateway_api_objects_validate_against_the_upstream_crds(spec_name):
    built = objects(spec_name)
    # The route last: applied in this order, it never exists without its SecurityPolicy.
    assert [o["kind"] for o in built] == ["Backend", "SecurityPolicy", "BackendTrafficPolicy", "HTTPRoute"]
    for obj in built:
        assert crd_schema.errors(obj) == [], obj
        json.dumps(obj)  # plain JSON, ready for server-side apply


@pytest.mark.parametrize("spec_name", ["default", "long-id"])
def test_ingress_nginx_objects_validate(spec_name):
    session = copy.deepcopy(SPECS[spec_name])
    session["spec"]["routing"] = ROUTING_INGRESS_NGINX
    (ingress,) = routing.routing_objects(session)
    kubernetes_validate.validate(ingress, "1.32", strict=True)
    assert ingress == ingress_nginx.session_ingress(session)


def test_a_session_without_routing_is_ingress_nginx():
    session = gss()
    del session["spec"]["routing"], session["spec"]["extAuthUrl"], session["spec"]["gateway"]
    assert routing.routing_mode(session) == ROUTING_INGRESS_NGINX
    assert [o["kind"] for o in routing.routing_objects(session)] == ["Ingress"]
    # Deleted route first, so a route is never left without its policy.
    assert routing.stale_kinds(ROUTING_INGRESS_NGINX) == tuple(reversed(routing.mode_kinds(ROUTING_GATEWAY_API)))
    assert routing.stale_kinds(ROUTING_INGRESS_NGINX)[0].kind == "HTTPRoute"
    assert routing.stale_kinds(ROUTING_GATEWAY_API) == routing.mode_kinds(ROUTING_INGRESS_NGINX)


def test_unknown_mode_is_refused():
    with pytest.raises(routing.RoutingError, match="spec.routing 'istio'"):
        routing.routing_objects(gss(routing="istio"))


def test_common_metadata_and_owner():
    for obj in objects("default"):
        meta = obj["metadata"]
        assert meta["name"] == "ses-ab12cd34ef56gh78"
        assert meta["namespace"] == "gshare-sessions"
        assert meta["labels"][SESSION_ID_LABEL] == SESSION_ID
        assert meta["ownerReferences"] == [{"apiVersion": "gshare.io/v1alpha1", "kind": "GShareSession",
                                            "name": "ses-ab12cd34ef56gh78", "uid": UID, "controller": True,
                                            "blockOwnerDeletion": True}]


def test_http_route():
    route = gateway_api.session_http_route(gss(port=9000))
    assert routing.routing_objects(gss(port=9000))[-1] == route
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"] == {
        "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gshare-sessions",
                        "namespace": "gshare-system"}],
        "hostnames": ["lab-c2.gshare.example.org"],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": f"/s/{SESSION_ID}/"}}],
                   "backendRefs": [{"name": "ses-ab12cd34ef56gh78", "port": 9000}]}],
    }
    defaulted = gateway_api.session_http_route(SPECS["gateway-absent"])
    assert defaulted["spec"]["parentRefs"][0]["name"] == GATEWAY_NAME_DEFAULT
    assert defaulted["spec"]["parentRefs"][0]["namespace"] == GATEWAY_NAMESPACE_DEFAULT
    other = gateway_api.session_http_route(SPECS["other-gateway"])["spec"]["parentRefs"][0]
    assert (other["name"], other["namespace"]) == ("edge", "envoy-gateway-system")


def test_path_obeys_the_http_route_cel_rules():
    # CEL is not evaluated by the schema helper: check what the HTTPRoute path rules would.
    for spec_name in ("default", "long-id"):
        value = objects(spec_name)[-1]["spec"]["rules"][0]["matches"][0]["path"]["value"]
        assert value.startswith("/") and "//" not in value and "/./" not in value and "/../" not in value
        assert "%2f" not in value.lower() and "#" not in value


def test_security_policy():
    backend, policy, _, route = objects("default")
    assert policy["apiVersion"] == "gateway.envoyproxy.io/v1alpha1"
    assert policy["spec"] == {
        "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route["metadata"]["name"]}],
        "extAuth": {
            "http": {
                "backendRefs": [{"group": "gateway.envoyproxy.io", "kind": "Backend", "name": backend["metadata"]["name"]}],
                "path": CONNECT_EXT_AUTHZ_PATH,
                "headersToBackend": ["x-auth-request-user"],
            },
            "headersToExtAuth": ["cookie", "authorization", "x-forwarded-proto"],
            "failOpen": False,
        },
    }
    assert "bodyToExtAuth" not in policy["spec"]["extAuth"]  # no body buffered, so no body limit


def test_security_policy_path_keeps_a_url_prefix_without_trailing_slash():
    policy = objects("ext-https-fqdn-port-prefix")[1]
    assert policy["spec"]["extAuth"]["http"]["path"] == "/gshare/internal/connect/ext-authz"


def test_backend_traffic_policy_keeps_idle_websockets_an_hour():
    _, _, traffic, route = objects("default")
    assert traffic["spec"] == {
        "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route["metadata"]["name"]}],
        "timeout": {"http": {"requestTimeout": "0s", "streamIdleTimeout": "1h"}},
    }
    assert "requestBuffer" not in traffic["spec"]  # no request body limit


@pytest.mark.parametrize(("spec_name", "endpoint", "tls"), [
    ("default", {"fqdn": {"hostname": "gshare.example.com", "port": 443}},
     {"wellKnownCACertificates": "System", "sni": "gshare.example.com"}),
    ("ext-http-fqdn-port", {"fqdn": {"hostname": "gshare-api.gshare-system.svc.cluster.local", "port": 8000}}, None),
    ("ext-https-fqdn-port-prefix", {"fqdn": {"hostname": "cp.example.org", "port": 8443}},
     {"wellKnownCACertificates": "System", "sni": "cp.example.org"}),
    ("ext-trailing-dot", {"fqdn": {"hostname": "gshare.example.com.", "port": 443}},
     {"wellKnownCACertificates": "System", "sni": "gshare.example.com"}),
    ("ext-upper-case-host", {"fqdn": {"hostname": "gshare.example.com", "port": 443}},
     {"wellKnownCACertificates": "System", "sni": "gshare.example.com"}),
    ("ext-ipv4", {"ip": {"address": "10.96.0.15", "port": 8000}}, None),
    ("ext-ipv6", {"ip": {"address": "fd00:0010:0096:0000:0000:0000:0000:000a", "port": 8000}}, None),
    ("ext-ipv6-loopback", {"ip": {"address": "0000:0000:0000:0000:0000:0000:0000:0001", "port": 8000}}, None),
    ("ext-ipv6-mapped", {"ip": {"address": "0000:0000:0000:0000:0000:ffff:c000:020a", "port": 80}}, None),
    ("ext-ipv6-full", {"ip": {"address": "2001:0db8:0000:0000:0000:0000:0000:0001", "port": 80}}, None),
])
def test_backend_endpoint_and_tls(spec_name, endpoint, tls):
    backend = objects(spec_name)[0]
    assert backend["spec"]["endpoints"] == [endpoint]
    assert backend["spec"].get("tls") == tls


@pytest.mark.parametrize("spec_name", [n for n, url in EXT_AUTH_URLS.items() if url.lower().startswith("https:")])
def test_https_backends_pin_the_certificate_name(spec_name):
    # Envoy Gateway v1.9.0 makes a literal sni the exact DNS SAN the control plane's certificate must carry; without
    # it Envoy would send and check the session domain.
    target = ext_auth_target(EXT_AUTH_URLS[spec_name])
    backend = objects(f"ext-{spec_name}")[0]
    assert target.kind == "fqdn"
    assert backend["spec"]["tls"] == {"wellKnownCACertificates": "System", "sni": target.host.rstrip(".")}
    assert backend["spec"]["tls"]["sni"] == backend["spec"]["endpoints"][0]["fqdn"]["hostname"].rstrip(".")


@pytest.mark.parametrize("url", [
    "https://192.0.2.10/internal/connect/ext-authz",
    "https://10.96.0.15:8443/internal/connect/ext-authz",
    "https://[::ffff:192.0.2.10]/internal/connect/ext-authz",
    "HTTPS://[fd00:10:96::a]:8443/internal/connect/ext-authz",
])
def test_https_to_an_ip_address_is_refused(url):
    # No name to check the certificate against: a Backend sni must be a hostname, and without one Envoy checks the
    # session domain, which the control plane's certificate does not carry.
    with pytest.raises(routing.RoutingError, match="https to an IP address"):
        ext_auth_target(url)
    with pytest.raises(routing.RoutingError, match="https to an IP address"):
        routing.routing_objects(gss(extAuthUrl=url))
    assert ext_auth_target("http" + url[5:]).kind == "ip"


def test_compressed_ipv6_would_fail_the_backend_pattern():
    # Why IPv6 is written out: the v1.9.0 Backend address pattern refuses "::1" and other valid compressed forms.
    backend = objects("ext-ipv6-loopback")[0]
    backend["spec"]["endpoints"][0]["ip"]["address"] = "::1"
    assert crd_schema.errors(backend)


@pytest.mark.parametrize("url", [
    "",
    "ftp://gshare.example.com/internal/connect/ext-authz",
    "gshare.example.com/internal/connect/ext-authz",
    "https://gshare.example.com",
    "https://gshare.example.com/",
    "https:///internal/connect/ext-authz",
    "https://user:secret@gshare.example.com/internal/connect/ext-authz",
    "https://gshare.example.com/internal/connect/ext-authz?x=1",
    "https://gshare.example.com/internal/connect/ext-authz#frag",
    "https://gshare.example.com/internal/connect/ext-authz?",
    "https://gshare.example.com:0/internal/connect/ext-authz",
    "https://gshare.example.com:65536/internal/connect/ext-authz",
    "https://gshare.example.com:http/internal/connect/ext-authz",
    "https://[fe80::1%25eth0]/internal/connect/ext-authz",
    "https://[not-an-ip]/internal/connect/ext-authz",
    "https://bücher.example/internal/connect/ext-authz",
    "https://under_score.example.com/internal/connect/ext-authz",
    "https://-leading.example.com/internal/connect/ext-authz",
    "https://" + "a" * 250 + ".com/internal/connect/ext-authz",
    "https://gshare.example.com/internal/connect/ext authz",
    "https://gshare.example.com//internal/connect/ext-authz",
])
def test_unusable_ext_auth_urls_are_refused(url):
    with pytest.raises(routing.RoutingError, match="extAuthUrl"):
        ext_auth_target(url)
    with pytest.raises(routing.RoutingError):
        routing.routing_objects(gss(extAuthUrl=url))


def test_missing_ext_auth_url_is_refused():
    session = gss()
    del session["spec"]["extAuthUrl"]
    with pytest.raises(routing.RoutingError, match="extAuthUrl is missing"):
        routing.routing_objects(session)


def test_builders_are_pure():
    session = gss()
    before = copy.deepcopy(session)
    first = routing.routing_objects(session)
    assert session == before
    assert routing.routing_objects(session) == first
    first[1]["metadata"]["labels"]["x"] = "y"
    assert all("x" not in o["metadata"]["labels"] for o in routing.routing_objects(session))


def test_the_external_auth_implementation_is_chosen_in_one_place():
    assert routing.EXTERNAL_AUTH is envoy_gateway
    assert routing.mode_kinds(ROUTING_GATEWAY_API) == envoy_gateway.KINDS + gateway_api.KINDS
    kinds = [(o["apiVersion"], o["kind"]) for o in objects("default")]
    assert kinds == [(k.api_version, k.kind) for k in routing.mode_kinds(ROUTING_GATEWAY_API)]


def test_schema_helper_catches_what_the_apiserver_would_refuse_or_prune():
    backend, policy, traffic, route = objects("default")
    pruned = copy.deepcopy(policy)
    pruned["spec"]["extAuth"]["http"]["headersToBackends"] = ["x"]  # a typo the apiserver would prune silently
    assert crd_schema.errors(pruned)
    bad_port = copy.deepcopy(backend)
    bad_port["spec"]["endpoints"][0]["fqdn"]["port"] = 70000
    assert crd_schema.errors(bad_port)
    bad_host = copy.deepcopy(route)
    bad_host["spec"]["hostnames"] = ["Lab.Example.org"]
    assert crd_schema.errors(bad_host)
    bad_timeout = copy.deepcopy(traffic)
    bad_timeout["spec"]["timeout"]["http"]["streamIdleTimeout"] = "1 hour"
    with pytest.raises(jsonschema.ValidationError):
        crd_schema.validate(bad_timeout)
    with pytest.raises(LookupError):
        crd_schema.validate({**route, "apiVersion": "gateway.networking.k8s.io/v9"})
