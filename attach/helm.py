"""Installing a :class:`~attach.releases.ChartRelease` with the embedded Helm engine.

The engine is Helm v4's own Go SDK, loaded in-process from the ``helm-python-sdk`` wheel (``helm_python``):
no ``helm`` binary, no ``helm repo add``, and the operator's own Helm configuration is never touched. It
talks to the cluster with the kubeconfig the attach command was given (already checked by
``validate_kubeconfig``), stores release records as Secrets in the release's namespace like ``helm install``
does, so ``helm list -A`` on the cluster shows what gShare installed.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any

import helm_python as helm
import yaml

from attach.releases import ChartRelease

logger = logging.getLogger(__name__)


class HelmInstallFailed(Exception):
    """Helm refused or failed the install/upgrade; ``str()`` is Helm's message (values redacted).

    ``unreachable`` is True when the apiserver is what failed (the budget ran out, or Helm says the cluster
    is unreachable), not the chart.
    """

    def __init__(self, message: str, *, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable or "kubernetes cluster unreachable" in message.lower()


@dataclass(frozen=True)
class InstallResult:
    """What happened to a release.

    Attributes:
        action: ``installed``, ``upgraded`` or ``unchanged`` (same chart version and values as deployed).
        revision: the deployed revision number.
        chart_version: the chart version now deployed.
    """

    action: str
    revision: int
    chart_version: str


#: Keys whose values are credentials wherever they appear in a values file (democratic-csi's driver.config:
#: sshConnection.password/privateKey, httpConnection.apiKey/password, ...).
_SECRET_KEY = re.compile(r"pass|secret|token|key|cred|auth|cert", re.IGNORECASE)


def _secret_scalars(value: Any, secret: bool = False) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _secret_scalars(v, secret or bool(_SECRET_KEY.search(str(k))))]
    if isinstance(value, list):
        return [s for v in value for s in _secret_scalars(v, secret)]
    if not secret or value is None or isinstance(value, bool):
        return []
    text = str(value)
    # The value as written, as JSON/Go would quote it in an error, and each line of a multi-line value (a PEM).
    forms = {text, json.dumps(text)[1:-1], *(line.strip() for line in text.splitlines() if len(line.strip()) >= 8)}
    return [form for form in forms if form]


def redact(message: str, release: ChartRelease) -> str:
    """Remove the credentials of a secret-bearing release's values from ``message`` (Helm errors may quote them).

    Every value under a key that names a credential (password, privateKey, apiKey, token, ...) is replaced by
    ``***``, whatever its length, also in its JSON-escaped form and line by line for multi-line values; other
    values (StorageClass names, reclaim policies) are left readable.
    """
    if not release.secret_values:
        return message
    for secret in sorted(set(_secret_scalars(release.values)), key=len, reverse=True):
        message = message.replace(secret, "***")
    return message


def _release_values(config: helm.Config, name: str) -> dict:
    values = config.get_values(name)
    return values if isinstance(values, dict) else {}


def install_release(kubeconfig: str | None, release: ChartRelease, *, timeout: int = 300,
                    kubeconfig_path: str | None = None) -> InstallResult:
    """Install ``release`` (see :func:`_install_release`) within ``timeout`` seconds in all.

    Helm's status/values reads take no context, so the whole operation runs in a worker thread that is left
    behind (daemon) if a silent apiserver holds it past the budget; install/upgrade are also cancelled
    through their context.

    Raises:
        HelmInstallFailed: as :func:`_install_release`, or when the budget is spent.
    """
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = _install_release(kubeconfig, release, timeout=timeout, kubeconfig_path=kubeconfig_path)
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc

    worker = threading.Thread(target=work, name=f"helm-{release.release}", daemon=True)
    worker.start()
    worker.join(timeout + 5)
    if worker.is_alive():
        raise HelmInstallFailed(f"it did not finish within {timeout} s (the apiserver stopped answering?)", unreachable=True)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _install_release(kubeconfig: str | None, release: ChartRelease, *, timeout: int = 300,
                     kubeconfig_path: str | None = None) -> InstallResult:
    """Install ``release``, upgrade it when it exists, or leave it alone when nothing would change.

    Args:
        kubeconfig: kubeconfig YAML of the target cluster (one context, inline credentials), or None to find the
            cluster as the ``helm`` command does: ``kubeconfig_path``, else ``KUBECONFIG``, else ``~/.kube/config``,
            each file's current context (``hack/cluster-bootstrap.sh storage``, run by a person at their cluster).
        release: what to install.
        timeout: seconds Helm may spend on the operation (it does not wait for readiness; the attach
            steps wait for what they need).

    Returns:
        An :class:`InstallResult`.

    Raises:
        HelmInstallFailed: the chart could not be fetched or rendered, or the cluster refused an object.
    """
    chart = release.chart
    options: dict[str, Any] = {"namespace": release.namespace, "timeout": timeout}
    if release.repo_url.startswith("oci://"):
        # An OCI registry has no index.yaml: Helm pulls ``oci://<base>/<chart>`` at the version (a tag).
        chart = release.chart_ref
        options.update(chart_version=release.version or None)
    elif release.repo_url:
        options.update(chart_repo_url=release.repo_url, chart_version=release.version or None,
                       plain_http=release.repo_url.startswith("http://"))
    # Helm's client has no per-request timeout: a silent apiserver would hold the call forever. Cancel it
    # through its context once the budget is spent (the SDK's documented way to stop a long operation).
    context = helm.HelmContext()
    timer = threading.Timer(timeout, context.cancel)
    timer.daemon = True
    timer.start()
    options["context"] = context
    try:
        source = {"kubeconfig_content": kubeconfig} if kubeconfig is not None else {"kubeconfig_path": kubeconfig_path}
        with helm.Config(**source, namespace=release.namespace) as config:
            try:
                current = config.status(release.release)
            except helm.HelmNotFoundError:
                current = None
            if current is not None and current.get("status") == "deployed":
                wanted_version = release.version or _local_chart_version(chart)
                if current.get("chart_version") == wanted_version and _release_values(config, release.release) == release.values:
                    return InstallResult("unchanged", int(current.get("revision") or 0), str(wanted_version))
            if current is None:
                result = config.install(chart, release.release, release.values, create_namespace=True, **options)
                action = "installed"
            else:
                try:
                    result = config.upgrade(chart, release.release, release.values, reset_values=True, **options)
                    action = "upgraded"
                except helm.HelmError as exc:
                    if "has no deployed releases" not in str(exc):
                        raise
                    # A first install that failed half-way (an interrupted attach): Helm cannot upgrade a
                    # release that was never deployed, so remove its record and install again.
                    config.uninstall(release.release, ignore_not_found=True)
                    result = config.install(chart, release.release, release.values, create_namespace=True, **options)
                    action = "installed"
    except helm.HelmCancelledError:
        raise HelmInstallFailed(f"it did not finish within {timeout} s (the apiserver stopped answering?)", unreachable=True) from None
    except helm.HelmError as exc:
        raise HelmInstallFailed(redact(str(exc), release)[:600]) from None
    finally:
        timer.cancel()
    return InstallResult(action, int(result.get("revision") or 0), str(result.get("chart_version") or ""))


def _local_chart_version(path: str) -> str:
    try:
        with open(f"{path}/Chart.yaml", encoding="utf-8") as handle:
            return str((yaml.safe_load(handle) or {}).get("version") or "")
    except OSError:
        return ""

