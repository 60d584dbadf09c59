"""The demo's ingress: what ingress-nginx does for gShare's session Ingress, on loopback, for every emulated cluster.

On a real cluster, ``https://<session_domain>/s/<session id>/`` reaches the cluster's ingress-nginx, which
routes by host and path to the session Service, after asking the control plane through the Ingress's
``nginx.ingress.kubernetes.io/auth-url``. This module plays that part for the demo: one threaded HTTP server
on ``127.0.0.1:<port>`` standing for each cluster's ingress controller. Browsers resolve ``*.localhost`` to
loopback, so ``http://lab-c1.gshare.localhost:<port>/s/<id>/?token=...`` (the console's **Open** link in the
demo, ``GSHARE_SESSION_SCHEME=http``, ``GSHARE_SESSION_PORT=<port>``) lands here.

What it does, after ingress-nginx (``nginx.tmpl`` and ``internal/ingress/controller``; the e2e suite proves the
same Ingress against a real nginx rendered that way, ``tests/e2e/nginx.py``):

* the ``Host`` header's name (port dropped) picks the cluster whose ``session_domain`` it is (DNS points each
  session domain at one cluster's ingress); an unknown host gets the default backend's 404; a ``Host`` that is not
  ``name[:port]`` (a path, ``?``, ``#``, ``@``, a backslash, a space, a control character), or two of them, gets 400,
  as nginx's ``ngx_http_validate_host`` answers (stricter: nginx lets ``?#@`` through);
* it keeps that cluster's Ingress objects of class ``nginx`` (a list every ``POLL_SECONDS`` on the emulated
  apiserver, as a controller's informer would hold them); a ``Prefix`` path ``/p/`` is nginx's
  ``location /p/`` plus ``location = /p``; the exact match wins, else the longest prefix, matched on the URI
  nginx routes on (``sessions.connect_path.nginx_uri``: percent-decoded, dot segments resolved, ``//`` merged;
  a URI nginx refuses gets 400); no location: the default backend's 404;
* the ``auth-url`` subrequest: the client's headers without its body, with ingress-nginx's ``Host`` (the auth
  URL's host name), ``X-Original-URL: $scheme://$http_host$request_uri`` (``http`` here, no TLS),
  ``X-Original-Method``, ``X-Sent-From: nginx-ingress-controller``, ``X-Real-IP``, ``X-Forwarded-For``,
  ``X-Auth-Request-Redirect: $request_uri``, ``X-Request-ID``, no ``Content-Length`` and no
  ``X-Forwarded-Proto``; a 2xx lets the request through, 401/403 are answered as such (``WWW-Authenticate``
  copied on 401), anything else (or no answer) is a 500, as ``auth_request`` does;
* ``auth-response-headers``: those headers of the verify answer go to the backend (the client cannot set them);
  ``auth-always-set-cookie: "true"``: the verify answer's ``Set-Cookie`` goes to the browser whatever the
  backend answers (without it, only with a 200/201/204/206/30x);
* a client silent for ``CLIENT_TIMEOUT`` (nginx's ``client_header_timeout``/``client_body_timeout``) is dropped; a
  ``Content-Length`` above ``MAX_BODY_BYTES`` (nginx's default ``client_max_body_size 1m``) is a 413, its body
  unread, and one that is not digits a 400. The session Ingresses' ``proxy-body-size: "0"`` (no limit) is not
  honoured here: the stand-in page reads no body, so a demo has nothing to upload;
* the backend: the session pod's stand-in page (``demo.session_page``); no Running pod behind the Service is
  ingress-nginx's 503.

A host some HTTPRoute of the cluster serves (Gateway API ``gateway-api`` routing: ``HTTPRoute``, Envoy Gateway's
``SecurityPolicy`` with ``extAuth.http`` and ``Backend``, listed with the Ingresses) is answered as Envoy configured by
Envoy Gateway would instead: path normalisation, routing and the ext_authz check are ``demo.envoy_proxy``'s.

Request lines are logged without their query string, and the Host as its valid host name only: a connect link's
``?token=`` is a secret.

Run it: ``python -m demo.ingress_nginx --config ingress.json --port 0 --ready-file ready.json`` with
``{"clusters": [{"name", "session_domain", "kubeconfig"}]}`` (the kubeconfig file of each emulated cluster).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import yaml

from demo import envoy_proxy as gateway_routing
from demo import session_page
from sessions.connect_path import host_of_authority, nginx_uri

logger = logging.getLogger("demo.ingress_nginx")

NGINX = "nginx.ingress.kubernetes.io/"
AUTH_URL = NGINX + "auth-url"
AUTH_RESPONSE_HEADERS = NGINX + "auth-response-headers"
AUTH_ALWAYS_SET_COOKIE = NGINX + "auth-always-set-cookie"
INGRESS_CLASS = "nginx"
#: How often each cluster's Ingress objects are listed, seconds.
POLL_SECONDS = 1.0
#: ingress-nginx's ``proxy-connect-timeout`` default, and a read bound for the auth subrequest, seconds.
AUTH_CONNECT_TIMEOUT = 5.0
AUTH_READ_TIMEOUT = 60.0
#: nginx's ``client_header_timeout``/``client_body_timeout`` default, seconds: a client silent that long is dropped.
CLIENT_TIMEOUT = 60.0
#: nginx's ``client_max_body_size`` default (``1m``): a request announcing a larger body is a 413, its body unread.
MAX_BODY_BYTES = 1024 * 1024
#: Statuses after which ingress-nginx's ``add_header Set-Cookie $auth_cookie`` (without ``always``) applies.
_ADD_HEADER_STATUSES = {200, 201, 204, 206, 301, 302, 303, 304, 307, 308}
# Not passed on to the auth subrequest: hop-by-hop headers, and what ingress-nginx's auth location overrides or blanks.
_NOT_TO_AUTH = {
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "content-length",
    "host", "x-original-url", "x-original-method", "x-sent-from", "x-real-ip", "x-forwarded-for",
    "x-auth-request-redirect", "x-request-id", "x-forwarded-proto",
}
_DIGITS = re.compile(r"[0-9]{1,19}")
_REASONS = {
    400: "Bad Request", 401: "Authorization Required", 403: "Forbidden", 404: "Not Found", 413: "Request Entity Too Large",
    500: "Internal Server Error", 503: "Service Temporarily Unavailable",
}


def _nginx_error_page(status: int) -> bytes:
    """nginx's built-in error page for ``status`` (what ``auth_request`` answers a refused request with)."""
    title = f"{status} {_REASONS.get(status, '')}".strip()
    return (f"<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n<center><h1>{title}</h1></center>\r\n"
            "<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n").encode()


