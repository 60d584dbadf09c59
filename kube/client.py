"""Kubernetes API clients for registered clusters, built from the stored (validated) kubeconfig.

Every client is made with ``retries=0`` so that a time budget given to a call is the time the call
can take: urllib3's default would retry a timed-out request three times.

A time budget (:class:`Deadline`) bounds a call as a whole, not each socket read: urllib3's timeouts
restart on every read, so a server that trickles one byte at a time would keep a call alive for as
long as it likes. :meth:`Deadline.call` runs the call under a wall-clock bound instead: the sockets the
call uses are shut down when the budget is spent, and the call raises :class:`DeadlineExceeded`.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import kubernetes
import urllib3
import yaml
from kubernetes.config.config_exception import ConfigException
from urllib3.connection import HTTPConnection, HTTPSConnection

from core.home import gshare_home
from kube.kubeconfig import KubeconfigError


def _cert_dir() -> Path:
    """A 0700 folder for the PEM files the Kubernetes client writes from inline ``*-data`` (0600 each,
    removed at exit by the client)."""
    folder = gshare_home() / "run" / "kube"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def api_client_for_kubeconfig(config: dict) -> kubernetes.client.ApiClient:
    """Return an ``ApiClient`` for a kubeconfig dict already checked by ``validate_kubeconfig``.

    Args:
        config: a kubeconfig dict reduced to one context (no exec, no file paths).

    Returns:
        A new ``kubernetes.client.ApiClient`` (close it when done).

    Raises:
        KubeconfigError: ``kubeconfig_invalid`` when the client library cannot use it (e.g. the
            inline certificate data is not a PEM).
    """
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_kube_config_from_dict(
            config, client_configuration=configuration, persist_config=False, temp_file_path=str(_cert_dir())
        )
        configuration.retries = 0
        api = kubernetes.client.ApiClient(configuration)
    except (ConfigException, ValueError, OSError) as exc:
        raise KubeconfigError(
            f"The Kubernetes client cannot use this kubeconfig ({type(exc).__name__}: {str(exc)[:200]}): "
            "check that the inline certificate data is a base64 PEM (`kubectl config view --raw --minify --flatten`)."
        ) from None
    guard_pools(api.rest_client.pool_manager)
    return api


def guard_pools(pool_manager: urllib3.PoolManager) -> None:
    """Make the connections of ``pool_manager`` (the Kubernetes client's, or a ``requests`` adapter's ``poolmanager``) ones
    that :meth:`Deadline.call` can cut off; otherwise they are the stock urllib3 ones. Call it before its first request."""
    pool_manager.pool_classes_by_scheme = {"http": _GuardedHTTPConnectionPool, "https": _GuardedHTTPSConnectionPool}


def api_client_for_cluster(cluster) -> kubernetes.client.ApiClient:
    """Return an ``ApiClient`` for a registered ``Cluster`` (its kubeconfig is decrypted in memory only)."""
    return api_client_for_kubeconfig(yaml.safe_load(cluster.kubeconfig))


T = TypeVar("T")

#: The guard of the apiserver call running in this thread (``Deadline.call``), if any.
_active = threading.local()


class DeadlineExceeded(TimeoutError):
    """An apiserver call did not complete within its time budget and was cut off.

    A ``TimeoutError`` (so an ``OSError``): callers that treat network failures as "unreachable" treat
    this one so too. Whatever the cut-off call raised or returned is discarded: an answer cut off
    mid-way is not an answer.

    Attributes:
        seconds: the whole budget, seconds.
    """

    def __init__(self, seconds: float):
        super().__init__(f"no complete answer within {seconds:g} s")
        self.seconds = seconds


class _CallGuard:
    """The sockets one apiserver call uses, shut down when its time is up (from a timer thread).

    Each socket is tracked through a duplicate of its file descriptor: ``shutdown`` acts on the connection
    shared by every descriptor, so it also reaches a socket that TLS wrapping detached from its Python
    object, and it makes a read blocked in the calling thread return at once. The duplicates are closed
    when the call ends; the call's own sockets are left to urllib3.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dups: list[socket.socket] = []
        self.fired = False
        self._done = False

    def track(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        try:
            dup = socket.fromfd(sock.fileno(), sock.family, sock.type)
        except (OSError, ValueError):  # already closed
            return
        with self._lock:
            if not self._done:
                self._dups.append(dup)
                if self.fired:  # connected after the time was up
                    _shutdown(dup)
                return
        dup.close()

    def fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            for dup in self._dups:
                _shutdown(dup)

    def finish(self) -> bool:
        """End the call (no shutdown after this); return whether the time ran out during it."""
        with self._lock:
            self._done = True
            dups, self._dups = self._dups, []
        for dup in dups:
            dup.close()
        return self.fired


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _track(sock: socket.socket | None) -> None:
    guard = getattr(_active, "guard", None)
    if guard is not None:
        guard.track(sock)


class _GuardedConnectionMixin:
    """Hands every socket a call opens or reuses to the running ``Deadline.call`` of this thread."""

    def _new_conn(self):
        sock = super()._new_conn()
        _track(sock)
        return sock

    def request(self, *args, **kwargs):
        _track(self.sock)  # a kept-alive connection reused by this call (a new one is tracked when it connects)
        return super().request(*args, **kwargs)


class _GuardedHTTPConnection(_GuardedConnectionMixin, HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnectionMixin, HTTPSConnection):
    pass


class _GuardedHTTPConnectionPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSConnectionPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


#: TLS errors that say nothing about the kubeconfig (the connection dropped mid-handshake): "unreachable".
_TLS_TRANSPORT_ERRORS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


#: ``ssl.SSLError.reason`` values that mean the kubeconfig's certificate or key data could not be loaded.
_UNUSABLE_DATA_REASONS = ("KEY_VALUES_MISMATCH", "CA_MD_TOO_WEAK", "EE_KEY_TOO_SMALL", "NO_CERTIFICATE_OR_CRL_FOUND")


def _ssl_error_in(exc: BaseException) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` behind an exception of the Kubernetes client (urllib3 wraps it once or twice)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ssl.SSLError):
            return exc
        reason = getattr(exc, "reason", None)
        exc = reason if isinstance(reason, BaseException) else (exc.__cause__ or exc.__context__)
        seen += 1
    return None


def tls_failure_detail(exc: BaseException, *, server: str) -> str | None:
    """A sentence naming the fix when ``exc`` (raised by an apiserver call) is a TLS failure caused by the
    kubeconfig: certificate data that cannot be used, a server certificate that does not verify against
    ``certificate-authority-data`` (or ``tls-server-name``), a server that does not speak TLS, or a TLS
    alert from the server (e.g. a refused client certificate). None for anything else, including a
    connection dropped mid-handshake and a call cut off by its :class:`Deadline`.
    """
    if isinstance(exc, DeadlineExceeded):
        return None
    error = _ssl_error_in(exc)
    if error is None or isinstance(error, _TLS_TRANSPORT_ERRORS):
        return None
    what = f"{type(error).__name__}: {getattr(error, 'verify_message', None) or error.reason or error.strerror or error}"[:200]
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"The certificate of the server at {server} did not verify against the kubeconfig's certificate-authority-data "
            f"({what}): put the cluster's CA certificate in `certificate-authority-data` and make `server` (or "
            "`tls-server-name`) a name the apiserver's certificate is issued for (`kubectl config view --raw --minify --flatten`)."
        )
    if error.library in ("PEM", "X509", "ASN1") or "PEM lib" in str(error) or error.reason in _UNUSABLE_DATA_REASONS:
        return (
            f"The certificate data in the kubeconfig could not be used ({what}): `certificate-authority-data`, "
            "`client-certificate-data` and `client-key-data` must be base64 of PEM certificates and a matching key "
            "(`kubectl config view --raw --minify --flatten`)."
        )
    return (
        f"The TLS handshake with the server at {server} failed ({what}): check that `server` is the apiserver's https URL and, "
        "for a client certificate, that the apiserver accepts `client-certificate-data` (`kubectl config view --raw --minify --flatten`)."
    )


@dataclass
class Deadline:
    """A time budget shared by several apiserver calls, each bounded as a whole by what is left.

    Args:
        seconds: the whole budget, seconds.
    """

    seconds: float

    def __post_init__(self) -> None:
        self._end = time.monotonic() + self.seconds

    def remaining(self) -> float:
        """Seconds left (never below 0)."""
        return max(0.0, self._end - time.monotonic())

    def request_timeout(self) -> tuple[float, float]:
        """``(connect, read)`` timeouts for the next call, both bounded by what is left (minimum 0.05 s).

        These bound each socket read only, not the call: a server that trickles its answer is not cut
        off by them. Make the call with :meth:`call` to bound it as a whole.
        """
        left = max(0.05, self.remaining())
        return (left, left)

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """Run one apiserver call ``fn(*args, **kwargs)`` within what is left of the budget, as a whole.

        ``fn`` makes its request through an ``ApiClient`` from :func:`api_client_for_kubeconfig` or a pool manager
        passed to :func:`guard_pools` (only their connections can be cut off): a method of a Kubernetes API object, or the gateway's own request
        (``kube.gateway``); it is given ``_request_timeout`` too (it bounds connecting). The body is read within the bound (do not pass
        ``_preload_content=False``). Name resolution is not bounded.

        Returns:
            What ``fn`` returns.

        Raises:
            DeadlineExceeded: the budget was spent before or during the call: its sockets were shut down and
                whatever it raised or returned is discarded.
            Exception: whatever ``fn`` raises otherwise.
        """
        left = self.remaining()
        if left <= 0:
            raise DeadlineExceeded(self.seconds)
        guard = _CallGuard()
        timer = threading.Timer(left, guard.fire)
        timer.daemon = True
        outer = getattr(_active, "guard", None)
        _active.guard = guard
        timer.start()
        try:
            result = fn(*args, _request_timeout=(left, left), **kwargs)
        except Exception as exc:
            if guard.finish():
                raise DeadlineExceeded(self.seconds) from exc
            raise
        finally:
            timer.cancel()
            _active.guard = outer
            guard.finish()
        if guard.fired:
            raise DeadlineExceeded(self.seconds)
        return result
