"""The plan's pure parts (``sessions.queue.plan``), without a database: positions, and a node with GPUs of two models."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessions.queue.plan import NEVER, Device, Fleet, Job, Node, plan

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


def _brute_earliest(fleet: Fleet, job: Job):
    """``Fleet.earliest`` by a walk over every node: the earliest k-th free time among its GPUs of an accepted model."""
    best = None
    for order, node in enumerate(fleet.nodes):
        if job.clusters is not None and node.cluster_id not in job.clusters:
            continue
        for model in sorted({d.model for d in node.devices}):
            if job.models and model not in job.models:
                continue
            times = sorted(d.free_at for d in node.devices if d.model == model)
            if len(times) >= job.gpus and times[job.gpus - 1] < NEVER and (best is None or (times[job.gpus - 1], order) < best[:2]):
                best = (times[job.gpus - 1], order, node.pk)
    return None if best is None else (best[0], best[2])


_NODE = st.tuples(st.integers(1, 2), st.lists(st.tuples(st.sampled_from(MODELS[:2]), st.one_of(st.none(), st.integers(0, 600))),
                                              min_size=1, max_size=8))
_JOB = st.tuples(st.integers(1, 4), st.frozensets(st.sampled_from(MODELS[:2]), max_size=2), st.one_of(st.none(), st.integers(10, 300)),
                 st.one_of(st.none(), st.just(frozenset({1}))), st.booleans())


@settings(max_examples=150, deadline=None)
@given(st.lists(_NODE, min_size=1, max_size=6), st.lists(_JOB, max_size=25))
def test_the_indexed_search_finds_what_a_walk_over_every_node_finds_as_the_plan_goes(nodes, jobs):
    """After each job the plan starts or holds GPUs for, ``Fleet.earliest`` (heaps of k-th free times, stale entries
    dropped as they surface) names the same time and node as a walk over the fleet."""
    built, pk = [], 100
    for n, (cluster, devices) in enumerate(nodes):
        gpus = []
        for i, (model, minutes) in enumerate(devices):
            pk += 1
            held = minutes != 0  # held whole until then (None: by a session with no known end), or free now
            gpus.append(Device(pk=pk, model=model, memory_mib=80000, cores=100, split_count=4, index=i, used_count=int(held),
                               used_memory_mib=80000 * held, used_cores=100 * held, used_exclusive=held,
                               free_at=NEVER if minutes is None else NOW + timedelta(minutes=minutes)))
        built.append(Node(pk=n + 1, name=f"n{n}", cluster_id=cluster, cluster_name=f"c{cluster}", devices=gpus))
    fleet = Fleet(built, now=NOW)
    for key, (gpus, models, minutes, clusters, share) in enumerate(jobs, start=1):
        job = Job(key=key, public_id=f"ses_{key}", gpus=gpus, models=models, clusters=clusters,
                  duration=None if minutes is None else timedelta(minutes=minutes), memory_mib=20000 if share else None,
                  cores=25 if share else None)
        found = fleet.earliest(job)
        assert (None if found is None else (found[0], found[1].pk)) == _brute_earliest(fleet, job)
        plan(fleet, [job])
