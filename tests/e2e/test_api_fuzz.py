"""Property-based fuzzing of the public and internal APIs from their own OpenAPI schema (schemathesis).

Schemathesis generates requests for every operation in ``/api/v1/schema/`` (valid ones from the schema and,
in its negative mode, ones that break it) and sends them over HTTP to the live server: public routes with a
staff API token, ``/internal/v1/`` routes with the operator token of a registered emulated cluster. Every
answer must be below 500, and every error (4xx) a JSON body with a stable ``code``: the contract of
docs/errors.md.

Bounded: ``FUZZ_EXAMPLES`` examples per operation and mode (``GSHARE_FUZZ_EXAMPLES`` to change it), no
shrinking deadline. Left out, and only these:

* destructive staff routes on the fixture's shared data: deregistering the cluster and deleting pools (a
  random id only ever answers 404 there; the real ids would tear down what the other operations test);
* operations that make the control plane dial an address taken from the request body: registering a cluster,
  changing its kubeconfig (``PATCH /api/v1/clusters/{id}``) and the connection test. Fuzzed kubeconfigs name
  arbitrary hosts, so these would resolve and dial addresses off this machine; their hostile input is covered
  by tests/clusters/test_kubeconfig*.py and tests/core/test_hostile_input.py.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from clusters import services as cluster_services
from clusters.operator_token.tokens import operator_token_mint
from demo import fleet
from tests.helpers import kubeconfig_text

FUZZ_EXAMPLES = int(os.environ.get("GSHARE_FUZZ_EXAMPLES", "12"))
EXCLUDED = {
    ("DELETE", "/api/v1/clusters/{public_id}/"),
    ("DELETE", "/api/v1/storage/pools/{public_id}/"),
    ("POST", "/api/v1/clusters/"),
    ("PATCH", "/api/v1/clusters/{public_id}/"),
    ("PUT", "/api/v1/clusters/{public_id}/"),
    ("POST", "/api/v1/clusters/{public_id}/connection-test/"),
}

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fuzz_target(live_server, fleet_cluster, staff_token):
    """The live server with a registered, inventoried emulated cluster: ``(base_url, public headers, internal headers)``."""
    emulated = fleet_cluster("lab-c1")
    cluster = cluster_services.cluster_register(name="lab-c1", kubeconfig=kubeconfig_text(emulated), session_domain="lab-c1.gshare.localhost")
    cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory("lab-c1")["snapshot"]["nodes"])
    operator = operator_token_mint(cluster_id=cluster.public_id)
    return live_server.url, {"Authorization": f"Bearer {staff_token}"}, {"Authorization": f"Bearer {operator}"}


def _openapi_document() -> dict:
    """The document ``GET /api/v1/schema/`` serves, from the same drf-spectacular generator (at collection time,
    so that every operation is its own test)."""
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


schema = schemathesis.openapi.from_dict(_openapi_document())


@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_every_error_has_a_code(case, fuzz_target):
    if (case.method.upper(), case.path) in EXCLUDED:
        return
    base_url, public, internal = fuzz_target
    headers = dict(case.headers or {})
    if "Authorization" not in headers:
        headers.update(internal if case.path.startswith("/internal/") else public)
    response = case.call(base_url=base_url, headers=headers, timeout=30)
    described = f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
    assert response.status_code < 500, described
    if response.status_code >= 400:
        content_type = (response.headers.get("content-type") or [""])[0]
        assert content_type.startswith("application/json"), described
        body = response.json()
        assert isinstance(body, dict) and isinstance(body.get("code"), str) and body["code"], described
