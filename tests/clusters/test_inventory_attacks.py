"""Inventory attacked: bodies only the schema's reader accepts, text hostile to COPY, values longer than their columns,
another cluster's token replaying a digest, a snapshot racing a deregistration, and a snapshot dropping GPUs while
sessions are placed on them. Real PostgreSQL; the races run in threads, each on its own connection."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import services
from clusters.internal.schemas import inventory_errors, inventory_read
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_token.tokens import operator_token_mint
from contract import inventory_digest
from core.exceptions import Conflict
from sessions.create import session_create
from sessions.lifecycle import outbox
from sessions.models import Allocation, Session
from tests.clusters.test_inventory import snapshot
from tests.factories import ClusterFactory
from tests.helpers import Http, run_threads
from tests.sessions.test_placement import recount, stored

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def cluster():
    return ClusterFactory(status=Cluster.Status.PENDING)


@pytest.fixture
def operator(http_for, cluster) -> Http:
    return http_for(operator_token_mint(cluster_id=cluster.public_id))


def devices(cluster) -> dict[str, tuple]:
    return {row[0]: row[1:] for row in GpuDevice.objects.filter(cluster=cluster).values_list(
        "uuid", "node__name", "index", "model", "memory_mib", "split_count", "cores", "health", "mode")}


@pytest.mark.django_db
def test_integers_written_as_integral_numbers_are_stored_as_integers(operator, cluster):
    """The schema's ``integer`` admits ``1.0`` and ``8.1559e4`` (the fast reader does not, so the schema judges
    them): such a snapshot is applied, not a 500 from COPY's integer columns."""
    body = snapshot(1)
    raw = json.dumps(body).replace('"index": 1,', '"index": 1.0,', 1).replace("81559", "8.1559e4", 1).replace(
        '"split_count": 10', '"split_count": 10.0', 1).replace('"cores": 100', '"cores": 1e2', 1)
    assert inventory_read(raw.encode()) is None and inventory_errors(json.loads(raw)) == []
    response = operator.put("/internal/v1/inventory", data=raw, headers=JSON)
    assert response.status_code == 200, response.text
    stored_rows = devices(cluster)
    assert stored_rows["GPU-a00000-0"][3:6] == (81559, 10, 100) and stored_rows["GPU-a00000-1"][1] == 1
    assert operator.put("/internal/v1/inventory", json=snapshot(1)).status_code == 200  # the same values: nothing new


@pytest.mark.django_db
def test_a_gpu_mode_label_longer_than_its_column_is_cut_not_a_500(operator, cluster):
    body = snapshot(1)
    body["nodes"][0]["labels"]["gshare.io/gpu-mode"] = "m" * 63  # a label value may be 63 characters
    response = operator.put("/internal/v1/inventory", json=body)
    assert response.status_code == 200, response.text
    node = Node.objects.get(cluster=cluster)
    assert node.gpu_mode == "m" * 32 and node.labels["gshare.io/gpu-mode"] == "m" * 63


@pytest.mark.django_db
def test_text_hostile_to_copy_is_stored_exactly(operator, cluster):
    """Tabs, newlines, carriage returns, backslashes, ``\\.`` and ``\\N`` in every text field COPY writes."""
    hostile = "a\tb\nc\r\\.\n\\N\\"
    body = snapshot(2)
    node = body["nodes"][0]
    node.update(name="n" + hostile, hami_error=hostile)
    node["labels"].update({"k" + hostile: hostile, "gshare.io/gpu-mode": "\\."})
    node["devices"][0].update(uuid="GPU-" + hostile, model=hostile, mode="\\N")
    node["devices"][1].update(uuid="\\.")
    response = operator.put("/internal/v1/inventory", json={**body, "digest": inventory_digest(body["nodes"])})
    assert response.status_code == 200, response.text
    stored_node = Node.objects.get(cluster=cluster, name="n" + hostile)
    assert (stored_node.inventory_error, stored_node.labels["k" + hostile], stored_node.gpu_mode) == (hostile, hostile, "\\.")
    rows = devices(cluster)
    assert rows["GPU-" + hostile][:5] == ("n" + hostile, 0, hostile, 81559, 10) and rows["GPU-" + hostile][-1] == "\\N"
    assert rows["\\."][0] == "n" + hostile and len(rows) == 16
    # Unchanged: the same hostile snapshot writes nothing new and is confirmed by its digest.
    assert operator.put("/internal/v1/inventory", json={**body, "digest": inventory_digest(body["nodes"])}).status_code == 200
    assert devices(cluster) == rows
    assert operator.put("/internal/v1/inventory", json={"digest": inventory_digest(body["nodes"])}).status_code == 200


