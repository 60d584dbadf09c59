"""The page each cluster's fallback route for ``/s/`` shows (``sessions.ended``): a stopped session's URL and an
unknown id get the same gShare page (404, links to start a new session and to the console's page of the session),
answered on a registered cluster's ``session_domain`` (the Host the ingress passes on) and the internal hosts, never
on the control plane's public host; the console's ``ended/<id>/`` link leads the owner and staff to the session's
page (when, why, who stopped it) and nobody else."""

from __future__ import annotations

import pytest

from audit import context as audit_context
from sessions import ext_authz, lifecycle
from sessions.models import Session
from tests.console_checks import page_text
from tests.factories import ClusterFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db

DOMAIN = "lab-c1.gshare.example.org"


@pytest.fixture
def cluster(settings):
    settings.ALLOWED_HOSTS = ["gshare.example.org", "testserver", "127.0.0.1", "localhost"]
    settings.GSHARE_CONTROL_PLANE_URL = "https://gshare.example.org/"
    ext_authz.forget_session_domains()
    yield ClusterFactory(name="lab-c1", session_domain=DOMAIN)
    ext_authz.forget_session_domains()


def _get(client, path: str, host: str = DOMAIN, method: str = "get"):
    return getattr(client, method)(path, HTTP_HOST=host)


def test_a_stopped_sessions_url_and_an_unknown_id_get_the_same_gshare_page(client, cluster):
    session = SessionFactory(cluster=cluster)
    lifecycle.session_stop(session=session)
    Session.objects.filter(pk=session.pk).update(phase=Session.Phase.TERMINATED)
    unknown = "ses_" + "a" * 16
    stopped = _get(client, f"/s/{session.public_id}/lab/tree?token=abc")
    never = _get(client, f"/s/{unknown}/lab/tree?token=abc")
    for response in (stopped, never):
        assert response.status_code == 404
        assert response["Content-Type"] == "text/html; charset=utf-8"
        assert response["Cache-Control"] == "no-store" and response["Referrer-Policy"] == "no-referrer"
        text = response.content.decode()
        assert "This session has ended or does not exist" in text
        assert 'href="https://gshare.example.org/gpu_sessions/session/start/" id="gs-start-new"' in text
        assert "default backend" not in text and "abc" not in text  # the token is never echoed
    # Nothing tells the two apart but the id from the URL: no row is read for the page.
    assert stopped.content.decode().replace(session.public_id, "ID") == never.content.decode().replace(unknown, "ID")
    assert f'href="https://gshare.example.org/gpu_sessions/session/ended/{session.public_id}/"' in stopped.content.decode()
    assert session.owner.username not in stopped.content.decode() and "Stopped on request" not in stopped.content.decode()


@pytest.mark.parametrize("path", ["/s/", "/s/not-an-id/", "/s/ses_<script>/", "/s/%3Cb%3E/x", "/s/ses_" + "a" * 300 + "/"])
def test_odd_session_paths_get_the_page_without_echoing_them(client, cluster, path):
    response = _get(client, path)
    assert response.status_code == 404
    text = response.content.decode()
    assert "This session has ended or does not exist" in text and "this address" in text
    assert "<script>" not in text and "<b>" not in text and "a" * 300 not in text
    assert 'href="https://gshare.example.org/gpu_sessions/session/"' in text


def test_every_method_gets_the_page_and_head_no_body(client, cluster):
    for method in ("post", "put", "delete", "options"):
        assert _get(client, "/s/ses_aaaaaaaaaaaaaaaa/x", method=method).status_code == 404
    head = _get(client, "/s/ses_aaaaaaaaaaaaaaaa/x", method="head")
    assert head.status_code == 404 and head.content == b""


def test_only_on_session_domains_and_internal_hosts(client, cluster):
    # The control plane's public host: the console's routes (a login redirect), not the page.
    public = _get(client, "/s/ses_aaaaaaaaaaaaaaaa/", host="gshare.example.org")
    assert b"This session has ended" not in public.content
    # An unregistered host is not a session domain: Django's refusal of a host it does not serve.
    assert _get(client, "/s/ses_aaaaaaaaaaaaaaaa/", host="lab-c9.gshare.example.org").status_code == 400
    # An internal host (the fallback route may name the internal plane's host).
    assert b"This session has ended" in _get(client, "/s/ses_aaaaaaaaaaaaaaaa/", host="testserver").content
    # A deregistered cluster's domain stops being one.
    cluster.status = cluster.Status.DEREGISTERED
    cluster.save(update_fields=["status"])
    ext_authz.forget_session_domains()
    assert _get(client, "/s/ses_aaaaaaaaaaaaaaaa/").status_code == 400


def test_the_pages_link_leads_the_owner_and_staff_to_the_session_and_nobody_else(client, cluster, django_user_model):
    owner, other = UserFactory(username="alice"), UserFactory(username="mallory")
    session = SessionFactory(cluster=cluster, owner=owner)
    with audit_context.actor_scope(f"console:{owner.username}"):
        lifecycle.session_stop(session=session)
    link = f"/gpu_sessions/session/ended/{session.public_id}/"
    assert client.get(link)["Location"].startswith("/login/")  # log in first
    client.force_login(other)
    assert client.get(link).status_code == 404
    client.force_login(owner)
    response = client.get(link)
    assert response.status_code == 302 and response["Location"] == f"/gpu_sessions/session/{session.pk}/change/"
    page = page_text(client.get(response["Location"]))
    assert "Stopped on request." in page and "console:alice" in page  # why, and who stopped it
    assert client.get("/gpu_sessions/session/ended/ses_aaaaaaaaaaaaaaaa/").status_code == 404
    staff = django_user_model.objects.create_superuser("admin", "admin@example.test", "pw")
    client.force_login(staff)
    assert client.get(link)["Location"] == f"/gpu_sessions/session/{session.pk}/change/"


@pytest.mark.parametrize("path", ["/s/..%2Finternal/v1/inventory", "/s/%2e%2e/internal/connect/verify",
                                  "/s/ses_aaaaaaaaaaaaaaaa/../../api/v1/me", "/s/x/%2e%2e/%2e%2e/gpu_sessions/session/"])
def test_on_a_session_domain_nothing_under_s_reaches_another_route(client, cluster, path):
    # Encoded or literal dot segments below /s/ (a proxy that passed them on unresolved): the page, and nothing else.
    response = client.get(path, HTTP_HOST=DOMAIN)
    assert response.status_code == 404 and b"This session has ended or does not exist" in response.content
