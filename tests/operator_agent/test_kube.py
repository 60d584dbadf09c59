"""The operator's Kubernetes gateway (operator_agent.kube): transport failures become KubeUnavailable, refusals pass."""

from __future__ import annotations

import socket

import pytest
import urllib3.exceptions

from operator_agent import kube


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_refusal_passes_through_unchanged():
    refusal = kube.ApiException(status=404, reason="Not Found")
    with pytest.raises(kube.ApiException) as raised, kube.apiserver_call():
        raise refusal
    assert raised.value is refusal


@pytest.mark.parametrize(("error", "kind", "timeout", "timed_out"), [
    (ConnectionRefusedError(111, "Connection refused"), "ConnectionRefusedError", False, False),
    (urllib3.exceptions.ProtocolError("Connection aborted."), "ProtocolError", False, False),
    (urllib3.exceptions.ReadTimeoutError(None, "/api/v1/nodes", "Read timed out."), "ReadTimeoutError", True, True),
    (TimeoutError("timed out"), "TimeoutError", True, True),
    (urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes",
                                      reason=urllib3.exceptions.ConnectTimeoutError("connect timed out")),
     "MaxRetryError", False, True),
])
def test_a_transport_failure_is_kube_unavailable(error, kind, timeout, timed_out):
    with pytest.raises(kube.KubeUnavailable) as raised, kube.apiserver_call():
        raise error
    assert str(raised.value) == str(error)
    assert (raised.value.kind, raised.value.timeout, raised.value.timed_out) == (kind, timeout, timed_out)
    assert raised.value.__cause__ is error


def test_other_errors_are_not_touched():
    with pytest.raises(KeyError), kube.apiserver_call():
        raise KeyError("spec")


def test_an_unreachable_apiserver_through_the_client_is_kube_unavailable():
    configuration = kube.Configuration(host=f"http://127.0.0.1:{closed_port()}")
    configuration.retries = False
    with kube.ApiClient(configuration) as api, pytest.raises(kube.KubeUnavailable) as raised, kube.apiserver_call():
        kube.core_v1(api).list_node(_request_timeout=5)
    # retries off: urllib3 raises the connection error itself, not a MaxRetryError around it
    assert raised.value.kind == "NewConnectionError" and "Connection refused" in str(raised.value)


def test_without_retries_copies_the_connection_and_turns_retries_off():
    configuration = kube.Configuration(host="https://apiserver.example:6443")
    configuration.retries = 3
    with kube.ApiClient(configuration) as api:
        quiet = kube.without_retries(api)
        try:
            assert quiet.configuration.host == "https://apiserver.example:6443"
            assert quiet.configuration.retries is False and configuration.retries == 3
        finally:
            quiet.close()



def test_api_message_is_the_status_message_else_the_status_and_reason():
    refusal = kube.ApiException(status=422, reason="Unprocessable Entity")
    refusal.body = '{"kind": "Status", "message": "Pod \\"ses-x\\" is invalid: spec.containers: Required value"}'
    assert kube.api_message(refusal) == 'Pod "ses-x" is invalid: spec.containers: Required value'
    refusal.body = "<html>bad gateway</html>"
    assert kube.api_message(refusal) == "422 Unprocessable Entity"
