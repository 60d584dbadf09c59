"""Inventory at fleet scale: digest-only reports, rows written only when changed, a 1,000-node snapshot's query count,
GPU UUIDs claimed by racing clusters, snapshots of different clusters not waiting for each other, and the fast body
reader never accepting what the contract's schema refuses."""

from __future__ import annotations

import copy
import json
import threading

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from clusters import services
from clusters.internal.schemas import inventory_errors, inventory_read
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_token.tokens import operator_token_mint
from contract import inventory_digest
from sessions import placement
from sessions.models import Allocation
from tests.clusters.test_inventory import snapshot
from tests.factories import ClusterFactory, SessionFactory
from tests.helpers import Http, run_threads

pytestmark = pytest.mark.django_db

CHECKS = {"session_domain_resolves": {"ok": True, "detail": "resolves", "checked_at": "2026-11-29T16:00:00Z"}}


def full(nodes: list[dict], **extra) -> dict:
    return {"nodes": nodes, "digest": inventory_digest(nodes), **extra}


def row_versions(cluster: Cluster) -> dict[str, str]:
    """Each GPU's and node's physical row version (``ctid``): an UPDATE writes a new one, even to equal values."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT uuid, ctid::text FROM clusters_gpudevice WHERE cluster_id = %s "
                       "UNION ALL SELECT name, ctid::text FROM clusters_node WHERE cluster_id = %s", [cluster.pk, cluster.pk])
        return dict(cursor.fetchall())


@pytest.fixture
def cluster():
    return ClusterFactory(status=Cluster.Status.PENDING)


@pytest.fixture
def operator(http_for, cluster) -> Http:
    return http_for(operator_token_mint(cluster_id=cluster.public_id))


def test_a_digest_only_report_confirms_the_recorded_snapshot_and_counts_as_a_heartbeat(operator, cluster):
    nodes = snapshot(3)["nodes"]
    first = operator.put("/internal/v1/inventory", json=full(nodes)).json()
    assert first["digest"] == inventory_digest(nodes) and first["unchanged"] is False and first["gpus"] == 24
    cluster.refresh_from_db()
    beat, versions = cluster.last_heartbeat_at, row_versions(cluster)
    response = operator.put("/internal/v1/inventory", json={"digest": first["digest"], "checks": CHECKS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["unchanged"] is True and body["digest"] == first["digest"] and "gpus" not in body
    assert body["session_domain"] == cluster.session_domain and "server_time" in body
    cluster.refresh_from_db()
    assert cluster.last_heartbeat_at > beat and cluster.status == Cluster.Status.CONNECTED
    assert cluster.operator_checks == CHECKS
    assert row_versions(cluster) == versions
    node = Node.objects.select_related("cluster").get(cluster=cluster, name="gpu-node-0000")
    assert node.reported_at == cluster.last_heartbeat_at  # listed, so last reported by the confirmation


def test_a_digest_other_than_the_recorded_one_asks_for_the_full_snapshot_and_changes_nothing(operator, cluster):
    nodes = snapshot(2)["nodes"]
    operator.put("/internal/v1/inventory", json=full(nodes))
    cluster.refresh_from_db()
    before = (cluster.last_heartbeat_at, cluster.operator_checks, row_versions(cluster))
    changed = copy.deepcopy(nodes)
    changed[0]["ready"] = False
    response = operator.put("/internal/v1/inventory", json={"digest": inventory_digest(changed), "checks": CHECKS})
    assert response.status_code == 409
    assert response.json()["code"] == "inventory_snapshot_required"
    assert "full snapshot" in response.json()["detail"]
    cluster.refresh_from_db()
    assert (cluster.last_heartbeat_at, cluster.operator_checks, row_versions(cluster)) == before


def test_a_snapshot_without_a_digest_records_none(operator, cluster):
    nodes = snapshot(1)["nodes"]
    assert operator.put("/internal/v1/inventory", json={"nodes": nodes}).json()["digest"] == ""
    response = operator.put("/internal/v1/inventory", json={"digest": inventory_digest(nodes)})
    assert response.status_code == 409 and response.json()["code"] == "inventory_snapshot_required"


def test_a_snapshot_that_leaves_a_held_gpu_missing_records_no_digest(operator, cluster):
    """Only a full snapshot decides when a kept GPU goes, so until then every report must be one."""
    nodes = snapshot(2)["nodes"]
    operator.put("/internal/v1/inventory", json=full(nodes))
    device = GpuDevice.objects.get(uuid="GPU-a00001-0")
    Allocation.objects.create(session=SessionFactory(cluster=cluster), device=device, memory_mib=100, cores=1)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    smaller = nodes[:1]
    body = operator.put("/internal/v1/inventory", json=full(smaller)).json()
    assert (body["gpus_missing"], body["digest"]) == (1, "")
    assert Cluster.objects.get(pk=cluster.pk).inventory_digest == ""
    response = operator.put("/internal/v1/inventory", json={"digest": inventory_digest(smaller)})
    assert response.status_code == 409 and response.json()["code"] == "inventory_snapshot_required"
    missing = GpuDevice.objects.select_related("cluster").get(pk=device.pk)
    assert missing.missing_since is not None and missing.reported_at == missing.last_seen_at < Cluster.objects.get(pk=cluster.pk).last_heartbeat_at


def test_an_unchanged_full_snapshot_writes_no_row_and_a_change_writes_only_its_rows(operator, cluster):
    nodes = snapshot(4)["nodes"]
    operator.put("/internal/v1/inventory", json=full(nodes))
    versions = row_versions(cluster)
    assert operator.put("/internal/v1/inventory", json=full(nodes)).status_code == 200
    assert row_versions(cluster) == versions
    changed = copy.deepcopy(nodes)
    changed[1]["devices"][2]["health"] = False
    changed[3]["labels"]["extra"] = "x"
    assert operator.put("/internal/v1/inventory", json=full(changed)).status_code == 200
    after = row_versions(cluster)
    # gpu-node-0001: its placement summary (one healthy GPU fewer) changed with its GPU.
    assert {key for key in versions if after[key] != versions[key]} == {"GPU-a00001-2", "gpu-node-0001", "gpu-node-0003"}
    assert GpuDevice.objects.get(uuid="GPU-a00001-2").health is False
    assert Node.objects.get(cluster=cluster, name="gpu-node-0003").labels["extra"] == "x"


def test_query_count_is_the_same_for_10_and_1000_nodes():
    cluster = ClusterFactory()
    services.inventory_apply(cluster=cluster, nodes=snapshot(3, prefix="warm")["nodes"])
    counts = {}
    for n in (10, 1000):
        with CaptureQueriesContext(connection) as queries:
            result = services.inventory_apply(cluster=cluster, nodes=snapshot(n, prefix=f"q{n}")["nodes"])
        counts[n] = len(queries)
        assert result.gpus == n * 8
    assert GpuDevice.objects.filter(cluster=cluster).count() == 1000 * 8
    assert counts[10] == counts[1000], counts
    assert counts[1000] <= 8
    digest = inventory_digest(snapshot(1000, prefix="q1000")["nodes"])
    services.inventory_apply(cluster=cluster, nodes=snapshot(1000, prefix="q1000")["nodes"], digest=digest)
    with CaptureQueriesContext(connection) as queries:
        services.inventory_confirm(cluster=cluster, digest=digest)
    statements = [q["sql"] for q in queries if "SAVEPOINT" not in q["sql"]]  # the test's transaction makes atomic() a savepoint
    assert len(statements) == 2, statements  # the cluster's row lock, the heartbeat


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: (s.pop("nodes"), s.pop("digest")),
        lambda s: s["nodes"][0]["devices"][0].update(memory_mib="lots"),
        lambda s: s["nodes"][0]["devices"][0].update(memory_mib=True),
        lambda s: s["nodes"][0]["devices"][0].update(memory_mib=-1),
        lambda s: s["nodes"][0]["devices"][0].update(cores=2**31),
        lambda s: s["nodes"][0]["devices"][0].update(split_count=0),
        lambda s: s["nodes"][0]["devices"][0].update(uuid=""),
        lambda s: s["nodes"][0]["devices"][0].update(uuid="x" * 129),
        lambda s: s["nodes"][0]["devices"][0].update(mode="m" * 33),
        lambda s: s["nodes"][0]["devices"][0].pop("health"),
        lambda s: s["nodes"][0].update(ready="yes"),
        lambda s: s["nodes"][0].update(labels={"a": 1}),
        lambda s: s["nodes"][0].update(name="n\x00"),
        lambda s: s["nodes"][0]["labels"].update({"k\ud800": "v"}),
        lambda s: s["nodes"][0].update(devices=s["nodes"][0]["devices"] * 9),
        lambda s: s["nodes"].append(dict(s["nodes"][0])),
        lambda s: s["nodes"][1]["devices"].append(dict(s["nodes"][0]["devices"][0])),
        lambda s: s.update(digest="md5:abc"),
        lambda s: s.update(digest="sha256:" + "A" * 64),
        lambda s: s.update(checks={"x": {"ok": True, "detail": "", "checked_at": "yesterday"}}),
        lambda s: s.update(checks={"x" * 65: {"ok": True, "detail": "", "checked_at": "2026-11-29T16:00:00Z"}}),
        lambda s: s.update(checks={"x": {"ok": True, "detail": "d" * 1001, "checked_at": "2026-11-29T16:00:00Z"}}),
        lambda s: s.update(checks={f"c{i}": {"ok": True, "detail": "", "checked_at": "2026-11-29T16:00:00Z"} for i in range(17)}),
        lambda s: s.update(nodes={"a": 1}),
    ],
)
def test_the_fast_reader_never_accepts_what_the_schema_refuses(mutate):
    body = full(snapshot(2)["nodes"], checks=CHECKS)
    assert inventory_read(json.dumps(body).encode()) == json.loads(json.dumps(body))
    mutate(body)
    raw = json.dumps(body).encode("utf-8", "surrogatepass")
    assert inventory_errors(json.loads(raw)), "the case should be invalid"
    assert inventory_read(raw) is None


def test_the_fast_reader_accepts_a_digest_only_report_and_drops_unknown_keys():
    digest = inventory_digest([])
    assert inventory_read(json.dumps({"digest": digest, "newer": 1}).encode()) == {"digest": digest}
    assert inventory_read(b'{"checks": {}}') is None and inventory_errors({"checks": {}})


# --- Concurrency on real PostgreSQL: committed transactions, one connection per thread ---


def _contested(prefix: str, own: int) -> list[dict]:
    """``own`` nodes of the cluster's own GPUs (``prefix``), then a node with GPUs both clusters claim."""
    nodes = snapshot(own, prefix=prefix, node_prefix=f"{prefix}-node")["nodes"]
    claimed = snapshot(1, prefix="shared", node_prefix=f"{prefix}-shared")["nodes"]
    return nodes + claimed


