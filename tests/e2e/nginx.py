"""A real nginx configured the way ingress-nginx renders a session Ingress with ``auth-url``.

The session Ingress (``operator_agent.manifests.routing.ingress_nginx.session_ingress``) carries::

    nginx.ingress.kubernetes.io/auth-url: <control plane>/internal/connect/verify
    nginx.ingress.kubernetes.io/auth-response-headers: X-Auth-Request-User
    nginx.ingress.kubernetes.io/auth-always-set-cookie: "true"

:func:`render_conf` writes the nginx configuration ingress-nginx generates for that from its template
(kubernetes/ingress-nginx ``rootfs/etc/nginx/template/nginx.tmpl``, the ``location = {{ $authPath }}``
block and the ``auth_request`` part of the Ingress location; the names come from
``internal/ingress/controller/template/template.go``: ``buildAuthLocation`` gives
``/_external-auth-<base64url(path) without "=">-<pathType>`` and ``buildAuthResponseHeaders`` gives
``auth_request_set $authHeader0 $upstream_http_x_auth_request_user;`` +
``proxy_set_header 'X-Auth-Request-User' $authHeader0;``), minus the Lua balancer, TLS and the
controller's metrics. Two deliberate differences, both marked in the rendered file:

* nginx listens on plain HTTP on loopback while a cluster's ingress terminates TLS, so ``$scheme``
  would be ``http``; the auth subrequest's ``X-Original-URL`` is ``https://$http_host$request_uri``
  (what ``$scheme://$http_host$request_uri`` is behind TLS), and the session location's
  ``X-Forwarded-Proto`` is ``https``.
* the backend and the auth URL are literal ``127.0.0.1:<port>`` addresses instead of the Lua
  balancer's upstream (``proxy_pass http://upstream_balancer;``).

:func:`ingress_nginx` (a pytest fixture) starts ``nginx -p <tmp> -c <tmp>/nginx.conf -g 'daemon off;'``
on ``127.0.0.1:<free port>``, every path (pid, logs, temp directories) under ``tmp_path``, and stops
it at teardown. The Debian package ``nginx`` provides ``/usr/sbin/nginx``; ``.ci/run`` installs it.
"""

from __future__ import annotations

import base64
import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
START_TIMEOUT = 10.0


def nginx_binary() -> str:
    """The nginx executable; fails the test (never skips) when nginx is not installed."""
    found = shutil.which("nginx") or next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.fail(
            "nginx is not installed: the connect end-to-end tests need a real nginx. "
            ".ci/run installs it (`apt-get install -y --no-install-recommends nginx`); locally run "
            "`sudo apt-get update && sudo apt-get install -y nginx` (the binary is /usr/sbin/nginx).",
            pytrace=False,
        )
    return found


def auth_location(path: str, path_type: str = "Prefix") -> str:
    """ingress-nginx's internal auth location for an Ingress path (``buildAuthLocation``)."""
    encoded = base64.urlsafe_b64encode(path.encode()).decode().replace("=", "")
    return f"/_external-auth-{encoded}-{path_type}"


def _hostname(url: str) -> str:
    """``authURL.Hostname()``: ingress-nginx sends the auth URL's host, without the port, as ``Host``."""
    return urlsplit(url).hostname or ""


def _auth_block(path: str, auth_url: str) -> str:
    return f"""
        location = {auth_location(path)} {{
            internal;

            access_log off;

            proxy_pass_request_body     off;
            proxy_set_header            Content-Length          "";
            proxy_set_header            X-Forwarded-Proto       "";
            proxy_set_header            X-Request-ID            $req_id;

            proxy_set_header            Host                    {_hostname(auth_url)};
            # ingress-nginx: $scheme://$http_host$request_uri -- https here because the cluster's
            # ingress terminates TLS while this test nginx listens on plain http.
            proxy_set_header            X-Original-URL          https://$http_host$request_uri;
            proxy_set_header            X-Original-Method       $request_method;
            proxy_set_header            X-Sent-From             "nginx-ingress-controller";
            proxy_set_header            X-Real-IP               $remote_addr;
            proxy_set_header            X-Forwarded-For         $remote_addr;

            proxy_set_header            X-Auth-Request-Redirect $request_uri;

            proxy_buffering                         off;
            proxy_buffer_size                       4k;
            proxy_buffers                           4 4k;
            proxy_request_buffering                 on;

            proxy_ssl_server_name       on;
            proxy_pass_request_headers  on;
            client_max_body_size        0;

            proxy_http_version 1.1;
            set $target {auth_url};
            proxy_pass $target;
        }}
"""


