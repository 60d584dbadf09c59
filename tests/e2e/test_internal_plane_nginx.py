"""The internal plane through a REAL nginx configured as ingress-nginx renders the control-plane chart's Ingresses.

Path of every request: test client -> nginx -> pytest-django's ``live_server`` (the api), with nginx's
``Host`` passed through as ingress-nginx does (``proxy_set_header Host $best_http_host``, which is
``$http_host`` without ``use-forwarded-headers``). Three server names, one per way the chart can be set up:

* ``gshare.example.com``: the public Ingress alone (``/`` to the api), the internal plane being on a host of
  its own. Its ``/internal`` and ``/.well-known`` reach the api, which answers 404 there.
* ``gshare-internal.example.com``: the internal-plane Ingress (``/internal`` and ``/.well-known`` only, with
  ``whitelist-source-range``); any other path is ingress-nginx's default backend (404).
* ``gshare-one.example.com``: both Ingresses on one host (``internalPlane.host`` empty), merged by ingress-nginx
  into one server: ``/`` from the public Ingress, ``/internal`` and ``/.well-known`` from the internal one,
  with its source range. That host is internal for the api; the restriction is nginx's.

ingress-nginx renders a Prefix path ``/internal`` as ``location /internal/`` plus ``location = /internal``
(``updateServerLocations`` in ``internal/ingress/controller/controller.go``) and ``whitelist-source-range``
as ``allow <cidr>; ... deny all;`` inside each location of that Ingress. The source range here is
``127.0.0.1/32`` (the clusters); the outsider is a client bound to ``127.0.0.2``.
"""

from __future__ import annotations

import grp
import http.client
import json
import os
import pwd
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from clusters.models import Node
from clusters.operator_tokens import operator_token_mint
from tests.e2e.nginx import Nginx, nginx_binary
from tests.factories import ClusterFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PUBLIC = "gshare.example.com"
INTERNAL = "gshare-internal.example.com"
ONE_HOST = "gshare-one.example.com"
CLUSTERS = "127.0.0.1"  # the source range (/32): the data-plane clusters' egress address
OUTSIDER = "127.0.0.2"  # any other address
INTERNAL_PREFIXES = ("/internal", "/.well-known")
INVENTORY = {"nodes": [{"name": "gpu-1", "ready": True, "devices": [
    {"uuid": "GPU-1", "index": 0, "model": "NVIDIA A100", "memory_mib": 40960, "split_count": 4, "cores": 100, "health": True},
]}]}


def _proxy(api: str, allow: str | None = None) -> str:
    """The body of an Ingress location to the api Service (ingress-nginx's proxy headers, trimmed)."""
    acl = f"allow {allow}/32;\n            deny all;\n" if allow else ""
    return f"""{acl}
            proxy_set_header Host                   $http_host;
            proxy_set_header X-Request-ID           $req_id;
            proxy_set_header X-Real-IP              $remote_addr;
            proxy_set_header X-Forwarded-For        $remote_addr;
            proxy_set_header X-Forwarded-Host       $http_host;
            proxy_set_header X-Forwarded-Port       443;
            proxy_set_header X-Forwarded-Proto      https;
            proxy_set_header X-Scheme               https;
            proxy_set_header Proxy                  "";
            client_max_body_size                    32m;
            proxy_http_version                      1.1;
            proxy_pass {api};
"""


def _internal_locations(api: str) -> str:
    """The internal-plane Ingress's locations: each Prefix path as ``/p/`` and ``= /p``, each with the source range."""
    return "".join(
        f"""
        location {prefix}/ {{{_proxy(api, allow=CLUSTERS)}        }}
        location = {prefix} {{{_proxy(api, allow=CLUSTERS)}        }}
"""
        for prefix in INTERNAL_PREFIXES
    )


def render_conf(prefix: Path, port: int, api: str) -> str:
    """nginx.conf: the three servers of the module docstring and ingress-nginx's catch-all default server."""
    user = ""
    if os.geteuid() == 0:  # as root nginx would switch its workers to nobody, who cannot enter tmp_path
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
    default_backend = "\n        location / {\n            return 404;\n        }\n"
    servers = {
        PUBLIC: f"\n        location / {{{_proxy(api)}        }}\n",
        INTERNAL: _internal_locations(api) + default_backend,
        ONE_HOST: _internal_locations(api) + f"\n        location / {{{_proxy(api)}        }}\n",
    }
    blocks = "".join(
        f"\n    server {{\n        listen 127.0.0.1:{port};\n        server_name {name};\n{body}    }}\n" for name, body in servers.items()
    )
    blocks += f"\n    server {{\n        listen 127.0.0.1:{port} default_server;\n        server_name _;\n{default_backend}    }}\n"
    return f"""# Rendered by tests/e2e/test_internal_plane_nginx.py after ingress-nginx's nginx.tmpl (the control-plane chart's Ingresses).
{user}
worker_processes 1;
pid {prefix}/nginx.pid;
lock_file {prefix}/nginx.lock;
error_log {prefix}/error.log info;

events {{
    worker_connections 256;
}}

http {{
    client_body_temp_path {prefix}/client-body;
    proxy_temp_path       {prefix}/proxy-temp;
    fastcgi_temp_path     {prefix}/fastcgi-temp;
    uwsgi_temp_path       {prefix}/uwsgi-temp;
    scgi_temp_path        {prefix}/scgi-temp;
    types {{ }}
    default_type text/html;
    log_format upstreaminfo '$remote_addr "$host" "$request" $status upstream=$upstream_status';
    access_log {prefix}/access.log upstreaminfo;
    server_tokens off;

    map $http_x_request_id $req_id {{
        default   $http_x_request_id;
        ""        $request_id;
    }}
{blocks}}}
"""


