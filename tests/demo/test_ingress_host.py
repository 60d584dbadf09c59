"""The demo ingress validates the ``Host``, so a Host carrying a path cannot make the verify judge one session while
the ingress serves another: it answers 400 to any Host that is not ``name[:port]`` (as nginx's
``ngx_http_validate_host``), builds ``X-Original-URL`` from the validated Host, and logs only its host name."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import pytest

from tests.demo.test_ingress import demo_stack, link_of, raw_get  # noqa: F401 -- demo_stack: the fixture
from tests.e2e.conftest import operator_process  # noqa: F401 -- the fixture


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
