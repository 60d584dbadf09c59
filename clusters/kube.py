"""Kubernetes API clients for registered clusters, built from the stored (validated) kubeconfig.

Every client is made with ``retries=0`` so that a time budget given to a call is the time the call
can take: urllib3's default would retry a timed-out request three times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import kubernetes
import yaml
from kubernetes.config.config_exception import ConfigException

from clusters.kubeconfig import KubeconfigError
from gshare.embedded import gshare_home


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
        return kubernetes.client.ApiClient(configuration)
    except (ConfigException, ValueError, OSError) as exc:
        raise KubeconfigError(
            f"The Kubernetes client cannot use this kubeconfig ({type(exc).__name__}: {str(exc)[:200]}): "
            "check that the inline certificate data is a base64 PEM (`kubectl config view --raw --minify --flatten`)."
        ) from None


def api_client_for_cluster(cluster) -> kubernetes.client.ApiClient:
    """Return an ``ApiClient`` for a registered ``Cluster`` (its kubeconfig is decrypted in memory only)."""
    return api_client_for_kubeconfig(yaml.safe_load(cluster.kubeconfig))


@dataclass
class Deadline:
    """A time budget shared by several apiserver calls.

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
        """``(connect, read)`` timeouts for the next call, both bounded by what is left (minimum 0.05 s)."""
        left = max(0.05, self.remaining())
        return (left, left)
