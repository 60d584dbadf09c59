"""Malformed internal JWT headers over HTTP: every ``/internal`` route answers 401 ``token_invalid`` JSON, never a 500.

The tokens below carry no valid signature; what they test is the header the control plane parses
before any key is looked up (a NUL or a lone surrogate in ``kid`` must be refused before it reaches PostgreSQL).
"""

from __future__ import annotations

import base64
import json

import pytest

from sessions.models import Session
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

PAYLOAD = {"iss": "gshare-control-plane", "sub": "operator:clu_x", "aud": "gshare-internal", "exp": 4102444800}


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _token(header: bytes | str | dict) -> str:
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    return f"{_b64(header)}.{_b64(json.dumps(PAYLOAD).encode())}.{_b64(b'not-a-signature')}"


MALFORMED = {
    "nul in kid": {"alg": "RS256", "typ": "JWT", "kid": "abc\u0000def"},
    "nul only kid": {"alg": "RS256", "kid": "\u0000"},
    "lone surrogate kid": '{"alg": "RS256", "kid": "\\ud800"}',
    "huge kid": {"alg": "RS256", "kid": "k" * 6000},
    "kid with spaces": {"alg": "RS256", "kid": "a b"},
    "integer kid": {"alg": "RS256", "kid": 7},
    "object kid": {"alg": "RS256", "kid": {"k": "v"}},
    "list kid": {"alg": "RS256", "kid": ["a"]},
    "null kid": {"alg": "RS256", "kid": None},
    "no kid": {"alg": "RS256"},
    "list alg": {"alg": ["RS256"], "kid": "abc"},
    "not json": b"this is not json",
    "json array": b"[1, 2]",
    "not utf-8": b"\xff\xfe\xfd",
    "nul in json": b'{"alg": "RS256", "kid": "a\x00b"}',
}
BAD_SHAPES = {
    "bad base64": "!!!.e30.c2ln",
    "one part": "abc",
    "empty parts": "..",
    "nul in token": "eyJhbGciOiJSUzI1NiJ9\x00.e30.c2ln",
}
ROUTES = [
    ("PUT", "/internal/v1/inventory", {"nodes": []}),
    ("POST", "/internal/v1/usage", {"samples": []}),
    ("POST", "/internal/v1/status", {"reports": []}),
    ("POST", "/internal/v1/storage", {"readings": []}),
    ("POST", "/internal/v1/token", {}),
]


def _all_tokens():
    return [*((name, _token(header)) for name, header in MALFORMED.items()), *BAD_SHAPES.items()]


def _assert_token_invalid(response, what):
    assert response.status_code == 401, (what, response.status_code, response.text[:300])
    assert response.headers["Content-Type"].startswith("application/json"), (what, response.headers["Content-Type"])
    body = response.json()
    assert body["code"] == "token_invalid", (what, body)
    assert body["detail"], what


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[p for _, p, _ in ROUTES])
def test_operator_routes_answer_401_token_invalid_for_malformed_headers(anon, method, path, body):
    for name, token in _all_tokens():
        response = anon.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})
        _assert_token_invalid(response, f"{method} {path}: {name}")


def test_connect_verify_answers_401_token_invalid_for_malformed_headers(anon, django_user_model):
    owner = django_user_model.objects.create_user("carol")
    cluster = ClusterFactory(session_domain="gpu-a.example.com")
    session = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING)
    url = f"https://gpu-a.example.com/s/{session.public_id}/lab"
    for name, token in _all_tokens():
        quoted = token.replace("\x00", "%00")
        for where, headers in (
            ("bearer", {"Authorization": f"Bearer {token}"}),
            ("query", {"X-Original-URL": f"{url}?token={quoted}"}),
            ("cookie", {"Cookie": f"gshare_connect={quoted}"}),
        ):
            response = anon.get("/internal/connect/verify", headers={"X-Original-URL": url, "X-Original-Method": "GET", **headers})
            _assert_token_invalid(response, f"verify ({where}): {name}")