def _session_block(path: str, backend_url: str) -> str:
    return f"""
        location {path} {{
            port_in_redirect off;

            # this location requires authentication
            auth_request        {auth_location(path)};
            auth_request_set    $auth_cookie $upstream_http_set_cookie;
            add_header          Set-Cookie $auth_cookie always;
            auth_request_set $authHeader0 $upstream_http_x_auth_request_user;
            proxy_set_header 'X-Auth-Request-User' $authHeader0;

            client_max_body_size                    0;

            proxy_set_header Host                   $http_host;

            # Allow websocket connections
            proxy_set_header                        Upgrade           $http_upgrade;
            proxy_set_header                        Connection        $connection_upgrade;

            proxy_set_header X-Request-ID           $req_id;
            proxy_set_header X-Real-IP              $remote_addr;
            proxy_set_header X-Forwarded-For        $remote_addr;
            proxy_set_header X-Forwarded-Host       $http_host;
            # https: TLS is terminated by the cluster's ingress (plain http in this test).
            proxy_set_header X-Forwarded-Port       443;
            proxy_set_header X-Forwarded-Proto      https;
            proxy_set_header X-Forwarded-Scheme     https;
            proxy_set_header X-Scheme               https;

            # mitigate HTTPoxy Vulnerability
            proxy_set_header Proxy                  "";

            proxy_connect_timeout                   5s;
            proxy_send_timeout                      3600s;
            proxy_read_timeout                      3600s;

            proxy_buffering                         off;
            proxy_request_buffering                 on;
            proxy_http_version                      1.1;

            proxy_pass {backend_url};
        }}
"""


def conf_head(prefix: Path) -> str:
    """The top of an nginx.conf running unprivileged-safe in ``prefix``: worker user (as root), pid, logs, temp paths,
    and the opening of the ``http`` block (the caller closes it)."""
    user = ""
    if os.geteuid() == 0:  # as root nginx would switch its workers to nobody, who cannot enter tmp_path
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
    return f"""{user}
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
    scgi_temp_path        {prefix}/scgi-temp;"""


