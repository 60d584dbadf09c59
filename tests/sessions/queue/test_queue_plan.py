"""The plan's pure parts (``sessions.queue.plan``), without a database: positions, and a node with GPUs of two models."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessions.queue.plan import Device, Fleet, Job, Node, plan

NOW = datetime(2026, 12, 1, tzinfo=UTC)
MODELS = ["H100", "A100", "L40S", "H20"]

pytestmark = pytest.mark.django_db(databases=[])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.frozensets(st.sampled_from(MODELS), max_size=3), max_size=60))
def test_a_position_counts_the_jobs_ahead_that_accept_a_model_it_accepts(accepted):
    """A job's position is 1 + the jobs ahead of it whose accepted models meet its own (an empty set accepts any model),
    as counted one job at a time; the plan keeps the counts per distinct set of models."""
    jobs = [Job(key=i + 1, public_id=f"ses_{i}", gpus=1, models=models) for i, models in enumerate(accepted)]
    outcomes = plan(Fleet([], now=NOW), jobs)
    expected = [1 + sum(1 for ahead in accepted[:i] if not ahead or not models or ahead & models)
                for i, models in enumerate(accepted)]
    assert [o.position for o in outcomes] == expected


def test_a_node_with_two_models_is_searched_per_model():
    """A node holding GPUs of two models: a job for one model takes that model's GPUs only, in index order."""
    devices = [Device(pk=10 + i, model="H100" if i % 2 else "A100", memory_mib=80000, cores=100, split_count=4, index=i)
               for i in range(4)]
    fleet = Fleet([Node(pk=1, name="n1", cluster_id=1, cluster_name="c", devices=devices)], now=NOW)
    (outcome,) = plan(fleet, [Job(key=1, public_id="ses_a", gpus=2, models=frozenset({"H100"}))])
    assert outcome.now and [d.pk for d in outcome.devices] == [11, 13]
    assert all(d.node_pk == 1 for d in devices)
    (second,) = plan(fleet, [Job(key=2, public_id="ses_b", gpus=2, models=frozenset({"A100"}))])
    assert second.now and [d.pk for d in second.devices] == [10, 12]
