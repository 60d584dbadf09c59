"""Console pages for sessions and GPU reservations: read-only (never deleted here), Stop through the service,
constant queries."""

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions.models import Allocation, Session
from tests.console_checks import assert_read_only
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory

pytestmark = pytest.mark.django_db


def _running_on_shared_gpus(count: int = 2) -> list[Session]:
    """``count`` Running sessions sharing one GPU of a new cluster, each with its reservation."""
    cluster = ClusterFactory()
    gpu = GpuDeviceFactory(node=NodeFactory(cluster=cluster), cluster=cluster, split_count=4)
    sessions = []
    for _ in range(count):
        session = SessionFactory(cluster=cluster, node=gpu.node.name, gpu_memory_mib=4000, gpu_cores=25)
        Allocation.objects.create(session=session, device=gpu, memory_mib=4000, cores=25)
        sessions.append(session)
    return sessions


def test_sessions_and_reservations_are_read_only(console):
    session = _running_on_shared_gpus()[0]
    assert_read_only(console, "/gpu_sessions/session/", session)
    assert_read_only(console, "/gpu_sessions/allocation/", session.allocations.get())
    assert Allocation.objects.count() == 2
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.RUNNING


def test_stop_action_goes_through_the_service(console):
    session = _running_on_shared_gpus(1)[0]
    assert 'value="stop"' in console.get("/gpu_sessions/session/").content.decode()
    asked = console.post("/gpu_sessions/session/", {"action": "stop", "_selected_action": [session.pk], "index": 0})
    assert asked.status_code == 200 and "Stop session?" in asked.content.decode()  # the confirmation first
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.RUNNING
    response = console.post("/gpu_sessions/session/", {"action": "stop", "_selected_action": [session.pk], "index": 0, "post": "yes"},
                            follow=True)
    assert response.status_code == 200 and "1 session(s) stopping" in response.content.decode()
    session.refresh_from_db()
    assert session.phase == Session.Phase.STOPPING
    assert Session.objects.filter(pk=session.pk).exists()


def test_stop_needs_the_change_permission(client, django_user_model):
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_session"))
    client.force_login(viewer)
    session = _running_on_shared_gpus(1)[0]
    assert 'value="stop"' not in client.get("/gpu_sessions/session/").content.decode()
    assert client.post("/gpu_sessions/session/", {"action": "stop", "_selected_action": [session.pk], "index": 0}).status_code == 403
    assert Session.objects.get(pk=session.pk).phase == Session.Phase.RUNNING


@pytest.mark.parametrize("path", ["/gpu_sessions/allocation/", "/gpu_sessions/session/"])
def test_list_pages_have_constant_queries(console, path):
    counts = []
    for _ in range(2):
        _running_on_shared_gpus(3)
        with CaptureQueriesContext(connection) as queries:
            response = console.get(path)
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
    session = Session.objects.first()
    assert console.get(f"/gpu_sessions/session/{session.pk}/change/").status_code == 200