def render_conf(
    *,
    prefix: Path,
    port: int,
    hosts: Sequence[str],
    paths: Sequence[str],
    auth_url: str,
    backend_url: str,
    catch_all: bool = True,
    backends: Mapping[str, str] | None = None,
    uri_echo_host: str | None = None,
) -> str:
    """The nginx.conf of the test ingress.

    Args:
        prefix: directory for the pid file, logs and temp directories.
        port: loopback port to listen on.
        hosts: one ``server`` block per host, each with the session locations (an Ingress rule's
            ``host``; several hosts stand for several clusters' ingresses routing the same path).
        paths: session Ingress paths (``/s/<session id>/``, pathType Prefix).
        auth_url: the ``auth-url`` (``<control plane>/internal/connect/verify``).
        backend_url: where allowed requests go (the session pod's Service).
        backends: per-path backends (``{path: url}``) overriding ``backend_url``: each session Ingress
            routes to its own pod's Service, so a test can tell whose pod a request reached.
        catch_all: also serve the session locations in the ``default_server`` (any other ``Host``),
            so that a request with an unknown host still reaches the verify and is refused by the
            control plane, not merely unrouted by nginx (ingress-nginx's ``_`` server would answer
            404 from its default backend).
    """
    locations = "".join(_auth_block(p, auth_url) + _session_block(p, (backends or {}).get(p, backend_url)) for p in paths)
    servers = [(host, "") for host in hosts]
    if catch_all:
        servers.append(("_", " default_server"))
    blocks = "".join(
        f"""
    server {{
        listen 127.0.0.1:{port}{flags};
        server_name {name};
{locations}
        location / {{
            return 404;
        }}
    }}
"""
        for name, flags in servers
    )
    if uri_echo_host:
        blocks += f"""
    server {{
        listen 127.0.0.1:{port};
        server_name {uri_echo_host};
        location / {{
            return 200 "$uri";
        }}
    }}
"""
    return f"""# Rendered by tests/e2e/nginx.py after ingress-nginx's nginx.tmpl (auth-url Ingress).
{conf_head(prefix)}
    types {{ }}
    default_type text/html;

    log_subrequest on;
    log_format upstreaminfo '$remote_addr "$host" "$request" $status upstream=$upstream_status';
    access_log {prefix}/access.log upstreaminfo;

    server_tokens off;
    server_name_in_redirect off;
    port_in_redirect        off;
    uninitialized_variable_warn off;

    # See https://www.nginx.com/blog/websocket-nginx
    map $http_upgrade $connection_upgrade {{
        default          upgrade;
        ''               close;
    }}

    map $http_x_request_id $req_id {{
        default   $http_x_request_id;
        ""        $request_id;
    }}
{blocks}}}
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Nginx:
    """A running nginx: ``url`` is ``http://127.0.0.1:<port>``; send requests with a ``Host`` header."""

    prefix: Path
    port: int
    process: subprocess.Popen
    conf: Path
    url: str = field(init=False)

    def __post_init__(self):
        self.url = f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        """The tails of the error and access logs and of nginx's stderr (for failure messages)."""
        parts = []
        for name in ("stderr.log", "error.log", "access.log"):
            path = self.prefix / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Fast shutdown (SIGTERM to the master, which stops its worker); SIGKILL after 10 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def run_nginx(prefix: Path, render: Callable[[Path, int], str]) -> Nginx:
    """Write ``<prefix>/nginx.conf`` = ``render(prefix, port)`` for a free loopback port and run nginx in the foreground.

    Retries on another free port when the chosen one was taken in between; fails the test with nginx's logs when it
    does not come up. The caller stops it (``Nginx.stop``).
    """
    binary = nginx_binary()
    prefix.mkdir(parents=True, exist_ok=True)
    last = ""
    for _ in range(3):
        port = _free_port()
        conf_path = prefix / "nginx.conf"
        conf_path.write_text(render(prefix, port))
        with open(prefix / "stderr.log", "wb") as stderr:
            process = subprocess.Popen(
                [binary, "-p", f"{prefix}/", "-c", str(conf_path), "-e", str(prefix / "error.log"), "-g", "daemon off;"],
                stdin=subprocess.DEVNULL, stdout=stderr, stderr=subprocess.STDOUT,
            )
        nginx = Nginx(prefix=prefix, port=port, process=process, conf=conf_path)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return nginx
            except OSError:
                time.sleep(0.05)
        nginx.stop()
        last = nginx.logs()
        if "Address already in use" not in last:
            break
    pytest.fail(f"nginx did not start (exit code {process.returncode}).\n{last}", pytrace=False)


def start_nginx(prefix: Path, **conf) -> Nginx:
    """Start nginx with the session-Ingress configuration of :func:`render_conf` (``conf`` are its arguments)."""
    return run_nginx(prefix, lambda prefix_, port: render_conf(prefix=prefix_, port=port, **conf))


@pytest.fixture
def ingress_nginx(tmp_path):
    """Factory: ``start(hosts=[...], paths=[...], auth_url=..., backend_url=..., catch_all=True) -> Nginx``.

    Each nginx gets its own directory under ``tmp_path``; all are stopped at teardown.
    """
    nginx_binary()
    started: list[Nginx] = []

    def start(**conf) -> Nginx:
        nginx = start_nginx(tmp_path / f"nginx-{len(started)}", **conf)
        started.append(nginx)
        return nginx

    yield start
    for nginx in started:
        nginx.stop()
