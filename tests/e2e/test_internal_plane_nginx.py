"""The internal plane through a REAL nginx configured as ingress-nginx configures itself from the control-plane
chart's rendered Ingresses (tests/e2e/ingress_nginx_conf.py has how and the ingress-nginx sources it follows).

Path of every request: test client -> nginx -> pytest-django's ``live_server`` (the api), whose
``GSHARE_INTERNAL_HOSTS`` and ``ALLOWED_HOSTS`` are the ones the chart sets (the pod IP being ``POD_IP``).
Three releases of the chart, one per way it can be set up, each on hosts of its own in one nginx:

* own host: the public Ingress on ``gshare.example.com`` (``/`` to the api) and the internal-plane Ingress on
  ``gshare-internal.example.com`` (``/internal`` and ``/.well-known`` only, ``whitelist-source-range``; any other
  path is ingress-nginx's default backend, 404). On the public host the internal routes reach the api, which
  answers 404 there.
* default (``internalPlane.enabled: false``): the public Ingress on ``gshare-default.example.com`` alone; the
  clusters use the api Service's in-cluster names.
* one host: both Ingresses on ``gshare-one.example.com``, merged by ingress-nginx into one server: ``/`` from the
  public Ingress, ``/internal`` and ``/.well-known`` from the internal one, with its source range. That host is
  internal for the api; the restriction is nginx's.

The source range is ``127.0.0.1/32`` (the clusters); the outsider is a client bound to ``127.0.0.2``. Both
ingress-nginx modes run: ``$best_http_host`` (the ``Host`` it forwards, unless ``upstream-vhost`` says
otherwise) is the client's ``Host``, or with ``use-forwarded-headers: true`` the client's ``X-Forwarded-Host``.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from clusters.models import Node
from clusters.operator_token.tokens import operator_token_mint
from tests.charts.rendering import CONTROL_PLANE_VALUES, containers, env_of, merged, of_kind, render_control_plane
from tests.e2e import ingress_nginx_conf
from tests.e2e.nginx import Nginx
from tests.factories import ClusterFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PUBLIC = "gshare.example.com"
INTERNAL = "gshare-internal.example.com"
DEFAULT = "gshare-default.example.com"
ONE_HOST = "gshare-one.example.com"
CLUSTERS = "127.0.0.1"  # the source range (/32): the data-plane clusters' egress address
OUTSIDER = "127.0.0.2"  # any other address
POD_IP = "10.42.0.7"
SOURCE_RANGE = f"{CLUSTERS}/32"
INVENTORY_PATH, VERIFY, JWKS = "/internal/v1/inventory", "/internal/connect/verify", "/.well-known/gshare-internal-jwks.json"
INTERNAL_ROUTES = (INVENTORY_PATH, VERIFY, JWKS)
INVENTORY = {"nodes": [{"name": "gpu-1", "ready": True, "devices": [
    {"uuid": "GPU-1", "index": 0, "model": "NVIDIA A100", "memory_mib": 40960, "split_count": 4, "cores": 100, "health": True},
]}]}

#: The chart's values of each setup (on top of the minimal values, whose controlPlaneUrl is the api Service's name).
SETUPS = {
    "own-host": {"controlPlaneUrl": f"https://{INTERNAL}",
                 "ingress": {"host": PUBLIC, "internalPlane": {"enabled": True, "host": INTERNAL, "sourceRange": SOURCE_RANGE}}},
    "default": {"ingress": {"host": DEFAULT}},
    "one-host": {"controlPlaneUrl": f"https://{ONE_HOST}", "ingress": {"host": ONE_HOST, "internalPlane": {"enabled": True, "sourceRange": SOURCE_RANGE}}},
}
#: Hosts whose public Ingress has no source range: the api's host check is all that guards the internal routes there.
PUBLIC_ONLY_HOSTS = (PUBLIC, DEFAULT)


@dataclass
class Chart:
    """The Ingresses of every setup, and the union of their internal and allowed hosts (pod IP filled in)."""

    ingresses: list[dict]
    internal_hosts: list[str]
    allowed_hosts: list[str]


def _setting(objects: list[dict], name: str) -> list[str]:
    # The api pod's nginx proxy container has no Django settings: read the containers that carry the setting.
    [value] = {env_of(c)[name]["value"] for _, c in containers(objects) if name in env_of(c)}
    return value.replace("$(POD_IP)", POD_IP).split(",")


@pytest.fixture(scope="module")
def chart() -> Chart:
    ingresses, internal, allowed = [], [], []
    for values in SETUPS.values():
        objects = render_control_plane(merged(CONTROL_PLANE_VALUES, values))
        ingresses += of_kind(objects, "Ingress")
        internal += [h for h in _setting(objects, "GSHARE_INTERNAL_HOSTS") if h not in internal]
        allowed += [h for h in _setting(objects, "DJANGO_ALLOWED_HOSTS") if h not in allowed]
    assert not set(PUBLIC_ONLY_HOSTS) & set(internal)
    return Chart(ingresses, internal, allowed)


@pytest.fixture(params=[False], ids=["plain"])
def nginx(request, tmp_path, live_server, settings, chart):
    """nginx in front of the live server, configured from the chart's Ingresses; ``request.param`` (indirect
    parametrization) is ingress-nginx's ``use-forwarded-headers``."""
    settings.GSHARE_INTERNAL_HOSTS = chart.internal_hosts
    settings.ALLOWED_HOSTS = chart.allowed_hosts
    api = f"http://127.0.0.1:{urlsplit(live_server.url).port}"
    running = ingress_nginx_conf.start(
        tmp_path / "nginx",
        lambda prefix, port: ingress_nginx_conf.render_conf(chart.ingresses, prefix=prefix, port=port, api=api, use_forwarded_headers=request.param),
    )
    yield running
    running.stop()


