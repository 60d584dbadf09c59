"""The demo ingress in Gateway API mode (``demo.envoy_proxy``): a cluster's HTTPRoutes, SecurityPolicies and Backends, as
the operator writes them per session, served as Envoy configured by Envoy Gateway v1.9.0 would.

Path of every request: test client -> the demo ingress on loopback (routes listed from an emulated apiserver that holds
the upstream Gateway API and Envoy Gateway CRDs, which validate the objects) -> the ext_authz check to a recording
authorization server written here -> the session pod's stand-in page. Requests are sent byte for byte with
``http.client``.
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from contract import CONNECT_EXT_AUTHZ_PATH, GATEWAY_NAME_DEFAULT, GATEWAY_NAMESPACE_DEFAULT
from demo.emulator import EmulatedCluster
from demo.envoy_proxy import GatewayTable, envoy_path
from demo.ingress_nginx import ClusterApi, ClusterIngress, DemoIngress

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "lab-c2.gshare.localhost"
NAMESPACE = "gshare-sessions"


class AuthServer:
    """A loopback authorization server: records each request (method, path, headers, body) and answers what
    ``answer`` says: ``(status, [(header, value)...], body)``."""

    def __init__(self):
        self.requests: list[dict] = []
        self.answer = (200, [("x-auth-request-user", "alice")], b"")
        auth = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                auth.requests.append({"method": self.command, "path": self.path,
                                      "headers": [(k.lower(), v) for k, v in self.headers.items()], "body": body})
                status, headers, answer_body = auth.answer
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer_body)))
                self.end_headers()
                self.wfile.write(answer_body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve  # noqa: N815 -- http.server's names

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def header(self, name: str, index: int = -1) -> list[str]:
        return [v for k, v in self.requests[index]["headers"] if k == name]


def _crds() -> list[dict]:
    names = ("gateway.networking.k8s.io_gatewayclasses", "gateway.networking.k8s.io_gateways",
             "gateway.networking.k8s.io_httproutes", "gateway.envoyproxy.io_securitypolicies",
             "gateway.envoyproxy.io_backends")
    return [yaml.safe_load((ROOT / "tests/fixtures/crds" / f"{n}.yaml").read_text()) for n in names]


def _session(name: str, prefix: str, auth_port: int, *, hostname: str = DOMAIN, fqdn: bool = False) -> list[dict]:
    """What the operator writes for one session in gateway-api mode (HTTPRoute, Backend, SecurityPolicy), with the
    Service and a Running pod behind it."""
    labels = {"app.kubernetes.io/name": "gshare-session", "gshare.io/session-id": name.replace("-", "_")}
    meta = {"name": name, "namespace": NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"selector": labels, "ports": [{"port": 8888, "targetPort": 8888}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, "labels": labels},
         "spec": {"nodeName": "gpu-1", "containers": [{"name": "session", "image": "quay.io/jupyter/base"}]},
         "status": {"phase": "Running"}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": meta,
         "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                  "name": GATEWAY_NAME_DEFAULT, "namespace": GATEWAY_NAMESPACE_DEFAULT}],
                  "hostnames": [hostname],
                  "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
                             "backendRefs": [{"name": name, "port": 8888}]}]}},
        {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "Backend", "metadata": meta,
         "spec": {"endpoints": [{"fqdn": {"hostname": "localhost", "port": auth_port}} if fqdn
                                else {"ip": {"address": "127.0.0.1", "port": auth_port}}]}},
        {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "SecurityPolicy", "metadata": meta,
         "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": name}],
                  "extAuth": {"http": {"backendRefs": [{"group": "gateway.envoyproxy.io", "kind": "Backend",
                                                        "name": name}],
                                       "path": CONNECT_EXT_AUTHZ_PATH, "headersToBackend": ["x-auth-request-user"]},
                              "headersToExtAuth": ["cookie", "authorization", "x-forwarded-proto"],
                              "failOpen": False}}},
    ]


def _gateway() -> list[dict]:
    return [
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "envoy-gateway"},
         "spec": {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
         "metadata": {"name": GATEWAY_NAME_DEFAULT, "namespace": GATEWAY_NAMESPACE_DEFAULT},
         "spec": {"gatewayClassName": "envoy-gateway",
                  "listeners": [{"name": "http", "protocol": "HTTP", "port": 80, "hostname": DOMAIN,
                                 "allowedRoutes": {"namespaces": {"from": "All"}}}]}},
    ]


@pytest.fixture(scope="module")
def stack():
    """An emulated cluster in gateway-api mode with sessions ``ses-a`` (``/s/ses_a/``), ``ses-ab`` (``/s/ses_ab/``, its
    auth Backend an ``fqdn``), ``ses-wide`` (``/s/``), ``ses-down`` (its auth Backend on a closed port), ``ses-far``
    (another hostname) and ``ses-broken`` (its SecurityPolicy's Backend missing)."""
    auth = AuthServer()
    auth.thread.start()
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    closed_port = closed.server_address[1]
    closed.server_close()
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                  for n in (NAMESPACE, GATEWAY_NAMESPACE_DEFAULT)]
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}
    objects = [*namespaces, node, *_crds(), *_gateway(), *_session("ses-a", "/s/ses_a/", auth.port),
               *_session("ses-ab", "/s/ses_ab/", auth.port, fqdn=True), *_session("ses-wide", "/s/", auth.port),
               *_session("ses-down", "/s/ses_down/", closed_port),
               *_session("ses-far", "/s/ses_far/", auth.port, hostname="elsewhere.gshare.localhost"),
               *[o for o in _session("ses-broken", "/s/ses_broken/", auth.port) if o["kind"] != "Backend"]]
    with EmulatedCluster(objects) as cluster:
        ingress = DemoIngress([ClusterIngress("lab-c2", DOMAIN, ClusterApi(server=cluster.url))],
                              poll_seconds=3600).start()
        try:
            yield {"ingress": ingress, "auth": auth, "host": f"{DOMAIN}:{ingress.port}", "cluster": cluster}
        finally:
            ingress.stop()
            auth.server.shutdown()
            auth.server.server_close()