@pytest.mark.django_db(transaction=True)
def test_two_clusters_racing_to_claim_the_same_gpus_one_wins_the_other_changes_nothing(live_server):
    clusters = [ClusterFactory(name=f"race-{i}") for i in range(2)]
    operators = [Http(live_server.url, operator_token_mint(cluster_id=c.public_id)) for c in clusters]
    for prefix, operator in zip("ab", operators, strict=True):  # each cluster's own GPUs first
        assert operator.put("/internal/v1/inventory", json=full(snapshot(20, prefix=prefix, node_prefix=f"{prefix}-node")["nodes"])).status_code == 200
    for round_ in range(5):
        bodies = [full(_contested(prefix, 20 + round_)) for prefix in "ab"]
        before = {c.pk: (sorted(GpuDevice.objects.filter(cluster=c).values_list("uuid", "node__name", "health")),
                         sorted(Node.objects.filter(cluster=c).values_list("name", "ready"))) for c in clusters}
        barrier = threading.Barrier(2)
        responses: list = [None, None]

        def send(index: int, barrier=barrier, responses=responses, bodies=bodies) -> None:
            barrier.wait()
            responses[index] = operators[index].put("/internal/v1/inventory", json=bodies[index])

        run_threads(send, [(0,), (1,)], timeout=60)
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200, 403], [r.text for r in responses]
        (loser,) = [i for i, r in enumerate(responses) if r.status_code == 403]
        assert responses[loser].json()["code"] == "forbidden_cluster_scope"
        winner = clusters[1 - loser]
        assert set(GpuDevice.objects.filter(uuid__startswith="GPU-shared").values_list("cluster_id", flat=True)) == {winner.pk}
        loser_rows = (sorted(GpuDevice.objects.filter(cluster=clusters[loser]).values_list("uuid", "node__name", "health")),
                      sorted(Node.objects.filter(cluster=clusters[loser]).values_list("name", "ready")))
        assert loser_rows == before[clusters[loser].pk]  # its own new nodes and GPUs of this round were not kept either
        # Give the contested GPUs back: the winner reports without them.
        winner_operator = operators[1 - loser]
        own = snapshot(20 + round_, prefix="ab"[1 - loser], node_prefix=f"{'ab'[1 - loser]}-node")["nodes"]
        assert winner_operator.put("/internal/v1/inventory", json=full(own)).status_code == 200
        assert not GpuDevice.objects.filter(uuid__startswith="GPU-shared").exists()


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_does_not_wait_for_another_clusters_open_snapshot():
    """The fleet-wide lock is gone: while cluster A's snapshot transaction is open (its row lock held), cluster B's
    snapshot commits. With a fleet-wide lock B would wait for A (and hit the lock timeout here)."""
    a, b = ClusterFactory(name="open-a"), ClusterFactory(name="open-b")
    a_applied, release, b_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold_a() -> None:
        try:
            with transaction.atomic():
                services.inventory_apply(cluster=a, nodes=snapshot(50, prefix="a")["nodes"])
                a_applied.set()
                release.wait(30)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    def apply_b() -> None:
        try:
            assert a_applied.wait(30)
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '10s'")
                services.inventory_apply(cluster=b, nodes=snapshot(50, prefix="b")["nodes"])
            b_done.set()
        except BaseException as exc:
            errors.append(exc)
        finally:
            release.set()
            connections.close_all()

    run_threads(lambda fn: fn(), [(hold_a,), (apply_b,)], timeout=60)
    assert not errors, errors
    assert b_done.is_set()
    assert GpuDevice.objects.filter(cluster=b).count() == 400 and GpuDevice.objects.filter(cluster=a).count() == 400