BOTH_MODES = pytest.mark.parametrize("nginx", [False, True], ids=["plain", "use-forwarded-headers"], indirect=True)


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str

    def json(self):
        return json.loads(self.body)


def send(nginx: Nginx, method: str, host: str, path: str, *, source: str = CLUSTERS, token: str | None = None, body=None,
         target: str | None = None, headers: dict[str, str] | None = None) -> Answer:
    """``method`` ``path`` with ``Host: host`` to nginx, from the loopback address ``source``.

    ``target`` replaces the request line's target (e.g. the absolute form ``http://<host><path>``); ``headers`` are
    added as given.
    """
    connection = http.client.HTTPConnection("127.0.0.1", nginx.port, timeout=30, source_address=(source, 0))
    sent = {"Host": host, **(headers or {})}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    try:
        connection.request(method, target or path, body=payload, headers=sent)
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
    for host in PUBLIC_ONLY_HOSTS:
        for source in (CLUSTERS, OUTSIDER):  # the public Ingress has no source range: the api's host check decides
            assert api_not_found(send(nginx, "PUT", host, "/internal/v1/inventory", source=source, token=token, body=INVENTORY))
            assert api_not_found(send(nginx, "GET", host, "/internal/connect/verify", source=source))
            assert api_not_found(send(nginx, "GET", host, "/.well-known/gshare-internal-jwks.json", source=source))
        # The public host itself works: health, the API (refusing no token), the console.
        assert send(nginx, "GET", host, "/healthz", source=OUTSIDER).status == 200
        assert send(nginx, "GET", host, "/api/v1/clusters", source=OUTSIDER).status == 401
        assert send(nginx, "GET", host, "/login/", source=OUTSIDER).status == 200
    assert not Node.objects.filter(cluster=cluster).exists()


def spoofed_hosts(internal_hosts: list[str]) -> list[str]:
    """Every internal host the chart sets, as given, in upper case, and with a port."""
    return [variant for host in internal_hosts for variant in (host, host.upper(), f"{host}:80", f"{host.upper()}:8443")]


