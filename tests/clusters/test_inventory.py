"""``PUT /internal/v1/inventory`` through HTTP: upsert, removal, scope, tokens, query counts."""

import copy
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import jwt
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import Price
from clusters import services
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_token.tokens import operator_token_mint
from demo import fleet
from identity.keys import signing_key_ensure
from sessions import placement
from sessions.models import Allocation, Session
from tests.factories import ClusterFactory, GpuDeviceFactory, SessionFactory
from tests.helpers import Http, kubeconfig_text

pytestmark = pytest.mark.django_db


def snapshot(n_nodes: int, gpus_per_node: int = 8, prefix: str = "a", node_prefix: str = "gpu-node") -> dict:
    return {
        "nodes": [
            {
                "name": f"{node_prefix}-{i:04d}",
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
def operator(http_for, cluster) -> Http:
    return http_for(operator_token_mint(cluster_id=cluster.public_id))


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
def test_bad_operator_tokens_get_401(http_for, cluster, make_token):
    token = make_token(cluster)
    response = http_for(token or None).put("/internal/v1/inventory", json=snapshot(1))
    assert response.status_code == 401, response.text
    assert response.json()["code"] in {"token_invalid", "token_missing"}
    assert Node.objects.count() == 0


def test_deregistered_cluster_token_gets_401(operator, cluster):
    assert operator.put("/internal/v1/inventory", json=snapshot(1)).status_code == 200
    services.cluster_deregister(cluster=cluster)
    response = operator.put("/internal/v1/inventory", json=snapshot(1))
    assert response.status_code == 401
    assert response.json()["code"] == "cluster_deregistered"


def test_api_token_is_not_an_operator_token(http_for, staff_token):
    response = http_for(staff_token).put("/internal/v1/inventory", json=snapshot(1))
    assert response.status_code == 401


def test_undecodable_node_is_kept_with_its_error(operator):
    body = snapshot(1)
    body["nodes"].append({"name": "gpu-broken", "labels": {"gpu": "on"}, "ready": True, "devices": [],
                          "hami_error": "record 1 has 8 fields; HAMi wrote 8 fields only in an unreleased build"})
    assert operator.put("/internal/v1/inventory", json=body).status_code == 200
    assert "8 fields" in Node.objects.get(name="gpu-broken").inventory_error
    assert Node.objects.get(name="gpu-node-0000").inventory_error == ""


# --- A GPU or node missing from a snapshot while a live session holds it is kept, absent, until it is free ---

LAB = "lab-c1"  # demo fleet: gpu-h100-01 with 8x H100 80GB, and a node with 2x V100 32GB


@pytest.fixture
def lab(fleet_cluster, http_for):
    """lab-c1 registered on its emulated apiserver (sessions are applied there), its operator client, and its
    real inventory applied through HTTP; returns ``(cluster, operator, nodes of the full snapshot)``."""
    emulated = fleet_cluster(LAB)
    cluster = services.cluster_register(name=LAB, kubeconfig=kubeconfig_text(emulated), session_domain=f"{LAB}.gshare.localhost")
    operator = http_for(operator_token_mint(cluster_id=cluster.public_id))
    nodes = fleet.expected_inventory(LAB)["snapshot"]["nodes"]
    assert operator.put("/internal/v1/inventory", json={"nodes": nodes}).status_code == 200
    return cluster, operator, nodes


def without(nodes: list[dict], *, uuids=(), node_names=()) -> dict:
    """The snapshot ``nodes`` without the GPUs ``uuids`` and the nodes ``node_names``."""
    kept = copy.deepcopy([n for n in nodes if n["name"] not in node_names])
    for node in kept:
        node["devices"] = [d for d in node["devices"] if d["uuid"] not in uuids]
    return {"nodes": kept}


def start_session(http: Http, **body) -> dict:
    response = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, **body})
    assert response.status_code == 201, response.text
    return response.json()


def held_gpu(session_id: str) -> GpuDevice:
    (allocation,) = Allocation.objects.filter(session__public_id=session_id).select_related("device")
    return allocation.device


def gpu_shown(http: Http, uuid: str) -> dict:
    (shown,) = [g for g in http.get(f"/api/v1/gpus?cluster={LAB}&limit=100").json()["results"] if g["uuid"] == uuid]
    return shown


def usage(operator: Http, session_id: str, uuid: str, *, ago: int = 0):
    """POST one 30 s usage sample of ``session_id`` on ``uuid``, ending ``ago`` seconds ago."""
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=ago)
    return operator.post("/internal/v1/usage", json={"samples": [{
        "sample_id": f"{session_id}:{uuid}:{int(end.timestamp() * 1000)}", "session_id": session_id, "device_uuid": uuid,
        "start": (end - timedelta(seconds=30)).isoformat().replace("+00:00", "Z"), "end": end.isoformat().replace("+00:00", "Z"),
        "gpu_util_percent": None, "memory_used_mib": None}]})


