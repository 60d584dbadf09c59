"""What the nginx in front of gunicorn (``gshare.front_proxy``) must not change: Envoy's check is judged on the request
target exactly as sent (every path trick of the verify's suite still refused, a link still let in), a refusal by
nginx itself is a JSON error, and an absolute-form target (which nginx would pass on in origin form) is refused."""

from __future__ import annotations

import json

import pytest

import contract
from tests.e2e.test_connect_ext_authz_gunicorn import TRICKS, send
from tests.e2e.test_slow_clients import DOMAIN, behind_proxy, setup  # noqa: F401 -- the fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PREFIX = contract.CONNECT_EXT_AUTHZ_PATH.encode()


def test_the_check_is_judged_on_the_target_as_sent_through_the_proxy(behind_proxy, setup):  # noqa: F811
    _api_token, session, link = setup
    other = b"ses_aaaaaaaaaaaaaaaa"
    token = link().encode()
    status, headers, _ = send(behind_proxy, b"GET", PREFIX + b"/s/" + session.public_id.encode() + b"/lab?x=1&token=" + token)
    assert status == 307 and headers["location"] == [f"/s/{session.public_id}/lab?x=1"]
    for path in TRICKS:
        target = PREFIX + path.replace(b"{mine}", session.public_id.encode()).replace(b"{yours}", other)
        status, headers, body = send(behind_proxy, b"GET", target + b"?token=" + token)
        assert status in (400, 401), (path, status)
        assert json.loads(body)["code"] in ("connect_refused", "invalid_request"), (path, body)
        assert "set-cookie" not in headers and "x-auth-request-user" not in headers, path


def test_an_absolute_form_target_is_refused_by_the_proxy(behind_proxy, setup):  # noqa: F811
    _api_token, session, link = setup
    target = PREFIX + b"/s/" + session.public_id.encode() + b"/?token=" + link().encode()
    for authority in (DOMAIN.encode(), b"evil.example", b"127.0.0.1"):
        status, headers, body = send(behind_proxy, b"GET", b"http://" + authority + target)
        assert (status, json.loads(body)["code"]) == (400, "invalid_request"), authority
        assert "set-cookie" not in headers
