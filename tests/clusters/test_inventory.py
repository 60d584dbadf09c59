"""``PUT /internal/v1/inventory`` through HTTP: upsert, removal, scope, tokens, query counts."""

import time

import jwt
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters import services
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_tokens import operator_token_mint
from gshare.auth.keys import signing_key_ensure
from tests.conftest import Http
from tests.factories import ClusterFactory, GpuDeviceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def snapshot(n_nodes: int, gpus_per_node: int = 8, prefix: str = "a") -> dict:
    return {
        "nodes": [
            {
                "name": f"gpu-node-{i:04d}",
                "labels": {"gpu": "on", "gshare.io/gpu-mode": "hami-core"},
                "ready": True,
                "devices": [
                    {"uuid": f"GPU-{prefix}{i:05d}-{j}", "index": j, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                     "split_count": 10, "cores": 100, "health": True, "mode": "hami-core"}
                    for j in range(gpus_per_node)
                ],
            }
            for i in range(n_nodes)
        ]
    }


@pytest.fixture
def cluster():
    return ClusterFactory(status=Cluster.Status.PENDING)


@pytest.fixture
def operator(live_server, cluster) -> Http:
    return Http(live_server.url, operator_token_mint(cluster_id=cluster.public_id))


def test_snapshot_is_applied_and_reported(operator, cluster):
    response = operator.put("/internal/v1/inventory", json=snapshot(2))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["nodes"] == 2 and body["gpus"] == 16 and body["cluster"] == cluster.public_id
    assert "server_time" in body
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.CONNECTED
    assert cluster.last_heartbeat_at is not None
    assert Node.objects.filter(cluster=cluster).count() == 2
    assert Node.objects.get(name="gpu-node-0000").gpu_mode == "hami-core"
    assert GpuDevice.objects.filter(cluster=cluster, model="NVIDIA H100 80GB HBM3").count() == 16


def test_what_is_gone_is_removed_and_changes_are_applied(operator, cluster):
    operator.put("/internal/v1/inventory", json=snapshot(3))
    smaller = snapshot(2)
    smaller["nodes"][0]["devices"] = smaller["nodes"][0]["devices"][:4]
    smaller["nodes"][0]["devices"][0]["health"] = False
    smaller["nodes"][1]["ready"] = False
    body = operator.put("/internal/v1/inventory", json=smaller).json()
    assert body["nodes_removed"] == 1 and body["gpus_removed"] == 12
    assert sorted(Node.objects.values_list("name", flat=True)) == ["gpu-node-0000", "gpu-node-0001"]
    assert GpuDevice.objects.count() == 12
    assert GpuDevice.objects.get(uuid="GPU-a00000-0").health is False
    assert Node.objects.get(name="gpu-node-0001").ready is False
    assert operator.put("/internal/v1/inventory", json={"nodes": []}).json()["nodes_removed"] == 2
    assert Node.objects.count() == 0 and GpuDevice.objects.count() == 0


@pytest.mark.django_db
def test_query_count_does_not_grow_with_nodes():
    cluster = ClusterFactory()
    services.inventory_apply(cluster=cluster, nodes=snapshot(3, prefix="warm")["nodes"])  # so both runs below replace nodes
    counts = {}
    for n in (10, 500):
        with CaptureQueriesContext(connection) as queries:
            services.inventory_apply(cluster=cluster, nodes=snapshot(n, prefix=f"q{n}")["nodes"])
        counts[n] = len(queries)
    assert GpuDevice.objects.filter(cluster=cluster).count() == 500 * 8
    assert counts[10] == counts[500], counts
    assert counts[500] <= 12


