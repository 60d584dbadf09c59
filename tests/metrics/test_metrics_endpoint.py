"""``GET /metrics``: the inventory of every cluster from the control plane's tables, the request counters, the
internal-host and token guards, and a constant number of queries whatever the fleet's size."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
import requests
from django.core.cache import cache
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from billing.models import CreditAccount, LedgerEntry
from clusters.models import Cluster
from core import instruments
from core.exceptions import Conflict
from metrics.fleet import CACHE_KEY, QUERIES
from sessions import create, placement
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory
from tests.metrics.promtool import check

pytestmark = pytest.mark.django_db

INTERNAL = "127.0.0.1"
PUBLIC = "gshare.example.com"
A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def _uncached(settings):
    settings.GSHARE_METRICS_CACHE_SECONDS = 0
    settings.GSHARE_METRICS_TOKEN = ""
    cache.delete(CACHE_KEY)


def fleet(*, name: str, nodes: int, gpus: int, model: str = H100, memory: int = 81559, split: int = 4):
    cluster = ClusterFactory(name=name)
    for _ in range(nodes):
        node = NodeFactory(cluster=cluster)
        for i in range(gpus):
            GpuDeviceFactory(node=node, cluster=cluster, index=i, model=model, memory_mib=memory, split_count=split)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    return cluster


def scrape(client, **headers) -> dict[str, list]:
    """``GET /metrics`` on an internal host, parsed back: metric family name -> its samples."""
    response = client.get("/metrics", HTTP_HOST=INTERNAL, **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {family.name: family.samples for family in text_string_to_metric_families(response.content.decode())}


def value(families: dict, name: str, sample: str | None = None, **labels) -> float | None:
    """The value of the sample ``sample`` (default: ``name``) of family ``name`` whose labels include ``labels``."""
    found = [s.value for s in families.get(name, []) if s.name == (sample or name) and labels.items() <= s.labels.items()]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def test_every_cluster_its_gpus_and_sessions_appear(client, django_user_model):
    now = timezone.now()
    a = fleet(name="alpha", nodes=2, gpus=2, model=H100)
    b = fleet(name="beta", nodes=1, gpus=1, model=A100, memory=40960)
    Cluster.objects.filter(pk=a.pk).update(
        last_heartbeat_at=now - datetime.timedelta(seconds=42), operator_token_expires_at=now + datetime.timedelta(days=2),
    )
    Cluster.objects.filter(pk=b.pk).update(operator_refused_since=now - datetime.timedelta(minutes=5), operator_refused_reason="token_expired")
    gone = fleet(name="gone", nodes=1, gpus=1)
    Cluster.objects.filter(pk=gone.pk).update(status=Cluster.Status.DEREGISTERED)
    user = django_user_model.objects.create_user("alice")
    whole = create.session_create(owner=user, image="img", gpus=1, cluster="alpha")
    shared = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=8000, gpu_cores=30, cluster="alpha")
    SessionFactory(cluster=b, phase="Starting")
    SessionFactory(cluster=b, phase="Terminated")
    account = CreditAccount.objects.get(user=user)
    for n, amount in enumerate([Decimal("-1.250000"), Decimal("-0.500000")]):
        LedgerEntry.objects.create(account=account, kind=LedgerEntry.Kind.CHARGE, amount=amount, balance_after=0,
                                   idempotency_key=f"charge-{n}", session=whole, created_by="usage")
    LedgerEntry.objects.create(account=account, kind=LedgerEntry.Kind.GRANT, amount=Decimal(100), balance_after=100,
                               idempotency_key="grant", created_by="console:root")

    m = scrape(client)

    assert value(m, "gshare_cluster_info", cluster="alpha", cluster_id=a.public_id, status="connected") == 1
    assert value(m, "gshare_cluster_info", cluster="gone") is None, "a deregistered cluster is not exported"
    assert 42 <= value(m, "gshare_cluster_heartbeat_age_seconds", cluster="alpha") < 60
    assert value(m, "gshare_cluster_heartbeat_age_seconds", cluster="beta") is None
    assert 2 * 86400 - 60 < value(m, "gshare_cluster_operator_token_expires_in_seconds", cluster="alpha") <= 2 * 86400
    assert 300 <= value(m, "gshare_cluster_operator_refused_seconds", cluster="beta", reason="token_expired") < 360
    assert value(m, "gshare_cluster_gpus", cluster="alpha", model=H100) == 4
    assert value(m, "gshare_cluster_gpus", cluster="beta", model=A100) == 1
    assert value(m, "gshare_cluster_gpus_healthy", cluster="alpha", model=H100) == 4
    assert value(m, "gshare_cluster_gpus_reserved", cluster="alpha", model=H100, kind="whole") == 1
    assert value(m, "gshare_cluster_gpus_reserved", cluster="alpha", model=H100, kind="shared") == 1
    assert value(m, "gshare_cluster_gpu_memory_bytes", cluster="alpha") == 4 * 81559 * 2**20
    assert value(m, "gshare_cluster_gpu_memory_reserved_bytes", cluster="alpha") == (81559 + 8000) * 2**20
    assert value(m, "gshare_cluster_gpu_cores", cluster="alpha") == 4.0
    assert value(m, "gshare_cluster_gpu_cores_reserved", cluster="alpha") == pytest.approx(1.3)
    assert value(m, "gshare_cluster_gpu_slots", cluster="alpha") == 16
    assert value(m, "gshare_cluster_gpu_slots_reserved", cluster="alpha") == 2
    assert value(m, "gshare_cluster_sessions", cluster="alpha", phase="Scheduled") == 2
    assert value(m, "gshare_cluster_sessions", cluster="beta", phase="Starting") == 1
    assert value(m, "gshare_cluster_sessions", cluster="beta", phase="Running") == 0
    assert value(m, "gshare_cluster_sessions", cluster="beta", phase="Terminated") is None
    assert value(m, "gshare_cluster_credits_burned", "gshare_cluster_credits_burned_total", cluster="alpha") == 1.75
    assert value(m, "gshare_cluster_credits_burned", "gshare_cluster_credits_burned_total", cluster="beta") == 0

    # Per GPU, with the node and the UUID: every card of every cluster, no federation.
    held = {a.device for a in whole.allocations.select_related("device__node")}
    card = held.pop()
    labels = {"cluster": "alpha", "node": card.node.name, "uuid": card.uuid, "model": H100}
    assert value(m, "gshare_gpu_reserved_whole", **labels) == 1
    assert value(m, "gshare_gpu_memory_reserved_bytes", **labels) == 81559 * 2**20
    assert value(m, "gshare_gpu_slots_reserved", **labels) == 1
    share = shared.allocations.select_related("device__node").get().device
    labels = {"cluster": "alpha", "node": share.node.name, "uuid": share.uuid, "model": H100}
    assert value(m, "gshare_gpu_cores_reserved", **labels) == pytest.approx(0.3)
    assert value(m, "gshare_gpu_reserved_whole", **labels) == 0
    assert value(m, "gshare_gpu_slots", **labels) == 4
    assert len([s for s in m["gshare_gpu_healthy"]]) == 5
    assert value(m, "gshare_inventory_generated_timestamp_seconds") == pytest.approx(now.timestamp(), abs=60)


@pytest.mark.parametrize("size", [(1, 1, 1), (4, 6, 8)], ids=["one-gpu", "192-gpus"])
def test_a_scrape_makes_the_same_number_of_queries_whatever_the_fleet(client, django_assert_num_queries, django_user_model, size):
    clusters, nodes, gpus = size
    for n in range(clusters):
        fleet(name=f"c{n}", nodes=nodes, gpus=gpus)
    user = django_user_model.objects.create_user("bob")
    for _ in range(clusters):
        create.session_create(owner=user, image="img", gpus=1)
    with django_assert_num_queries(QUERIES):
        m = scrape(client)
    assert len(m["gshare_gpu_healthy"]) == clusters * nodes * gpus


def test_the_inventory_is_cached_for_the_configured_seconds(client, settings, django_assert_num_queries):
    settings.GSHARE_METRICS_CACHE_SECONDS = 60
    fleet(name="alpha", nodes=1, gpus=1)
    with django_assert_num_queries(QUERIES):
        first = scrape(client)
    fleet(name="beta", nodes=1, gpus=1)
    with django_assert_num_queries(0):
        second = scrape(client)
    assert value(second, "gshare_cluster_gpus", cluster="beta", model=H100) is None
    assert value(first, "gshare_inventory_generated_timestamp_seconds") == value(second, "gshare_inventory_generated_timestamp_seconds")
    cache.delete(CACHE_KEY)
    assert value(scrape(client), "gshare_cluster_gpus", cluster="beta", model=H100) == 1


def test_metrics_answer_404_on_a_public_host(client, settings):
    settings.GSHARE_INTERNAL_HOSTS = [INTERNAL]
    response = client.get("/metrics", HTTP_HOST=PUBLIC)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_the_metrics_token_is_required_when_set(client, settings):
    settings.GSHARE_METRICS_TOKEN = "scrape-me-0123456789"
    missing = client.get("/metrics", HTTP_HOST=INTERNAL)
    assert missing.status_code == 401 and missing.json()["code"] == "token_missing"
    assert missing["WWW-Authenticate"].startswith("Bearer")
    wrong = client.get("/metrics", HTTP_HOST=INTERNAL, HTTP_AUTHORIZATION="Bearer scrape-me-0123456788")
    assert wrong.status_code == 401 and wrong.json()["code"] == "token_invalid"
    assert "scrape-me" not in wrong.content.decode()
    basic = client.get("/metrics", HTTP_HOST=INTERNAL, HTTP_AUTHORIZATION="Basic c2NyYXBlLW1l")
    assert basic.status_code == 401 and basic.json()["code"] == "token_missing"
    assert "gshare_cluster_info" in scrape(client, HTTP_AUTHORIZATION="Bearer scrape-me-0123456789")


def test_only_get_is_allowed(client):
    response = client.post("/metrics", HTTP_HOST=INTERNAL)
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"


def counter(name: str, **labels) -> float:
    return instruments.REGISTRY.get_sample_value(name, labels) or 0.0


def test_placement_decisions_and_latency_are_counted(client, django_user_model, django_capture_on_commit_callbacks):
    fleet(name="alpha", nodes=1, gpus=1)
    user = django_user_model.objects.create_user("carol")
    placed, no_capacity = counter("gshare_placement_decisions_total", outcome="placed"), counter("gshare_placement_decisions_total", outcome="no_capacity")
    timed = counter("gshare_placement_duration_seconds_count")
    with django_capture_on_commit_callbacks() as committed:  # "placed" is counted once the reservation commits
        create.session_create(owner=user, image="img", gpus=1)
    with pytest.raises(Conflict):
        create.session_create(owner=user, image="img", gpus=1)
    assert counter("gshare_placement_decisions_total", outcome="placed") == placed
    placed_child = instruments.PLACEMENT_DECISIONS.labels(outcome="placed")
    for callback in committed:  # only the counter's: the apply task would dial the factory cluster
        if getattr(callback, "__self__", None) is placed_child:
            callback()
    assert counter("gshare_placement_decisions_total", outcome="placed") == placed + 1
    assert counter("gshare_placement_decisions_total", outcome="no_capacity") == no_capacity + 1
    assert counter("gshare_placement_duration_seconds_count") == timed + 2
    m = scrape(client)
    assert value(m, "gshare_placement_decisions", "gshare_placement_decisions_total", outcome="placed") >= 1


def test_policy_refusals_are_counted(django_user_model):
    from billing.models import Policy

    fleet(name="alpha", nodes=1, gpus=2)
    user = django_user_model.objects.create_user("dave")
    Policy.objects.create(user=user, max_gpus=1)
    before = counter("gshare_placement_decisions_total", outcome="refused_by_policy")
    with pytest.raises(Exception) as info:
        create.session_create(owner=user, image="img", gpus=2)
    assert getattr(info.value, "code", None) == "quota_exceeded"
    assert counter("gshare_placement_decisions_total", outcome="refused_by_policy") == before + 1


def test_accepted_and_duplicate_usage_samples_are_counted(client):
    from billing import ingest
    from clusters.models import GpuDevice
    from tests.helpers import T0, metered_session, sample

    cluster = fleet(name="alpha", nodes=1, gpus=1)
    gpu = GpuDevice.objects.get(cluster=cluster)
    session = metered_session(cluster)
    accepted = counter("gshare_usage_samples_total", cluster="alpha", outcome="accepted")
    duplicate = counter("gshare_usage_samples_total", cluster="alpha", outcome="duplicate")
    first, second = sample(session, gpu), sample(session, gpu, start=T0 + datetime.timedelta(seconds=60))
    assert ingest.usage_ingest(cluster=cluster, samples=[first, second, first])["accepted"] == 2
    assert ingest.usage_ingest(cluster=cluster, samples=[second])["duplicates"] == 1
    assert counter("gshare_usage_samples_total", cluster="alpha", outcome="accepted") == accepted + 2
    assert counter("gshare_usage_samples_total", cluster="alpha", outcome="duplicate") == duplicate + 2
    m = scrape(client)
    assert value(m, "gshare_usage_samples", "gshare_usage_samples_total", cluster="alpha", outcome="accepted") >= 2


def test_refused_usage_batches_are_counted():
    from billing import ingest

    cluster = fleet(name="alpha", nodes=1, gpus=1)
    before = counter("gshare_usage_samples_total", cluster="alpha", outcome="refused")
    with pytest.raises(Exception) as info:
        ingest.usage_ingest(cluster=cluster, samples=[{"sample_id": "s-1"}, {"sample_id": "s-2"}])
    assert getattr(info.value, "code", None)
    assert counter("gshare_usage_samples_total", cluster="alpha", outcome="refused") == before + 2


def test_connect_verify_is_timed_by_outcome(client):
    before = counter("gshare_connect_verify_duration_seconds_count", outcome="refused")
    response = client.get("/internal/connect/verify", HTTP_HOST=INTERNAL)
    assert response.status_code == 401
    assert counter("gshare_connect_verify_duration_seconds_count", outcome="refused") == before + 1
    m = scrape(client)
    assert value(m, "gshare_connect_verify_duration_seconds", "gshare_connect_verify_duration_seconds_count", outcome="refused") >= 1


@pytest.mark.django_db(transaction=True)
def test_a_live_scrape_over_http_passes_promtool(live_server, django_user_model):
    fleet(name="alpha", nodes=2, gpus=2)
    user = django_user_model.objects.create_user("erin")
    create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=4000, gpu_cores=25)
    response = requests.get(live_server.url + "/metrics", timeout=30)
    assert response.status_code == 200
    assert "gshare_gpu_memory_reserved_bytes{" in response.text
    result = check("metrics", stdin=response.content)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert result.stdout.decode().strip() == "" and result.stderr.decode().strip() == "", "promtool lint findings"


def test_every_refused_operator_callback_is_counted_though_only_one_a_minute_is_written():
    from clusters.operator_refusals import operator_refusal_record

    cluster = ClusterFactory(name="alpha")
    cache.delete(f"operator-refused:{cluster.public_id}")
    before = counter("gshare_operator_callbacks_refused_total", cluster_id=cluster.public_id, reason="token_expired")
    written = [operator_refusal_record(reason="token_expired", cluster=cluster) for _ in range(3)]
    assert written == [True, False, False]
    assert counter("gshare_operator_callbacks_refused_total", cluster_id=cluster.public_id, reason="token_expired") == before + 3


def test_idle_sessions_and_their_gpus_are_counted_per_cluster(client):
    from sessions.models import SessionActivity

    now = timezone.now()
    alpha, beta = fleet(name="alpha", nodes=1, gpus=1), fleet(name="beta", nodes=1, gpus=1)
    idle = SessionFactory(cluster=alpha, gpus=2)
    busy = SessionFactory(cluster=alpha, gpus=1)
    unknown = SessionFactory(cluster=beta, gpus=4)
    for s in (idle, busy, unknown):
        type(s).objects.filter(pk=s.pk).update(started_at=now - datetime.timedelta(hours=2))
    SessionActivity.objects.create(session=idle, state="ok", sampled_at=now, last_kernel_at=now - datetime.timedelta(minutes=20))
    SessionActivity.objects.create(session=busy, state="ok", sampled_at=now, last_kernel_at=now - datetime.timedelta(minutes=1))
    SessionActivity.objects.create(session=unknown, state="unknown", reason="monitor down", sampled_at=now)
    m = scrape(client)
    assert value(m, "gshare_cluster_idle_sessions", cluster="alpha") == 1
    assert value(m, "gshare_cluster_idle_gpus", cluster="alpha") == 2
    assert value(m, "gshare_cluster_idle_sessions", cluster="beta") == 0, "unknown activity is never idle"
