"""Admission by credits, quota and allowed clusters (billing/admission.py, through sessions.create.session_create
and POST /api/v1/sessions), including concurrent requests that must not overdraw or pass a limit."""

import threading
import time
from decimal import ROUND_CEILING, Decimal

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from billing import admission
from billing.models import CreditAccount, LedgerEntry, Policy, Price
from billing.services import account_for, credit_grant, ledger_append
from core.exceptions import Conflict
from identity.tokens import api_token_create
from sessions import create, lifecycle, placement
from sessions.models import Allocation, Session
from storage.models import StoragePool, Volume
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory
from tests.helpers import Http, lock_waiters

H100, T4 = ("NVIDIA H100 80GB HBM3", 81559), ("Tesla T4", 15360)


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice")


@pytest.fixture(autouse=True)
def production_defaults(settings):
    """The production defaults, not the test suite's (min_balance_hours 0): each test states what it relies on."""
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = 1
    settings.GSHARE_BILLING_DEFAULT_GRACE_SECONDS = 900
    settings.GSHARE_BILLING_DEFAULT_PRICE = Decimal("1.0")


def fleet(name, *models, gpus=2):
    """A connected factory cluster with one node of ``gpus`` GPUs per ``(model, memory_mib)``."""
    cluster = ClusterFactory(name=name)
    for model, memory in models:
        node = NodeFactory(cluster=cluster)
        for i in range(gpus):
            GpuDeviceFactory(node=node, cluster=cluster, index=i, model=model, memory_mib=memory, split_count=10)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster


def grant(user, amount, key="g"):
    credit_grant(user=user, amount=Decimal(amount), reason="test", idempotency_key=f"{user.pk}:{key}", created_by="test")


def policy(user=None, *, clusters=(), **fields):
    row = Policy.objects.create(user=user, **fields)
    row.allowed_clusters.set(clusters)
    return row


# --------------------------------------------------------------------------- policy_for


@pytest.mark.django_db
def test_policy_for_user_row_then_default_row_then_settings(user, django_user_model, settings):
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = 2
    settings.GSHARE_BILLING_DEFAULT_GRACE_SECONDS = 300
    fallback = admission.policy_for(user)
    assert fallback == admission.EffectivePolicy(None, None, None, Decimal(2), 300, "settings", max_volume_gb=500)
    settings.GSHARE_BILLING_DEFAULT_MAX_VOLUME_GB = 0  # no limit
    assert admission.policy_for(user).max_volume_gb is None
    cluster = ClusterFactory()
    policy(max_sessions=3, min_balance_hours=Decimal("0.5"), grace_seconds=60, clusters=[cluster])
    default = admission.policy_for(user)
    assert (default.source, default.max_sessions, default.max_gpus, default.min_balance_hours, default.grace_seconds) == (
        "default", 3, None, Decimal("0.5"), 60)
    assert default.allowed_clusters == frozenset({cluster.pk})
    policy(user, max_gpus=4, max_volume_gb=20)  # a user's row replaces the default whole: null limits are unlimited, no clusters = all
    own = admission.policy_for(user)
    assert (default.max_volume_gb, own.max_volume_gb) == (500, 20)
    assert (own.source, own.max_sessions, own.max_gpus, own.allowed_clusters, own.min_balance_hours, own.grace_seconds) == (
        "user", None, 4, None, Decimal(1), 900)
    other = django_user_model.objects.create_user("bob")
    assert admission.policies_for(user_ids=[user.pk, other.pk]) == {user.pk: own, other.pk: default}


# --------------------------------------------------------------------------- costs


@pytest.mark.django_db
def test_request_cost_takes_the_highest_price_and_the_smallest_memory_of_the_candidates():
    a, b = fleet("alpha", H100), fleet("beta", T4)
    Price.objects.create(gpu_model=H100[0], credits_per_gpu_hour=Decimal("4"))
    Price.objects.create(gpu_model=T4[0], credits_per_gpu_hour=Decimal("1"))
    cost = admission.request_hourly_cost
    assert cost(gpus=2, gpu_memory_mib=None, gpu_cores=None, clusters=[a.pk, b.pk]) == Decimal("8")
    assert cost(gpus=2, gpu_memory_mib=None, gpu_cores=None, clusters=[b.pk]) == Decimal("2")
    # Shared: max(4096 / 15360 (the T4, the smallest), 10 / 100) = 0.266667 of a GPU at the H100's price.
    assert cost(gpus=1, gpu_memory_mib=4096, gpu_cores=10, clusters=[a.pk, b.pk]) == Decimal("1.066668")
    assert cost(gpus=1, gpu_memory_mib=4096, gpu_cores=1, clusters=[a.pk]) == Decimal("0.200884")  # 0.050221 (4096/81559) × 4
    assert cost(gpus=1, gpu_memory_mib=4096, gpu_cores=10, clusters=[a.pk]) == Decimal("0.4")  # cores: 0.1 × 4
    assert cost(gpus=3, gpu_memory_mib=None, gpu_cores=25, clusters=[a.pk]) == Decimal("12")  # no memory: the whole GPU, 3 × 4
    assert cost(gpus=1, gpu_memory_mib=4096, gpu_cores=None, clusters=[a.pk]) == Decimal("4")  # no cores: every SM
    # No GPU on the candidates: the default price (no default row: GSHARE_BILLING_DEFAULT_PRICE), a share asking memory counts 1.
    assert cost(gpus=1, gpu_memory_mib=100, gpu_cores=None, clusters=[]) == Decimal("1")
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("2.5"))
    assert cost(gpus=2, gpu_memory_mib=None, gpu_cores=None, clusters=[]) == Decimal("5")


