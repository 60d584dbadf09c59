"""``GSHARE_DB_PREPARED_STATEMENTS``: session creation's big statements prepared on the server, with the same decisions."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

from billing.models import Policy, Price
from sessions import create, placement
from sessions.models import Allocation, Session
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory

pytestmark = pytest.mark.django_db


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        return [row[0] for row in cursor.fetchall()]


#: Shares and whole GPUs on a two-node cluster of 2 GPUs each; the last one is refused.
REQUESTS = [(1, 8000, 25), (1, None, None), (2, None, None), (1, 8000, 50), (2, None, None)]


def _place(owner, requests) -> list[tuple]:
    """Each session's node and GPU indexes, or the refusal's code."""
    placed = []
    for gpus, memory, cores in requests:
        try:
            session = create.session_create(owner=owner, image="img", gpus=gpus, gpu_memory_mib=memory, gpu_cores=cores)
        except create.Conflict as refused:
            placed.append(refused.code)
            continue
        placed.append((session.node, sorted(a.device.index for a in Allocation.objects.filter(session=session).select_related("device"))))
    return placed


def test_decisions_are_the_same_with_prepared_statements(django_user_model):
    Price.objects.create(gpu_model="", credits_per_gpu_hour=0)
    Policy.objects.update_or_create(user=None, defaults={"min_balance_hours": 0})
    owner = django_user_model.objects.create_user("alice")
    cluster = ClusterFactory()
    for name in ("node-a", "node-b"):
        node = NodeFactory(cluster=cluster, name=name)
        for index in range(2):
            GpuDeviceFactory(node=node, index=index, memory_mib=16000)
    placement.usage_recompute(cluster_ids=[cluster.pk])  # rows made by factories, not by inventory_apply

    expected = _place(owner, REQUESTS)
    assert "no_capacity" in expected and len(set(map(str, expected))) > 2
    Session.objects.update(phase=Session.Phase.TERMINATED)
    Allocation.objects.all().delete()
    placement.usage_recompute(cluster_ids=[cluster.pk])
    before = set(_prepared())
    with override_settings(GSHARE_DB_PREPARED_STATEMENTS=True), CaptureQueriesContext(connection) as queries:
        placed = _place(owner, REQUESTS[:-1])
        # Checked before the refusal: psycopg forgets (deallocates) its prepared statements at every rollback.
        prepared = set(_prepared()) - before
        placed += _place(owner, REQUESTS[-1:])
    assert placed == expected
    assert any("INSERT INTO gpu_sessions_allocation" in sql for sql in prepared)  # placement.reserve
    assert any("billing_policy" in sql for sql in prepared)  # admission_read
    assert any(sql.startswith("\nSELECT n.cluster_id") for sql in prepared)  # placement.choose
    # Still logged and counted like any other query, with the statement's text.
    assert any("INSERT INTO gpu_sessions_allocation" in query["sql"] for query in queries.captured_queries)
