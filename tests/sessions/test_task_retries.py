"""The apply and delete tasks leave a transient apiserver failure to Celery's own retries (``autoretry_for``) and give
up in ``on_failure`` once they are spent; eager (the tests' mode) the first failure is final."""

import pytest
import yaml

from sessions import tasks
from sessions.lifecycle import TransientApplyError
from sessions.models import Session
from tests.factories import ClusterFactory, SessionFactory
from tests.helpers import silent_kubeconfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def silent_session(silent_listener, settings):
    settings.GSHARE_PROBE_TIMEOUT = 0.3
    cluster = ClusterFactory(apiserver_url=f"http://{silent_listener}", kubeconfig=yaml.safe_dump(silent_kubeconfig(silent_listener)))
    return SessionFactory(cluster=cluster, phase=Session.Phase.SCHEDULED)


@pytest.mark.parametrize("task", [tasks.session_apply_task, tasks.session_delete_task])
def test_the_tasks_retry_the_transient_error_with_celerys_backoff(task):
    assert task.autoretry_for == (TransientApplyError,)
    assert (task.max_retries, task.retry_backoff, task.retry_backoff_max, task.retry_jitter) == (4, 2, 30, True)


def test_eager_the_first_failure_is_final(silent_session):
    tasks.session_apply_task.delay(silent_session.pk)
    silent_session.refresh_from_db()
    assert silent_session.phase == Session.Phase.FAILED
    assert silent_session.message.startswith("Could not apply the session to its cluster after several attempts: the apiserver of ")


def test_on_a_worker_the_last_retry_raises_and_on_failure_gives_up(silent_session):
    task = tasks.session_apply_task
    task.push_request(id="t-1", retries=task.max_retries, is_eager=False, called_directly=False, args=[silent_session.pk], kwargs={})
    try:
        with pytest.raises(TransientApplyError) as failed:  # retries spent: Celery raises the task's own error
            task.run(silent_session.pk)
        silent_session.refresh_from_db()
        assert silent_session.phase == Session.Phase.SCHEDULED  # not given up by the body
        task.on_failure(failed.value, "t-1", (silent_session.pk,), {}, None)
    finally:
        task.pop_request()
    silent_session.refresh_from_db()
    assert silent_session.phase == Session.Phase.FAILED and "did not answer" in silent_session.message


def test_a_delete_that_keeps_failing_marks_the_session_failed_with_the_fix(silent_session):
    Session.objects.filter(pk=silent_session.pk).update(phase=Session.Phase.STOPPING)
    tasks.session_delete_task.on_failure(TransientApplyError("the apiserver did not answer (DeadlineExceeded)"), "t-2",
                                         (silent_session.pk,), {}, None)
    silent_session.refresh_from_db()
    assert silent_session.phase == Session.Phase.FAILED
    assert silent_session.message == ("Stopped, but its GShareSession could not be deleted: the apiserver did not answer "
                                      "(DeadlineExceeded). Delete it by hand.")
