"""A session's CPU and memory (``sessions.resources``): ``cpu`` and ``memory_gib`` on ``POST /api/v1/sessions``, the policy's
defaults and maxima per GPU, the audit row, the idempotency fingerprint, the policy's own checks, and hostile input (always
400 with a code, never a 500, never a half-created session). Placement's fit of CPU and memory on the node is
``tests/sessions/test_placement_resources.py``."""

from decimal import Decimal

import pytest

from audit.models import AuditRecord
from billing import admission
from billing.services import policy_set
from core.exceptions import ApplicationError
from identity.tokens import api_token_create
from sessions import create, placement
from sessions.lifecycle import outbox
from sessions.manifests import gshare_session_manifest
from sessions.models import Session
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, UserFactory

pytestmark = pytest.mark.django_db

IMAGE = "quay.io/jupyter/base-notebook"


@pytest.fixture(autouse=True)
def no_cluster_calls(monkeypatch):
    """The factory cluster's apiserver is never dialled: applies are not published (sessions stay Scheduled)."""
    monkeypatch.setattr(outbox, "publish_after_commit", lambda *args, **kwargs: None)


@pytest.fixture(autouse=True)
def fleet():
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster)
    for i in range(4):
        GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=16000, cores=100)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster


@pytest.fixture
def alice(plain_user):
    policy_set(user=plain_user, min_balance_hours=Decimal(0), default_cpu_per_gpu=Decimal(4), default_memory_gib_per_gpu=Decimal(16),
               max_cpu_per_gpu=Decimal(8), max_memory_gib_per_gpu=Decimal(64))
    return plain_user


@pytest.fixture
def alice_http(http_for, alice):
    return http_for(api_token_create(username=alice.username)[1])


def start(http, **body):
    return http.post("/api/v1/sessions", json={"image": IMAGE, "gpus": 1, **body})


# --------------------------------------------------------------------------- the request


def test_omitted_cpu_and_memory_are_the_policys_defaults_per_gpu(alice_http):
    response = start(alice_http, gpus=2)
    assert response.status_code == 201, response.text
    body = response.json()
    assert (Decimal(body["cpu"]), Decimal(body["memory_gib"])) == (Decimal(8), Decimal(32))
    session = Session.objects.get(public_id=body["id"])
    assert (session.cpu, session.memory_gib) == (Decimal(8), Decimal(32))


def test_asked_cpu_and_memory_are_stored_shown_and_audited(alice_http):
    response = start(alice_http, cpu="0.5", memory_gib=2.25)
    assert response.status_code == 201, response.text
    body = response.json()
    assert (Decimal(body["cpu"]), Decimal(body["memory_gib"])) == (Decimal("0.5"), Decimal("2.25"))
    session = Session.objects.get(public_id=body["id"])
    assert (session.cpu, session.memory_gib) == (Decimal("0.5"), Decimal("2.25"))
    record = AuditRecord.objects.filter(action="session_create").latest("pk")
    assert Decimal(record.changes["cpu"]["new"]) == Decimal("0.5") and Decimal(record.changes["memory_gib"]["new"]) == Decimal("2.25")
    listed = alice_http.get("/api/v1/sessions").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert Decimal(rows[0]["cpu"]) == Decimal("0.5")


def test_the_maximum_is_per_gpu_times_the_gpus(alice_http):
    assert start(alice_http, gpus=2, cpu=16, memory_gib=128).status_code == 201


@pytest.mark.parametrize(("field", "value", "code", "limit"), [
    ("cpu", "8.001", "cpu_over_limit", "max_cpu"),
    ("cpu", 9, "cpu_over_limit", "max_cpu"),
    ("memory_gib", 65, "memory_over_limit", "max_memory_gib"),
])
def test_over_the_policys_maximum_is_400_naming_the_limit(alice_http, field, value, code, limit):
    response = start(alice_http, **{field: value})
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == code and f"max_{field.split('_')[0]}" in body["detail"] and limit in body
    assert not Session.objects.exists()


@pytest.mark.parametrize("value", [0, -1, "0", "-0.5", "NaN", "nan", "Infinity", "-Infinity", "1e400", "1e-400", "1.2345", "0.0001",
                                   True, False, [], {}, "", " ", "1_0", "٤", "4 cores", 10**9, "9" * 40, 1e308, 4097])
@pytest.mark.parametrize("field", ["cpu", "memory_gib"])
def test_hostile_values_are_invalid_request(alice_http, field, value):
    if field == "memory_gib" and value == 4097:
        value = 65537
    response = start(alice_http, **{field: value})
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_request" and field in response.json()["detail"]
    assert not Session.objects.exists()


