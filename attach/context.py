"""What every step of an attach run shares: the flags (:class:`AttachOptions`), what earlier steps found
(:class:`AttachState`), and :class:`StepContext`, through which a step reaches the cluster (``kube.KubeGateway``), the
control plane (``attach.api_client``), Helm and the check pods, and stops the run with a fix (:class:`AttachStopped`).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from attach import checks, fixes, releases
from attach.api_client import ControlPlaneClient, ControlPlaneError
from attach.helm import HelmInstallFailed, install_release
from kube import KubeError, KubeGateway
from kube.gateway import NAMESPACES, PODS

#: Pod Security admission: the check pods are privileged, so gShare's namespace must allow them.
NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "privileged", "app.kubernetes.io/managed-by": "gshare"}


class AttachStopped(Exception):
    """The attach cannot go on. ``problem`` says what is wrong, ``fix`` the exact command(s) that repair it."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


@dataclass(frozen=True)
class AttachOptions:
    """The command's flags.

    Attributes:
        kubeconfig_path: ``--kubeconfig``: file of a kubeconfig with cluster-admin rights.
        name: ``--name``: the cluster's name in gShare.
        control_plane_url: ``--control-plane``: URL the operator's pod reaches the control plane at.
        api_token: a staff API token (``GSHARE_API_TOKEN`` or ``--token-file``); never printed.
        api_url: ``--api-url``: where this machine reaches the control plane's public API ("" = ``control_plane_url``).
        session_domain: ``--session-domain``: hostname the cluster's ingress serves sessions at.
        ingress_node: ``--ingress-node``: node that runs the routing controller's proxy (the session domain resolves to it).
        storage_values_path: ``--storage-values``: democratic-csi NFS values file, or None.
        skip_ingress: ``--skip-ingress``: the cluster already runs its routing controller (found, not installed).
        routing: ``--routing``: ``gateway-api`` or ``ingress-nginx``; "" = gateway-api, or with ``skip_ingress`` what is found.
        gateway: ``--gateway``: ``NAMESPACE/NAME`` of the session Gateway ("" = ``gshare-system/gshare-sessions``).
        operator_image: ``--operator-image``: image of the operator, or None for the chart's default.
        argv: the command line as the user ran it, for "then re-run:" (``attach.fixes.invocation``).
        manage: the prefix that runs another manage.py command, for fixes that name one.
    """

    kubeconfig_path: str
    name: str
    control_plane_url: str
    session_domain: str
    ingress_node: str
    storage_values_path: str | None = None
    skip_ingress: bool = False
    routing: str = ""
    gateway: str = ""
    operator_image: str | None = None
    api_token: str = field(default="", repr=False)
    api_url: str = ""
    argv: tuple[str, ...] = ()
    manage: tuple[str, ...] = ("python", "manage.py")


@dataclass
class AttachState:
    """What the steps found or made so far; each step reads what the earlier ones set."""

    kubeconfig: str = ""
    registered_kubeconfig: str = ""  # the least-privilege kubeconfig registration sends (steps.credential)
    config: dict = field(default_factory=dict)
    server: str = ""
    git_version: str = ""
    kube_system_uid: str = ""
    nodes: list = field(default_factory=list)
    gpu_nodes: dict[str, int] = field(default_factory=dict)  # node -> GPUs on the PCI bus
    cluster: dict | None = None  # the registration as GET /api/v1/clusters/{id} shows it to staff
    storage: releases.StoragePlan | None = None
    routing: str = ""  # the mode step 5 set up or found (what registration sends)
    gateway_namespace: str = ""
    gateway_name: str = ""
    started_at: Any = None


def probe_timeout() -> float:
    """Seconds each apiserver call of the attach may take, in all (``GSHARE_PROBE_TIMEOUT``)."""
    return settings.GSHARE_PROBE_TIMEOUT


def read_text(path: str, limit: int) -> str:
    """Read a UTF-8 text file of at most ``limit`` bytes; raises OSError, UnicodeDecodeError or ValueError (too large)."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit // 1024} KiB")
    return data.decode("utf-8")


def status_reason(exc: KubeError) -> str:
    """``HTTP <status> <reason>`` of an apiserver refusal, for a problem sentence."""
    return f"HTTP {exc.status} {exc.reason}".strip()


def name_of(obj: dict) -> str:
    """An object's ``metadata.name``."""
    return (obj.get("metadata") or {}).get("name") or ""


def control_plane_fix(exc: ControlPlaneError, url: str) -> str:
    """What to do when the control plane's API did not answer as expected."""
    if exc.status == 0:
        return (f"check this machine reaches the control plane's API: curl -sS {url}/healthz (pass --api-url if it is "
                "reached at another address from here than from the cluster's pods)")
    if exc.status in (401, 403) and exc.code in ("not_authenticated", "authentication_failed", "token_expired", "token_revoked"):
        return "create a new token (manage.py create_api_token <staff user>) and pass it in GSHARE_API_TOKEN or --token-file"
    if exc.code:
        return f"do what the message says (code {exc.code}, docs/errors.md)"
    return f"check that {url} is the control plane's address: curl -sS {url}/api/v1/version -H 'Authorization: Bearer <token>'"


