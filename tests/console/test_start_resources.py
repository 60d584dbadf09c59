"""The Start session form's CPU and memory (``console.pages.sessions.actions.StartSessionForm``): the fields, labelled per
session, filled with the policy's default per GPU × the GPUs, sent to ``session_create`` (refusals shown with the API's
code, nothing started), and the GPU model picker's memory per GPU; through Django's test client, and in Chromium the
fields following the GPU count (``console/static/console/sessions.js``) up to the started session."""

from __future__ import annotations

from decimal import Decimal

import pytest
from playwright.sync_api import expect

from billing.services import policy_set
from sessions import placement
from sessions.lifecycle import outbox
from sessions.models import Session
from tests.console.conftest import login
from tests.console_checks import page_text
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, UserFactory

START = "/gpu_sessions/session/start/"


@pytest.fixture(autouse=True)
def no_cluster_calls(monkeypatch):
    """The factory cluster's apiserver is never dialled: applies are not published (sessions stay Scheduled)."""
    monkeypatch.setattr(outbox, "publish_after_commit", lambda *args, **kwargs: None)


def fleet() -> None:
    cluster = ClusterFactory(name="lab-c1")
    node = NodeFactory(cluster=cluster)
    for index in range(4):
        GpuDeviceFactory(node=node, cluster=cluster, index=index, memory_mib=81559)
    other = NodeFactory(cluster=cluster)
    for index, memory in enumerate((46068, 23028)):  # one model registered with two memories (deviceMemoryScaling)
        GpuDeviceFactory(node=other, cluster=cluster, index=index, model="NVIDIA L40S", memory_mib=memory)
    placement.usage_recompute(cluster_ids=[cluster.pk])


def researcher(username: str = "bob"):
    user = UserFactory(username=username)
    policy_set(user=user, min_balance_hours=Decimal(0), default_cpu_per_gpu=Decimal("2.5"), default_memory_gib_per_gpu=Decimal(12),
               max_cpu_per_gpu=Decimal(8), max_memory_gib_per_gpu=Decimal(64))
    return user


def form_data(**fields) -> dict:
    return {"image": "quay.io/jupyter/base-notebook", "name": "", "gpus": "1", "share": "whole", "gpu_memory_mib": "", "gpu_cores": "",
            "cluster": "", "idempotency_key": f"key-{sorted(fields.items())}"[:150], **fields}


@pytest.mark.django_db
def test_the_form_offers_cpu_and_memory_per_session_with_the_policys_defaults_and_memory_per_gpu(client):
    fleet()
    client.force_login(researcher())
    text = page_text(client.get(START))
    assert "CPU cores per session" in text and "Memory (GiB) per session" in text
    assert 'name="cpu"' in text and 'value="2.5"' in text and 'data-gs-per-gpu="2.5"' in text
    assert 'name="memory_gib"' in text and 'value="12"' in text and "at most 64 GiB per GPU (your limit)" in text
    assert "/dev/shm gets half of it" in text
    assert "NVIDIA H100 80GB HBM3: 4 of 4 free, 79.6 GiB per GPU" in text
    assert "NVIDIA L40S: 2 of 2 free, 22.5–45 GiB per GPU" in text


@pytest.mark.django_db
def test_the_form_starts_with_what_was_typed_or_the_defaults(client):
    fleet()
    bob = researcher()
    client.force_login(bob)
    assert client.post(START, form_data(cpu="3.5", memory_gib="20")).status_code == 302
    session = Session.objects.filter(owner=bob).latest("pk")
    assert (session.cpu, session.memory_gib) == (Decimal("3.5"), Decimal(20))
    assert client.post(START, form_data(gpus="2", cpu="", memory_gib="")).status_code == 302
    session = Session.objects.filter(owner=bob).latest("pk")
    assert (session.cpu, session.memory_gib) == (Decimal(5), Decimal(24))


@pytest.mark.django_db
@pytest.mark.parametrize(("fields", "code"), [({"cpu": "9"}, "cpu_over_limit"), ({"memory_gib": "64.001"}, "memory_over_limit"),
                                              ({"cpu": "NaN"}, "invalid_request"), ({"cpu": "-1"}, "invalid_request"),
                                              ({"memory_gib": "1e400"}, "invalid_request"), ({"memory_gib": "0.0001"}, "invalid_request"),
                                              ({"cpu": "x" * 32}, "invalid_request"), ({"cpu": "0"}, "invalid_request")])
def test_the_form_shows_the_services_refusal(client, fields, code):
    fleet()
    client.force_login(researcher())
    response = client.post(START, form_data(**fields))
    assert response.status_code == 200 and f'<code class="gs-refusal-code">{code}</code>' in response.content.decode()
    assert not Session.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_browser_cpu_and_memory_follow_the_gpu_count_until_edited(live_server, page):
    fleet()
    bob = researcher()
    bob.set_password("bob-Pa55word!")
    bob.save()
    login(page, live_server.url, "bob", "bob-Pa55word!")
    page.goto(f"{live_server.url}{START}")
    cpu, memory = page.locator("#id_cpu"), page.locator("#id_memory_gib")
    expect(cpu).to_have_value("2.5")
    expect(memory).to_have_value("12")
    page.fill("#id_gpus", "3")
    expect(cpu).to_have_value("7.5")
    expect(memory).to_have_value("36")
    page.fill("#id_memory_gib", "40")  # typed: no longer follows the GPU count
    page.fill("#id_gpus", "2")
    expect(cpu).to_have_value("5")
    expect(memory).to_have_value("40")
    page.fill("#id_image", "quay.io/jupyter/base-notebook")
    page.get_by_role("button", name="Start session").click()
    page.wait_for_load_state()
    session = Session.objects.get(owner=bob)
    assert (session.gpus, session.cpu, session.memory_gib) == (2, Decimal(5), Decimal(40))
