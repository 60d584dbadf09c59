"""The queue in the console: the Start session form queues by default, a queued session's page shows its place,
estimate, reason and alternatives (one click starts one instead), its status JSON refreshes them, the list's badge, and
the Queue page (staff: everyone's; a researcher: their own)."""


import pytest

from sessions import create
from sessions.models import Session
from tests.console.queue.conftest import BASE, full_h100, other_user

pytestmark = pytest.mark.django_db


def test_the_start_form_queues_when_nothing_is_free_and_the_page_shows_the_place(client, fleet, researcher):
    blocker = full_h100()
    form = client.get(f"{BASE}/start/")
    assert 'name="queue"' in form.text and "checked" in form.text.split('name="queue"')[1][:80]
    answer = client.post(f"{BASE}/start/", {"image": "img", "gpus": 2, "share": "whole", "gpu_models": ["NVIDIA H100 80GB HBM3"],
                                           "runtime_hours": "1", "queue": "on", "idempotency_key": "k1"}, follow=True)
    session = Session.objects.get(owner=researcher)
    assert session.phase == Session.Phase.QUEUED
    page = answer.text
    assert "waits in the queue at position 1" in page and 'id="gs-queue-position">1<' in page
    assert "2026-12-01 15:00:00 UTC" in page and blocker.public_id in page
    assert "Start this instead" in page and "any GPU model" in page
    assert 'id="gs-activity"' not in page  # no GPU yet, so no activity section: the queue section stands in its place
    status = client.get(f"{BASE}/{session.pk}/status/").json()
    assert status["queue_position"] == 1 and status["estimated_start"] == "2026-12-01 15:00:00 UTC" and status["follow"] is True
    listing = client.get(f"{BASE}/").text
    assert "#1 · 2026-12-01 15:00:00 UTC" in listing


def test_start_this_instead_starts_the_offer_and_leaves_the_queue(client, fleet, researcher):
    full_h100()
    queued = create.session_create(owner=researcher, image="img", gpus=2, gpu_models=["H100"], queue=True)
    index = [o["why"] for o in queued.alternatives].index("any GPU model")
    answer = client.post(f"{BASE}/{queued.pk}/alternative/", {"index": index}, follow=True)
    queued.refresh_from_db()
    started = Session.objects.filter(owner=researcher).exclude(pk=queued.pk).get()
    assert started.phase == Session.Phase.SCHEDULED and started.cluster.name == "lab-a"
    assert queued.phase == Session.Phase.TERMINATED and started.public_id in queued.message
    assert f"Started {started.public_id}" in answer.text
    assert client.post(f"{BASE}/{queued.pk}/alternative/", {"index": "x"}, follow=True).status_code == 200


def test_another_users_queued_session_cannot_be_taken_over(client, fleet, researcher):
    full_h100()
    other = other_user()
    theirs = create.session_create(owner=other, image="img", gpus=2, gpu_models=["H100"], queue=True)
    assert client.post(f"{BASE}/{theirs.pk}/alternative/", {"index": 0}).status_code == 404
    assert Session.objects.filter(owner=researcher).count() == 0


def test_the_queue_page_shows_staff_everyone_and_a_researcher_their_own(client, fleet, researcher, staff_user):
    full_h100()
    mine = create.session_create(owner=researcher, image="img", gpus=2, gpu_models=["H100"], queue=True)
    other = other_user()
    theirs = create.session_create(owner=other, image="img", gpus=1, gpu_models=["H100"], queue=True)
    page = client.get(f"{BASE}/queue/").text
    assert mine.public_id in page and theirs.public_id not in page
    client.force_login(staff_user)
    page = client.get(f"{BASE}/queue/").text
    assert mine.public_id in page and theirs.public_id in page and other.username in page
