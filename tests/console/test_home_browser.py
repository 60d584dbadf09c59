"""A researcher's home page in Chromium (1,400 × 900 px): after logging in, alice sees her Running session (phase,
GPUs, where, cost, Open and Stop on screen) and her queued one (position and estimated start), never bob's, the free
GPUs and her credits, and **Start session** takes her to the Start session form. Every request stays on loopback
(``tests/console/conftest.py``)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing import services as billing
from console.dashboard import utc
from sessions import placement
from sessions.models import Allocation, Session
from tests.console.conftest import login, shot
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def alices_sessions(console_users):
    """alice's Running session on lab-c1 (one whole H100 of four) and her queued one; bob's Running session."""
    alice = console_users["alice"][0]
    now = timezone.now()
    billing.credit_grant(user=alice, amount=Decimal("200"), reason="welcome", idempotency_key="home-browser:alice", created_by="test")
    cluster = ClusterFactory(name="lab-c1", session_domain="lab-c1.gshare.localhost")
    node = NodeFactory(cluster=cluster, name="gpu-node-a")
    devices = [GpuDeviceFactory(node=node, cluster=cluster, index=i, model=H100) for i in range(4)]
    running = SessionFactory(owner=alice, cluster=cluster, node=node.name, name="llama-finetune", started_at=now - timedelta(hours=1))
    Session.objects.filter(pk=running.pk).update(ends_at=now + timedelta(hours=5))
    Allocation.objects.create(session=running, device=devices[0], memory_mib=devices[0].memory_mib, cores=100, exclusive=True)
    bobs = SessionFactory(owner=UserFactory(username="bob"), cluster=cluster, node=node.name, name="bob-private-run")
    Allocation.objects.create(session=bobs, device=devices[1], memory_mib=devices[1].memory_mib, cores=100, exclusive=True)
    placement.usage_recompute(cluster_ids=[cluster.pk])
    queued = Session.objects.create(
        owner=alice, name="eight-h100", image="quay.io/jupyter/pytorch-notebook", gpus=8, gpu_models=[H100],
        phase=Session.Phase.QUEUED, queued_at=now, queue_position=3, estimated_start=now + timedelta(hours=4),
        waiting_for="8 × H100 on one node: no node has 8",
    )
    return {"running": running, "queued": queued, "bobs": bobs}


def test_browser_a_researcher_lands_on_their_home_page_and_starts_a_session(live_server, console_users, alices_sessions, page):
    base = live_server.url
    login(page, base, "alice", console_users["alice"][1])
    running, queued = alices_sessions["running"], alices_sessions["queued"]

    home = page.locator("#home")
    expect(home).to_be_visible()
    expect(page.locator("#recent-actions-module")).to_have_count(0)
    row = page.locator(f'tr[data-session="{running.public_id}"]')
    expect(row).to_contain_text("llama-finetune")
    expect(row).to_contain_text("Running")
    expect(row.locator('[data-cell="where"]')).to_have_text("lab-c1 / gpu-node-a")
    expect(row.locator('[data-cell="gpus"]')).to_contain_text("1 whole GPU")
    expect(row.locator('[data-cell="when"]')).to_have_text(f"ends {utc(Session.objects.get(pk=running.pk).ends_at)}")
    expect(page.get_by_role("button", name=f"Open {running.public_id}")).to_be_visible()
    expect(page.get_by_role("button", name=f"Stop {running.public_id}")).to_be_visible()

    waiting = page.locator(f'tr[data-session="{queued.public_id}"]')
    expect(waiting).to_contain_text("Queued")
    expect(waiting.locator('[data-cell="when"]')).to_contain_text(f"#3 in the queue · starts about {utc(queued.estimated_start)}")
    expect(waiting).to_contain_text("no node has 8")
    expect(page.get_by_role("button", name=f"Open {queued.public_id}")).to_have_count(0)

    assert "bob-private-run" not in page.content() and alices_sessions["bobs"].public_id not in page.content()
    expect(page.locator(f'#home-free tr[data-model="{H100}"] [data-cell="free"]')).to_have_text("2 of 4")
    expect(page.locator("#home-runway")).to_contain_text("until ")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "the home page scrolls sideways at 1400 px"
    shot(page, "console-researcher-home")

    page.locator("#home-start").click()
    page.wait_for_url(f"{base}/gpu_sessions/session/start/")
    expect(page.locator("h1").first).to_contain_text("Start session")
