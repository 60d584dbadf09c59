"""The demo ingress (``demo.ingress_nginx``): a session's connect link opened through it as through ingress-nginx.

Path of every request: test client -> the demo ingress on loopback (host and path routing from the emulated
cluster's Ingress objects, made by a real operator process) -> ``auth-url`` subrequest to the live server's
``/internal/connect/verify`` -> on 2xx, the session pod's stand-in page. The ingress polls nothing here
(``poll_seconds`` of an hour): each test lists the Ingresses when it means to, so what the ingress holds is
never a race.

Requests are sent byte for byte with ``http.client`` (``requests`` would resolve ``..`` itself), to
``127.0.0.1:<port>`` with ``Host: lab-c1.gshare.localhost:<port>``, as a browser resolving ``*.localhost``
sends them; the connect cookie is ``Secure``, so it is sent back by hand.

The ingress validates the ``Host`` as nginx's ``ngx_http_validate_host`` does: a Host that is not ``name[:port]``
(one carrying a path could make the verify judge one session while the ingress serves another) is a 400, and only
the validated host name is logged.
"""

from __future__ import annotations

import http.client
import json
import logging
import subprocess
import sys
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

import pytest

from clusters import services as cluster_services
from demo.ingress_nginx import ClusterApi, ClusterIngress, DemoIngress
from sessions import connect
from tests.helpers import kubeconfig_text, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

DOMAIN = "lab-c1.gshare.localhost"


def raw_get(ingress: DemoIngress, host: str, request_uri: str, headers: dict[str, str] | None = None):
    """GET ``request_uri`` exactly as written; returns ``(status, headers as a list, body text)``."""
    conn = http.client.HTTPConnection("127.0.0.1", ingress.port, timeout=30)
    try:
        conn.putrequest("GET", request_uri, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.getheaders(), response.read().decode()
    finally:
        conn.close()


def cookies_of(headers) -> list[str]:
    return [value for name, value in headers if name.lower() == "set-cookie"]


@pytest.fixture
def demo_stack(http, fleet_cluster, operator_process, tmp_path, settings, live_server):
    """Cluster ``lab-c1`` on ``lab-c1.gshare.localhost``, its operator, the demo ingress, and two Running sessions.

    Returns ``{"ingress", "cluster", "host" (Host header with port), "sessions": [two API bodies]}``.
    """
    settings.GSHARE_CONTROL_PLANE_URL = live_server.url
    settings.GSHARE_SESSION_SCHEME = "http"
    connect.clear_local_caches()
    emulated = fleet_cluster("lab-c1", pod_startup_seconds=0.2)
    cluster = cluster_services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated), session_domain=DOMAIN)
    kubeconfig_path = tmp_path / "kubeconfig.yaml"
    kubeconfig_path.write_text(kubeconfig_text(emulated))
    token_path = tmp_path / "internal-jwt"
    from clusters.operator_token.tokens import operator_token_mint

    token_path.write_text(operator_token_mint(cluster_id=cluster.public_id))
    cluster_ingress = ClusterIngress("lab-c1", DOMAIN, ClusterApi.from_kubeconfig(kubeconfig_path))
    ingress = DemoIngress([cluster_ingress], poll_seconds=3600).start()
    settings.GSHARE_SESSION_PORT = ingress.port
    try:
        operator_process(cluster, kubeconfig_path, token_path)
        wait_for(lambda: http.get(f"/api/v1/gpus?cluster={cluster.public_id}").json()["count"] > 0, what="inventory")
        sessions = []
        for name in ("one", "two"):
            created = http.post("/api/v1/sessions", json={"name": name, "image": "quay.io/jupyter/base-notebook", "gpus": 1,
                                                          "gpu_memory_mib": 2048, "gpu_cores": 20})
            assert created.status_code == 201, created.text
            sessions.append(created.json())
        for body in sessions:
            body.update(wait_for(lambda body=body: (b := http.get(f"/api/v1/sessions/{body['id']}").json())["phase"] == "Running" and b,
                                 what="Running"))

        def routed():
            cluster_ingress.refresh()
            return all(s["id"] in "".join(loc.path for loc in cluster_ingress.locations.get(DOMAIN, [])) for s in sessions)

        wait_for(routed, what="both session Ingresses listed")
        yield {"ingress": ingress, "cluster": cluster_ingress, "host": f"{DOMAIN}:{ingress.port}", "sessions": sessions}
    finally:
        ingress.stop()


