"""The Kopf wiring of the session reconciler: handlers, settings, and the thread that runs Kopf.

Built on Kopf (the operator framework named in ``docs/architecture.md``), run in a thread of ``python -m operator_agent``
beside the inventory loop (``operator_agent.main``), standalone (one replica, no peering), for
the one namespace ``GSHARE_SESSION_NAMESPACE``. One thin handler per event, each calling
``operator_agent.sessions.reconciler.SessionReconciler``:

* ``on.resume`` + ``on.create`` of a GShareSession, ``on.update`` of its ``spec`` and a
  ``timer`` every ``RESYNC_SECONDS`` -> ``SessionReconciler.reconcile``.
  A failed call raises ``kopf.TemporaryError(delay=GSHARE_RECONCILE_INTERVAL)``.
* ``on.event`` of session Pods (label ``app.kubernetes.io/managed-by=gshare-operator``) ->
  ``SessionReconciler.sync_status``.
* ``on.event`` ``DELETED`` of a GShareSession -> ``SessionReconciler.session_deleted`` (``Terminated`` reported once).
  No finalizer: a finalizer would block the deletion -- and keep the GPU pod running -- whenever the operator or the
  control plane is down. The cost: a GShareSession deleted while the operator is not running gets no ``Terminated``
  (the control plane deleted it and knows).

Kopf settings (``operator_settings``): resource/namespace scanning disabled (no cluster-wide
list/watch of CRDs and namespaces: the chart's RBAC stays namespaced to the session
namespace), Kopf's bookkeeping kept in annotations under ``operator.gshare.io/`` (a structural
CRD schema would prune ``status.kopf``). With scanning disabled Kopf only serves resources
present when it starts, so ``run_sessions`` waits until the GShareSession CRD is served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from contract import (
    GSHARE_API_GROUP,
    GSHARE_API_VERSION,
    GSHARE_SESSION_PLURAL,
    SESSION_ID_LABEL,
    session_object_name,
)
from operator_agent import kube
from operator_agent.config import OperatorConfig
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.loop import repeat
from operator_agent.manifests.session import MANAGED_BY, MANAGED_BY_LABEL
from operator_agent.reporters.status import StatusReporter
from operator_agent.sessions.reconciler import FIELD_MANAGER, SessionReconciler

__all__ = [
    "KOPF_ANNOTATION_PREFIX",
    "RESYNC_SECONDS",
    "build_registry",
    "connection_info",
    "crd_served",
    "operator_settings",
    "run_sessions",
]

logger = logging.getLogger(__name__)

KOPF_ANNOTATION_PREFIX = "operator.gshare.io"
"""Prefix of the annotations where Kopf keeps its per-object bookkeeping (diff base, retries)."""

RESYNC_SECONDS = 60.0
"""Period of the per-session safety timer that re-applies the children and re-reads the Pod."""


def operator_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    """Kopf settings of the session operator (see the module docstring)."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.scanning.disabled = True
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_ANNOTATION_PREFIX, v1=False)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=KOPF_ANNOTATION_PREFIX, v1=False)
    settings.persistence.finalizer = f"{KOPF_ANNOTATION_PREFIX}/finalizer"  # unused: no handler needs one
    settings.posting.reporting_component = FIELD_MANAGER
    settings.execution.default_backoff = config.reconcile_interval
    settings.networking.request_timeout = max(config.http_timeout, 60.0)
    return settings