def test_a_gpu_a_live_session_holds_survives_a_snapshot_without_it(http, lab):
    """The reservation outlives the GPU's absence, so the GPU is never placed twice."""
    cluster, operator, nodes = lab
    shared = start_session(http, gpu_memory_mib=20000, gpu_cores=10)
    gpu = held_gpu(shared["id"])
    assert gpu.model.startswith("NVIDIA H100")

    body = operator.put("/internal/v1/inventory", json=without(nodes, uuids={gpu.uuid})).json()
    assert (body["gpus"], body["gpus_removed"], body["gpus_missing"], body["nodes_removed"], body["nodes_missing"]) == (9, 0, 1, 0, 0)
    assert held_gpu(shared["id"]).pk == gpu.pk  # the allocation survived
    assert http.get(f"/api/v1/sessions/{shared['id']}").json()["phase"] not in Session.TERMINAL_PHASES
    missing = GpuDevice.objects.get(pk=gpu.pk)
    assert missing.missing_since is not None and missing.health is False and missing.used_count == 1
    assert gpu_shown(http, gpu.uuid)["health"] is False
    # Not placeable while missing: binpack would stack a share onto the busiest GPU, which is this one.
    other = start_session(http, gpu_memory_mib=20000, gpu_cores=10)
    assert held_gpu(other["id"]).pk != gpu.pk
    assert http.delete(f"/api/v1/sessions/{other['id']}").status_code == 202
    refused = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 8})
    assert refused.status_code == 409 and refused.json()["code"] == "no_capacity"

    body = operator.put("/internal/v1/inventory", json={"nodes": nodes}).json()
    assert (body["gpus"], body["gpus_removed"], body["gpus_missing"]) == (10, 0, 0)
    back = GpuDevice.objects.get(uuid=gpu.uuid)
    assert back.pk == gpu.pk and back.missing_since is None and back.health is True
    assert (back.used_count, back.used_memory_mib, back.used_cores) == (1, 20000, 10)  # still reserved
    assert Allocation.objects.filter(device=back, session__public_id=shared["id"]).exists()
    node = Node.objects.get(pk=back.node_id)
    assert (node.load, node.free_devices) == (1, 7)
    assert placement.usage_recompute(cluster_ids=[cluster.pk]) == [] and Node.objects.get(pk=node.pk).free_devices == 7
    # The incident: 8 whole GPUs next to the live shared session must not fit on the 8-GPU node.
    refused = http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 8})
    assert refused.status_code == 409 and refused.json()["code"] == "no_capacity", refused.text
    assert gpu_shown(http, gpu.uuid)["health"] is True


@pytest.mark.django_db(transaction=True)
def test_a_missing_gpu_is_removed_once_its_session_ended(http, lab):
    _, operator, nodes = lab
    session = start_session(http)
    gpu = held_gpu(session["id"])
    assert operator.put("/internal/v1/inventory", json=without(nodes, uuids={gpu.uuid})).json()["gpus_missing"] == 1
    assert operator.put("/internal/v1/inventory", json=without(nodes, uuids={gpu.uuid})).json()["gpus_missing"] == 1  # still held
    assert GpuDevice.objects.filter(pk=gpu.pk).exists()
    assert http.delete(f"/api/v1/sessions/{session['id']}").json()["phase"] == "Terminated"
    body = operator.put("/internal/v1/inventory", json=without(nodes, uuids={gpu.uuid})).json()
    assert (body["gpus_removed"], body["gpus_missing"]) == (1, 0)
    assert not GpuDevice.objects.filter(uuid=gpu.uuid).exists()
    # It may come back later as a new GPU, free.
    assert operator.put("/internal/v1/inventory", json={"nodes": nodes}).json()["gpus"] == 10
    assert GpuDevice.objects.get(uuid=gpu.uuid).used_count == 0


def test_a_missing_node_is_kept_not_ready_with_only_the_held_gpus(http, lab):
    _, operator, nodes = lab
    session = start_session(http)
    gpu = held_gpu(session["id"])
    body = operator.put("/internal/v1/inventory", json=without(nodes, node_names={gpu.node.name})).json()
    assert (body["nodes"], body["gpus"], body["nodes_removed"], body["gpus_removed"], body["nodes_missing"], body["gpus_missing"]) == (1, 2, 0, 7, 1, 1)
    node = Node.objects.get(pk=gpu.node_id)
    assert node.ready is False and node.missing_since is not None
    assert list(node.devices.values_list("uuid", flat=True)) == [gpu.uuid]
    assert held_gpu(session["id"]).pk == gpu.pk
    assert http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 2}).status_code == 201  # the V100s
    assert http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1}).json()["code"] == "no_capacity"
    # Back: matched by name and UUID, ready again, the reservation kept.
    body = operator.put("/internal/v1/inventory", json={"nodes": nodes}).json()
    assert (body["nodes"], body["gpus"], body["nodes_missing"], body["gpus_missing"]) == (2, 10, 0, 0)
    node.refresh_from_db()
    assert node.ready is True and node.missing_since is None and (node.load, node.free_devices) == (1, 7)
    # Gone again, and this time its session ended first: the node and its GPUs go.
    http.delete(f"/api/v1/sessions/{session['id']}")
    body = operator.put("/internal/v1/inventory", json=without(nodes, node_names={gpu.node.name})).json()
    assert (body["nodes_removed"], body["gpus_removed"], body["nodes_missing"], body["gpus_missing"]) == (1, 8, 0, 0)
    assert not Node.objects.filter(pk=node.pk).exists()