def send(stack, method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b"",
         host: str | None = None):
    """Send ``method target`` exactly as written; returns ``(status, headers as a list, body bytes)``."""
    conn = http.client.HTTPConnection("127.0.0.1", stack["ingress"].port, timeout=30)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host or stack["host"])
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        response = conn.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        conn.close()


def _values(headers, name: str) -> list[str]:
    return [v for k, v in headers if k.lower() == name]


def test_an_allowed_request_is_checked_as_envoy_checks_it_then_served(stack):
    auth = stack["auth"]
    auth.answer = (200, [("x-auth-request-user", "alice"), ("Set-Cookie", "dropped=1")], b"")
    status, headers, body = send(stack, "GET", "/s/ses_a/lab/tree?x=1&token=t", {
        "Cookie": "gshare_connect=abc", "Authorization": "Bearer t", "X-Forwarded-Proto": "https",
        "X-Auth-Request-User": "mallory", "X-Other": "not sent"})
    assert status == 200, body
    assert b"alice" in body and b"mallory" not in body and b"ses_a" in body
    assert _values(headers, "set-cookie") == []  # an allowed answer's Set-Cookie does not reach the client
    assert _values(headers, "server") == ["envoy"]
    check = auth.requests[-1]
    assert check["method"] == "GET"
    assert check["path"] == f"{CONNECT_EXT_AUTHZ_PATH}/s/ses_a/lab/tree?x=1&token=t"
    assert check["body"] == b""
    assert auth.header("host") == [stack["host"]]
    assert auth.header("content-length") == ["0"]
    assert auth.header("cookie") == ["gshare_connect=abc"]
    assert auth.header("authorization") == ["Bearer t"]
    assert auth.header("x-forwarded-proto") == ["http"]  # set by Envoy at the edge, never the client's
    assert auth.header("x-other") == [] and auth.header("x-auth-request-user") == []
    assert auth.header("transfer-encoding") == []


def test_the_original_method_goes_to_the_check_without_the_body(stack):
    auth = stack["auth"]
    auth.answer = (200, [("x-auth-request-user", "alice")], b"")
    status, _, _ = send(stack, "POST", "/s/ses_a/api/contents", {"Content-Type": "application/json"}, b'{"a": 1}')
    assert status == 200
    check = auth.requests[-1]
    assert (check["method"], check["body"]) == ("POST", b"")
    assert auth.header("content-length") == ["0"] and auth.header("content-type") == []


def test_a_denial_is_answered_with_the_checks_status_headers_and_body(stack):
    auth = stack["auth"]
    denial = json.dumps({"code": "unauthenticated", "detail": "no session cookie"}).encode()
    auth.answer = (401, [("Content-Type", "application/json"), ("WWW-Authenticate", "Bearer")], denial)
    status, headers, body = send(stack, "GET", "/s/ses_a/")
    assert (status, body) == (401, denial)
    assert _values(headers, "content-type") == ["application/json"]
    assert _values(headers, "www-authenticate") == ["Bearer"]
    assert _values(headers, "server") == ["envoy"]  # the check's own Server is not passed on


