"""The buffering proxy (nginx) in front of gunicorn, so that slow clients cannot take the web server down.

gunicorn's sync and gthread workers give a connection a whole worker (or thread) from its first byte to its last:
16 connections sending their headers one byte at a time held every worker of the chart's api, and ``GET /api/v1/me``,
the connect verify and Envoy's ext_authz check timed out for the whole attack. gunicorn has no header or body
timeout. nginx, event-driven, holds thousands of such connections for a few hundred bytes each, cuts a client off
when its headers take longer than ``client_header_timeout`` or its body stalls for ``client_body_timeout``, reads the
whole request before it opens a connection to gunicorn and the whole answer before it trickles it out, so a gunicorn
worker is only ever busy with a complete request. The application keeps its sync workers, so psycopg 3's persistent
connections (``DATABASE_CONN_MAX_AGE``), prometheus-client's multiprocess files and the raw request target Envoy's
check is judged on (``RAW_URI``: ``proxy_pass`` without a URI passes the target as received) are unchanged
(docs/performance.md, "Slow clients").

:func:`render_nginx_conf` writes the configuration the demo and the tests run; the Helm chart renders the same text
from its values (``charts/gshare/templates/configmap-proxy.yaml``; ``tests/charts/test_front_proxy_chart.py`` holds
the two equal). The module imports neither Django nor the project.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Errors nginx answers itself (gunicorn never saw the request), as the API's ``{"code", "detail"}`` JSON.
PROXY_ERRORS = (
    (400, "invalid_request", "The request is malformed (an absolute-form target, a path above the root, a bad header); "
                             "send a well-formed HTTP request."),
    (413, "request_too_large", "The request body is larger than the server accepts (GSHARE_MAX_BODY_BYTES); send less."),
    (414, "request_line_too_long", "The request line is longer than the server accepts; shorten the URL."),
    (494, "request_header_too_large", "A request header is larger than the server accepts; send shorter headers."),
    (502, "server_unavailable", "The web server is starting or restarting; retry in a few seconds."),
    (504, "server_timeout", "The web server took too long to answer; retry, or ask an operator to check its load."),
)


@dataclass(frozen=True)
class ProxySettings:
    """What the nginx in front of gunicorn is told.

    Attributes:
        listen: the address nginx listens on (``0.0.0.0:8000`` in the chart, ``127.0.0.1:<port>`` in the demo).
        upstream: gunicorn's address (``127.0.0.1:8001``); nothing else reaches it.
        prefix: a writable directory for the pid file and the request/answer buffers on disk.
        client_header_timeout: seconds a client has to send its request line and headers, in all.
        client_body_timeout: seconds a request body may stall between two reads.
        send_timeout: seconds an answer may stall between two writes to a client that does not read.
        keepalive_timeout: seconds an idle kept-alive connection stays open.
        upstream_timeout: seconds nginx waits for gunicorn's answer (longer than gunicorn's ``--timeout``).
        max_body_bytes: the largest request body accepted (``GSHARE_MAX_BODY_BYTES``, Django's own limit).
        worker_connections: connections per nginx worker (clients and gunicorn alike).
        worker_processes: nginx worker processes.
        user: the ``user`` directive, only when nginx starts as root (the demo or tests on a root shell: its workers
            would otherwise run as ``nobody`` and could not write to ``prefix``); the chart runs it unprivileged.
    """

    listen: str
    upstream: str
    prefix: str
    client_header_timeout: int = 10
    client_body_timeout: int = 30
    send_timeout: int = 30
    keepalive_timeout: int = 15
    upstream_timeout: int = 65
    max_body_bytes: int = 32 * 1024 * 1024
    worker_connections: int = 4096
    worker_processes: int = 1
    user: str | None = None


def render_nginx_conf(proxy: ProxySettings) -> str:
    """nginx.conf for :class:`ProxySettings`: run it as ``nginx -e stderr -p <prefix> -c <file>``.

    Args:
        proxy: where to listen, where gunicorn is, the timeouts and limits.

    Returns:
        The configuration text: no nginx access log and only critical error lines (gunicorn's log, redacted by
        ``gshare.access_log``, is the one: nginx's lines quote the request line, a connect link's query included),
        the ``Host`` passed as sent, requests and answers buffered, nginx's own refusals as JSON errors.
    """
    p = proxy
    error_pages = "".join(
        f"""
        error_page {status} = /_gshare_proxy/{code};
        location = /_gshare_proxy/{code} {{
            internal;
            default_type application/json;
            return {431 if status == 494 else status} '{{"code": "{code}", "detail": "{detail}"}}';
        }}"""
        for status, code, detail in PROXY_ERRORS
    )
    return f"""# nginx in front of gunicorn: buffers requests and answers, cuts off slow clients (gshare/front_proxy.py).
daemon off;{f"{chr(10)}user {p.user};" if p.user else ""}
worker_processes {p.worker_processes};
pid {p.prefix}/nginx.pid;
# crit: nginx's error and info lines quote the request line, query (connect tokens) included.
error_log stderr crit;

events {{
    worker_connections {p.worker_connections};
}}

http {{
    client_body_temp_path {p.prefix}/client-body;
    proxy_temp_path {p.prefix}/proxy-temp;
    fastcgi_temp_path {p.prefix}/fastcgi-temp;
    uwsgi_temp_path {p.prefix}/uwsgi-temp;
    scgi_temp_path {p.prefix}/scgi-temp;
    access_log off;
    server_tokens off;

    client_header_timeout {p.client_header_timeout}s;
    client_body_timeout {p.client_body_timeout}s;
    send_timeout {p.send_timeout}s;
    keepalive_timeout {p.keepalive_timeout}s;
    reset_timedout_connection on;
    client_max_body_size {p.max_body_bytes};

    server {{
        listen {p.listen} backlog=4096;

        location / {{
            # An absolute-form target (GET http://host/...) would reach gunicorn in origin form, judged on the Host
            # header instead of refused: Envoy's checks and browsers never send one to the api.
            if ($request ~ "^[^ ]+ [A-Za-z][A-Za-z0-9+.-]*://") {{
                return 400;
            }}
            proxy_pass http://{p.upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_request_buffering on;
            proxy_buffering on;
            proxy_connect_timeout 5s;
            proxy_send_timeout {p.upstream_timeout}s;
            proxy_read_timeout {p.upstream_timeout}s;
            proxy_redirect off;
        }}
{error_pages}
    }}
}}
"""


def main(argv: list[str] | None = None) -> None:
    """``python -m gshare.front_proxy --listen 0.0.0.0:8000 --upstream 127.0.0.1:8001 --prefix /tmp``: print nginx.conf."""
    import argparse

    parser = argparse.ArgumentParser(description="Print the nginx.conf that serves gunicorn behind nginx (docs/install.md, Slow clients).")
    parser.add_argument("--listen", default="0.0.0.0:8000")
    parser.add_argument("--upstream", default="127.0.0.1:8001", help="gunicorn's --bind")
    parser.add_argument("--prefix", default="/tmp", help="a writable directory for nginx's pid file and buffers")
    args = parser.parse_args(argv)
    print(render_nginx_conf(ProxySettings(listen=args.listen, upstream=args.upstream, prefix=args.prefix)), end="")


if __name__ == "__main__":
    main()