def link_of(http, session: dict) -> str:
    response = http.post(f"/api/v1/sessions/{session['id']}/connect")
    assert response.status_code == 200, response.text
    return response.json()["url"]


def test_a_link_opens_the_stand_in_page_and_the_cookie_alone_works_next(http, demo_stack):
    ingress, host, (session, _) = demo_stack["ingress"], demo_stack["host"], demo_stack["sessions"]
    url = link_of(http, session)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("http", host, f"/s/{session['id']}/")  # the demo's URL: http, port

    status, headers, body = raw_get(ingress, host, f"{parts.path}?{parts.query}", {"X-Auth-Request-User": "mallory"})
    assert status == 200, body
    assert f'<span id="session-id">{session["id"]}</span>' in body
    assert f'<td id="node">{session["node"]}</td>' in body
    assert '<td id="user">admin</td>' in body  # from the verify answer (auth-response-headers), not the client's header
    for device in session["devices"]:
        assert device in body
    (set_cookie,) = cookies_of(headers)  # auth-always-set-cookie: the verify's Set-Cookie reaches the browser
    jar = SimpleCookie()
    jar.load(set_cookie)
    morsel = jar[connect.COOKIE_NAME]
    assert morsel["path"] == f"/s/{session['id']}/" and morsel["httponly"] and morsel["samesite"] == "Lax"
    cookie = f"{connect.COOKIE_NAME}={morsel.value}"

    status, headers, body = raw_get(ingress, host, f"/s/{session['id']}/lab/tree?x=1", {"Cookie": cookie})
    assert status == 200 and f"/s/{session['id']}/lab/tree" in body
    assert cookies_of(headers) == []  # only the link's visit sets it
    status, _, _ = raw_get(ingress, host, f"/s/{session['id']}/lab")
    assert status == 401  # neither token nor cookie


def test_path_tricks_unknown_hosts_and_unknown_paths_are_refused_as_nginx_would(http, demo_stack):
    ingress, host, (mine, other) = demo_stack["ingress"], demo_stack["host"], demo_stack["sessions"]
    query = urlsplit(link_of(http, mine)).query
    for trick in (f"/s/{mine['id']}/../{other['id']}/", f"/s/{mine['id']}/%2e%2e/%2E%2E/s/{other['id']}/",
                  f"/s/{mine['id']}/..%2f..%2fs/{other['id']}/"):
        status, _, body = raw_get(ingress, host, f"{trick}?{query}")
        assert status == 401, (trick, body)  # routed to the other session's location, and the verify refuses the path
        assert other["id"] not in body
    status, _, _ = raw_get(ingress, host, f"/s/../../etc?{query}")
    assert status == 400  # above the root: nginx refuses the URI itself

    status, _, body = raw_get(ingress, f"unknown.gshare.localhost:{ingress.port}", f"/s/{mine['id']}/?{query}")
    assert (status, body) == (404, "default backend - 404")
    status, _, body = raw_get(ingress, host, "/not-a-session/")
    assert (status, body) == (404, "default backend - 404")