class StepContext:
    """One attach run as its steps see it: ``options``, ``state``, ``echo`` and the means every step uses.

    Args:
        options: the flags.
        echo: called with each line the run prints (progress lines, warnings).
    """

    def __init__(self, options: AttachOptions, echo: Callable[[str], None]):
        self.options = options
        self.echo = echo
        self.state = AttachState(started_at=timezone.now())
        self.rerun = fixes.shell_line(options.argv) if options.argv else "the same attach_cluster command"

    def stop(self, problem: str, fix: str) -> AttachStopped:
        """The :class:`AttachStopped` to raise: ``fix``, then the command line that re-runs this attach."""
        return AttachStopped(problem, f"{fix}\nthen re-run: {self.rerun}")

    def manage(self, *command: str) -> str:
        """A manage.py command line run the way this one was (same interpreter and manage.py)."""
        return shlex.join([*self.options.manage, *command])

    @property
    def api_url(self) -> str:
        """Where this machine reaches the control plane's API (``--api-url``, else ``--control-plane``)."""
        return self.options.api_url or self.options.control_plane_url

    def control_plane(self) -> ControlPlaneClient:
        """A client of the control plane's API with the staff token (close it: use it as a context manager)."""
        return ControlPlaneClient(self.api_url, self.options.api_token, timeout=probe_timeout() + 5,
                                  long_timeout=max(probe_timeout(), settings.GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT) * 3 + 30)

    def kube(self) -> KubeGateway:
        """The gateway to the cluster being attached, each call bounded as a whole by ``GSHARE_PROBE_TIMEOUT`` (a trickling
        server is cut off)."""
        return KubeGateway.for_kubeconfig(self.state.config, server=self.state.server, call_timeout=probe_timeout())

    def ensure_namespace(self, kube: KubeGateway, name: str) -> None:
        """Create gShare's namespace (privileged under Pod Security: the check pods need it), or label it so."""
        made = kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": NAMESPACE_LABELS}},
                           exists_ok=True)
        if made is None:  # it exists
            current = (kube.get(NAMESPACES, name).get("metadata") or {}).get("labels") or {}
            if any(current.get(k) != v for k, v in NAMESPACE_LABELS.items()):
                kube.patch(NAMESPACES, name, {"metadata": {"labels": NAMESPACE_LABELS}})

    def install(self, release: releases.ChartRelease) -> str:
        """Install or upgrade a Helm release with the admin kubeconfig; returns the step's phrase about it.

        Raises:
            AttachStopped: Helm failed; the fix names what to check (the apiserver, or the chart with ``helm template``).
        """
        try:
            result = install_release(self.state.kubeconfig, release, timeout=settings.GSHARE_ATTACH_HELM_TIMEOUT)
        except HelmInstallFailed as exc:
            oci = release.repo_url.startswith("oci://")
            source = (f"--version {release.version}" if oci else
                      f"--repo {release.repo_url} --version {release.version}" if release.repo_url else "")
            fix = (f"check it is reachable from the control plane: curl -k --max-time 10 {self.state.server}/version" if exc.unreachable
                   else f"check the chart can be fetched and rendered: helm template {release.release} {release.chart_ref} {source}".strip())
            raise self.stop(f"Helm could not install {release.what} (release {release.release} in {release.namespace}): {exc}", fix) from None
        return f"{release.what}: release {release.release} {result.action} (revision {result.revision})"

    def run_checks(self, kind: str, node_names: list[str], targets: list[str] | None = None) -> dict[str, checks.CheckReport]:
        """Run a check pod of ``kind`` (``node``, ``nfs``) on each node and read its report; the pods are deleted after.

        Args:
            kind: which checks (``attach.checks.check_pod``).
            node_names: the nodes to check.
            targets: ``host:port`` the pods try to reach (``nfs``).

        Returns:
            node -> its pod's report.

        Raises:
            AttachStopped: a pod did not finish within ``GSHARE_ATTACH_CHECK_TIMEOUT`` seconds.
        """
        namespace = releases.operator_namespace()
        with self.kube() as kube:
            self.ensure_namespace(kube, namespace)
            names = {}
            for node in node_names:
                manifest = checks.check_pod(kind, node, namespace, targets=targets)
                name = manifest["metadata"]["name"]
                names[node] = name
                _delete_pod(kube, namespace, name)
                kube.create(manifest)
            reports: dict[str, checks.CheckReport] = {}
            deadline = time.monotonic() + settings.GSHARE_ATTACH_CHECK_TIMEOUT
            try:
                while len(reports) < len(names):
                    for node, name in names.items():
                        if node in reports:
                            continue
                        pod = kube.get(PODS, name, namespace=namespace)
                        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                            reports[node] = checks.parse_check_log(kube.pod_log(name, namespace=namespace) or "")
                    if len(reports) < len(names):
                        if time.monotonic() > deadline:
                            waiting = sorted(set(names) - set(reports))
                            raise self.stop(
                                f"the check pod did not finish within {settings.GSHARE_ATTACH_CHECK_TIMEOUT:.0f} s on {', '.join(waiting)}",
                                f"see why: kubectl -n {namespace} describe pod {names[waiting[0]]} "
                                f"(the image {settings.GSHARE_ATTACH_CHECK_IMAGE} must be pullable on every node)")
                        time.sleep(0.2)
            finally:
                for name in names.values():
                    _delete_pod(kube, namespace, name)
        return reports


def _delete_pod(kube: KubeGateway, namespace: str, name: str) -> None:
    """Delete a check pod now and wait (up to 30 s) until it is gone, so one of the same name can be created."""
    kube.delete(PODS, name, namespace=namespace, grace_period_seconds=0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if kube.get(PODS, name, namespace=namespace, missing_ok=True) is None:
            return
        time.sleep(0.1)
