"""What the console's queue tests share: a frozen clock, no background work published (the tests run the queue's passes
themselves), two clusters of two GPUs each (lab-h: H100s, lab-a: A100s), a researcher logged in, and a helper that fills
the H100s with another user's 3-hour session."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
import time_machine

from billing.services import policy_set
from sessions import create, placement
from sessions.lifecycle import outbox
from sessions.queue import leave
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, UserFactory

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BASE = "/gpu_sessions/session"


@pytest.fixture(autouse=True)
def frozen():
    with time_machine.travel(NOW, tick=False):
        yield


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setattr(outbox, "publish_after_commit", lambda *args, **kwargs: None)
    monkeypatch.setattr(leave, "publish_after_commit", lambda: None)


@pytest.fixture
def fleet():
    for name, model, memory in (("lab-h", "NVIDIA H100 80GB HBM3", 81559), ("lab-a", "NVIDIA A100-SXM4-40GB", 40960)):
        cluster = ClusterFactory(name=name)
        node = NodeFactory(cluster=cluster)
        for i in range(2):
            GpuDeviceFactory(node=node, cluster=cluster, index=i, split_count=4, memory_mib=memory, cores=100, model=model)
        placement.usage_recompute(cluster_ids=[cluster.pk])


@pytest.fixture
def researcher(client, django_user_model):
    user = django_user_model.objects.create_user(username="rita", password="pw-rita-123")
    policy_set(user=user, min_balance_hours=Decimal(0))
    client.force_login(user)
    return user


def other_user():
    """A user who may start sessions on any balance."""
    user = UserFactory()
    policy_set(user=user, min_balance_hours=Decimal(0))
    return user


def full_h100():
    """Another user's 3-hour session on both H100s."""
    return create.session_create(owner=other_user(), image="img", gpus=2, gpu_models=["H100"], runtime_hours=3)