@pytest.mark.django_db
def test_a_digest_with_a_trailing_newline_is_refused(operator, cluster):
    """``$`` in the digest's pattern matches before a final newline: the length rule refuses it, in both readers."""
    nodes = snapshot(1)["nodes"]
    digest = inventory_digest(nodes)
    for body in ({"nodes": nodes, "digest": digest + "\n"}, {"digest": digest + "\n"}):
        response = operator.put("/internal/v1/inventory", json=body)
        assert (response.status_code, response.json()["code"]) == (400, "invalid_inventory"), response.text
    assert not Node.objects.filter(cluster=cluster).exists()


@pytest.mark.django_db
def test_deregistration_forgets_the_inventory_digest(operator, cluster):
    nodes = snapshot(1)["nodes"]
    assert operator.put("/internal/v1/inventory", json={"nodes": nodes, "digest": inventory_digest(nodes)}).status_code == 200
    services.cluster_deregister(cluster=cluster)
    cluster.refresh_from_db()
    assert cluster.inventory_digest == ""


@pytest.mark.django_db
def test_another_clusters_token_replaying_a_digest_is_refused_and_changes_nothing(http_for, operator, cluster):
    nodes = snapshot(2)["nodes"]
    digest = operator.put("/internal/v1/inventory", json={"nodes": nodes, "digest": inventory_digest(nodes)}).json()["digest"]
    other = ClusterFactory(name="other")
    other_operator = http_for(operator_token_mint(cluster_id=other.public_id))
    response = other_operator.put("/internal/v1/inventory", json={"digest": digest})
    assert response.status_code == 409 and response.json()["code"] == "inventory_snapshot_required"
    other.refresh_from_db()
    assert other.inventory_digest == "" and other.last_heartbeat_at is None
    assert not Node.objects.filter(cluster=other).exists() and len(devices(cluster)) == 16
    # A token whose payload names the cluster but whose signature is another token's: 401, nothing recorded.
    own, foreign = operator_token_mint(cluster_id=cluster.public_id), operator_token_mint(cluster_id=other.public_id)
    forged = ".".join([foreign.split(".")[0], own.split(".")[1], foreign.split(".")[2]])
    response = http_for(forged).put("/internal/v1/inventory", json={"digest": digest})
    assert response.status_code == 401 and response.json()["code"] == "token_invalid"


_INT32 = 2**31 - 1
_strings = st.one_of(st.text(max_size=4), st.sampled_from([
    "", "\x00", "\ud800", "\U0001F600" * 128, "\U0001F600" * 129, "x" * 32, "x" * 33, "x" * 64, "x" * 65, "x" * 253, "x" * 254,
    "2026-11-29T16:00:00Z", "2026-11-29T16:00:00", "sha256:" + "a" * 64 + "\n", "sha256:" + "A" * 64, "\\u0000"]))