def build_registry(reconciler: SessionReconciler, configuration: kube.Configuration,
                   *, retry_delay: float) -> kopf.OperatorRegistry:
    """The Kopf handlers of the session operator, bound to ``reconciler``.

    Args:
        reconciler: does the work; handlers only translate events and errors.
        configuration: the apiserver connection Kopf logs in with (same as ``reconciler``'s).
        retry_delay: seconds before a failed reconcile is retried (``kopf.TemporaryError(delay=...)``).
    """
    registry = kopf.OperatorRegistry()
    resource = (GSHARE_API_GROUP, GSHARE_API_VERSION, GSHARE_SESSION_PLURAL)

    @kopf.on.login(id="kubeconfig", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(configuration)

    @kopf.on.resume(*resource, id="reconcile", registry=registry)
    @kopf.on.create(*resource, id="reconcile", registry=registry)
    @kopf.on.update(*resource, id="reconcile", field="spec", registry=registry)
    @kopf.timer(*resource, id="resync", interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, registry=registry)
    def reconcile_session(name: str, **_: Any) -> None:
        _temporarily(lambda: reconciler.reconcile(name), f"GShareSession {name}", retry_delay)

    @kopf.on.event(*resource, id="session-deleted", registry=registry)
    def session_event(event: Mapping[str, Any], **_: Any) -> None:
        if event.get("type") == "DELETED":
            reconciler.session_deleted(_plain(event["object"]))

    @kopf.on.event("", "v1", "pods", id="pod-status", labels={MANAGED_BY_LABEL: MANAGED_BY}, registry=registry)
    def pod_event(body: Mapping[str, Any], **_: Any) -> None:
        session_id = (body.get("metadata", {}).get("labels") or {}).get(SESSION_ID_LABEL)
        if session_id:
            _temporarily(lambda: reconciler.sync_status(session_object_name(session_id)), f"pod of {session_id}",
                         retry_delay, raise_temporary=False)

    return registry


def connection_info(configuration: kube.Configuration) -> kopf.ConnectionInfo:
    """Kopf's credentials from a ``kubernetes`` client configuration (kubeconfig or in-cluster).

    The bearer token is read afresh (``refresh_api_key_hook``: the in-cluster token file is
    re-read), so Kopf's re-login after a 401 picks up a rotated service-account token.
    """
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook(configuration)
    # What the kubernetes client itself sends as the Authorization header ("Bearer <token>"); the
    # api_key entry is "BearerToken" from client v33, "authorization" before.
    bearer = (configuration.auth_settings().get("BearerToken") or {}).get("value")
    authorization = bearer or configuration.get_api_key_with_prefix("authorization") or ""
    scheme, _, token = authorization.strip().partition(" ")
    if not token:
        scheme, token = ("Bearer", scheme) if scheme else (None, None)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def _temporarily(work: Callable[[], object], what: str, delay: float, *, raise_temporary: bool = True) -> None:
    """Run ``work``; turn apiserver failures into ``kopf.TemporaryError(delay=delay)`` (or a log line)."""
    try:
        with kube.apiserver_call():
            work()
    except kube.ApiException as exc:
        message = f"{what}: apiserver answered {exc.status} {exc.reason}: {kube.api_message(exc)}"
    except kube.KubeUnavailable as exc:
        message = f"{what}: cannot reach the apiserver: {exc}"
    else:
        return
    if raise_temporary:
        raise kopf.TemporaryError(message, delay=delay)
    logger.warning("%s (the next event or the resync timer retries)", message)


def _plain(value: Any) -> Any:
    """A Kopf body view as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


class _NotMainThreadFilter(logging.Filter):
    """Drops Kopf's warning that it ignores OS signals: ``operator_agent.main`` handles them and sets the stop flag."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "OS signals are ignored" not in record.getMessage()


def crd_served(api_client: kube.ApiClient, *, request_timeout: float | None = None) -> bool:
    """Whether the apiserver serves ``gsharesessions.gshare.io/v1alpha1`` (discovery, no RBAC needed).

    Raises:
        kube.ApiException (other than 404), or a transport error (``kube.apiserver_call`` makes it ``KubeUnavailable``).
    """
    kwargs: dict[str, Any] = {} if request_timeout is None else {"_request_timeout": request_timeout}
    try:
        resources = kube.custom_objects(api_client).get_api_resources(
            GSHARE_API_GROUP, GSHARE_API_VERSION, **kwargs
        )
    except kube.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == GSHARE_SESSION_PLURAL for r in resources.resources or [])


def run_sessions(
    config: OperatorConfig,
    api_client: kube.ApiClient,
    client: ControlPlaneClient,
    stop: threading.Event,
    *,
    ready: threading.Event | None = None,
) -> None:
    """Reconcile the GShareSessions of ``config.session_namespace`` and report their status until ``stop`` is set.

    Starts the reporter thread, waits until the GShareSession CRD is served, then runs Kopf in
    this thread (``kopf.run`` with ``stop`` as its stop flag). If Kopf ends on its own (an error it
    could not handle), it is started again after ``config.reconcile_interval`` seconds (at least 1).

    Args:
        config: operator settings (namespace, intervals, timeouts).
        api_client: client of the data-plane apiserver.
        client: control-plane client for the status reports (not shared with another thread).
        stop: set to stop; the caller joins this thread afterwards.
        ready: set once Kopf has started (for tests).
    """
    reporter = StatusReporter(client)
    reconciler = SessionReconciler(api_client, reporter, config.session_namespace, request_timeout=config.http_timeout)
    flusher = threading.Thread(
        target=reporter.run, args=(stop, config.reconcile_interval, config.backoff_max), name="status-reporter", daemon=True
    )
    flusher.start()
    logging.getLogger("kopf._core.reactor.running").addFilter(_NotMainThreadFilter())
    if not logger.isEnabledFor(logging.DEBUG):
        # Kopf logs "Handler ... succeeded" at INFO for every watch event of every session and pod;
        # this module logs the transitions that matter. Kopf's warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    restart_delay = max(config.reconcile_interval, 1.0)
    waiting_logged = False

    def step() -> float:
        """Wait for the CRD, then run Kopf until ``stop`` (or until it gives up); return the pause before trying again."""
        nonlocal waiting_logged
        try:
            with kube.apiserver_call():
                served = crd_served(api_client, request_timeout=config.http_timeout)
        except kube.ApiException as exc:
            logger.warning("cannot look up the GShareSession resource: apiserver answered %s %s", exc.status, exc.reason)
            return restart_delay
        except kube.KubeUnavailable as exc:
            logger.warning("cannot reach the apiserver to look up the GShareSession resource: %s", exc)
            return restart_delay
        if not served:
            if not waiting_logged:
                logger.warning("the GShareSession CRD (%s.%s/%s) is not installed: sessions are not reconciled until it is",
                               GSHARE_SESSION_PLURAL, GSHARE_API_GROUP, GSHARE_API_VERSION)
                waiting_logged = True
            return max(restart_delay, 10.0)
        logger.info("reconciling GShareSessions in namespace %s", config.session_namespace)
        try:
            kopf.run(
                registry=build_registry(reconciler, api_client.configuration, retry_delay=config.reconcile_interval),
                settings=operator_settings(config),
                standalone=True,
                clusterwide=False,
                namespaces=[config.session_namespace],
                stop_flag=stop,
                ready_flag=ready,
            )
        except Exception as exc:  # Kopf gave up (e.g. the apiserver vanished): start it again
            logger.error("session reconciler stopped: %s: %s; restarting in %gs", type(exc).__name__, exc, restart_delay)
        return restart_delay

    try:
        repeat(step, stop)
    finally:
        reporter.wake()
        flusher.join(timeout=max(config.http_timeout, 1.0) + 1.0)