def test_a_307_with_the_cookie_reaches_the_client(stack):
    auth = stack["auth"]
    cookie = "gshare_connect=v; Path=/s/ses_a/; HttpOnly; Secure; SameSite=Lax"
    auth.answer = (307, [("Location", "/s/ses_a/lab"), ("Set-Cookie", cookie)], b"redirecting")
    status, headers, body = send(stack, "GET", "/s/ses_a/lab?token=secret")
    assert (status, body) == (307, b"redirecting")
    assert _values(headers, "location") == ["/s/ses_a/lab"] and _values(headers, "set-cookie") == [cookie]


def test_a_policy_whose_backend_is_missing_fails_closed(stack):
    count = len(stack["auth"].requests)
    status, _, body = send(stack, "GET", "/s/ses_broken/")
    assert (status, body) == (500, b"")
    assert len(stack["auth"].requests) == count


def test_an_auth_server_error_or_silence_is_a_403(stack):
    stack["auth"].answer = (503, [("Content-Type", "application/json")], b'{"code": "unavailable"}')
    status, _, body = send(stack, "GET", "/s/ses_a/")
    assert (status, body) == (403, b"")
    status, _, body = send(stack, "GET", "/s/ses_down/")  # its Backend's port is closed
    assert (status, body) == (403, b"")


@pytest.mark.parametrize(("target", "checked", "served"), [
    ("/s/ses_a", "/s/ses_a", "ses_a"),  # element-wise: the prefix without its slash
    ("/s/ses_ab/x", "/s/ses_ab/x", "ses_ab"),  # /s/ses_ab/ is longer than /s/ and does not match /s/ses_a/
    ("/s/ses_a/../ses_ab/", "/s/ses_ab/", "ses_ab"),  # dot segments resolved before routing
    ("/s/ses_a/%2e%2E/ses_ab/", "/s/ses_ab/", "ses_ab"),  # escaped dots are dots
    ("/s//ses_a///x", "/s/ses_a/x", "ses_a"),  # slashes merged
    ("/s/%73es_a/", "/s/ses_a/", "ses_a"),  # an escaped unreserved character is decoded
    ("/s/ses_abc/", "/s/ses_abc/", "ses_wide"),  # not ses_ab's (element-wise): the /s/ route's
    ("/s/ses_a/../../../s/ses_ab/", "/s/ses_ab/", "ses_ab"),  # never above the root
    ("/s/ses_far/", "/s/ses_far/", "ses_wide"),  # ses_far's route names a host the Gateway's listener does not admit
])
def test_paths_are_normalised_as_envoy_does_and_the_longest_prefix_wins(stack, target, checked, served):
    auth = stack["auth"]
    auth.answer = (200, [("x-auth-request-user", "alice")], b"")
    status, _, body = send(stack, "GET", target)
    assert status == 200, body
    assert auth.requests[-1]["path"] == CONNECT_EXT_AUTHZ_PATH + checked
    assert f'data-session-id="{served}"'.encode() in body


def test_escaped_slashes_are_redirected_and_fragments_refused(stack):
    count = len(stack["auth"].requests)
    status, headers, _ = send(stack, "GET", "/s/ses_a%2F..%2Fses_ab/?q=1")
    assert status == 307 and _values(headers, "location") == ["/s/ses_ab/?q=1"]
    status, _, _ = send(stack, "GET", "/s/ses_a/%5c..%5Cx")
    assert status == 307
    assert send(stack, "GET", "/s/ses_a/#frag")[0] == 400
    assert send(stack, "GET", "http://evil/s/ses_a/")[0] == 400
    assert len(stack["auth"].requests) == count  # nothing refused was ever checked


def test_an_unrouted_path_is_envoys_404_and_an_unknown_host_the_default_backends(stack):
    count = len(stack["auth"].requests)
    status, _, body = send(stack, "GET", "/elsewhere/")
    assert (status, body) == (404, b"")
    status, _, body = send(stack, "GET", "/s/ses_a/", host="unknown.gshare.localhost")
    assert status == 404 and body == b"default backend - 404"  # no cluster has this session domain
    assert len(stack["auth"].requests) == count  # nothing unrouted is checked