_anything = st.recursive(
    st.one_of(st.sampled_from([0, -1, _INT32, _INT32 + 1, 2**64, 1.0, 1.5, -0.0]), st.integers(), st.floats(allow_nan=False),
              _strings, st.booleans(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(_strings, inner, max_size=2)), max_leaves=4)


def _field(good):
    return st.one_of(good, good, good, _anything)


_device = st.fixed_dictionaries(
    {"uuid": _field(st.sampled_from(["GPU-1", "GPU-2"])), "index": _field(st.just(0)), "model": _field(st.just("H100")),
     "memory_mib": _field(st.just(81559)), "split_count": _field(st.just(10)), "cores": _field(st.just(100)),
     "health": _field(st.just(True))},
    optional={"mode": _field(st.sampled_from(["hami-core", None])), "extra": _anything})
_node = st.fixed_dictionaries(
    {"name": _field(st.sampled_from(["n1", "n2"])), "ready": _field(st.just(True)), "devices": _field(st.lists(_device, max_size=2))},
    optional={"labels": _field(st.dictionaries(_strings, _strings, max_size=2)), "hami_error": _field(_strings)})
_check = st.fixed_dictionaries({"ok": _field(st.booleans()), "detail": _field(_strings), "checked_at": _field(st.just("2026-11-29T16:00:00Z"))})
_body = st.fixed_dictionaries({}, optional={
    "nodes": _field(st.lists(_node, max_size=3)), "digest": _field(st.just("sha256:" + "0" * 64)),
    "checks": _field(st.dictionaries(_strings, _check, max_size=2)), "unknown": _anything})


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(_body, st.booleans())
def test_the_fast_reader_never_accepts_a_body_the_schemas_reader_refuses(body, ascii_only):
    """Near-valid bodies, each field sometimes replaced by anything (bounds, floats, NUL, surrogates, nesting), keys
    the schema does not name included: whatever the fast reader accepts, ``inventory_errors`` accepts too."""
    try:
        raw = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    except (ValueError, OverflowError):
        return
    fast = inventory_read(raw)
    if fast is not None:
        parsed = json.loads(raw)
        assert inventory_errors(parsed) == [], raw
        assert fast.get("digest") == parsed.get("digest") and len(fast.get("nodes") or []) == len(parsed.get("nodes") or []), raw


def test_an_escaped_nul_in_a_key_the_fast_reader_drops_is_left_to_the_schemas_reader():
    raw = b'{"nodes": [], "unknown": "\\u0000"}'
    assert inventory_read(raw) is None
    assert inventory_errors(json.loads(raw)) == ["unknown: contains a NUL character or an unpaired surrogate, which cannot be stored"]


@pytest.mark.django_db(transaction=True)
def test_snapshots_racing_a_deregistration_leave_nothing_of_the_cluster(live_server):
    for round_ in range(4):
        cluster = ClusterFactory(name=f"dereg-{round_}")
        operator = Http(live_server.url, operator_token_mint(cluster_id=cluster.public_id))
        assert operator.put("/internal/v1/inventory", json=snapshot(5, prefix=f"d{round_}x")).status_code == 200
        barrier, answers, errors = threading.Barrier(2), [], []

        def report(operator=operator, barrier=barrier, answers=answers, round_=round_):
            barrier.wait()
            for i in range(3):
                body = snapshot(5 + i, prefix=f"d{round_}x")
                answers.append(operator.put("/internal/v1/inventory", json={**body, "digest": inventory_digest(body["nodes"])}))

        def deregister(cluster=cluster, barrier=barrier, errors=errors):
            try:
                barrier.wait()
                services.cluster_deregister(cluster=cluster)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(repr(exc))
            finally:
                connections.close_all()

        run_threads(lambda f: f(), [(report,), (deregister,)], timeout=60)
        assert errors == []
        for answer in answers:
            assert answer.status_code == 200 or (answer.status_code, answer.json()["code"]) in {
                (409, "cluster_deregistered"), (401, "cluster_deregistered"), (401, "token_revoked")}, answer.text
        assert Cluster.objects.get(pk=cluster.pk).status == Cluster.Status.DEREGISTERED
        assert not Node.objects.filter(cluster=cluster).exists() and not GpuDevice.objects.filter(cluster=cluster).exists()


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_dropping_gpus_while_sessions_are_placed_on_them_keeps_every_held_gpu(django_user_model, monkeypatch):
    """A creator places whole-GPU sessions on the cluster while its operator alternately drops and restores a node:
    a GPU a live session holds is kept (missing) by the snapshot, never deleted under the session; a dropped GPU is
    never reserved; the counters equal a recount."""
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    cluster = ClusterFactory(name="shrinking")
    full_nodes = snapshot(2, gpus_per_node=4, prefix="s")["nodes"]
    services.inventory_apply(cluster=cluster, nodes=full_nodes)
    owner = django_user_model.objects.create_user("placer")
    barrier, errors, placed = threading.Barrier(2), [], []

    def create():
        try:
            barrier.wait()
            for _ in range(8):
                try:
                    placed.append(session_create(owner=owner, image="img", gpus=1, cluster="shrinking"))
                except Conflict as exc:
                    assert exc.code in ("no_capacity", "placement_contended"), exc.code
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    def report():
        try:
            barrier.wait()
            for i in range(8):
                services.inventory_apply(cluster=cluster, nodes=full_nodes[:1] if i % 2 == 0 else full_nodes)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    run_threads(lambda f: f(), [(create,), (report,)], timeout=120)
    assert errors == []
    services.inventory_apply(cluster=cluster, nodes=full_nodes[:1])  # the node gone for good
    live = Session.objects.exclude(phase__in=Session.TERMINAL_PHASES)
    held = set(Allocation.objects.filter(session__in=live).values_list("device__uuid", flat=True))
    assert len(held) == Allocation.objects.count() == live.count() == len(placed)
    kept = set(GpuDevice.objects.filter(cluster=cluster).values_list("uuid", flat=True))
    assert held <= kept
    assert kept == {d["uuid"] for d in full_nodes[0]["devices"]} | held
    assert all(not d.health and d.missing_since for d in GpuDevice.objects.filter(uuid__in=held - {d["uuid"] for d in full_nodes[0]["devices"]}))
    assert stored() == recount()
