"""Fixtures of the queue's tests (``sessions.queue``): a frozen clock at ``helpers.NOW`` and no publishing, each asked
for by the modules that want it (``pytest.mark.usefixtures``)."""

import pytest
import time_machine

from sessions.lifecycle import outbox
from sessions.queue import leave
from tests.sessions.queue.helpers import NOW


@pytest.fixture
def frozen():
    """The clock stands at ``NOW`` (time-machine, not ticking)."""
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


@pytest.fixture
def no_background(monkeypatch):
    """Neither applies nor passes are published: the tests run ``queue_pass`` themselves, when they mean to."""
    monkeypatch.setattr(outbox, "publish_after_commit", lambda *args, **kwargs: None)
    monkeypatch.setattr(outbox, "publish", lambda task_name, session_pk: None)
    monkeypatch.setattr(leave, "publish_after_commit", lambda: None)
