"""A queued session in Chromium (1,400 × 900 px): alice asks for two H100s while every H100 is held, the Start session
form queues her request, her session's page shows its place, estimated start, why it waits and the alternatives, and
**Start this instead** starts the A100 offer at once. Every request stays on loopback (``tests/console/conftest.py``)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from playwright.sync_api import expect

from billing.services import credit_grant, policy_set
from sessions import create, placement
from sessions.lifecycle import outbox
from sessions.models import Session
from sessions.queue import leave
from tests.console.conftest import login, shot
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"


@pytest.fixture
def full_h100s(console_users, monkeypatch):
    """lab-c1: two H100s held by bob's 3-hour session; lab-c2: two free A100s."""
    monkeypatch.setattr(outbox, "publish_after_commit", lambda *args, **kwargs: None)
    monkeypatch.setattr(leave, "publish_after_commit", lambda: None)
    for name, model, memory in (("lab-c1", H100, 81559), ("lab-c2", A100, 40960)):
        cluster = ClusterFactory(name=name, session_domain=f"{name}.gshare.localhost")
        node = NodeFactory(cluster=cluster, name=f"{name}-gpu")
        for i in range(2):
            GpuDeviceFactory(node=node, cluster=cluster, index=i, model=model, memory_mib=memory, split_count=4, cores=100)
        placement.usage_recompute(cluster_ids=[cluster.pk])
    bob = UserFactory(username="bob")
    policy_set(user=bob, min_balance_hours=Decimal(0))
    alice = console_users["alice"][0]
    credit_grant(user=alice, amount=Decimal(200), reason="welcome", idempotency_key="queue-browser:alice", created_by="test")
    return create.session_create(owner=bob, image="img", gpus=2, gpu_models=["H100"], runtime_hours=3, name="bob-training")


def test_browser_a_queued_session_shows_its_place_and_starts_an_alternative(live_server, console_users, full_h100s, page):
    base = live_server.url
    login(page, base, "alice", console_users["alice"][1])
    page.goto(f"{base}/gpu_sessions/session/start/")
    page.fill("#id_image", "quay.io/jupyter/pytorch-notebook")
    page.fill("#id_name", "two-h100")
    page.fill("#id_gpus", "2")
    page.check(f'input[name=gpu_models][value="{H100}"]')
    page.fill("#id_runtime_hours", "2")
    expect(page.locator("#id_queue")).to_be_checked()
    page.click("button.gs-start")
    page.wait_for_load_state()

    queued = Session.objects.get(owner__username="alice")
    assert queued.phase == Session.Phase.QUEUED
    expect(page.locator("#gs-phase")).to_have_text("Queued")
    expect(page.locator("#gs-queue-position")).to_have_text("1")
    expect(page.locator("#gs-queue-estimate")).to_contain_text(full_h100s.ends_at.strftime("%Y-%m-%d %H:%M"))
    expect(page.locator("#gs-queue-waiting")).to_contain_text(full_h100s.public_id)
    offer = page.locator("#gs-alternatives tr", has_text="any GPU model")
    expect(offer).to_contain_text(A100)
    expect(offer).to_contain_text("now")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "the page scrolls sideways at 1400 px"
    shot(page, "console-queued-session")

    offer.get_by_role("button", name="Start this instead").click()
    page.wait_for_load_state()
    started = Session.objects.filter(owner__username="alice").exclude(pk=queued.pk).get()
    assert started.phase == Session.Phase.SCHEDULED and started.cluster.name == "lab-c2"
    expect(page.locator(".messagelist")).to_contain_text(f"Started {started.public_id}")
    assert Session.objects.get(pk=queued.pk).phase == Session.Phase.TERMINATED
