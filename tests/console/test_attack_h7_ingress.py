"""h7's attack on the demo ingress (issue 11): a ``Host`` carrying a path made the verify judge one session while the
ingress served another. The ingress now answers 400 to any Host that is not ``name[:port]`` (as nginx's
``ngx_http_validate_host``), builds ``X-Original-URL`` from the validated Host, and logs only its host name; the
verify itself refuses an ``X-Original-URL`` whose authority is not a valid host[:port]."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import pytest

from sessions import services
from sessions.models import Session
from tests.demo.test_ingress import demo_stack, link_of, raw_get  # noqa: F401 -- demo_stack: the fixture
from tests.e2e.conftest import operator_process  # noqa: F401 -- the fixture
from tests.factories import ClusterFactory


@pytest.mark.django_db(transaction=True)
@pytest.mark.e2e
def test_host_header_with_a_path_does_not_open_another_session(http, demo_stack, caplog):  # noqa: F811
    ingress, host, (mine, other) = demo_stack["ingress"], demo_stack["host"], demo_stack["sessions"]
    query = urlsplit(link_of(http, mine)).query
    token = query.split("token=", 1)[1]
    caplog.set_level(logging.INFO, logger="demo.ingress")
    smuggled_host = f"{host}/s/{mine['id']}/?{query}&"
    status, _, body = raw_get(ingress, smuggled_host, f"/s/{other['id']}/")
    assert status == 400 and other["id"] not in body, (status, body[:300])
    for hostile in (f"{host}?{query}", f"{host}#x", f"x@{host}", f"{host}\\s", f"{host}:x", f"{host.split(':')[0]}..x"):
        status, _, body = raw_get(ingress, hostile, f"/s/{mine['id']}/?{query}")
        assert status == 400 and mine["id"] not in body, hostile
    status, _, body = raw_get(ingress, host, f"/s/{other['id']}/", {"Host": host})  # two Host headers
    assert status == 400, body[:300]
    # the raw Host (its path and token) is never logged: only a valid host name, else "-"
    assert token not in caplog.text and "/s/ses_" not in "".join(r.getMessage().split('"GET', 1)[0] for r in caplog.records)
    # the link itself still opens its own session, with a plain Host
    status, _, body = raw_get(ingress, host, f"/s/{mine['id']}/?{query}")
    assert status == 200 and mine["id"] in body
    assert f'"{host.split(":")[0]}" "GET /s/{mine["id"]}/" 200' in caplog.text and token not in caplog.text


@pytest.mark.django_db
def test_verify_refuses_an_original_url_whose_authority_is_not_host_and_port(client, django_user_model):
    owner = django_user_model.objects.create_user("carol")
    session = Session.objects.create(owner=owner, cluster=ClusterFactory(session_domain="gpu-a.example.com"), image="img",
                                     gpus=1, phase=Session.Phase.RUNNING)
    url = services.session_connect(session=session, user=owner)
    path = url.split("gpu-a.example.com", 1)[1]
    for authority in ("gpu-a.example.com?x", "gpu-a.example.com#x", "gpu-a.example.com:x", "gpu-a.example.com:",
                      "gpu-a.example.com%2f", "gpu-a.example.com\\", "gpu-a..example.com", "gpu-a.example.com\x7f"):
        response = client.get("/internal/connect/verify", HTTP_X_ORIGINAL_URL=f"https://{authority}{path}",
                              HTTP_X_ORIGINAL_METHOD="GET")
        assert response.status_code == 401 and response.json()["code"] == "connect_refused", authority
    for authority in ("gpu-a.example.com", "GPU-A.example.com:443"):
        response = client.get("/internal/connect/verify", HTTP_X_ORIGINAL_URL=f"https://{authority}{path}",
                              HTTP_X_ORIGINAL_METHOD="GET")
        assert response.status_code == 200, authority
