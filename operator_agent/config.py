"""Operator configuration, read from the process environment.

The operator cannot use django-environ (it imports Django when installed), so its settings
are a small frozen dataclass built from ``os.environ``:

* ``GSHARE_CLUSTER_ID`` (required): id of this cluster on the control plane.
* ``GSHARE_CONTROL_PLANE_URL`` (required): base URL of the control plane (``http``/``https``).
* ``GSHARE_TOKEN_FILE``: path of the mounted operator token; default ``/var/run/secrets/gshare/internal-jwt``.
* ``GSHARE_INVENTORY_INTERVAL``: seconds between inventory reports; default ``30``.
* ``GSHARE_HTTP_TIMEOUT``: seconds per HTTP request (connect and read, each); default ``10``.
* ``GSHARE_BACKOFF_MAX``: cap of the retry backoff, in seconds; default ``60``.
* ``GSHARE_LOG_LEVEL``: Python logging level name; default ``INFO``.
* ``GSHARE_SESSION_NAMESPACE``: namespace of the ``GShareSession`` objects (and of the session
  Pods, Services and Ingresses); default ``gshare-sessions`` (``contract.SESSION_NAMESPACE_DEFAULT``).
* ``GSHARE_RECONCILE_INTERVAL``: seconds; the longest a session status change waits before it is
  reported (changes are normally sent at once) and the retry delay of a failed reconcile; default ``2``.
* ``GSHARE_OPERATOR_NAMESPACE`` (the pod's namespace, from the downward API) and
  ``GSHARE_TOKEN_SECRET_NAME`` (the token Secret, ``gshare-operator-internal-jwt`` in the chart): when both
  are set, the operator also reads its token from that Secret through the Kubernetes API and writes a
  self-refreshed token back to it (``operator_agent.token``); unset, it uses the file and memory only.
* ``GSHARE_VOLUME_SYNC_INTERVAL``: seconds between volume-sync reports (``POST /internal/v1/storage``:
  CSIStorageCapacity readings, the PVC status of every gShare volume, node disks; ``operator_agent.reporters.storage``);
  default ``60``.
* ``GSHARE_VOLUME_STORAGE_CLASS``: the StorageClass this cluster provisions session volumes from (the chart's
  ``volumeStorageClass``); always listed in the volume-sync report, with ``capacity_bytes: null`` when no
  CSIStorageCapacity object names it. Empty: none (only classes with CSIStorageCapacity objects are reported).
* ``GSHARE_USAGE_INTERVAL``: seconds between usage samples of the Running sessions (``operator_agent.reporters.usage``,
  ``POST /internal/v1/usage``); default ``60``.
* ``GSHARE_USAGE_QUEUE_PATH``: the SQLite file of the on-disk usage queue (unsent samples and each session's last
  sampled instant); default ``/var/lib/gshare/usage-queue.sqlite3``. Its directory must exist and be writable (the
  chart mounts a volume there); it is not created.
* ``GSHARE_USAGE_QUEUE_MAX``: most samples kept unsent; beyond it the oldest are dropped (and logged); default
  ``200000``.
* ``GSHARE_ACTIVITY_INTERVAL``: seconds between GPU activity reports of the Running sessions
  (``operator_agent.reporters.activity``, ``POST /internal/v1/activity``), read from HAMi's vGPU monitor; default ``30``.
* ``GSHARE_HAMI_MONITOR_SELECTOR``: label selector of HAMi's device-plugin pods (in any namespace), whose
  ``vGPUmonitor`` container serves the monitor; default ``app.kubernetes.io/component=hami-device-plugin``
  (``contract.HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT``).
* ``GSHARE_HAMI_MONITOR_NAMESPACE``: the namespace of those pods (HAMi's release namespace, ``kube-system`` in HAMi's
  install guide); empty: they are looked for in every namespace (which needs ``list`` on pods cluster-wide).
* ``GSHARE_HAMI_MONITOR_PORT``: the monitor's container port, reached through the apiserver's pod proxy; default
  ``9394`` (``contract.HAMI_MONITOR_PORT_DEFAULT``).
* ``GSHARE_HAMI_MONITOR_TIMEOUT``: seconds one monitor scrape may take as a whole (connect, answer, body); default
  ``5``. A node whose monitor does not answer in time is reported ``unknown`` for that tick.
* ``GSHARE_METRICS_PORT``: port of the operator's own ``/metrics`` (Prometheus text, ``operator_agent.metrics``) on
  ``GSHARE_METRICS_ADDRESS`` (an IP address, default ``0.0.0.0``: all interfaces, as a Prometheus in the cluster
  scrapes the pod IP); default ``8080``; ``0`` turns it off.

Kubernetes access (``kubernetes_api_client``): in-cluster service-account config when
``KUBERNETES_SERVICE_HOST`` is set (the operator runs as a pod), otherwise the kubeconfig
named by ``KUBECONFIG`` (``~/.kube/config`` when unset), as ``kubectl`` does.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import kubernetes.client
import kubernetes.config

from contract import (
    DEFAULT_TOKEN_FILE,
    HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT,
    HAMI_MONITOR_PORT_DEFAULT,
    SESSION_NAMESPACE_DEFAULT,
)

__all__ = ["DEFAULT_USAGE_QUEUE_MAX", "DEFAULT_USAGE_QUEUE_PATH", "ConfigError", "OperatorConfig", "kubernetes_api_client"]

DEFAULT_USAGE_QUEUE_PATH = "/var/lib/gshare/usage-queue.sqlite3"
"""Default ``GSHARE_USAGE_QUEUE_PATH``: on the volume the operator chart mounts at ``/var/lib/gshare``."""

DEFAULT_USAGE_QUEUE_MAX = 200_000
"""Default ``GSHARE_USAGE_QUEUE_MAX``: about 2.3 days of a 24-GPU cluster at one sample per GPU and minute."""

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# DNS-1123 label: what Kubernetes accepts as a namespace name.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
# DNS-1123 subdomain: what Kubernetes accepts as a Secret name.
# Label selector characters: keys, values, and the operators =, ==, !=, in/notin (...), !key, commas and spaces.
_SELECTOR = re.compile(r"[A-Za-z0-9_./=!,() -]+\Z")
_DNS1123_SUBDOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


class ConfigError(ValueError):
    """A required environment variable is missing or a value is malformed; the message names the variable."""


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of one operator process.

    Attributes:
        cluster_id: id of this cluster on the control plane (informational: the control plane
            takes the cluster from the token's ``sub``, ``operator:<cluster_id>``).
        control_plane_url: base URL of the control plane, without a trailing ``/``.
        token_file: path of the operator token file; re-read before every request.
        inventory_interval: seconds between inventory reports (> 0).
        http_timeout: seconds allowed per HTTP request, for connect and for read (> 0).
        backoff_max: cap, in seconds, of the exponential retry backoff (> 0).
        log_level: logging level name (``DEBUG`` … ``CRITICAL``).
        session_namespace: namespace of the ``GShareSession`` objects and their children.
        reconcile_interval: seconds; longest delay of a status report and retry delay of a failed
            reconcile (> 0).
        operator_namespace: namespace of the operator's token Secret, or None.
        token_secret_name: name of the operator's token Secret, or None.
        volume_sync_interval: seconds between volume-sync reports (> 0).
        volume_storage_class: the StorageClass of session volumes on this cluster, or None.
        usage_interval: seconds between usage samples (> 0).
        usage_queue_path: path of the SQLite file of the usage queue.
        usage_queue_max: most unsent samples kept (>= 1); the oldest are dropped beyond it.
        activity_interval: seconds between GPU activity reports (> 0).
        hami_monitor_selector: label selector of HAMi's device-plugin pods.
        hami_monitor_namespace: namespace of those pods, or None for every namespace.
        hami_monitor_port: container port of HAMi's vGPU monitor (1-65535).
        hami_monitor_timeout: seconds one monitor scrape may take as a whole (> 0).
        metrics_port: port of the operator's ``/metrics``, 0 = not served.
        metrics_address: IP address the ``/metrics`` server binds.
    """

    cluster_id: str
    control_plane_url: str
    token_file: str = DEFAULT_TOKEN_FILE
    inventory_interval: float = 30.0
    http_timeout: float = 10.0
    backoff_max: float = 60.0
    log_level: str = "INFO"
    session_namespace: str = SESSION_NAMESPACE_DEFAULT
    reconcile_interval: float = 2.0
    operator_namespace: str | None = None
    token_secret_name: str | None = None
    volume_sync_interval: float = 60.0
    volume_storage_class: str | None = None
    usage_interval: float = 60.0
    usage_queue_path: str = DEFAULT_USAGE_QUEUE_PATH
    usage_queue_max: int = DEFAULT_USAGE_QUEUE_MAX
    activity_interval: float = 30.0
    hami_monitor_selector: str = HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT
    hami_monitor_namespace: str | None = None
    hami_monitor_port: int = HAMI_MONITOR_PORT_DEFAULT
    hami_monitor_timeout: float = 5.0
    metrics_port: int = 8080
    metrics_address: str = "0.0.0.0"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> OperatorConfig:
        """Build the config from ``environ`` (``os.environ`` by default).

        Raises:
            ConfigError: a required variable is missing/empty or a value is malformed.
        """
        cluster_id = _required(environ, "GSHARE_CLUSTER_ID")
        url = _required(environ, "GSHARE_CONTROL_PLANE_URL").rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"GSHARE_CONTROL_PLANE_URL must be an http(s) URL such as https://gshare.example.com, got {url!r}"
            )
        token_file = (environ.get("GSHARE_TOKEN_FILE") or "").strip() or DEFAULT_TOKEN_FILE
        log_level = (environ.get("GSHARE_LOG_LEVEL") or "INFO").strip().upper()
        if log_level not in _LOG_LEVELS:
            raise ConfigError(f"GSHARE_LOG_LEVEL must be one of {', '.join(_LOG_LEVELS)}, got {log_level!r}")
        session_namespace = (environ.get("GSHARE_SESSION_NAMESPACE") or "").strip() or SESSION_NAMESPACE_DEFAULT
        if not _DNS1123_LABEL.match(session_namespace):
            raise ConfigError(
                f"GSHARE_SESSION_NAMESPACE must be a Kubernetes namespace name (DNS-1123 label), got {session_namespace!r}"
            )
        operator_namespace = (environ.get("GSHARE_OPERATOR_NAMESPACE") or "").strip() or None
        if operator_namespace is not None and not _DNS1123_LABEL.match(operator_namespace):
            raise ConfigError(
                f"GSHARE_OPERATOR_NAMESPACE must be a Kubernetes namespace name (DNS-1123 label), got {operator_namespace!r}"
            )
        token_secret_name = (environ.get("GSHARE_TOKEN_SECRET_NAME") or "").strip() or None
        if token_secret_name is not None and not _DNS1123_SUBDOMAIN.match(token_secret_name):
            raise ConfigError(
                f"GSHARE_TOKEN_SECRET_NAME must be a Kubernetes object name (DNS-1123 subdomain), got {token_secret_name!r}"
            )
        hami_monitor_namespace = (environ.get("GSHARE_HAMI_MONITOR_NAMESPACE") or "").strip() or None
        if hami_monitor_namespace is not None and not _DNS1123_LABEL.match(hami_monitor_namespace):
            raise ConfigError("GSHARE_HAMI_MONITOR_NAMESPACE must be a Kubernetes namespace name (DNS-1123 label), "
                              f"got {hami_monitor_namespace!r}")
        metrics_address = (environ.get("GSHARE_METRICS_ADDRESS") or "").strip() or "0.0.0.0"
        try:
            ipaddress.ip_address(metrics_address)
        except ValueError:
            raise ConfigError(f"GSHARE_METRICS_ADDRESS must be an IP address such as 0.0.0.0 or 127.0.0.1, "
                              f"got {metrics_address[:100]!r}") from None
        volume_storage_class = (environ.get("GSHARE_VOLUME_STORAGE_CLASS") or "").strip() or None
        if volume_storage_class is not None and not _DNS1123_SUBDOMAIN.match(volume_storage_class):
            raise ConfigError(
                "GSHARE_VOLUME_STORAGE_CLASS must be a StorageClass name (DNS-1123 subdomain), "
                f"got {volume_storage_class!r}"
            )
        return cls(
            cluster_id=cluster_id,
            control_plane_url=url,
            token_file=token_file,
            inventory_interval=_seconds(environ, "GSHARE_INVENTORY_INTERVAL", 30.0),
            http_timeout=_seconds(environ, "GSHARE_HTTP_TIMEOUT", 10.0),
            backoff_max=_seconds(environ, "GSHARE_BACKOFF_MAX", 60.0),
            log_level=log_level,
            session_namespace=session_namespace,
            reconcile_interval=_seconds(environ, "GSHARE_RECONCILE_INTERVAL", 2.0),
            operator_namespace=operator_namespace,
            token_secret_name=token_secret_name,
            volume_sync_interval=_seconds(environ, "GSHARE_VOLUME_SYNC_INTERVAL", 60.0),
            volume_storage_class=volume_storage_class,
            usage_interval=_seconds(environ, "GSHARE_USAGE_INTERVAL", 60.0),
            usage_queue_path=(environ.get("GSHARE_USAGE_QUEUE_PATH") or "").strip() or DEFAULT_USAGE_QUEUE_PATH,
            usage_queue_max=_positive_int(environ, "GSHARE_USAGE_QUEUE_MAX", DEFAULT_USAGE_QUEUE_MAX),
            activity_interval=_seconds(environ, "GSHARE_ACTIVITY_INTERVAL", 30.0),
            hami_monitor_selector=_selector(environ, "GSHARE_HAMI_MONITOR_SELECTOR", HAMI_DEVICE_PLUGIN_SELECTOR_DEFAULT),
            hami_monitor_namespace=hami_monitor_namespace,
            hami_monitor_port=_port(environ, "GSHARE_HAMI_MONITOR_PORT", HAMI_MONITOR_PORT_DEFAULT, allow_zero=False),
            hami_monitor_timeout=_seconds(environ, "GSHARE_HAMI_MONITOR_TIMEOUT", 5.0),
            metrics_port=_port(environ, "GSHARE_METRICS_PORT", 8080, allow_zero=True),
            metrics_address=metrics_address,
        )

    @property
    def token_secret_configured(self) -> bool:
        """True when both ``GSHARE_OPERATOR_NAMESPACE`` and ``GSHARE_TOKEN_SECRET_NAME`` are set."""
        return bool(self.operator_namespace and self.token_secret_name)

    @property
    def log_level_number(self) -> int:
        """``log_level`` as a ``logging`` level number."""
        return logging.getLevelName(self.log_level)


