"""The operator's Kubernetes gateway: the one operator module that talks to the ``kubernetes`` client and ``urllib3``.

Every other operator module reaches the data-plane apiserver through what this module hands out: the API objects
(``core_v1``, ``custom_objects``, ``storage_v1``); ``ApiException`` for a refusal, whose ``status`` callers read (404
absent, 409 exists, 400/422 invalid, 403 RBAC) and whose ``Status`` message ``api_message`` gives; and one error for a
transport failure (no connection, TLS, a timeout, an answer cut off), ``KubeUnavailable``, raised by the
``apiserver_call`` block each call site wraps its calls in. The client factory (``kubernetes_api_client``:
kubeconfig or in-cluster) stays in ``operator_agent.config``, with the settings it reads.

The import-linter contract ``operator-kube-gateway`` (``.importlinter``) keeps it so.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator

import kubernetes.client
import urllib3.exceptions

__all__ = [
    "ApiClient",
    "ApiException",
    "Configuration",
    "CoreV1Api",
    "CustomObjectsApi",
    "KubeUnavailable",
    "StorageV1Api",
    "V1Node",
    "V1Pod",
    "api_message",
    "apiserver_call",
    "core_v1",
    "custom_objects",
    "storage_v1",
    "without_retries",
]

ApiClient = kubernetes.client.ApiClient
ApiException = kubernetes.client.exceptions.ApiException
Configuration = kubernetes.client.Configuration
CoreV1Api = kubernetes.client.CoreV1Api
CustomObjectsApi = kubernetes.client.CustomObjectsApi
StorageV1Api = kubernetes.client.StorageV1Api
V1Node = kubernetes.client.V1Node
V1Pod = kubernetes.client.V1Pod

_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
_TIMEOUT_ERRORS = (urllib3.exceptions.TimeoutError, TimeoutError)


class KubeUnavailable(Exception):
    """The apiserver could not be reached, or its answer was cut off: a transport failure, worth retrying later.

    ``str()`` is the underlying error's text. Attributes:
        kind: the underlying error's class name (e.g. ``MaxRetryError``, ``ConnectionRefusedError``).
        timeout: the underlying error is itself a timeout (urllib3's or the socket's).
        timed_out: a timeout is the underlying error or one of its causes (e.g. a ``MaxRetryError`` whose reason
            is a ``ReadTimeoutError``).
    """

    def __init__(self, message: str, *, kind: str, timeout: bool, timed_out: bool):
        super().__init__(message)
        self.kind = kind
        self.timeout = timeout
        self.timed_out = timed_out


@contextlib.contextmanager
def apiserver_call() -> Iterator[None]:
    """A block of apiserver calls (and reads of their answers) whose transport failures raise ``KubeUnavailable``.

    ``ApiException`` (the apiserver answered with an error status) passes through unchanged.

    Raises:
        KubeUnavailable: from the ``urllib3`` or ``OSError`` failure raised in the block (as ``__cause__``).
    """
    try:
        yield
    except _TRANSPORT_ERRORS as exc:
        raise KubeUnavailable(str(exc), kind=type(exc).__name__, timeout=isinstance(exc, _TIMEOUT_ERRORS),
                              timed_out=_timed_out(exc)) from exc


def api_message(exc: ApiException) -> str:
    """The ``message`` of the apiserver's ``Status`` error body, else the status and reason."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"{exc.status} {exc.reason}"


def core_v1(api_client: ApiClient) -> CoreV1Api:
    """The core/v1 API (Pods, Nodes, Services, PVCs, Secrets, Events) over ``api_client``."""
    return kubernetes.client.CoreV1Api(api_client)


def custom_objects(api_client: ApiClient) -> CustomObjectsApi:
    """The custom-object API (GShareSessions, routing objects, API discovery of a group version) over ``api_client``."""
    return kubernetes.client.CustomObjectsApi(api_client)


def storage_v1(api_client: ApiClient) -> StorageV1Api:
    """The storage.k8s.io/v1 API (StorageClasses, CSIStorageCapacity) over ``api_client``."""
    return kubernetes.client.StorageV1Api(api_client)


def without_retries(api_client: ApiClient) -> ApiClient:
    """A new client with ``api_client``'s connection settings whose calls urllib3 does not retry (its own pool)."""
    configuration = copy.copy(api_client.configuration)
    configuration.retries = False
    return kubernetes.client.ApiClient(configuration)


def _timed_out(exc: BaseException) -> bool:
    """Whether a timeout is ``exc`` or one of its reasons or causes (followed at most ten deep)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        if isinstance(current, _TIMEOUT_ERRORS):
            return True
        current = getattr(current, "reason", None) or current.__cause__ or current.__context__
        seen += 1
    return False