@dataclass(frozen=True)
class ClusterApi:
    """One emulated apiserver, read over HTTP(S) with the kubeconfig's server, bearer token and CA."""

    server: str
    token: str | None = None
    ca_file: str | None = None  # PEM file of the CA of an HTTPS apiserver (verified), None: the system's

    @classmethod
    def from_kubeconfig(cls, path: str | Path) -> ClusterApi:
        """The current context's server, token and CA of the kubeconfig file at ``path`` (a
        ``certificate-authority-data`` CA is written to ``<path>.ca.pem``, the file ``requests`` verifies with)."""
        config = yaml.safe_load(Path(path).read_text())
        context_name = config.get("current-context") or config["contexts"][0]["name"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next((u["user"] for u in config.get("users") or [] if u["name"] == context.get("user")), {})
        ca_file = cluster.get("certificate-authority")
        if cluster.get("certificate-authority-data"):  # requests verifies against a file only: the CA next to it
            ca_path = Path(path).with_name(Path(path).name + ".ca.pem")
            ca_path.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
            ca_file = str(ca_path)
        return cls(server=cluster["server"].rstrip("/"), token=user.get("token"), ca_file=ca_file)

    def get(self, path: str) -> dict[str, Any] | None:
        """GET ``path`` as JSON; None on 404.

        Raises:
            requests.RequestException: the apiserver is unreachable or answered another error.
        """
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        response = requests.get(self.server + path, headers=headers, timeout=10, verify=self.ca_file or True)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()


@dataclass(frozen=True)
class Location:
    """One nginx location of an Ingress path: ``exact`` (``= /p``) or prefix (``/p/``)."""

    path: str
    exact: bool
    namespace: str
    ingress: str
    service: str
    annotations: dict[str, str]


@dataclass
class ClusterIngress:
    """The ingress controller of one cluster: its session domain, its apiserver, and the locations of its Ingresses."""

    name: str
    session_domain: str
    api: ClusterApi
    locations: dict[str, list[Location]] = field(default_factory=dict)  # by host
    gateway: gateway_routing.GatewayTable = field(default_factory=gateway_routing.GatewayTable)
    listed_at: float = 0.0
    error: str = ""

    def refresh(self) -> None:
        """List the cluster's Ingress objects and its Gateway API and Envoy Gateway objects (``demo.envoy_proxy``), and
        rebuild its routes (kept as they were when a list fails)."""
        try:
            listed = self.api.get("/apis/networking.k8s.io/v1/ingresses") or {}
            table = gateway_routing.GatewayTable.list(self.api.get)
        except (requests.RequestException, ValueError) as exc:
            if not self.error:
                logger.warning("cluster %s: listing its routes failed (%s); keeping the last list", self.name,
                               type(exc).__name__)
            self.error = type(exc).__name__
            return
        self.error = ""
        self.locations = locations_of(listed.get("items") or [])
        self.gateway = table
        self.listed_at = time.monotonic()

    def route(self, host: str, uri: str) -> Location | None:
        """The location of ``host`` serving the normalised ``uri``: the exact match, else the longest prefix."""
        candidates = self.locations.get(host, [])
        exact = next((loc for loc in candidates if loc.exact and loc.path == uri), None)
        if exact is not None:
            return exact
        prefixes = [loc for loc in candidates if not loc.exact and uri.startswith(loc.path)]
        return max(prefixes, key=lambda loc: len(loc.path), default=None)


def locations_of(ingresses: list[dict[str, Any]]) -> dict[str, list[Location]]:
    """The locations ingress-nginx of class ``nginx`` builds from ``ingresses``, by host.

    Ingresses are taken oldest first (``creationTimestamp``, then namespace/name), and the first Ingress to name a
    host and path keeps it, as ingress-nginx does. A ``Prefix`` path ``/p`` or ``/p/`` gives ``/p/`` and ``= /p``;
    ``Exact`` gives ``= /p``; ``/`` stays ``/``.
    """
    def order(ingress):
        meta = ingress.get("metadata") or {}
        return meta.get("creationTimestamp") or "", meta.get("namespace") or "", meta.get("name") or ""

    servers: dict[str, list[Location]] = {}
    for ingress in sorted(ingresses, key=order):
        spec, meta = ingress.get("spec") or {}, ingress.get("metadata") or {}
        if spec.get("ingressClassName") != INGRESS_CLASS or meta.get("deletionTimestamp"):
            continue
        for rule in spec.get("rules") or []:
            host = (rule.get("host") or "").lower()
            for path in (rule.get("http") or {}).get("paths") or []:
                service = ((path.get("backend") or {}).get("service") or {}).get("name")
                if not host or not service:
                    continue
                value, kind = path.get("path") or "/", path.get("pathType") or "Prefix"
                if value == "/":
                    wanted = [("/", False)]
                elif kind == "Exact":
                    wanted = [(value, True)]
                else:
                    wanted = [(value.rstrip("/") + "/", False), (value.rstrip("/"), True)]
                taken = servers.setdefault(host, [])
                for where, exact in wanted:
                    if not any((loc.path, loc.exact) == (where, exact) for loc in taken):
                        taken.append(Location(where, exact, meta.get("namespace", ""), meta.get("name", ""), service,
                                              dict(meta.get("annotations") or {})))
    return servers


@dataclass
class Answer:
    """A response to send: status, headers (in order, repeats allowed), body and the ``Server`` it names (``nginx``
    for ingress-nginx's answers, ``envoy`` for Envoy Gateway's)."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    server: str = "nginx"


def _error(status: int) -> Answer:
    return Answer(status, [("Content-Type", "text/html")], _nginx_error_page(status))


def _default_backend() -> Answer:
    return Answer(404, [("Content-Type", "text/plain")], b"default backend - 404")


class DemoIngress:
    """The ingress of every emulated cluster, on one loopback port, keyed by ``Host``.

    Args:
        clusters: one ``ClusterIngress`` per cluster (distinct session domains).
        host: address to listen on (loopback).
        port: TCP port (0: a free one; see ``port`` once started).
        poll_seconds: how often each cluster's Ingresses are listed.
        client_timeout: seconds a client may stay silent while sending its request (headers or body) before its
            connection is closed.
    """

    def __init__(self, clusters: list[ClusterIngress], host: str = "127.0.0.1", port: int = 0, poll_seconds: float = POLL_SECONDS,
                 client_timeout: float = CLIENT_TIMEOUT):
        self.clusters = {c.session_domain.lower(): c for c in clusters}
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        ingress = self

        class Handler(_Handler):
            controller = ingress
            timeout = client_timeout  # StreamRequestHandler: the socket's timeout, on every read and write

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{self.server.server_address[0]}:{self.port}"

    def start(self) -> DemoIngress:
        """List every cluster's Ingresses once, then serve and keep listing in background threads; returns self."""
        for cluster in self.clusters.values():
            cluster.refresh()
        self._threads = [threading.Thread(target=self._poll, name="ingress-poll", daemon=True),
                         threading.Thread(target=self.server.serve_forever, name="ingress-serve", daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and polling."""
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            for cluster in self.clusters.values():
                cluster.refresh()

    def handle(self, method: str, host_header: str, request_uri: str, headers: list[tuple[str, str]], client_ip: str) -> Answer:
        """Answer one request as ingress-nginx would (see the module docstring).

        A ``Host`` that is not ``name[:port]`` (``sessions.connect_path.host_of_authority``) is a 400, as nginx's
        ``ngx_http_validate_host`` answers: routing reads its name, the verify its whole value, and the two must agree.
        """
        hostname = host_of_authority(host_header) if host_header else ""
        if hostname is None:
            return _error(400)
        cluster = self.clusters.get(hostname)
        if cluster is None:
            return _default_backend()
        if cluster.gateway.serves(hostname):
            def backend(route: gateway_routing.GatewayRoute, path: str, upstream: dict[str, str]) -> gateway_routing.Reply:
                if route.upstream is not None:  # an Envoy Gateway Backend: the fallback route's control plane
                    answer = _proxy(*route.upstream, method=method, host=host_header, request_uri=request_uri,
                                    headers=headers, unavailable=_no_healthy_upstream)
                else:
                    answer = _page(cluster, route.namespace, route.service, path, upstream, unavailable=_no_healthy_upstream)
                return answer.status, answer.headers, answer.body

            status, answer_headers, body = gateway_routing.handle(
                cluster.gateway, method=method, authority=host_header, hostname=hostname, request_target=request_uri,
                headers=headers, client_ip=client_ip, backend=backend)
            return Answer(status, answer_headers, body, server="envoy")
        uri = nginx_uri(request_uri)
        if uri is None:
            return _error(400)
        location = cluster.route(hostname, uri)
        if location is None:
            return _default_backend()
        auth_url = location.annotations.get(AUTH_URL)
        always_cookie = location.annotations.get(AUTH_ALWAYS_SET_COOKIE, "").lower() == "true"
        cookie, upstream_headers = None, []
        if auth_url:
            verdict = _auth_subrequest(auth_url, method=method, host=host_header, request_uri=request_uri,
                                       headers=headers, client_ip=client_ip)
            cookie = verdict.header("Set-Cookie")
            if not 200 <= verdict.status < 300:
                answer = _error(verdict.status if verdict.status in (401, 403) else 500)
                if verdict.status == 401 and verdict.header("WWW-Authenticate"):
                    answer.headers.append(("WWW-Authenticate", verdict.header("WWW-Authenticate")))
                if cookie and always_cookie:
                    answer.headers.append(("Set-Cookie", cookie))
                return answer
            wanted = [h.strip() for h in location.annotations.get(AUTH_RESPONSE_HEADERS, "").split(",") if h.strip()]
            upstream_headers = [(name, verdict.header(name)) for name in wanted if verdict.header(name)]
        external = _external_name(cluster, location)
        if external is not None:  # the fallback route's ExternalName Service: the control plane
            answer = _proxy(*external, method=method, host=host_header, request_uri=request_uri, headers=headers,
                            unavailable=lambda: _error(502))
        else:
            answer = _backend(cluster, location, uri, dict((k.lower(), v) for k, v in upstream_headers))
        if cookie and (always_cookie or answer.status in _ADD_HEADER_STATUSES):
            answer.headers.append(("Set-Cookie", cookie))
        return answer


@dataclass
class _Verdict:
    status: int
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str:
        """The first value of header ``name`` ("" when absent), as nginx's ``$upstream_http_<name>``."""
        return next((value for key, value in self.headers if key.lower() == name.lower()), "")


def _auth_subrequest(auth_url: str, *, method: str, host: str, request_uri: str, headers: list[tuple[str, str]],
                     client_ip: str) -> _Verdict:
    """GET ``auth_url`` with the client's headers and ingress-nginx's (no body); status 502 when it cannot be reached.

    ``host`` is the client's ``Host`` once validated as ``name[:port]`` (``DemoIngress.handle``), never a raw one.
    """
    parts = urlsplit(auth_url)
    sent = [(name, value) for name, value in headers if name.lower() not in _NOT_TO_AUTH]
    request_id = next((v for k, v in headers if k.lower() == "x-request-id"), "") or uuid.uuid4().hex
    sent += [
        ("Host", parts.hostname or ""),  # ingress-nginx: the auth URL's host name, without the port
        ("X-Request-ID", request_id),
        ("X-Original-URL", f"http://{host}{request_uri}"),  # $scheme://$http_host$request_uri; no TLS here
        ("X-Original-Method", method),
        ("X-Sent-From", "nginx-ingress-controller"),
        ("X-Real-IP", client_ip),
        ("X-Forwarded-For", client_ip),
        ("X-Auth-Request-Redirect", request_uri),
        ("Connection", "close"),
    ]
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=AUTH_CONNECT_TIMEOUT)
    try:
        connection.connect()
        connection.sock.settimeout(AUTH_READ_TIMEOUT)
        connection.putrequest("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                              skip_host=True, skip_accept_encoding=True)
        for name, value in sent:
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        response.read()
        return _Verdict(response.status, response.getheaders())
    except (OSError, http.client.HTTPException) as exc:
        logger.warning("auth subrequest to %s failed: %s", auth_url, type(exc).__name__)
        return _Verdict(502, [])
    finally:
        connection.close()


def _external_name(cluster: ClusterIngress, location: Location) -> tuple[str, int] | None:
    """``(externalName, port)`` when the location's Service is of type ``ExternalName`` (ingress-nginx proxies to that
    name), else None."""
    try:
        service = cluster.api.get(f"/api/v1/namespaces/{location.namespace}/services/{location.service}") or {}
    except (requests.RequestException, ValueError):
        return None
    spec = service.get("spec") or {}
    ports = spec.get("ports") or []
    if spec.get("type") != "ExternalName" or not spec.get("externalName") or not ports:
        return None
    return str(spec["externalName"]), int(ports[0].get("port") or 80)


_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                         "content-length", "host"})


def _proxy(target: str, port: int, *, method: str, host: str, request_uri: str, headers: list[tuple[str, str]],
           unavailable: Callable[[], Answer]) -> Answer:
    """Pass the request on to ``target:port`` over HTTP as both proxies do by default: the same method and request
    target, the client's ``Host`` kept, hop-by-hop headers dropped, no body (the stand-in reads none); its answer back,
    or ``unavailable()`` when it cannot be reached."""
    connection = http.client.HTTPConnection(target, port, timeout=AUTH_READ_TIMEOUT)
    try:
        connection.putrequest(method, request_uri, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", host)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                connection.putheader(name, value)
        connection.putheader("Content-Length", "0")
        connection.endheaders()
        response = connection.getresponse()
        body = response.read()
        kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP | {"server", "date"}]
        return Answer(response.status, kept, body)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        logger.warning("proxying to %s:%s failed: %s", target, port, type(exc).__name__)
        return unavailable()
    finally:
        connection.close()


def _backend(cluster: ClusterIngress, location: Location, uri: str, upstream: dict[str, str]) -> Answer:
    """The session pod's answer (its stand-in page), or ingress-nginx's 503 without a Running pod behind the Service."""
    return _page(cluster, location.namespace, location.service, uri, upstream, unavailable=lambda: _error(503))


def _no_healthy_upstream() -> Answer:
    """Envoy's answer when a route's backend has no ready endpoint."""
    return Answer(503, [("Content-Type", "text/plain")], b"no healthy upstream")


def _page(cluster: ClusterIngress, namespace: str, service: str, uri: str, upstream: dict[str, str], *,
          unavailable: Callable[[], Answer]) -> Answer:
    """The stand-in page of the Running pod behind ``namespace/service``, else ``unavailable()``."""
    try:
        facts = session_page.pod_facts(cluster.api.get, namespace, service)
    except (requests.RequestException, ValueError, KeyError) as exc:
        logger.warning("cluster %s: reading the pod behind %s/%s failed: %s", cluster.name, namespace, service,
                       type(exc).__name__)
        facts = None
    if facts is None:
        return unavailable()
    body = session_page.render(facts, path=uri, user=upstream.get("x-auth-request-user", "")).encode()
    return Answer(200, [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")], body)


class _Handler(BaseHTTPRequestHandler):
    controller: DemoIngress
    protocol_version = "HTTP/1.1"
    server_version = "nginx"
    sys_version = ""

    def _serve(self) -> None:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True  # a chunked body is not read: do not reuse the connection
        elif length is not None and not _DIGITS.fullmatch(length):
            self.close_connection = True
            return self._answer(_error(400))  # nginx: "client sent invalid Content-Length header"
        elif length:
            remaining = int(length)
            if remaining > MAX_BODY_BYTES:
                self.close_connection = True  # the body is not read: the connection cannot be reused
                return self._answer(_error(413))
            # A silent client raises TimeoutError after ``timeout`` seconds; http.server then closes the connection.
            while remaining > 0:  # the stand-in page does not read the body
                chunk = self.rfile.read(min(remaining, 65536))
                if not chunk:
                    break
                remaining -= len(chunk)
        try:
            if len(self.headers.get_all("Host") or []) > 1:
                answer = _error(400)  # nginx: "client sent duplicate host header"
            else:
                answer = self.controller.handle(self.command, self.headers.get("Host", ""), self.path,
                                                list(self.headers.items()), self.client_address[0])
        except Exception:  # a bug here must be a 500, as nginx would answer, never a dropped connection
            logger.exception("demo ingress failed on %s", self.path.split("?", 1)[0])
            answer = _error(500)
        self._answer(answer)

    def _answer(self, answer: Answer) -> None:
        self.log_request(answer.status)
        self.send_response_only(answer.status, _REASONS.get(answer.status))
        self.send_header("Server", answer.server)
        self.send_header("Date", self.date_time_string())
        for name, value in answer.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer.body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _serve  # noqa: N815 -- http.server's names

    def log_request(self, code="-", size="-") -> None:
        # Never the query string, nor the raw Host (a hostile one carries a path and a token): only its valid host name.
        path = self.path.split("?", 1)[0]
        headers = getattr(self, "headers", None)  # absent when the request line itself was refused
        hostname = host_of_authority(headers.get("Host", "")) if headers is not None else None
        logger.info('%s "%s" "%s %s" %s', self.client_address[0], hostname or "-", self.command, path, code)

    def log_message(self, format, *args) -> None:  # noqa: A002 -- http.server's signature
        logger.info("%s %s", self.client_address[0], (format % args).split("?", 1)[0])


def clusters_from_config(config: dict[str, Any]) -> list[ClusterIngress]:
    """``{"clusters": [{"name", "session_domain", "kubeconfig"}]}`` -> one ``ClusterIngress`` each.

    Raises:
        ValueError: a cluster without a session domain, or two with the same one.
    """
    clusters = [ClusterIngress(c["name"], c["session_domain"].lower(), ClusterApi.from_kubeconfig(c["kubeconfig"]))
                for c in config["clusters"]]
    domains = [c.session_domain for c in clusters]
    if not all(domains) or len(set(domains)) != len(domains):
        raise ValueError(f"every cluster needs its own session domain, got {domains}")
    return clusters


def main(argv: list[str] | None = None) -> int:
    """Serve the demo ingress until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m demo.ingress_nginx", description=main.__doc__)
    parser.add_argument("--config", required=True, help='JSON file: {"clusters": [{"name", "session_domain", "kubeconfig"}]}')
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0: a free one, see --ready-file)")
    parser.add_argument("--ready-file", help='write {"url", "port", "pid"} here once serving')
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    ingress = DemoIngress(clusters_from_config(json.loads(Path(args.config).read_text())), port=args.port).start()
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    if args.ready_file:
        ready = Path(args.ready_file)
        tmp = ready.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": ingress.url, "port": ingress.port, "pid": os.getpid()}))
        tmp.replace(ready)
    logger.info("serving %s on %s", ", ".join(sorted(ingress.clusters)), ingress.url)
    while not stopped.wait(0.5):
        pass
    ingress.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
