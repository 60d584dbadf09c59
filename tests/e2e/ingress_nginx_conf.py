"""nginx.conf for rendered Ingress objects, written the way ingress-nginx writes it (the parts gShare's charts use).

The sources (kubernetes/ingress-nginx):

* ``internal/ingress/controller/controller.go``: one ``server`` per host of an IngressClass, whatever the number of
  Ingresses naming it. ``createServers`` gives each server a root location ``/`` to the default backend carrying the
  annotations of the first Ingress of that host; ``getBackendServers`` adds a location per Ingress path, replaces
  that root location when an Ingress has ``/`` itself, and keeps the first Ingress's location when two name the
  same path. ``locationApplyAnnotations`` copies the Ingress's annotations onto each of ITS locations only, so on
  a host two Ingresses share, every location carries its own Ingress's source range and upstream vhost.
* ``internal/ingress/controller/location.go`` (``updateServerLocations``): a Prefix path ``/p`` becomes
  ``location /p/`` plus ``location = /p``.
* ``rootfs/etc/nginx/template/nginx.tmpl``, in each location: ``allow <cidr>; ... deny all;`` for
  ``whitelist-source-range``, ``client_max_body_size`` for ``proxy-body-size``, and
  ``proxy_set_header Host "<upstream-vhost>"`` when the location has ``upstream-vhost``, else
  ``proxy_set_header Host $best_http_host``; ``X-Forwarded-Host`` is ``$best_http_host`` in both cases.
* ``rootfs/etc/nginx/lua/lua_ingress.lua`` (``rewrite``): ``$best_http_host`` is ``$http_host`` (the client's
  ``Host`` header, whatever host the request line names), or ``$host`` without one; with the ConfigMap's
  ``use-forwarded-headers: true``, the first entry of the client's ``X-Forwarded-Host`` when it sent one. Plain
  nginx has no Lua: the same values come from ``map`` blocks here.

nginx picks the server from the request line's host when the request line is absolute
(``GET http://host/path``) and from ``Host`` otherwise, so the host nginx routes on and ``$http_host`` differ
when a client sends both. Left out: TLS, the Lua balancer (``proxy_pass`` names the backend directly), the
controller's metrics, snippets. An ``nginx.ingress.kubernetes.io/`` annotation this module does not render
fails the test, so a chart change is rendered here or refused, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.nginx import Nginx, conf_head, run_nginx

NGINX_ANNOTATION = "nginx.ingress.kubernetes.io/"
SOURCE_RANGE = NGINX_ANNOTATION + "whitelist-source-range"
BODY_SIZE = NGINX_ANNOTATION + "proxy-body-size"
UPSTREAM_VHOST = NGINX_ANNOTATION + "upstream-vhost"
RENDERED_ANNOTATIONS = {SOURCE_RANGE, BODY_SIZE, UPSTREAM_VHOST}
#: The server of a rule without ``host``: ingress-nginx puts its paths in the catch-all server (``server_name _``, the
#: ``default_server``), beside the default backend's ``/`` (``controller.go``, ``defServerName``).
CATCH_ALL = "_"


@dataclass
class Location:
    """One ingress-nginx location: a path of one Ingress (or a host's default-backend root) and that Ingress's annotations."""

    path: str
    path_type: str
    annotations: dict[str, str]
    ingress: str
    default_backend: bool = False


@dataclass
class Server:
    """One ``server`` block: every location of one host."""

    host: str
    locations: list[Location] = field(default_factory=list)


def _annotations(ingress: dict[str, Any]) -> dict[str, str]:
    annotations = dict(ingress["metadata"].get("annotations") or {})
    unknown = sorted(a for a in annotations if a.startswith(NGINX_ANNOTATION) and a not in RENDERED_ANNOTATIONS)
    if unknown:
        raise AssertionError(f"Ingress {ingress['metadata']['name']} has {unknown}: render them in tests/e2e/ingress_nginx_conf.py")
    return annotations


def servers_of(ingresses: list[dict[str, Any]], ingress_class: str = "nginx") -> list[Server]:
    """The servers ingress-nginx of class ``ingress_class`` builds from ``ingresses`` (in creation order)."""
    servers: dict[str, Server] = {}
    mine = [i for i in ingresses if i["kind"] == "Ingress" and i["spec"].get("ingressClassName") == ingress_class]
    for ingress in mine:  # createServers: a root location to the default backend, annotated by the host's first Ingress
        for rule in ingress["spec"]["rules"]:
            host = rule.get("host") or CATCH_ALL
            if host not in servers:
                root = Location("/", "Prefix", {}, "-", default_backend=True) if host == CATCH_ALL else \
                    Location("/", "Prefix", _annotations(ingress), ingress["metadata"]["name"], default_backend=True)
                servers[host] = Server(host, [root])
    for ingress in mine:  # getBackendServers: each path of each Ingress, with its own Ingress's annotations
        for rule in ingress["spec"]["rules"]:
            server = servers[rule.get("host") or CATCH_ALL]
            for path in rule["http"]["paths"]:
                same = next((loc for loc in server.locations if (loc.path, loc.path_type) == (path["path"], path["pathType"])), None)
                location = Location(path["path"], path["pathType"], _annotations(ingress), ingress["metadata"]["name"])
                if same is None:
                    server.locations.append(location)
                elif same.default_backend:
                    server.locations[server.locations.index(same)] = location
    return list(servers.values())


def _nginx_locations(location: Location) -> list[str]:
    """``updateServerLocations``: ``/`` stays; a Prefix ``/p`` is ``/p/`` and ``= /p``; Exact ``/p`` is ``= /p``."""
    if location.path == "/":
        return ["/"]
    if location.path_type == "Exact":
        return [f"= {location.path}"]
    return [location.path.rstrip("/") + "/", f"= {location.path.rstrip('/')}"]


def _location_body(location: Location, api: str) -> str:
    lines = []
    source_range = location.annotations.get(SOURCE_RANGE, "")
    if source_range:
        lines += [f"allow {cidr.strip()};" for cidr in source_range.split(",") if cidr.strip()] + ["deny all;"]
    if location.default_backend:
        return "".join(f"\n            {line}" for line in [*lines, "return 404;  # the default backend"]) + "\n"
    if BODY_SIZE in location.annotations:
        lines.append(f"client_max_body_size {location.annotations[BODY_SIZE]};")
    vhost = location.annotations.get(UPSTREAM_VHOST)
    lines += [
        f'proxy_set_header Host "{vhost}";' if vhost else "proxy_set_header Host $best_http_host;",
        "proxy_set_header X-Request-ID $req_id;",
        "proxy_set_header X-Real-IP $remote_addr;",
        "proxy_set_header X-Forwarded-For $remote_addr;",
        "proxy_set_header X-Forwarded-Host $best_http_host;",
        "proxy_set_header X-Forwarded-Port 443;",
        "proxy_set_header X-Forwarded-Proto https;",
        "proxy_set_header X-Scheme https;",
        'proxy_set_header Proxy "";',
        "proxy_http_version 1.1;",
        f"proxy_pass {api};",
    ]
    return "".join(f"\n            {line}" for line in lines) + "\n"


def render_conf(ingresses: list[dict[str, Any]], *, prefix: Path, port: int, api: str, use_forwarded_headers: bool = False) -> str:
    """nginx.conf serving ``ingresses`` on ``127.0.0.1:port`` to ``api`` (``http://127.0.0.1:<port>``), plus ingress-nginx's
    catch-all server (404). ``use_forwarded_headers`` is the ingress-nginx ConfigMap key of that name."""
    if use_forwarded_headers:  # lua_ingress.rewrite: the first entry of X-Forwarded-Host when the client sent one
        best_http_host = """
    map $http_x_forwarded_host $best_http_host {
        ""                 $http_host_or_host;
        "~^(?<first_forwarded_host>[^,]*)"  $first_forwarded_host;
        default            $http_host_or_host;
    }"""
    else:
        best_http_host = """
    map "" $best_http_host {
        default            $http_host_or_host;
    }"""
    blocks = ""
    servers = servers_of(ingresses)
    if not any(server.host == CATCH_ALL for server in servers):
        servers.append(Server(CATCH_ALL, [Location("/", "Prefix", {}, "-", default_backend=True)]))
    for server in servers:
        body = "".join(
            f"\n        location {where} {{  # Ingress {location.ingress}{_location_body(location, api)}        }}\n"
            for location in server.locations
            for where in _nginx_locations(location)
        )
        listen = f"127.0.0.1:{port} default_server" if server.host == CATCH_ALL else f"127.0.0.1:{port}"
        blocks += f"\n    server {{\n        listen {listen};\n        server_name {server.host};\n{body}    }}\n"
    return f"""# Rendered by tests/e2e/ingress_nginx_conf.py after ingress-nginx's nginx.tmpl (use-forwarded-headers: {str(use_forwarded_headers).lower()}).
{conf_head(prefix)}
    types {{ }}
    default_type text/html;
    log_format upstreaminfo '$remote_addr "$host" "$http_host" "$http_x_forwarded_host" "$request" $status upstream=$upstream_status';
    access_log {prefix}/access.log upstreaminfo;
    server_tokens off;

    map $http_x_request_id $req_id {{
        default   $http_x_request_id;
        ""        $request_id;
    }}

    map $http_host $http_host_or_host {{
        default   $http_host;
        ""        $host;
    }}
{best_http_host}
{blocks}}}
"""


def start(prefix: Path, render: Callable[[Path, int], str]) -> Nginx:
    """Run nginx with ``render(prefix, port)`` as its configuration (``tests.e2e.nginx.run_nginx``)."""
    return run_nginx(prefix, render)
