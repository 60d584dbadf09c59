"""``on_failure`` of the apply and delete tasks runs after the last retry, when the session may have moved on: stopped
by its owner or reported Running by the operator while the last attempt was in flight, or deleted. Giving up then must
not overwrite what happened meanwhile, nor raise."""

import pytest

from sessions import tasks
from sessions.lifecycle import TransientApplyError
from sessions.models import Session
from tests.factories import SessionFactory

pytestmark = pytest.mark.django_db

GAVE_UP = TransientApplyError("the apiserver of lab-c1 did not answer (DeadlineExceeded)")


@pytest.mark.parametrize(("phase", "message"), [(Session.Phase.STOPPING, "Stopped on request."), (Session.Phase.RUNNING, ""),
                                                (Session.Phase.STARTING, "")])
def test_an_apply_that_gives_up_leaves_a_session_that_moved_on_alone(phase, message):
    session = SessionFactory(phase=phase, message=message)
    tasks.session_apply_task.on_failure(GAVE_UP, "t-1", (session.pk,), {}, None)
    session.refresh_from_db()
    assert (session.phase, session.message, session.ended_at) == (phase, message, None)


def test_an_apply_that_gives_up_still_fails_a_session_left_scheduled():
    session = SessionFactory(phase=Session.Phase.SCHEDULED)
    tasks.session_apply_task.on_failure(GAVE_UP, "t-1", (session.pk,), {}, None)
    session.refresh_from_db()
    assert session.phase == Session.Phase.FAILED and "did not answer" in session.message


@pytest.mark.parametrize("task", [tasks.session_apply_task, tasks.session_delete_task])
def test_giving_up_on_a_session_deleted_meanwhile_does_nothing(task):
    session = SessionFactory(phase=Session.Phase.SCHEDULED)
    pk = session.pk
    Session.objects.filter(pk=pk).delete()
    task.on_failure(GAVE_UP, "t-1", (pk,), {}, None)  # no DoesNotExist out of on_failure


def test_a_delete_that_gives_up_leaves_a_terminated_session_alone():
    session = SessionFactory(phase=Session.Phase.TERMINATED, message="Stopped on request.")
    tasks.session_delete_task.on_failure(GAVE_UP, "t-2", (session.pk,), {}, None)
    session.refresh_from_db()
    assert (session.phase, session.message) == (Session.Phase.TERMINATED, "Stopped on request.")