@pytest.mark.django_db
def test_holds_are_the_live_sessions_hourly_cost_times_the_policys_hours(user):
    fleet("alpha", H100, T4)
    Price.objects.create(gpu_model=H100[0], credits_per_gpu_hour=Decimal("4"))
    Price.objects.create(gpu_model=T4[0], credits_per_gpu_hour=Decimal("1"))
    policy(min_balance_hours=0)
    assert admission.session_holds(user) == 0
    whole = create.session_create(owner=user, image="img", gpus=2)  # binpack: both GPUs of one node
    shared = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=8192, gpu_cores=10)
    ended = create.session_create(owner=user, image="img", gpus=1)
    lifecycle.session_fail(session=ended, message="test")

    def hourly(session):
        total = Decimal(0)
        for a in Allocation.objects.filter(session=session).select_related("device"):
            price = Decimal(4) if a.device.model == H100[0] else Decimal(1)
            share = Decimal(1) if session.whole_gpus else max(Decimal(session.gpu_memory_mib) / a.device.memory_mib, Decimal("0.1"))
            total += price * share.quantize(Decimal("0.000001"))
        return total

    Policy.objects.update(min_balance_hours=Decimal("1.5"))
    expected = ((hourly(whole) + hourly(shared)) * Decimal("1.5")).quantize(Decimal("0.000001"), rounding=ROUND_CEILING)
    assert expected > 0
    assert admission.session_holds(user) == expected


# --------------------------------------------------------------------------- credits


@pytest.mark.django_db
def test_a_balance_below_the_minimum_is_refused_with_the_figures(user):
    fleet("alpha", H100)
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("2"))
    with pytest.raises(admission.InsufficientCredits) as refused:
        create.session_create(owner=user, image="img", gpus=1)
    assert refused.value.status == 402 and refused.value.code == "insufficient_credits"
    assert refused.value.extra == {"balance": "0", "accrued": "0", "holds": "0", "available": "0", "required": "2", "hourly_cost": "2"}
    assert "grant" in refused.value.detail
    assert Session.objects.count() == 0 and Allocation.objects.count() == 0
    grant(user, "3")
    first = create.session_create(owner=user, image="img", gpus=1)  # needs 2, has 3
    with pytest.raises(admission.InsufficientCredits) as second:  # 3 - hold 2 = 1 < 2
        create.session_create(owner=user, image="img", gpus=1)
    assert second.value.extra["holds"] == "2" and second.value.extra["available"] == "1"
    lifecycle.session_fail(session=first, message="test")  # an ended session holds nothing
    create.session_create(owner=user, image="img", gpus=1)


@pytest.mark.django_db
def test_min_balance_hours_zero_admits_any_balance_that_is_not_negative(user, settings):
    fleet("alpha", H100)
    settings.GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = 0
    create.session_create(owner=user, image="img", gpus=1)  # balance 0: admitted
    ledger_append(account=account_for(user), kind=LedgerEntry.Kind.ADJUSTMENT, amount=Decimal("-0.5"), idempotency_key="minus")
    with pytest.raises(admission.InsufficientCredits) as refused:
        create.session_create(owner=user, image="img", gpus=1)
    assert refused.value.extra["balance"] == "-0.5" and "not negative" in refused.value.detail


# --------------------------------------------------------------------------- quota and clusters


