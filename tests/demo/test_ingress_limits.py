"""The demo ingress bounds what a client can hold: it answers 413 to a body above nginx's default ``client_max_body_size`` (1m) without reading it, 400 to a
``Content-Length`` that is not digits, and drops a client silent for its ``client_timeout`` (nginx's 60 s)."""

from __future__ import annotations

import socket

import pytest

from demo import ingress_nginx as demo_ingress
from demo.ingress_nginx import DemoIngress


@pytest.fixture
def ingress():
    served = DemoIngress([], poll_seconds=3600, client_timeout=1.0).start()
    yield served
    served.stop()


def _exchange(ingress, request: bytes, wait: float = 8.0) -> bytes | None:
    """Send ``request``; everything answered until the ingress closes, or None if it still waits after ``wait`` s."""
    with socket.create_connection(("127.0.0.1", ingress.port), timeout=10) as sock:
        sock.sendall(request)
        sock.settimeout(wait)
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except TimeoutError:
            return None
        return received


def test_a_huge_announced_body_is_a_413_unread_and_the_connection_closed(ingress):
    answer = _exchange(ingress, b"POST / HTTP/1.1\r\nHost: x.localhost\r\nContent-Length: 100000000000\r\n\r\n")
    assert answer is not None, "the ingress still waits for the body: one thread per such connection"
    assert answer.startswith(b"HTTP/1.1 413 ")
    limit = demo_ingress.MAX_BODY_BYTES
    answer = _exchange(ingress, b"POST / HTTP/1.1\r\nHost: x.localhost\r\nContent-Length: %d\r\n\r\n" % (limit + 1))
    assert answer is not None and answer.startswith(b"HTTP/1.1 413 ")
    answer = _exchange(ingress, b"POST / HTTP/1.1\r\nHost: x.localhost\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                       % (limit, b"x" * limit))
    assert answer is not None and answer.startswith(b"HTTP/1.1 404 ")  # at the limit: read, then the default backend


@pytest.mark.parametrize("length", [b"-1", b"1e9", b"\xb2", b"", b"12345678901234567890"])
def test_a_content_length_that_is_not_digits_is_a_400(ingress, length):
    answer = _exchange(ingress, b"POST / HTTP/1.1\r\nHost: x.localhost\r\nContent-Length: " + length + b"\r\n\r\n")
    assert answer is not None and answer.startswith(b"HTTP/1.1 400 "), answer


def test_a_silent_client_is_dropped_after_the_client_timeout(ingress):

    answer = _exchange(ingress, b"POST / HTTP/1.1\r\nHost: x.localhost\r\nContent-Length: 10\r\n\r\nabc")
    assert answer == b"", "the ingress kept the connection of a client that stopped sending its body"
    assert _exchange(ingress, b"GET / HTTP/1.1\r\nHost: x.localhost\r\n") == b""  # nor waits for headers forever


def test_the_default_client_timeout_is_nginx_s():
    assert demo_ingress.CLIENT_TIMEOUT == 60.0 and demo_ingress.MAX_BODY_BYTES == 1024 * 1024
    served = DemoIngress([], poll_seconds=3600)
    try:
        assert served.server.RequestHandlerClass.timeout == 60.0
    finally:
        served.server.server_close()
