"""The operator's session-path checks (``operator_agent.session_path``) against the emulated cluster lab-c1 and real
loopback servers: the session domain against the ingress node's addresses, and the auth-url's answer."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import kubernetes
import pytest
import requests

from demo import fleet
from demo.emulator import EmulatedCluster
from operator_agent.session_path import SessionPathChecks, check_session_domain, check_verify
from tests.helpers import serving

CLUSTER = "lab-c1"
INGRESS_NODE = "lab-c1-cp-01"


@pytest.fixture(scope="module")
def core_v1() -> Iterator[kubernetes.client.CoreV1Api]:
    with EmulatedCluster(fleet.cluster_objects(CLUSTER), version=fleet.cluster_version(CLUSTER), token="t") as running:
        api = kubernetes.config.new_client_from_config_dict(running.kubeconfig(CLUSTER))
        yield kubernetes.client.CoreV1Api(api)
        api.close()


def node_addresses(core_v1) -> list[str]:
    return [a.address for a in core_v1.read_node(INGRESS_NODE).status.addresses]


@contextmanager
def answering(status: int, body: bytes, content_type: str) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            assert self.headers.get("Authorization") is None  # the operator token never goes to the auth-url
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            pass

    with serving(Handler) as url:
        yield url + "/internal/connect/verify"


def test_a_name_that_resolves_to_the_ingress_node_passes(core_v1):
    address = node_addresses(core_v1)[0]
    result = check_session_domain(core_v1, session_domain="gpu.example.org", ingress_node=INGRESS_NODE,
                                  resolve=lambda host: [address])
    assert result["ok"] is True and f"an address of the ingress node {INGRESS_NODE}" in result["detail"]
    assert result["checked_at"].endswith("Z")


def test_a_name_that_resolves_elsewhere_names_both_addresses(core_v1):
    result = check_session_domain(core_v1, session_domain="gpu.example.org", ingress_node=INGRESS_NODE,
                                  resolve=lambda host: ["198.51.100.7"])
    assert result["ok"] is False
    assert "resolves to 198.51.100.7, which is not an address of the ingress node" in result["detail"]
    assert node_addresses(core_v1)[0] in result["detail"]


def test_a_name_that_does_not_resolve_fails_with_the_dns_fix(core_v1):
    result = check_session_domain(core_v1, session_domain="gpu.sessions.invalid", ingress_node=INGRESS_NODE)
    assert result["ok"] is False and "gpu.sessions.invalid does not resolve inside the cluster" in result["detail"]
    assert "create its DNS record" in result["detail"]


def test_localhost_names_are_loopback_as_browsers_resolve_them(core_v1):
    result = check_session_domain(core_v1, session_domain="lab-c1.gshare.localhost", ingress_node="")
    assert result["ok"] is True and "resolves to 127.0.0.1, ::1" in result["detail"]


def test_an_ingress_node_that_is_not_a_node_is_named(core_v1):
    result = check_session_domain(core_v1, session_domain="gpu.example.org", ingress_node="no-such-node",
                                  resolve=lambda host: ["198.51.100.7"])
    assert result["ok"] is False and "ingress_node no-such-node is not a node of this cluster" in result["detail"]


def test_nothing_to_check_without_a_session_domain_or_verify_url(core_v1):
    assert check_session_domain(core_v1, session_domain="", ingress_node=INGRESS_NODE) is None
    assert check_verify(requests.Session(), "") is None


def test_the_control_planes_401_passes():
    with answering(401, b'{"code": "token_missing", "detail": "No connect token."}', "application/json") as url:
        result = check_verify(requests.Session(), url)
    assert result["ok"] is True and "answers 401 token_missing" in result["detail"]


def test_an_html_page_at_the_auth_url_is_the_closed_internal_plane():
    with answering(200, b"<html><body>console</body></html>", "text/html") as url:
        result = check_verify(requests.Session(), url)
    assert result["ok"] is False and "the internal plane is closed" in result["detail"]
    assert f"The session Ingresses' auth-url {url}" in result["detail"]


def test_an_auth_url_nobody_listens_at_is_a_refused_connection():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = check_verify(requests.Session(), f"http://127.0.0.1:{port}/internal/connect/verify")
    assert result["ok"] is False and f"connection refused by 127.0.0.1:{port}" in result["detail"]


def test_a_2xx_to_no_token_is_not_the_control_plane():
    with answering(200, b"{}", "application/json") as url:
        result = check_verify(requests.Session(), url)
    assert result["ok"] is False and "answered 200" in result["detail"]


def test_checks_follow_the_control_planes_answer_and_log_a_failure_once(core_v1, caplog):
    caplog.set_level(logging.INFO, logger="operator_agent.session_path")
    checks = SessionPathChecks()
    answer = {"session_domain": "gpu.sessions.invalid", "ingress_node": INGRESS_NODE, "connect_verify_url": ""}
    checks.update(core_v1, answer)
    checks.update(core_v1, answer)
    assert set(checks.payload()) == {"session_domain_resolves"}
    assert caplog.text.count("session path check session_domain_resolves failed") == 1
    checks.update(core_v1, {})  # an older control plane names nothing to check
    assert checks.payload() == {}


def test_a_failing_control_plane_behind_the_auth_url_is_named():
    with answering(503, b'{"code": "verify_unavailable", "detail": "retry"}', "application/json") as url:
        result = check_verify(requests.Session(), url)
    assert result["ok"] is False and "answered 503 verify_unavailable: the control plane behind it is failing" in result["detail"]


def test_a_gateway_api_cluster_probes_the_ext_authz_url_as_envoy_calls_it(core_v1):
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            ext_authz = self.path.startswith("/internal/connect/ext-authz/")
            body = b'{"code": "token_missing", "detail": "No connect token."}' if ext_authz else b"<html>verify</html>"
            self.send_response(401 if ext_authz else 200)
            self.send_header("Content-Type", "application/json" if ext_authz else "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            pass

    with serving(Handler) as base:
        answer = {"session_domain": "", "ingress_node": "", "connect_verify_url": base + "/internal/connect/verify",
                  "routing": "gateway-api", "connect_ext_authz_url": base + "/internal/connect/ext-authz"}
        checks = SessionPathChecks()
        checks.update(core_v1, answer)
        result = checks.payload()["verify_reachable"]
        assert result["ok"] is True, result
        assert "ext_authz URL" in result["detail"] and "Envoy Gateway" in result["detail"]
        assert seen == [("/internal/connect/ext-authz/", None)]  # no token, and the verify URL is not probed

        # The same cluster moved back to ingress-nginx: the auth-url is probed again (here it answers HTML).
        checks.update(core_v1, {**answer, "routing": "ingress-nginx"})
        result = checks.payload()["verify_reachable"]
        assert result["ok"] is False and "The session Ingresses' auth-url" in result["detail"]
        assert seen[-1] == ("/internal/connect/verify", None)

        # An older control plane sends no routing keys: ingress-nginx.
        checks.update(core_v1, {k: answer[k] for k in ("session_domain", "ingress_node", "connect_verify_url")})
        assert seen[-1] == ("/internal/connect/verify", None)


def test_a_failing_ext_authz_names_envoy_gateway():
    with answering(503, b'{"code": "verify_unavailable", "detail": "retry"}', "application/json") as url:
        result = check_verify(requests.Session(), url, routing="gateway-api")
    assert result["ok"] is False and "Envoy Gateway refuses every session request" in result["detail"]