@pytest.mark.django_db
def test_max_sessions_and_max_gpus(user, django_user_model):
    fleet("alpha", H100, gpus=8)
    policy(user, max_sessions=2, max_gpus=3, min_balance_hours=0)
    first = create.session_create(owner=user, image="img", gpus=2)
    with pytest.raises(admission.QuotaExceeded) as gpus:
        create.session_create(owner=user, image="img", gpus=2)
    assert gpus.value.status == 403 and gpus.value.code == "quota_exceeded"
    assert gpus.value.extra == {"limit": "max_gpus", "allowed": 3, "current": 2, "requested": 2} and "max_gpus" in gpus.value.detail
    create.session_create(owner=user, image="img", gpus=1)
    with pytest.raises(admission.QuotaExceeded) as sessions:
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=100)
    assert sessions.value.extra["limit"] == "max_sessions" and "max_sessions" in sessions.value.detail
    other = django_user_model.objects.create_user("bob")  # limits are per user (bob: the settings' defaults)
    grant(other, "10")
    create.session_create(owner=other, image="img", gpus=1)
    lifecycle.session_stop(session=first)  # Stopping still counts until it ended
    with pytest.raises(admission.QuotaExceeded):
        create.session_create(owner=user, image="img", gpus=1)
    lifecycle.session_fail(session=first, message="test")
    create.session_create(owner=user, image="img", gpus=1)


@pytest.mark.django_db
def test_allowed_clusters_pin_and_narrow_placement(user):
    alpha, beta = fleet("alpha", H100), fleet("beta", H100)  # binpack's tie-break prefers alpha
    policy(user, min_balance_hours=0, clusters=[beta])
    with pytest.raises(admission.ClusterNotAllowed) as refused:
        create.session_create(owner=user, image="img", gpus=1, cluster="alpha")
    assert refused.value.status == 403 and refused.value.code == "cluster_not_allowed"
    assert "alpha" in refused.value.detail and refused.value.extra == {"allowed_clusters": [beta.public_id]}
    assert create.session_create(owner=user, image="img", gpus=1).cluster == beta
    assert create.session_create(owner=user, image="img", gpus=1, cluster="beta").cluster == beta
    with pytest.raises(Conflict) as full:  # beta's two GPUs taken: alpha is not an option
        create.session_create(owner=user, image="img", gpus=1)
    assert full.value.code == "no_capacity" and "the clusters your policy allows" in full.value.detail
    # A volume whose PVC is on alpha keeps its sessions there, and alpha is not allowed.
    pool = StoragePool.objects.create(name="tank", cluster=alpha, storage_class="nfs", sharing=StoragePool.Sharing.ALL)
    vol = Volume.objects.create(owner=user, pool=pool, name="data", quota_gb=1, cluster=alpha, claim_name="c", status=Volume.Status.BOUND)
    with pytest.raises(admission.ClusterNotAllowed) as by_volume:
        create.session_create(owner=user, image="img", gpus=1, volumes=[vol.public_id])
    assert "volumes" in by_volume.value.detail


@pytest.mark.django_db
def test_the_account_is_created_when_missing_and_kept_only_when_admitted(user):
    fleet("alpha", H100)
    policy(min_balance_hours=0)
    create.session_create(owner=user, image="img", gpus=1)
    assert CreditAccount.objects.get(user=user).balance == 0
    other = type(user).objects.create_user("bob")
    Policy.objects.update(min_balance_hours=1)
    with pytest.raises(admission.InsufficientCredits):
        create.session_create(owner=other, image="img", gpus=1)
    assert not CreditAccount.objects.filter(user=other).exists()  # rolled back with the refusal


@pytest.mark.django_db
def test_admission_adds_a_constant_number_of_queries(django_user_model):
    """Full admission (limits and min_balance_hours > 0) against none at all: the same queries (the account's lock and
    one read of the policy, live sessions, prices and the candidates' GPU models), with 0 or 5 live sessions on 3
    clusters."""
    clusters = [fleet(f"c{i}", H100, T4, gpus=4) for i in range(3)]
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1"))

    def count(owner, **kwargs):
        with CaptureQueriesContext(connection) as queries:
            create.session_create(owner=owner, image="img", gpus=1, gpu_memory_mib=100, **kwargs)
        return len(queries)

    plain = django_user_model.objects.create_user("plain")
    policy(plain, min_balance_hours=0)
    account_for(plain)
    baseline = count(plain)
    full = django_user_model.objects.create_user("full")
    policy(full, max_sessions=20, max_gpus=20, min_balance_hours=1)
    grant(full, "1000")
    counts = [count(full)]
    for cluster in clusters:
        count(full, cluster=cluster.name)
    for _ in range(2):
        counts.append(count(full))
    assert counts[0] == counts[-1] == counts[-2], counts
    assert counts[0] == baseline, (baseline, counts)


# --------------------------------------------------------------------------- HTTP


