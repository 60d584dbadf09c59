"""The internal plane (``/internal``, ``/.well-known``) answers only on ``GSHARE_INTERNAL_HOSTS``, over HTTP.

Every request goes to pytest-django's live server on loopback with a chosen ``Host`` header, as a reverse
proxy (ingress-nginx: ``proxy_set_header Host $best_http_host``) forwards it. The through-nginx version is
``tests/e2e/test_internal_plane_nginx.py``.
"""

from __future__ import annotations

import pytest
import requests
from django.core.exceptions import ImproperlyConfigured

from clusters.models import Node
from clusters.operator_token.tokens import operator_token_mint
from core.internal_hosts import internal_hosts
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = "gshare.example.com"
INTERNAL = "gshare-internal.example.com"
INVENTORY = {"nodes": [{"name": "gpu-1", "ready": True, "devices": [
    {"uuid": "GPU-1", "index": 0, "model": "NVIDIA A100", "memory_mib": 40960, "split_count": 4, "cores": 100, "health": True},
]}]}


@pytest.fixture
def internal_host(settings):
    """Only ``gshare-internal.example.com`` is internal (ALLOWED_HOSTS is ``*`` outside production)."""
    settings.GSHARE_INTERNAL_HOSTS = [INTERNAL]
    return INTERNAL


@pytest.fixture
def operator_token():
    cluster = ClusterFactory()
    return cluster, operator_token_mint(cluster_id=cluster.public_id)


def send(live_server, method: str, path: str, host: str, **kwargs) -> requests.Response:
    """``method`` ``path`` to the live server with ``Host: host``."""
    headers = {"Host": host, **kwargs.pop("headers", {})}
    response = requests.request(method, live_server.url + path, headers=headers, timeout=30, allow_redirects=False, **kwargs)
    assert response.status_code < 500, response.text
    return response


def assert_not_found(response: requests.Response) -> None:
    assert response.status_code == 404, response.text
    assert response.headers["Content-Type"] == "application/json"
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize(("method", "path"), [
    ("PUT", "/internal/v1/inventory"),
    ("POST", "/internal/v1/token"),
    ("POST", "/internal/v1/status"),
    ("POST", "/internal/v1/usage"),
    ("POST", "/internal/v1/storage"),
    ("GET", "/internal/connect/verify"),
    ("GET", "/internal/ping"),
    ("GET", "/internal"),
    ("GET", "/.well-known/gshare-internal-jwks.json"),
    ("GET", "/.well-known/anything-else"),
    ("GET", "/metrics"),
])
def test_internal_routes_are_404_on_the_public_host_even_with_a_valid_operator_token(live_server, internal_host, operator_token, method, path):
    cluster, token = operator_token
    response = send(live_server, method, path, PUBLIC, headers={"Authorization": f"Bearer {token}"},
                    **({"json": INVENTORY} if method == "PUT" else {}))
    assert_not_found(response)
    assert not Node.objects.filter(cluster=cluster).exists()


def test_internal_routes_answer_as_before_on_the_internal_host(live_server, internal_host, operator_token):
    cluster, token = operator_token
    applied = send(live_server, "PUT", "/internal/v1/inventory", INTERNAL, headers={"Authorization": f"Bearer {token}"}, json=INVENTORY)
    assert applied.status_code == 200, applied.text
    assert applied.json()["nodes"] == 1 and Node.objects.filter(cluster=cluster).count() == 1
    assert send(live_server, "PUT", "/internal/v1/inventory", INTERNAL, json=INVENTORY).status_code == 401
    assert send(live_server, "GET", "/internal/connect/verify", INTERNAL).status_code == 401
    jwks = send(live_server, "GET", "/.well-known/gshare-internal-jwks.json", INTERNAL)
    assert jwks.status_code == 200 and jwks.json()["keys"]


def test_the_public_host_still_serves_the_api_console_and_health(live_server, internal_host, staff_token):
    assert send(live_server, "GET", "/healthz", PUBLIC).status_code == 200
    api = send(live_server, "GET", "/api/v1/clusters", PUBLIC, headers={"Authorization": f"Bearer {staff_token}"})
    assert api.status_code == 200, api.text
    assert send(live_server, "GET", "/login/", PUBLIC).status_code == 200


@pytest.mark.parametrize("host", [f"{INTERNAL}:8443", INTERNAL.upper(), f"{INTERNAL}."])
def test_the_host_is_judged_as_django_reads_it_port_case_and_trailing_dot_aside(live_server, internal_host, host):
    assert send(live_server, "GET", "/.well-known/gshare-internal-jwks.json", host).status_code == 200


@pytest.mark.parametrize("host", [f"{PUBLIC}:8443", f"x{INTERNAL}", f"{INTERNAL}.evil.example.net", f"{INTERNAL[:-4]}"])
def test_hosts_that_merely_resemble_the_internal_one_are_public(live_server, internal_host, host):
    assert_not_found(send(live_server, "GET", "/.well-known/gshare-internal-jwks.json", host))


def test_a_percent_encoded_path_is_judged_decoded(live_server, internal_host, operator_token):
    cluster, token = operator_token
    response = send(live_server, "PUT", "/%69nternal/v1/inventory", PUBLIC, headers={"Authorization": f"Bearer {token}"}, json=INVENTORY)
    assert_not_found(response)
    assert not Node.objects.filter(cluster=cluster).exists()


def test_x_forwarded_host_is_ignored_unless_django_uses_it(live_server, internal_host, settings):
    path = "/.well-known/gshare-internal-jwks.json"
    assert_not_found(send(live_server, "GET", path, PUBLIC, headers={"X-Forwarded-Host": INTERNAL}))
    assert send(live_server, "GET", path, INTERNAL, headers={"X-Forwarded-Host": PUBLIC}).status_code == 200

    settings.USE_X_FORWARDED_HOST = True  # then Django, and this check, act on the forwarded host
    assert_not_found(send(live_server, "GET", path, INTERNAL, headers={"X-Forwarded-Host": PUBLIC}))
    assert send(live_server, "GET", path, PUBLIC, headers={"X-Forwarded-Host": INTERNAL}).status_code == 200


def test_subdomain_patterns_and_bare_ipv6_addresses_are_understood(live_server, settings):
    settings.GSHARE_INTERNAL_HOSTS = [".svc.cluster.local", "fd00::7"]  # a pod IP comes without brackets
    path = "/.well-known/gshare-internal-jwks.json"
    assert send(live_server, "GET", path, "gshare-api.gshare.svc.cluster.local").status_code == 200
    assert send(live_server, "GET", path, "[fd00::7]:8000").status_code == 200
    assert_not_found(send(live_server, "GET", path, "[fd00::8]:8000"))
    assert_not_found(send(live_server, "GET", path, "localhost"))


def test_the_test_defaults_keep_loopback_and_the_live_server_internal(live_server):
    assert live_server.url.startswith("http://localhost:")
    assert send(live_server, "GET", "/.well-known/gshare-internal-jwks.json", "127.0.0.1").status_code == 200
    assert requests.get(live_server.url + "/.well-known/gshare-internal-jwks.json", timeout=30).status_code == 200


@pytest.mark.parametrize("entry", ["bad host", "http://gshare.example.com", "gshare.example.com/internal"])
def test_a_malformed_entry_is_a_configuration_error_naming_it(settings, entry):
    settings.GSHARE_INTERNAL_HOSTS = ["127.0.0.1", entry]
    with pytest.raises(ImproperlyConfigured, match="GSHARE_INTERNAL_HOSTS has"):
        internal_hosts()
