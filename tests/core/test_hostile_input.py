"""Hostile input through HTTP: always JSON {"code", "detail"} with the right status, never a 500."""

import threading

import pytest
from django.db import connections

from clusters import services
from clusters.models import GpuDevice
from clusters.operator_token.tokens import operator_token_mint
from core.exceptions import Forbidden
from tests.factories import ClusterFactory
from tests.helpers import run_threads

pytestmark = pytest.mark.django_db


def _device(uuid, index=0):
    return {"uuid": uuid, "index": index, "model": "m", "memory_mib": 1, "split_count": 1, "cores": 100, "health": True}


@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v2/clusters", "/internal/v1/nope", "/internal/whatever"])
def test_unknown_api_paths_are_json_404(http, path):
    response = http.get(path, allow_redirects=False)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("path", ["/api/v1/clusters/%00", "/api/v1/gpus?cluster=%00", "/api/v1/clusters?status=%00"])
def test_nul_in_url_is_400(http, path):
    response = http.get(path)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"


@pytest.fixture
def operator(http_for):
    cluster = ClusterFactory()
    return http_for(operator_token_mint(cluster_id=cluster.public_id))


@pytest.mark.parametrize(
    "body",
    [
        {"nodes": [{"name": "n", "ready": True, "devices": [dict(_device("GPU-1"), index=2**40)]}]},
        {"nodes": [{"name": "n\x00", "ready": True, "devices": []}]},
        {"nodes": [{"name": "n", "labels": {"k": "v\x00"}, "ready": True, "devices": []}]},
        {"nodes": [{"name": "n", "ready": True, "devices": [_device("GPU-\x00")]}]},
    ],
)
def test_unstorable_inventory_is_400(operator, body):
    response = operator.put("/internal/v1/inventory", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_inventory"


def test_surrogates_and_deep_nesting_are_400(operator):
    response = operator.put("/internal/v1/inventory", data='{"nodes": [{"name": "\\ud800", "ready": true, "devices": []}]}',
                            headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_inventory"
    response = operator.put("/internal/v1/inventory", data="[" * 100000, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_json"


def test_large_errors_do_not_echo_the_payload(operator):
    body = {"nodes": [{"name": f"n{i}", "ready": True, "devices": []} for i in range(5001)]}
    response = operator.put("/internal/v1/inventory", json=body)
    assert response.status_code == 400
    assert len(response.text) < 2000 and "more than 5000 items" in response.json()["detail"]


def test_oversized_body_is_413(operator, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = operator.put("/internal/v1/inventory", json={"nodes": [], "pad": "x" * 5000})
    assert response.status_code == 413
    assert response.json()["code"] == "request_too_large"


def test_patch_with_unexpected_fields_is_400(http):
    cluster = ClusterFactory()
    response = http.patch(f"/api/v1/clusters/{cluster.public_id}", json={"cluster": "x", "kubeconfig": "y"})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"


@pytest.mark.django_db(transaction=True)
def test_same_gpu_from_two_clusters_at_once_is_never_accepted_twice():
    a, b = ClusterFactory(), ClusterFactory()
    outcomes = []
    for round_ in range(5):
        barrier = threading.Barrier(2)

        def report(cluster, round_=round_, barrier=barrier):
            try:
                barrier.wait()
                services.inventory_apply(cluster=cluster, nodes=[{"name": f"n-{cluster.pk}", "ready": True, "devices": [_device(f"GPU-race-{round_}")]}])
                outcomes.append("ok")
            except Forbidden:
                outcomes.append("forbidden")
            finally:
                connections.close_all()

        run_threads(report, [(c,) for c in (a, b)], timeout=30)
        device = GpuDevice.objects.select_related("node").get(uuid=f"GPU-race-{round_}")
        assert device.node.cluster_id == device.cluster_id
    assert outcomes.count("ok") == 5 and outcomes.count("forbidden") == 5