@pytest.mark.django_db
def test_refusals_through_the_api(http_user, plain_user, live_cluster):
    cluster, _ = live_cluster("lab-c1")
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1.25"))
    body = {"image": "quay.io/jupyter/base-notebook", "gpus": 2}
    refused = http_user.post("/api/v1/sessions", json=body)
    assert refused.status_code == 402, refused.text
    assert refused.json()["code"] == "insufficient_credits"
    assert refused.json()["required"] == "2.5" and refused.json()["balance"] == "0"
    policy(plain_user, max_gpus=1, min_balance_hours=0)
    over = http_user.post("/api/v1/sessions", json=body)
    assert over.status_code == 403 and over.json()["code"] == "quota_exceeded" and over.json()["limit"] == "max_gpus"
    assert "`DELETE /api/v1/sessions/{id}`" in over.json()["detail"] and "Stop button" not in over.text  # API words in the API
    other = ClusterFactory(name="elsewhere")
    Policy.objects.get(user=plain_user).allowed_clusters.set([other])
    pinned = http_user.post("/api/v1/sessions", json={**body, "gpus": 1, "cluster": cluster.public_id})
    assert pinned.status_code == 403 and pinned.json()["code"] == "cluster_not_allowed"
    assert pinned.json()["allowed_clusters"] == [other.public_id]
    Policy.objects.get(user=plain_user).allowed_clusters.clear()
    assert http_user.post("/api/v1/sessions", json={**body, "gpus": 1}).status_code == 201


def _race(live_server, user, n: int, clusters: list[str]) -> list[tuple[int, dict]]:
    """``n`` concurrent ``POST /api/v1/sessions`` of ``user`` (real HTTP, one thread and client each), pinned in turn
    to each of ``clusters`` (so the cluster row locks do not serialize them: only the account's lock does), started
    while this test holds the user's account row lock and released once all ``n`` wait on it."""
    token = api_token_create(username=user.username)[1]
    results: list[tuple[int, dict]] = []

    def attempt(cluster):
        try:
            response = Http(live_server.url, token).post(
                "/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, "cluster": cluster})
            results.append((response.status_code, response.json()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(clusters[i % len(clusters)],)) for i in range(n)]
    with transaction.atomic():
        CreditAccount.objects.select_for_update().get(user=user)
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                if lock_waiters(cursor) >= n:
                    break
            time.sleep(0.05)
        else:
            pytest.fail("the requests never all waited on the account's row lock")
    for thread in threads:
        thread.join(60)
    assert len(results) == n, results
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_cannot_overdraw(live_server, plain_user, live_cluster):
    live_cluster("lab-c1"), live_cluster("lab-c2")  # 10 and 9 GPUs: capacity is not what limits
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("2"))  # every model: 2 credits per GPU-hour
    policy(min_balance_hours=1)
    grant(plain_user, "6")  # exactly 3 sessions of 1 GPU-hour at 2 credits
    results = _race(live_server, plain_user, 8, ["lab-c1", "lab-c2"])
    codes = sorted(status for status, _ in results)
    assert codes == [201] * 3 + [402] * 5, results
    assert {body["code"] for status, body in results if status == 402} == {"insufficient_credits"}
    assert Session.objects.filter(owner=plain_user).exclude(phase__in=Session.TERMINAL_PHASES).count() == 3
    assert admission.session_holds(plain_user) == Decimal(6)


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_cannot_pass_max_sessions(live_server, plain_user, live_cluster):
    live_cluster("lab-c1"), live_cluster("lab-c2")
    policy(plain_user, max_sessions=2, min_balance_hours=0)
    account_for(plain_user)
    results = _race(live_server, plain_user, 6, ["lab-c1", "lab-c2"])
    codes = sorted(status for status, _ in results)
    assert codes == [201] * 2 + [403] * 4, results
    assert {body["limit"] for status, body in results if status == 403} == {"max_sessions"}
    assert Session.objects.filter(owner=plain_user).count() == 2


@pytest.mark.django_db
def test_a_share_is_admitted_at_the_split_slot_it_reserves_not_the_cores_it_asks(user):
    """A 1 % share on GPUs split in 4 reserves (and pays for) 25 % of the GPU. Admission priced the 1 % asked, so a
    balance for 0.01 GPU-hours started a session billed 0.25 per hour: 25 times the credits the policy asks to hold."""
    cluster = ClusterFactory(name="alpha")
    node = NodeFactory(cluster=cluster)
    GpuDeviceFactory(node=node, cluster=cluster, index=0, model=H100[0], memory_mib=H100[1], split_count=4)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1"))
    grant(user, "0.1")  # 1 h of a 1 % share, not of a 25 % one
    with pytest.raises(admission.InsufficientCredits) as refused:
        create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1024, gpu_cores=1)
    assert refused.value.extra["required"] == "0.25" and refused.value.extra["hourly_cost"] == "0.25"
    assert Session.objects.count() == 0 and Allocation.objects.count() == 0  # nothing half-applied
    grant(user, "0.15", key="more")
    session = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1024, gpu_cores=1)
    assert session.gpu_cores == 25
