"""Attacks on the queue in the console as a hostile researcher would make them: another user's queued session (its
page, its status JSON, its "Start this instead"), forged alternative numbers, a stale "Start this instead", and what
the Queue page shows. Never a 500; a refusal is a message on the session's page."""


import pytest

from sessions import create, lifecycle
from sessions.models import Session
from tests.console.queue.conftest import BASE, full_h100, other_user

pytestmark = pytest.mark.django_db


def _queued(owner):
    return create.session_create(owner=owner, image="img", gpus=2, gpu_models=["H100"], queue=True)


def test_another_users_queued_session_page_and_status_are_404(client, fleet, researcher):
    full_h100()
    other = other_user()
    theirs = _queued(other)
    for url in (f"{BASE}/{theirs.pk}/change/", f"{BASE}/{theirs.pk}/status/"):
        answer = client.get(url)
        assert answer.status_code in (403, 404), (url, answer.status_code)
        assert theirs.public_id not in answer.text and "waiting_for" not in answer.text
    assert client.get(f"{BASE}/ended/{theirs.public_id}/").status_code in (403, 404)
    assert client.post(f"{BASE}/{theirs.pk}/stop/").status_code in (403, 404)
    theirs.refresh_from_db()
    assert theirs.phase == Session.Phase.QUEUED


def test_the_queue_page_of_a_researcher_names_no_other_owner_or_session(client, fleet, researcher):
    full_h100()
    other = other_user()
    theirs = _queued(other)
    mine = _queued(researcher)
    page = client.get(f"{BASE}/queue/?owner={other.username}&all=1").text
    assert mine.public_id in page and other.username not in page
    # Theirs is ahead: its id appears only where mine's waiting_for names what it waits for (decided acceptable).
    assert page.count(theirs.public_id) == page.count(f"when {theirs.public_id} is planned to end") == 1


@pytest.mark.parametrize("index", ["-1", "", "abc", "3", "99", "1e3", "9" * 5000, "0.0", "[0]"])
def test_a_forged_alternative_number_is_a_message_never_a_500(client, fleet, researcher, index):
    full_h100()
    mine = _queued(researcher)
    answer = client.post(f"{BASE}/{mine.pk}/alternative/", {"index": index})
    assert answer.status_code == 302
    page = client.get(answer["Location"])
    assert page.status_code == 200 and "no alternative number" in page.text
    assert Session.objects.filter(owner=researcher).count() == 1
    mine.refresh_from_db()
    assert mine.phase == Session.Phase.QUEUED


def test_start_this_instead_without_an_index_or_by_get_does_nothing(client, fleet, researcher):
    full_h100()
    mine = _queued(researcher)
    assert client.post(f"{BASE}/{mine.pk}/alternative/").status_code == 302
    assert client.get(f"{BASE}/{mine.pk}/alternative/?index=0").status_code == 405
    assert Session.objects.filter(owner=researcher).count() == 1


def test_start_this_instead_on_a_session_that_left_the_queue_starts_nothing(client, fleet, researcher):
    full_h100()
    mine = _queued(researcher)
    index = [o["why"] for o in mine.alternatives].index("any GPU model")
    lifecycle.session_stop(session=mine)
    answer = client.post(f"{BASE}/{mine.pk}/alternative/", {"index": index}, follow=True)
    assert answer.status_code == 200 and "no longer waits in the queue" in answer.text
    assert Session.objects.filter(owner=researcher).count() == 1


def test_staff_cannot_start_a_researchers_alternative_as_themselves(client, fleet, researcher, staff_user):
    """Staff may see every queued session, but an alternative is started for its owner only (403 message, nothing)."""
    full_h100()
    theirs = _queued(researcher)
    index = [o["why"] for o in theirs.alternatives].index("any GPU model")
    client.force_login(staff_user)
    answer = client.post(f"{BASE}/{theirs.pk}/alternative/", {"index": index}, follow=True)
    assert answer.status_code == 200 and "Only the session&#x27;s owner" in answer.text
    assert not Session.objects.filter(owner=staff_user).exists()
    theirs.refresh_from_db()
    assert theirs.phase == Session.Phase.QUEUED