@BOTH_MODES
def test_a_spoofed_host_on_a_public_host_never_opens_the_internal_routes(nginx, operator, chart):
    """The request line names a public host, so nginx serves it from that host's server (no source range); the
    ``Host`` header (or, with use-forwarded-headers, ``X-Forwarded-Host``) names an internal host. The public
    Ingress's upstream-vhost makes the api judge the host nginx routed on: 404, and no inventory written."""
    cluster, token = operator
    opened = []
    for public in PUBLIC_ONLY_HOSTS:
        for spoof in spoofed_hosts(chart.internal_hosts):
            shapes = {
                "absolute-form": {"host": spoof, "target": f"http://{public}{{path}}"},
                "x-forwarded-host": {"host": public, "headers": {"X-Forwarded-Host": spoof}},
                "both": {"host": spoof, "target": f"http://{public}{{path}}", "headers": {"X-Forwarded-Host": f"{spoof}, {public}"}},
            }
            for shape, how in shapes.items():
                for path in INTERNAL_ROUTES:
                    method, extra = ("PUT", {"token": token, "body": INVENTORY}) if path == INVENTORY_PATH else ("GET", {})
                    target = how.get("target", "").format(path=path) or None
                    answer = send(nginx, method, how["host"], path, source=OUTSIDER, target=target, headers=how.get("headers"), **extra)
                    if not api_not_found(answer):
                        opened.append((public, spoof, shape, path, answer.status))
    assert opened == [], f"internal routes answered on a public host: {opened[:10]} ({len(opened)} in all)"
    assert not Node.objects.filter(cluster=cluster).exists()


@BOTH_MODES
def test_on_one_host_a_spoofed_host_does_not_lift_the_source_range(nginx, chart):
    for spoof in spoofed_hosts(chart.internal_hosts):
        for path in INTERNAL_ROUTES:
            answer = send(nginx, "GET", spoof, path, source=OUTSIDER, target=f"http://{ONE_HOST}{path}", headers={"X-Forwarded-Host": spoof})
            assert answer.status == 403, (spoof, path)


@BOTH_MODES
def test_the_clusters_reach_the_internal_host_whatever_host_header_they_send(nginx, operator):
    """The internal Ingress's upstream-vhost: the api sees the internal host for every request nginx routed there."""
    cluster, token = operator
    for host, headers in ((PUBLIC, {}), (f"{INTERNAL.upper()}:443", {}), (INTERNAL, {"X-Forwarded-Host": PUBLIC})):
        sent = {"host": host, "headers": headers}
        jwks = send(nginx, "GET", path=JWKS, target=f"http://{INTERNAL}{JWKS}", **sent)
        assert jwks.status == 200 and jwks.json()["keys"], (sent, jwks.body)
        assert send(nginx, "GET", path=VERIFY, target=f"http://{INTERNAL}{VERIFY}", **sent).status == 401, sent
        applied = send(nginx, "PUT", path=INVENTORY_PATH, target=f"http://{INTERNAL}{INVENTORY_PATH}", token=token, body=INVENTORY, **sent)
        assert applied.status == 200, (sent, applied.body)
        assert send(nginx, "GET", path=VERIFY, target=f"http://{INTERNAL}{VERIFY}", source=OUTSIDER, **sent).status == 403, sent
    assert Node.objects.filter(cluster=cluster).count() == 1


@BOTH_MODES
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


@BOTH_MODES
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


EXT_AUTHZ = "/internal/connect/ext-authz"


def test_envoys_ext_authz_check_carrying_a_session_domain_reaches_the_api_from_the_clusters_only(nginx):
    """Envoy's ext_authz check (gateway-api clusters) carries the session's host: the chart's host-less ext-authz
    Ingress puts that one path in ingress-nginx's catch-all server, restricted to the clusters' source range, and the
    api answers it only for a registered cluster's session domain."""
    ClusterFactory(session_domain="lab.gpu.example.org")
    check = f"{EXT_AUTHZ}/s/ses_abc/?x=1"
    for method in ("GET", "POST"):  # Envoy sends the original method
        answer = send(nginx, method, "lab.gpu.example.org", check)
        assert (answer.status, answer.json()["code"]) == (401, "token_missing"), method  # judged by the api
    assert send(nginx, "GET", "lab.gpu.example.org", check, source=OUTSIDER).status == 403  # nginx's deny
    assert api_not_found(send(nginx, "GET", "unknown.gpu.example.org", check))  # not a session domain: the api's 404
    for path in (INVENTORY_PATH, VERIFY, JWKS, "/admin/"):  # the catch-all server has nothing else
        answer = send(nginx, "GET", "lab.gpu.example.org", path)
        assert answer.status == 404 and not api_not_found(answer), path