def kubernetes_api_client(environ: Mapping[str, str] = os.environ) -> kubernetes.client.ApiClient:
    """Return a Kubernetes ``ApiClient`` for the cluster this operator runs in.

    In-cluster config (service-account token and CA) when ``KUBERNETES_SERVICE_HOST`` is set,
    else ``kubernetes.config.load_kube_config`` with ``KUBECONFIG`` (which may list several
    files separated by ``os.pathsep``; ``~/.kube/config`` when unset). The global default
    configuration of the ``kubernetes`` package is left untouched.

    Raises:
        ConfigError: no usable Kubernetes configuration was found.
    """
    configuration = kubernetes.client.Configuration()
    try:
        if environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(
                config_file=environ.get("KUBECONFIG") or None,
                client_configuration=configuration,
                persist_config=False,
            )
    except (kubernetes.config.ConfigException, OSError) as exc:
        where = "in-cluster service account" if environ.get("KUBERNETES_SERVICE_HOST") else "KUBECONFIG"
        raise ConfigError(f"cannot load Kubernetes configuration ({where}): {exc}") from exc
    return kubernetes.client.ApiClient(configuration)


def _required(environ: Mapping[str, str], name: str) -> str:
    """Return the stripped value of ``name`` or raise ``ConfigError`` when missing or empty."""
    value = (environ.get(name) or "").strip()
    if not value:
        raise ConfigError(f"{name} is required but not set: set it in the operator's environment (chart values)")
    return value


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    """Parse ``name`` as a positive number of seconds, ``default`` when unset or empty."""
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds, got {raw!r}")
    return value


def _positive_int(environ: Mapping[str, str], name: str, default: int) -> int:
    """Parse ``name`` as a positive integer, ``default`` when unset or empty."""
    raw = (environ.get(name) or "").strip().replace("_", "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {raw!r}")
    return value


def _port(environ: Mapping[str, str], name: str, default: int, *, allow_zero: bool) -> int:
    """Parse ``name`` as a TCP port (1-65535, or 0 when ``allow_zero``), ``default`` when unset or empty."""
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    lowest = 0 if allow_zero else 1
    if not raw.isdigit() or not lowest <= int(raw) <= 65535:
        off = " (0 turns it off)" if allow_zero else ""
        raise ConfigError(f"{name} must be a port number between {lowest} and 65535{off}, got {raw!r}")
    return int(raw)


def _selector(environ: Mapping[str, str], name: str, default: str) -> str:
    """Parse ``name`` as a Kubernetes label selector (its shape only: the apiserver judges the grammar)."""
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    if len(raw) > 1000 or not raw.isprintable() or not _SELECTOR.match(raw):
        raise ConfigError(f"{name} must be a label selector such as app.kubernetes.io/component=hami-device-plugin, "
                          f"got {raw[:100]!r}")
    return raw