def test_the_route_table_keeps_only_attached_routes():
    objects = [*_gateway(), *_session("ses-a", "/s/ses_a/", 1), *_session("ses-far", "/s/ses_far/", 1,
                                                                        hostname="elsewhere.example")]
    by_kind = {k: [o for o in objects if o["kind"] == k] for k in ("Gateway", "HTTPRoute", "SecurityPolicy", "Backend")}
    table = GatewayTable.build(by_kind["Gateway"], by_kind["HTTPRoute"], by_kind["SecurityPolicy"], by_kind["Backend"])
    assert table.serves(DOMAIN) and not table.serves("elsewhere.example")  # the listener's hostname excludes it
    route = table.route(DOMAIN, "/s/ses_a/x")
    assert route is not None and route.service == "ses-a" and route.auth is not None
    assert (route.auth.host, route.auth.port, route.auth.path) == ("127.0.0.1", 1, CONNECT_EXT_AUTHZ_PATH)
    assert table.route(DOMAIN, "/s/ses_ax") is None
    same_only = [{**g, "spec": {**g["spec"], "listeners": [{**g["spec"]["listeners"][0], "allowedRoutes": {}}]}}
                 for g in by_kind["Gateway"]]
    assert not GatewayTable.build(same_only, by_kind["HTTPRoute"], [], []).serves(DOMAIN)  # Same namespace only
    assert not GatewayTable.build([], by_kind["HTTPRoute"], [], []).serves(DOMAIN)  # no Gateway: not attached
    no_backend = GatewayTable.build(by_kind["Gateway"], by_kind["HTTPRoute"], by_kind["SecurityPolicy"], [])
    route = no_backend.route(DOMAIN, "/s/ses_a/")
    assert route is not None and route.auth is None and route.auth_broken  # fails closed: Envoy Gateway's 500
    unchecked = GatewayTable.build(by_kind["Gateway"], by_kind["HTTPRoute"], [], by_kind["Backend"])
    assert not unchecked.route(DOMAIN, "/s/ses_a/").auth_broken  # no policy: no check, as Envoy would


def test_a_cluster_without_gateway_crds_lists_no_routes():
    with EmulatedCluster([]) as cluster:
        ingress = ClusterIngress("lab-c1", "lab-c1.gshare.localhost", ClusterApi(server=cluster.url))
        ingress.refresh()
        assert ingress.error == "" and ingress.gateway.routes == {}


@pytest.mark.parametrize(("target", "expected"), [
    ("/a/b", ("/a/b", "", False)),
    ("/a/./b/../c?x=/../", ("/a/c", "x=/../", False)),
    ("/a/%2fb", ("/a/b", "", True)),
    ("/a/%41%2d%7e%20%zz", ("/a/A-~%20%zz", "", False)),  # unreserved escapes decoded, others kept as sent
    ("/%c0%af/%25", ("/%c0%af/%25", "", False)),  # Envoy's path_utility_test.cc cases from here on
    ("/a/..\\c", ("/c", "", False)),
    ("/a/b/%2E./c", ("/a/c", "", False)),
    ("/xyz/..;foo=bar/.;fff=zzz/remain;blah-bluh?query", ("/remain;blah-bluh", "query", False)),
    ("/xyz/...;foo", ("/xyz/...;foo", "", False)),
    ("/a//b?a=///c", ("/a/b", "a=///c", False)),
    ("/x/%2E%2e/z%2f%2Fabc%5C../def", ("/z/def", "", True)),
    ("/%c0%af/%5c%25", ("/%c0%af/%25", "", True)),
    ("/a b", ("/a%20b", "", False)),
    ("/a/..", ("/", "", False)),
    ("/a/.", ("/a/", "", False)),
])
def test_envoy_path(target, expected):
    path = envoy_path(target)
    assert path is not None and (path.path, path.query, path.redirect) == expected


@pytest.mark.parametrize("target", ["/xyz/.%00../abc", "/xyz/AAAAA%%0000/abc", "/a#b", "a/b", "*",
                                    "http://host/a"])
def test_envoy_refuses(target):
    assert envoy_path(target) is None


def test_attach_clusters_gateway_admits_the_session_namespace_by_selector_on_its_https_listener():
    """``attach_cluster``'s Gateway (one HTTPS listener, routes from the session namespace only, by the
    ``kubernetes.io/metadata.name`` label) admits the session's route: TLS is not terminated in the demo."""
    objects = [*_gateway(), *_session("ses-a", "/s/ses_a/", 1)]
    by_kind = {k: [o for o in objects if o["kind"] == k] for k in ("Gateway", "HTTPRoute", "SecurityPolicy", "Backend")}
    [route] = by_kind["HTTPRoute"]

    def gateway_admitting(selector: dict) -> list[dict]:
        listener = {"name": "https", "protocol": "HTTPS", "port": 443, "hostname": DOMAIN,
                    "allowedRoutes": {"namespaces": {"from": "Selector", "selector": selector}}}
        return [{**g, "spec": {**g["spec"], "listeners": [listener]}} for g in by_kind["Gateway"]]

    own = {"matchLabels": {"kubernetes.io/metadata.name": route["metadata"]["namespace"]}}
    assert GatewayTable.build(gateway_admitting(own), by_kind["HTTPRoute"], [], []).route(DOMAIN, "/s/ses_a/") is not None
    for other in ({"matchLabels": {"kubernetes.io/metadata.name": "elsewhere"}}, {"matchLabels": {"team": "a"}},
                  {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "Exists"}]}):
        assert not GatewayTable.build(gateway_admitting(other), by_kind["HTTPRoute"], [], []).serves(DOMAIN), other
