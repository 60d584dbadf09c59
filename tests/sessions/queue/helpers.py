"""What the queue's tests share: their instant, image and GPU model, and starting and ending a session through the
services."""

from datetime import UTC, datetime, timedelta

from sessions import create, lifecycle
from sessions.models import Session

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
IMAGE = "quay.io/jupyter/base-notebook"
H100 = "NVIDIA H100 80GB HBM3"


def start(owner, **body) -> Session:
    """``sessions.create.session_create`` for ``owner``: one GPU of any model unless ``body`` says otherwise."""
    return create.session_create(owner=owner, image=IMAGE, **{"gpus": 1, **body})


def end(session: Session) -> None:
    """Terminate ``session`` as its release path does."""
    lifecycle.session_terminate(session=Session.objects.get(pk=session.pk), message="ended")