def test_usage_of_a_missing_gpu_is_accepted_while_its_session_lives(http, lab):
    _, operator, nodes = lab
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1.2"))
    session = start_session(http)
    # Created five minutes ago: the sample below (90 to 60 s ago) lies in the time it held its GPUs (billing.held).
    Session.objects.filter(public_id=session["id"]).update(created_at=datetime.now(UTC) - timedelta(minutes=5))
    gpu = held_gpu(session["id"])
    operator.put("/internal/v1/inventory", json=without(nodes, uuids={gpu.uuid}))
    response = usage(operator, session["id"], gpu.uuid, ago=60)
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == 1
    operator.put("/internal/v1/inventory", json={"nodes": nodes})
    response = usage(operator, session["id"], gpu.uuid)
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == 1


def test_a_gpu_hami_gave_a_live_session_is_kept_too(http, lab):
    """HAMi may give the Pod another GPU of the node than placement reserved; usage is charged on the one reported."""
    _, operator, nodes = lab
    session = start_session(http)
    reserved = held_gpu(session["id"])
    reported = GpuDevice.objects.filter(node=reserved.node).exclude(pk=reserved.pk).order_by("index").first()
    status = operator.post("/internal/v1/status", json={"reports": [{
        "session": session["id"], "phase": "Running", "node": reserved.node.name, "devices": [reported.uuid], "message": "",
        "observed_at": datetime.now(UTC).isoformat().replace("+00:00", "Z")}]})
    assert status.status_code == 200, status.text
    body = operator.put("/internal/v1/inventory", json=without(nodes, uuids={reported.uuid})).json()
    assert (body["gpus_removed"], body["gpus_missing"]) == (0, 1)
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1.2"))
    # The window ends 5 s ahead (within the clock skew allowed): usage is cut to the held time, which began at the
    # session's creation, and a window ending at the last whole second may end before it (nothing left to store).
    assert usage(operator, session["id"], reported.uuid, ago=-5).json()["accepted"] == 1


def test_removed_counts_are_gpus_not_the_reservations_deleted_with_them(http, lab):
    """A reservation left by a session already ended (not live) goes with its GPU, and is not counted as a GPU."""
    _, operator, nodes = lab
    session = start_session(http)
    gpu = held_gpu(session["id"])
    Session.objects.filter(public_id=session["id"]).update(phase=Session.Phase.FAILED)  # ended, reservation not released
    body = operator.put("/internal/v1/inventory", json=without(nodes, uuids={gpu.uuid})).json()
    assert (body["gpus_removed"], body["gpus_missing"], body["nodes_removed"]) == (1, 0, 0)
    assert not GpuDevice.objects.filter(pk=gpu.pk).exists() and not Allocation.objects.exists()
    body = operator.put("/internal/v1/inventory", json=without(nodes, node_names={gpu.node.name})).json()
    assert (body["gpus_removed"], body["nodes_removed"]) == (7, 1)


@pytest.mark.django_db
def test_query_count_does_not_grow_with_nodes_when_gpus_are_kept():
    cluster = ClusterFactory()
    counts = {}
    for n in (10, 500):
        services.inventory_apply(cluster=cluster, nodes=snapshot(n, prefix=f"k{n}")["nodes"])
        held = list(GpuDevice.objects.filter(cluster=cluster, index=0).order_by("node__name")[:3])
        for device in held:
            Allocation.objects.create(session=SessionFactory(cluster=cluster), device=device, memory_mib=100, cores=1)
        placement.usage_recompute(cluster_ids=[cluster.pk])
        with CaptureQueriesContext(connection) as queries:
            result = services.inventory_apply(cluster=cluster, nodes=snapshot(n, prefix=f"r{n}", node_prefix=f"r{n}")["nodes"])
        counts[n] = len(queries)
        assert (result.nodes_missing, result.gpus_missing) == (3, 3)
        assert (result.nodes_removed, result.gpus_removed) == (n - 3, n * 8 - 3)
        Allocation.objects.all().delete()
    assert counts[10] == counts[500], counts
    assert counts[500] <= 12


def test_a_gpu_moved_off_a_removed_node_keeps_its_reservation(http, lab):
    _, operator, nodes = lab
    session = start_session(http)
    gpu = held_gpu(session["id"])
    moved = without(nodes, node_names={gpu.node.name})
    (other,) = moved["nodes"]
    other["devices"].append({**next(d for n in nodes for d in n["devices"] if d["uuid"] == gpu.uuid), "index": 9})
    body = operator.put("/internal/v1/inventory", json=moved).json()
    assert (body["nodes_removed"], body["gpus_removed"], body["nodes_missing"], body["gpus_missing"]) == (1, 7, 0, 0)
    now = held_gpu(session["id"])
    assert now.pk == gpu.pk and now.node.name == other["name"] and now.used_count == 1
