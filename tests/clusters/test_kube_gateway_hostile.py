"""``kube.KubeGateway`` against a hostile apiserver: huge, non-JSON, secret-quoting or escape-laden error
answers, a 2xx that is not JSON, a redirect elsewhere. What the gateway keeps of such an answer ends up in API error
bodies, session messages and audit rows, so it must be bounded, printable and free of the credential it was sent."""

from __future__ import annotations

import pytest
import yaml

from kube import KubeGateway, KubeRefused, KubeUnavailable
from kube.errors import MAX_MESSAGE
from kube.gateway import NAMESPACES
from tests.helpers import status_body

TOKEN = "sekrit-bearer-0123456789abcdef"


def kubeconfig_for(host_port: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://{host_port}"}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


def refusal_of(host_port: str) -> KubeRefused | KubeUnavailable:
    with KubeGateway.for_kubeconfig(kubeconfig_for(host_port), call_timeout=5) as kube, pytest.raises((KubeRefused, KubeUnavailable)) as info:
        kube.get(NAMESPACES, "kube-system")
    return info.value


def assert_clean(text: str, limit: int) -> None:
    assert len(text) <= limit, len(text)
    assert TOKEN not in text
    assert not any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in text), repr(text)


def test_a_ten_megabyte_non_json_error_body_leaves_no_message_and_is_read_in_time(hostile):
    host_port, _ = hostile(500, b"<html>" + b"x" * 10_000_000 + b"</html>", headers={"Content-Type": "text/html"})
    error = refusal_of(host_port)
    # the whole answer was read and classified, not cut off by the call's own deadline (that would be no status)
    assert isinstance(error, KubeUnavailable) and error.status == 500 and error.message == ""
    assert not error.deadline_exceeded


def test_a_status_message_quoting_the_token_and_escapes_is_bounded_printable_and_redacted(hostile):
    kubeconfig_text = yaml.safe_dump(kubeconfig_for("x:1"))
    message = f"\x1b[31mdenied\x1b[0m\r\nAuthorization: Bearer {TOKEN}\x00\x07 " + kubeconfig_text + "y" * 5000
    host_port, _ = hostile(403, status_body(message))
    error = refusal_of(host_port)
    assert isinstance(error, KubeRefused) and error.status == 403
    assert error.message.startswith("denied Authorization: [redacted]")
    assert_clean(error.message, MAX_MESSAGE)
    assert_clean(str(error), 2 * MAX_MESSAGE)


def test_a_hostile_reason_phrase_is_bounded_printable_and_redacted(hostile):
    reason = "\x1b]0;owned\x07Forbidden " + f"Bearer {TOKEN} bare {TOKEN} " + "z" * 20_000
    host_port, _ = hostile(403, status_body("no"), reason=reason)
    error = refusal_of(host_port)
    assert isinstance(error, KubeRefused) and error.status == 403
    assert_clean(error.reason, MAX_MESSAGE)
    assert_clean(error.summary, 2 * MAX_MESSAGE + 2)


def test_a_2xx_with_garbage_json_is_an_unreadable_refusal(hostile):
    host_port, _ = hostile(200, b'{"kind": "Namespace", \xff\xfe garbage', headers={"Content-Type": "application/json"})
    error = refusal_of(host_port)
    assert isinstance(error, KubeRefused) and error.unreadable
    host_port, _ = hostile(200, b"[1, 2, 3]", headers={"Content-Type": "application/json"})
    assert refusal_of(host_port).unreadable


def test_a_redirect_to_a_host_that_is_not_allowed_is_not_followed(hostile):
    elsewhere, elsewhere_hits = hostile(200, b'{"kind": "Namespace"}', allow=False)
    host_port, hits = hostile(302, b"", headers={"Location": f"http://{elsewhere}/api/v1/namespaces/kube-system"})
    error = refusal_of(host_port)
    assert hits and not elsewhere_hits, "the redirect was followed to a host the kubeconfig did not name"
    # retries=0 makes urllib3 give up on the first redirect: "did not answer", transient, not a 302 refusal.
    assert isinstance(error, KubeUnavailable) and error.cause_name == "MaxRetryError"


@pytest.mark.django_db(transaction=True)
def test_a_registration_refused_by_a_hostile_apiserver_quotes_neither_its_escapes_nor_the_token(http, hostile):
    reason = f"\x1b[2J\x1b]0;pwn\x07Forbidden Bearer {TOKEN} " + "r" * 5000
    host_port, hits = hostile(403, status_body(f"token: {TOKEN}\r\n" + "m" * 5000), reason=reason)
    response = http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": yaml.safe_dump(kubeconfig_for(host_port))})
    assert hits and hits[0]["authorization"] == f"Bearer {TOKEN}"  # the hostile server did get the credential
    assert response.status_code == 400 and response.json()["code"] == "cluster_auth_failed", response.text[:300]
    assert TOKEN not in response.text and "\\u001b" not in response.text and "\x1b" not in response.text
    assert len(response.text) < 2000
