"""``POST /internal/v1/status``: scope, idempotence, out-of-order reports, terminal phases."""

from datetime import UTC, datetime, timedelta

import pytest

from clusters.operator_token.tokens import operator_token_mint
from sessions.models import Allocation, Session
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)


def at(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


@pytest.fixture
def placed(django_user_model, silent_listener):
    """A Starting session on a factory cluster (its apply is skipped: we set the phase directly)."""
    owner = django_user_model.objects.create_user("bob")
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster, name="gpu-a")
    GpuDeviceFactory(node=node, cluster=cluster, uuid="GPU-aaaa")
    session = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.STARTING, node="gpu-a")
    Allocation.objects.create(session=session, device=node.devices.get(), memory_mib=1, cores=1, exclusive=True)
    return session


@pytest.fixture
def operator(http_for, placed):
    return http_for(operator_token_mint(cluster_id=placed.cluster.public_id))


def report(session, phase, seconds, **extra):
    return {"session": session.public_id, "phase": phase, "observed_at": at(seconds), **extra}


def test_running_then_succeeded(operator, placed):
    body = operator.post("/internal/v1/status", json={"reports": [report(placed, "Running", 1, node="gpu-a", devices=["GPU-aaaa"])]}).json()
    assert body["applied"] == 1 and "server_time" in body
    placed.refresh_from_db()
    assert placed.phase == "Running" and placed.devices == ["GPU-aaaa"] and placed.started_at == T0 + timedelta(seconds=1)
    operator.post("/internal/v1/status", json={"reports": [report(placed, "Succeeded", 5, message="exit 0")]})
    placed.refresh_from_db()
    assert placed.phase == "Terminated" and placed.ended_at == T0 + timedelta(seconds=5)
    assert Allocation.objects.count() == 0


def test_reports_are_idempotent_and_order_tolerant(operator, placed):
    batch = {"reports": [report(placed, "Failed", 9, message="OOMKilled"), report(placed, "Running", 3)]}
    assert operator.post("/internal/v1/status", json=batch).json()["applied"] == 2
    assert operator.post("/internal/v1/status", json=batch).json() ["ignored"] == 2  # same batch again
    late = operator.post("/internal/v1/status", json={"reports": [report(placed, "Running", 20)]}).json()
    assert late["ignored"] == 1  # a late Running never revives a Failed session
    placed.refresh_from_db()
    assert placed.phase == "Failed" and placed.message == "OOMKilled"


def test_late_running_does_not_revive_a_stopping_session(operator, placed):
    Session.objects.filter(pk=placed.pk).update(phase=Session.Phase.STOPPING)
    operator.post("/internal/v1/status", json={"reports": [report(placed, "Running", 2)]})
    placed.refresh_from_db()
    assert placed.phase == "Stopping"
    operator.post("/internal/v1/status", json={"reports": [report(placed, "Terminated", 3)]})
    placed.refresh_from_db()
    assert placed.phase == "Terminated"


def test_another_clusters_session_refuses_the_whole_batch(http_for, placed):
    other = ClusterFactory()
    foreign = http_for(operator_token_mint(cluster_id=other.public_id))
    own = Session.objects.create(owner=placed.owner, cluster=other, image="img", gpus=1, phase=Session.Phase.STARTING)
    response = foreign.post("/internal/v1/status", json={"reports": [report(own, "Running", 1), report(placed, "Failed", 1)]})
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden_cluster_scope"
    assert placed.public_id in response.json()["detail"]
    own.refresh_from_db()
    placed.refresh_from_db()
    assert own.phase == "Starting" and placed.phase == "Starting"


@pytest.mark.parametrize(
    "bad",
    [{"reports": [{"session": "ses_x", "phase": "Exploded", "observed_at": "2026-11-29T16:00:00Z"}]},
     {"reports": [{"session": "ses_x", "phase": "Running", "observed_at": "yesterday"}]},
     {"reports": [{"session": "ses_x", "phase": "Running", "observed_at": "2026-11-29T16:00:00"}]},
     {"reports": "nope"}, {}],
)
def test_malformed_reports_are_400(operator, bad):
    response = operator.post("/internal/v1/status", json=bad)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_status"