def test_a_stopped_session_is_refused_then_unrouted(http, demo_stack):
    ingress, host, cluster, (session, _) = demo_stack["ingress"], demo_stack["host"], demo_stack["cluster"], demo_stack["sessions"]
    parts = urlsplit(link_of(http, session))
    status, headers, _ = raw_get(ingress, host, f"{parts.path}?{parts.query}")
    assert status == 200
    jar = SimpleCookie()
    jar.load(cookies_of(headers)[0])
    cookie = f"{connect.COOKIE_NAME}={jar[connect.COOKIE_NAME].value}"

    assert http.delete(f"/api/v1/sessions/{session['id']}").status_code == 202
    # The ingress still holds the session's Ingress (no list since): the verify refuses the link and the cookie, once
    # its per-process facts (connect.FACTS_CACHE_SECONDS) have expired.
    wait_for(lambda: raw_get(ingress, host, f"{parts.path}?{parts.query}")[0] == 401, timeout=10, what="the link refused")
    for headers in ({}, {"Cookie": cookie}):
        status, _, body = raw_get(ingress, host, f"{parts.path}?{parts.query}", headers)
        assert status == 401, body
        assert "401 Authorization Required" in body
    wait_for(lambda: (cluster.refresh() or True) and cluster.route(DOMAIN, parts.path).ingress == "gshare-session-ended",
             what="the session's Ingress gone (owner cascade), the fallback's left")
    # The operator's fallback route for /s/ (an Ingress to an ExternalName Service, the control plane): gShare's page,
    # not the default backend; the same for an id that never existed.
    status, _, body = raw_get(ingress, host, f"{parts.path}?{parts.query}")
    assert status == 404 and "This session has ended or does not exist" in body, body
    assert "default backend" not in body and parts.query not in body
    unknown = "ses_" + "b" * 16
    status, _, other = raw_get(ingress, host, f"/s/{unknown}/lab")
    assert status == 404 and other.replace(unknown, "ID") == body.replace(session["id"], "ID")


def test_the_command_line_serves_the_clusters_of_its_config(tmp_path, fleet_cluster):
    emulated = fleet_cluster("lab-c2")
    kubeconfig_path = tmp_path / "kubeconfig.yaml"
    kubeconfig_path.write_text(kubeconfig_text(emulated))
    config = tmp_path / "ingress.json"
    config.write_text(json.dumps({"clusters": [{"name": "lab-c2", "session_domain": "lab-c2.gshare.localhost",
                                                "kubeconfig": str(kubeconfig_path)}]}))
    ready = tmp_path / "ready.json"
    process = subprocess.Popen([sys.executable, "-m", "demo.ingress_nginx", "--config", str(config), "--port", "0", "--ready-file", str(ready)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(ready.exists, timeout=20, what="ready file")
        port = json.loads(ready.read_text())["port"]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/s/ses_abc/", headers={"Host": f"lab-c2.gshare.localhost:{port}"})
        response = conn.getresponse()
        assert (response.status, response.read()) == (404, b"default backend - 404")  # no session Ingress on the cluster
        conn.close()
    finally:
        process.terminate()
        assert process.wait(10) == 0  # SIGTERM is a clean stop


@pytest.mark.django_db(transaction=True)
@pytest.mark.e2e
def test_host_header_with_a_path_does_not_open_another_session(http, demo_stack, caplog):
    ingress, host, (mine, other) = demo_stack["ingress"], demo_stack["host"], demo_stack["sessions"]
    query = urlsplit(link_of(http, mine)).query
    token = query.split("token=", 1)[1]
    caplog.set_level(logging.INFO, logger="demo.ingress_nginx")
    smuggled_host = f"{host}/s/{mine['id']}/?{query}&"
    status, _, body = raw_get(ingress, smuggled_host, f"/s/{other['id']}/")
    assert status == 400 and other["id"] not in body, (status, body[:300])
    for hostile in (f"{host}?{query}", f"{host}#x", f"x@{host}", f"{host}\\s", f"{host}:x", f"{host.split(':')[0]}..x"):
        status, _, body = raw_get(ingress, hostile, f"/s/{mine['id']}/?{query}")
        assert status == 400 and mine["id"] not in body, hostile
    status, _, body = raw_get(ingress, host, f"/s/{other['id']}/", {"Host": host})  # two Host headers
    assert status == 400, body[:300]
    # the raw Host (its path and token) is never logged: only a valid host name, else "-"
    assert token not in caplog.text and "/s/ses_" not in "".join(r.getMessage().split('"GET', 1)[0] for r in caplog.records)
    # the link itself still opens its own session, with a plain Host
    status, _, body = raw_get(ingress, host, f"/s/{mine['id']}/?{query}")
    assert status == 200 and mine["id"] in body
    assert f'"{host.split(":")[0]}" "GET /s/{mine["id"]}/" 200' in caplog.text and token not in caplog.text