def test_foreign_gpu_is_refused_whole(operator, cluster):
    other = GpuDeviceFactory(uuid="GPU-a00001-3")  # belongs to another cluster
    operator.put("/internal/v1/inventory", json=snapshot(1))
    before = sorted(GpuDevice.objects.values_list("uuid", "cluster_id"))
    response = operator.put("/internal/v1/inventory", json=snapshot(2))
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden_cluster_scope"
    assert "GPU-a00001-3" in response.json()["detail"]
    assert sorted(GpuDevice.objects.values_list("uuid", "cluster_id")) == before
    assert Node.objects.filter(cluster=cluster).count() == 1
    assert GpuDevice.objects.get(uuid="GPU-a00001-3").cluster_id == other.cluster_id


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda s: s.pop("nodes"), "nodes"),
        (lambda s: s["nodes"][0]["devices"][0].update(memory_mib="lots"), "nodes[0].devices[0].memory_mib"),
        (lambda s: s["nodes"][0]["devices"][0].update(split_count=0), "split_count"),
        (lambda s: s["nodes"].append(dict(s["nodes"][0])), "appears twice"),
    ],
)
def test_malformed_snapshot_is_400_and_names_the_field(operator, mutate, fragment):
    body = snapshot(1)
    mutate(body)
    response = operator.put("/internal/v1/inventory", json=body)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_inventory"
    assert fragment in response.json()["detail"]
    assert Node.objects.count() == 0


def _forge(claims_update: dict, header_update: dict | None = None, key=None) -> str:
    key = key or signing_key_ensure()
    now = int(time.time())
    claims = {"iss": "gshare-control-plane", "sub": "operator:x", "aud": "gshare-internal", "iat": now, "nbf": now, "exp": now + 600, "jti": "j"}
    claims.update(claims_update)
    return jwt.encode(claims, key.private_key_pem, algorithm="RS256", headers={"kid": key.kid, **(header_update or {})})


@pytest.mark.parametrize(
    "make_token",
    [
        pytest.param(lambda c: _forge({"sub": f"operator:{c.public_id}", "exp": int(time.time()) - 100}), id="expired"),
        pytest.param(lambda c: _forge({"sub": f"operator:{c.public_id}", "aud": "gshare-connect"}), id="wrong-audience"),
        pytest.param(lambda c: _forge({"sub": f"operator:{c.public_id}"}, {"kid": "unknown"}), id="unknown-kid"),
        pytest.param(lambda c: operator_token_mint(cluster_id=c.public_id)[:-4] + "AAAA", id="tampered"),
        pytest.param(lambda c: jwt.encode({"sub": f"operator:{c.public_id}"}, "k" * 32, algorithm="HS256"), id="hs256"),
        pytest.param(
            lambda c: jwt.api_jws.PyJWS(algorithms=["none"]).encode(
                f'{{"sub":"operator:{c.public_id}","aud":"gshare-internal","iss":"gshare-control-plane"}}'.encode(), None, algorithm="none"
            ),
            id="alg-none",
        ),
        pytest.param(lambda c: _forge({"sub": "user:alice"}), id="not-an-operator"),
        pytest.param(lambda c: "", id="missing"),
    ],
)
def test_bad_operator_tokens_get_401(live_server, cluster, make_token):
    token = make_token(cluster)
    response = Http(live_server.url, token or None).put("/internal/v1/inventory", json=snapshot(1))
    assert response.status_code == 401, response.text
    assert response.json()["code"] in {"token_invalid", "token_missing"}
    assert Node.objects.count() == 0


def test_deregistered_cluster_token_gets_401(operator, cluster):
    assert operator.put("/internal/v1/inventory", json=snapshot(1)).status_code == 200
    services.cluster_deregister(cluster=cluster)
    response = operator.put("/internal/v1/inventory", json=snapshot(1))
    assert response.status_code == 401
    assert response.json()["code"] == "cluster_deregistered"


def test_api_token_is_not_an_operator_token(live_server, staff_token):
    response = Http(live_server.url, staff_token).put("/internal/v1/inventory", json=snapshot(1))
    assert response.status_code == 401


def test_undecodable_node_is_kept_with_its_error(operator):
    body = snapshot(1)
    body["nodes"].append({"name": "gpu-broken", "labels": {"gpu": "on"}, "ready": True, "devices": [],
                          "hami_error": "record 1 has 8 fields; HAMi wrote 8 fields only in an unreleased build"})
    assert operator.put("/internal/v1/inventory", json=body).status_code == 200
    assert "8 fields" in Node.objects.get(name="gpu-broken").inventory_error
    assert Node.objects.get(name="gpu-node-0000").inventory_error == ""
