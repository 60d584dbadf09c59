"""A staff account without permissions cannot open (get a connect link for) or poll another user's session, nor pass
the connect verify to it, nor see the dashboard's tiles; a researcher's session filter lists no cluster. The right to
open anyone's session is ``sessions.permissions.may_open_any_session`` (superuser, or staff with
``gpu_sessions.change_session``), the same in the console, the connect-link service and the verify, whose cached user
facts are dropped when the user's groups or permissions change."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.cache import cache

from sessions import connect
from sessions.models import Session
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

DOMAIN = "gpu-perm.example.com"
#: How long after a change every process refuses: the per-process facts' TTL.
BOUND = connect.FACTS_CACHE_SECONDS + 0.2


@pytest.fixture
def bare_staff(django_user_model):
    return django_user_model.objects.create_user("helpdesk", "h@example.test", "Pw-123456789!", is_staff=True)


@pytest.fixture
def running(django_user_model):
    cache.clear()
    connect.clear_local_caches()
    owner = django_user_model.objects.create_user("victim")
    return Session.objects.create(owner=owner, cluster=ClusterFactory(name="lab-p1", session_domain=DOMAIN), image="img",
                                  gpus=1, phase=Session.Phase.RUNNING)


def _change_session() -> Permission:
    return Permission.objects.get(content_type__app_label="gpu_sessions", codename="change_session")


def test_staff_without_permissions_cannot_open_or_poll_others_sessions(client, bare_staff, running):
    client.force_login(bare_staff)
    assert client.get("/gpu_sessions/session/").status_code == 403
    assert client.get(f"/gpu_sessions/session/{running.pk}/change/").status_code == 403
    status = client.get(f"/gpu_sessions/session/{running.pk}/status/")
    opened = client.post(f"/gpu_sessions/session/{running.pk}/open/")
    assert status.status_code == 403 and b"ses_" not in status.content
    assert opened.status_code == 403 and "token=" not in (opened.headers.get("Location") or "")


def test_staff_who_may_view_poll_and_who_may_change_open(client, bare_staff, running):
    bare_staff.user_permissions.add(Permission.objects.get(content_type__app_label="gpu_sessions", codename="view_session"))
    client.force_login(bare_staff)
    status = client.get(f"/gpu_sessions/session/{running.pk}/status/")
    assert status.status_code == 200 and status.json()["id"] == running.public_id
    assert client.post(f"/gpu_sessions/session/{running.pk}/open/").status_code == 403  # viewing is not opening
    bare_staff.user_permissions.add(_change_session())
    opened = client.post(f"/gpu_sessions/session/{running.pk}/open/")
    assert opened.status_code == 302 and opened["Location"].startswith(f"https://{DOMAIN}/s/{running.public_id}/?token=")


def test_a_researcher_opens_and_polls_their_own_only(client, running, plain_user):
    mine = Session.objects.create(owner=plain_user, cluster=running.cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    client.force_login(plain_user)
    assert client.get(f"/gpu_sessions/session/{mine.pk}/status/").status_code == 200
    assert client.post(f"/gpu_sessions/session/{mine.pk}/open/").status_code == 302
    assert client.get(f"/gpu_sessions/session/{running.pk}/status/").status_code == 404
    assert client.post(f"/gpu_sessions/session/{running.pk}/open/").status_code == 404


def _verify(client, token: str, session) -> int:
    url = f"https://{DOMAIN}/s/{session.public_id}/?token={token}"
    return client.get("/internal/connect/verify", HTTP_X_ORIGINAL_URL=url, HTTP_X_ORIGINAL_METHOD="GET").status_code


def test_the_verify_admits_another_users_session_only_with_the_permission_and_forgets_it_when_taken(
        client, bare_staff, running, django_user_model, django_capture_on_commit_callbacks):
    # A link the service would not mint for this user (staff alone), signed as the service does.
    token = connect.link_token_sign(user=bare_staff, session_id=running.public_id, host=DOMAIN)
    response = client.get("/internal/connect/verify", HTTP_X_ORIGINAL_URL=f"https://{DOMAIN}/s/{running.public_id}/?token={token}",
                          HTTP_X_ORIGINAL_METHOD="GET")
    assert response.status_code == 403 and response.json()["code"] == "connect_forbidden"

    operators = Group.objects.create(name="session operators")
    with django_capture_on_commit_callbacks(execute=True):
        operators.permissions.add(_change_session())
        bare_staff.groups.add(operators)  # a group change drops the user's cached facts
    time.sleep(BOUND)
    assert _verify(client, token, running) == 200
    with django_capture_on_commit_callbacks(execute=True):
        operators.permissions.remove(_change_session())  # the group's permission taken: its members' facts dropped
    time.sleep(BOUND)
    assert _verify(client, token, running) == 403
    with django_capture_on_commit_callbacks(execute=True):
        operators.permissions.add(_change_session())
    time.sleep(BOUND)
    assert _verify(client, token, running) == 200
    with django_capture_on_commit_callbacks(execute=True):
        operators.delete()  # memberships go without an m2m_changed
    time.sleep(BOUND)
    assert _verify(client, token, running) == 403
    with django_capture_on_commit_callbacks(execute=True):
        bare_staff.user_permissions.add(_change_session())
    time.sleep(BOUND)
    assert _verify(client, token, running) == 200
    with django_capture_on_commit_callbacks(execute=True):
        bare_staff.user_permissions.clear()
    time.sleep(BOUND)
    assert _verify(client, token, running) == 403

    boss = django_user_model.objects.create_superuser("boss", "b@example.test", "Pw-123456789!")
    assert _verify(client, connect.link_token_sign(user=boss, session_id=running.public_id, host=DOMAIN), running) == 200
    # the owner needs no permission
    assert _verify(client, connect.link_token_sign(user=running.owner, session_id=running.public_id, host=DOMAIN), running) == 200


def test_the_connect_api_refuses_staff_without_the_permission(client, bare_staff, running):
    from identity.tokens import api_token_create

    token = api_token_create(username=bare_staff.username)[1]
    response = client.post(f"/api/v1/sessions/{running.public_id}/connect", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 403 and response.json()["code"] == "forbidden"


def test_staff_without_the_cluster_permission_see_no_dashboard(client, bare_staff):
    ClusterFactory(name="lab-secret-fleet")
    client.force_login(bare_staff)
    page = client.get("/")
    # (the top bar's cluster selector names the clusters to every user, researchers too: by design)
    assert page.status_code == 200
    assert b'id="dashboard"' not in page.content and b'class="gs-tiles"' not in page.content
    assert b'id="dashboard-chart"' not in page.content
    bare_staff.user_permissions.add(Permission.objects.get(content_type__app_label="clusters", codename="view_cluster"))
    page = client.get("/")
    assert page.status_code == 200 and b'id="dashboard"' in page.content and b'class="gs-tiles"' in page.content


def test_the_schema_and_the_docs_need_a_signed_in_user(client, plain_user):
    anonymous = client.get("/api/v1/schema/")
    assert anonymous.status_code == 401 and b"not_authenticated" in anonymous.content  # in the schema's format
    assert "/internal/" not in anonymous.content.decode()
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 302 and docs["Location"] == "/login/?next=/api/v1/docs/"  # a browser logs in first
    assert client.get("/api/v1/docs/", HTTP_AUTHORIZATION="Bearer gsh_wrong").status_code == 302  # never a 500
    assert client.get("/api/v1/schema/", HTTP_AUTHORIZATION="Bearer gsh_wrong").status_code == 401
    from identity.tokens import api_token_create

    token = api_token_create(username=plain_user.username)[1]
    schema = client.get("/api/v1/schema/?format=json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert schema.status_code == 200 and "/api/v1/sessions/" in schema.json()["paths"]
    client.force_login(plain_user)
    assert client.get("/api/v1/docs/").status_code == 200
    assert client.get("/api/v1/docs/", HTTP_AUTHORIZATION="Bearer gsh_wrong").status_code == 200  # the page is the session's


def test_the_session_filter_lists_no_cluster_to_researchers_and_no_unused_deregistered_one_to_staff(client, plain_user,
                                                                                                   django_user_model):
    from clusters.models import Cluster

    ClusterFactory(name="lab-old-secret", status=Cluster.Status.DEREGISTERED)
    history = ClusterFactory(name="lab-old-history", status=Cluster.Status.DEREGISTERED)
    live = ClusterFactory(name="lab-live-one")
    Session.objects.create(owner=plain_user, cluster=history, image="img", gpus=1, phase=Session.Phase.TERMINATED)
    client.force_login(plain_user)
    page = client.get("/gpu_sessions/session/")
    assert page.status_code == 200
    assert b"cluster__id__exact" not in page.content and b"lab-old-secret" not in page.content
    assert [spec.title for spec in page.context["cl"].filter_specs] == ["phase", "activity"]
    boss = django_user_model.objects.create_superuser("boss", "b@example.test", "Pw-123456789!")
    client.force_login(boss)
    page = client.get("/gpu_sessions/session/")
    (cluster_filter,) = [spec for spec in page.context["cl"].filter_specs if spec.title == "cluster"]
    named = " | ".join(str(label) for _pk, label in cluster_filter.lookup_choices)  # "<name> (<clu_ id>)"
    assert live.name in named and history.name in named and "lab-old-secret" not in named


def test_open_is_offered_only_to_who_may_open(client, bare_staff, running):
    """A staff user who may view sessions but not change them sees no Open button (it would answer 403); with the
    permission to change sessions, Open is offered on the row and the session's page."""
    bare_staff.user_permissions.add(Permission.objects.get(content_type__app_label="gpu_sessions", codename="view_session"))
    client.force_login(bare_staff)
    listing = client.get("/gpu_sessions/session/").content.decode()
    page = client.get(f"/gpu_sessions/session/{running.pk}/change/").content.decode()
    assert running.public_id in listing and "gs-open" not in listing and "gs-open" not in page
    bare_staff.user_permissions.add(_change_session())
    listing = client.get("/gpu_sessions/session/").content.decode()
    page = client.get(f"/gpu_sessions/session/{running.pk}/change/").content.decode()
    assert "gs-open" in listing and "gs-open" in page