@pytest.fixture
def nginx(tmp_path, live_server, settings):
    """nginx on ``127.0.0.1:<free port>`` in front of the live server, whose internal hosts are the internal ones."""
    settings.GSHARE_INTERNAL_HOSTS = [INTERNAL, ONE_HOST]  # what the chart sets for each of the two layouts
    binary = nginx_binary()
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    api = f"http://127.0.0.1:{urlsplit(live_server.url).port}"
    for _ in range(3):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        conf = prefix / "nginx.conf"
        conf.write_text(render_conf(prefix, port, api))
        with open(prefix / "stderr.log", "wb") as stderr:
            process = subprocess.Popen([binary, "-p", f"{prefix}/", "-c", str(conf), "-e", str(prefix / "error.log"), "-g", "daemon off;"],
                                       stdin=subprocess.DEVNULL, stdout=stderr, stderr=subprocess.STDOUT)
        running = Nginx(prefix=prefix, port=port, process=process, conf=conf)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.05)
        if process.poll() is None:
            yield running
            running.stop()
            return
        if "Address already in use" not in running.logs():
            break
    pytest.fail(f"nginx did not start:\n{running.logs()}", pytrace=False)


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str

    def json(self):
        return json.loads(self.body)


def send(nginx: Nginx, method: str, host: str, path: str, *, source: str = CLUSTERS, token: str | None = None, body=None) -> Answer:
    """``method`` ``path`` with ``Host: host`` to nginx, from the loopback address ``source``."""
    connection = http.client.HTTPConnection("127.0.0.1", nginx.port, timeout=30, source_address=(source, 0))
    headers = {"Host": host}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        answer = Answer(response.status, response.read(), response.getheader("Content-Type", ""))
    finally:
        connection.close()
    if answer.status >= 500:
        pytest.fail(f"nginx answered {answer.status}:\n{nginx.logs()}", pytrace=False)
    return answer


def api_not_found(answer: Answer) -> bool:
    """The api's own 404 (it reached the control plane), not nginx's."""
    return answer.status == 404 and answer.content_type == "application/json" and answer.json()["code"] == "not_found"


@pytest.fixture
def operator():
    cluster = ClusterFactory()
    return cluster, operator_token_mint(cluster_id=cluster.public_id)


def test_on_the_public_host_the_internal_routes_reach_the_api_and_answer_404(nginx, operator):
    cluster, token = operator
    for source in (CLUSTERS, OUTSIDER):  # the public Ingress has no source range: the api's host check decides
        assert api_not_found(send(nginx, "PUT", PUBLIC, "/internal/v1/inventory", source=source, token=token, body=INVENTORY))
        assert api_not_found(send(nginx, "GET", PUBLIC, "/internal/connect/verify", source=source))
        assert api_not_found(send(nginx, "GET", PUBLIC, "/.well-known/gshare-internal-jwks.json", source=source))
    assert not Node.objects.filter(cluster=cluster).exists()
    # The public host itself works: health, the API (refusing no token), the console.
    assert send(nginx, "GET", PUBLIC, "/healthz", source=OUTSIDER).status == 200
    assert send(nginx, "GET", PUBLIC, "/api/v1/clusters", source=OUTSIDER).status == 401
    assert send(nginx, "GET", PUBLIC, "/login/", source=OUTSIDER).status == 200


def test_on_the_internal_host_the_clusters_get_the_internal_routes_as_before(nginx, operator):
    cluster, token = operator
    assert send(nginx, "PUT", INTERNAL, "/internal/v1/inventory", body=INVENTORY).status == 401
    applied = send(nginx, "PUT", INTERNAL, "/internal/v1/inventory", token=token, body=INVENTORY)
    assert applied.status == 200, applied.body
    assert applied.json()["nodes"] == 1 and Node.objects.filter(cluster=cluster).count() == 1
    assert send(nginx, "GET", INTERNAL, "/internal/connect/verify").status == 401
    jwks = send(nginx, "GET", INTERNAL, "/.well-known/gshare-internal-jwks.json")
    assert jwks.status == 200 and jwks.json()["keys"]


def test_the_internal_host_serves_nothing_else_and_nobody_else(nginx):
    for path in ("/api/v1/clusters", "/login/", "/healthz", "/internalx"):
        answer = send(nginx, "GET", INTERNAL, path)
        assert answer.status == 404 and not api_not_found(answer), path  # ingress-nginx's default backend
    assert send(nginx, "GET", INTERNAL, "/.well-known/gshare-internal-jwks.json", source=OUTSIDER).status == 403
    assert send(nginx, "GET", INTERNAL, "/internal/connect/verify", source=OUTSIDER).status == 403


def test_on_one_host_for_both_the_merged_source_range_guards_the_internal_routes(nginx, operator):
    cluster, token = operator
    jwks = send(nginx, "GET", ONE_HOST, "/.well-known/gshare-internal-jwks.json")
    assert jwks.status == 200 and jwks.json()["keys"]
    assert send(nginx, "GET", ONE_HOST, "/internal/connect/verify").status == 401
    assert send(nginx, "PUT", ONE_HOST, "/internal/v1/inventory", token=token, body=INVENTORY).status == 200
    for path in ("/.well-known/gshare-internal-jwks.json", "/internal/connect/verify", "/internal/v1/inventory", "/internal"):
        assert send(nginx, "GET", ONE_HOST, path, source=OUTSIDER).status == 403, path
    # The public paths of that host stay open to everyone.
    assert send(nginx, "GET", ONE_HOST, "/healthz", source=OUTSIDER).status == 200
    assert send(nginx, "GET", ONE_HOST, "/api/v1/clusters", source=OUTSIDER).status == 401