def test_null_is_the_default(alice_http):
    response = start(alice_http, cpu=None, memory_gib=None)
    assert response.status_code == 201, response.text
    assert Decimal(response.json()["cpu"]) == 4


def test_a_policy_default_of_zero_asks_nothing(plain_user):
    policy_set(user=plain_user, min_balance_hours=Decimal(0), default_cpu_per_gpu=0, default_memory_gib_per_gpu=0)
    session = create.session_create(owner=plain_user, image=IMAGE, gpus=1)
    assert (session.cpu, session.memory_gib) == (None, None)


def test_the_idempotency_fingerprint_counts_cpu_and_memory_only_when_given(alice_http):
    base = {"image": IMAGE, "gpus": 1}
    assert create._fingerprint(base) == create._fingerprint({**base, "cpu": None, "memory_gib": None})
    assert create._fingerprint({**base, "cpu": 4}) == create._fingerprint({**base, "cpu": "4.000"})
    assert create._fingerprint({**base, "cpu": 4}) != create._fingerprint(base)
    first = alice_http.post("/api/v1/sessions", json={**base, "cpu": 2}, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201, first.text
    again = alice_http.post("/api/v1/sessions", json={**base, "cpu": "2.0"}, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = alice_http.post("/api/v1/sessions", json={**base, "cpu": 3}, headers={"Idempotency-Key": "k-1"})
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"


def test_the_gshare_session_carries_millicores_and_mib_only_when_the_session_has_them(alice):
    session = create.session_create(owner=alice, image=IMAGE, gpus=1, cpu="0.25", memory_gib="1.001")
    spec = gshare_session_manifest(session)["spec"]
    assert (spec["cpuMillicores"], spec["memoryMiB"]) == (250, 1026)  # 1.001 GiB = 1025.024 MiB, rounded up
    Session.objects.filter(pk=session.pk).update(cpu=None, memory_gib=None)  # as made before CPU requests
    spec = gshare_session_manifest(Session.objects.select_related("cluster", "owner").get(pk=session.pk))["spec"]
    assert "cpuMillicores" not in spec and "memoryMiB" not in spec


# --------------------------------------------------------------------------- the policy


def test_policy_fields_are_read_by_admission_and_audited():
    user = UserFactory()
    policy_set(user=user)
    policy = admission.policy_for(user)
    assert (policy.default_cpu_per_gpu, policy.max_memory_gib_per_gpu) == (Decimal(4), Decimal(128))
    policy_set(user=user, default_cpu_per_gpu=Decimal("2.5"), max_cpu_per_gpu=Decimal(10), default_memory_gib_per_gpu=Decimal(8),
               max_memory_gib_per_gpu=Decimal(32))
    policy = admission.policy_for(user)
    assert (policy.default_cpu_per_gpu, policy.max_cpu_per_gpu, policy.default_memory_gib_per_gpu, policy.max_memory_gib_per_gpu) == (
        Decimal("2.5"), Decimal(10), Decimal(8), Decimal(32))
    record = AuditRecord.objects.filter(action="policy_update").latest("pk")
    assert {"default_cpu_per_gpu", "max_cpu_per_gpu", "default_memory_gib_per_gpu", "max_memory_gib_per_gpu"} <= set(record.changes)


@pytest.mark.parametrize("field", ["default_cpu_per_gpu", "max_cpu_per_gpu", "default_memory_gib_per_gpu", "max_memory_gib_per_gpu"])
@pytest.mark.parametrize("value", [Decimal(-1), Decimal("NaN"), Decimal("Infinity"), Decimal("1.234"), Decimal(10**6), True, 1.5, "2", None])
def test_policy_refuses_hostile_resource_fields(field, value):
    fields = {"default_cpu_per_gpu": 0, "default_memory_gib_per_gpu": 0, field: value}
    with pytest.raises(ApplicationError) as refused:
        policy_set(user=UserFactory(), **fields)
    assert refused.value.code == "invalid_request" and field in refused.value.detail


@pytest.mark.parametrize(("default", "maximum"), [("default_cpu_per_gpu", "max_cpu_per_gpu"),
                                                  ("default_memory_gib_per_gpu", "max_memory_gib_per_gpu")])
def test_policy_default_must_not_exceed_its_maximum(default, maximum):
    with pytest.raises(ApplicationError) as refused:
        policy_set(user=UserFactory(), **{default: Decimal(9), maximum: Decimal(8)})
    assert refused.value.code == "invalid_request" and default in refused.value.detail and maximum in refused.value.detail
