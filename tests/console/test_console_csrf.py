"""The console's own POST views (Stop, Open, Start session, token create, actions) refuse a request without CSRF."""

from __future__ import annotations

import pytest
from django.test import Client

from sessions.models import Session
from tests.factories import ClusterFactory, SessionFactory

pytestmark = pytest.mark.django_db


def test_console_posts_need_csrf(plain_user):
    session = SessionFactory(owner=plain_user, cluster=ClusterFactory(name="lab-f1"))
    client = Client(enforce_csrf_checks=True)
    client.force_login(plain_user)
    for url, data in ((f"/gpu_sessions/session/{session.pk}/stop/", {}), (f"/gpu_sessions/session/{session.pk}/open/", {}),
                      ("/gpu_sessions/session/start/", {"image": "x", "gpus": "1", "share": "whole", "idempotency_key": "k"}),
                      ("/gshare/apitoken/add/", {"name": "csrf"}), ("/storage/volume/add/", {"name": "csrf", "quota_gb": "1"}),
                      ("/gpu_sessions/session/", {"action": "stop", "_selected_action": [str(session.pk)]})):
        assert client.post(url, data).status_code == 403, url
    session.refresh_from_db()
    assert session.phase == Session.Phase.RUNNING
    assert not Session.objects.exclude(pk=session.pk).exists()
