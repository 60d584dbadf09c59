"""``attach_cluster``: prepare a GPU cluster, register it and deploy its operator, in ten idempotent steps.

Every step either finds its work already done (and says so), does it, or stops the attach with
:class:`AttachStopped`, which carries what is wrong and the exact command that fixes it. Re-running the
command is the supported way to repair a half-finished attach or to roll the operator forward. The
cluster is reached only through the kubeconfig given (checked by the same rules as registration); the
control plane only through its public API with a staff token (``attach.control_plane``), so the
command runs on any machine and never opens the control plane's database.

Steps (docs/attach.md describes each, its failures and their fixes):

1. reach the cluster (kubeconfig rules, ``/version``);
2. GPU node prerequisites (a check pod per node: driver, container toolkit, containerd's nvidia runtime);
3. the ``nvidia`` RuntimeClass and the labels ``gpu=on`` and ``gshare.io/gpu-mode`` on GPU nodes;
4. HAMi, with its kube-scheduler pinned to the cluster's version, then wait for GPUs to be advertised;
5. session routing (``attach.routing``): Envoy Gateway and the session Gateway (``--routing gateway-api``, the
   default), or ingress-nginx (``--routing ingress-nginx``, retired upstream), on the ingress node; with
   ``--skip-ingress`` the controller the cluster already runs;
6. the control plane's credential: ServiceAccount ``gshare-control-plane`` with least-privilege RBAC and its token
   (``attach.credential``): registration sends that, never the admin kubeconfig;
7. registration through the control plane's API (``POST /api/v1/clusters``, probe included; an existing
   registration is kept and its credential refreshed with ``PATCH``);
8. the operator: the control plane pushes its token into the Secret ``gshare-operator-internal-jwt``
   (``POST /api/v1/clusters/{id}/operator-token/push``), then the ``charts/gshare-operator`` release;
9. storage (with ``--storage-values``): NFS client and reachability checks, democratic-csi;
10. the connection test and the operator's first inventory report.
"""

from __future__ import annotations

import re
import shlex
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from attach import checks, credential, fixes, releases
from attach.control_plane import ControlPlaneClient, ControlPlaneError
from attach.helm import HelmInstallFailed, install_release
from attach.routing import RoutingStep, parse_gateway_flag
from clusters.models import cluster_name_validator, dns_name_validator
from contract import (
    CLOCK_SYNCED,
    GPU_MODE_LABEL,
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GSHARE_API_VERSION,
    OPERATOR_CHECKS,
    ROUTING_GATEWAY_API,
    ROUTING_INGRESS_NGINX,
    ROUTING_MODES,
    rfc3339,
)
from core.exceptions import ApplicationError
from core.layout import cluster_layout
from core.version import GSHARE_VERSION, compatible
from kube import KubeError, KubeGateway, KubeRefused, KubeUnavailable
from kube.gateway import NAMESPACES, NODES, PODS, RUNTIME_CLASSES
from kube.kubeconfig import KubeconfigError, validate_kubeconfig

HAMI_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
#: A Kubernetes object name (RFC 1123 subdomain: namespaces and Secret names are within it).
K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
#: A release number as ``GET /api/v1/version`` gives it (core/version.py); the fix "git checkout v<it>" is built from it.
RELEASE = re.compile(r"v?[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?([-+][0-9A-Za-z.]{1,40})?")
DEFAULT_GPU_MODE = "hami-core"
TOTAL_STEPS = 10
MAX_KUBECONFIG_BYTES = 256 * 1024  # as POST /api/v1/clusters
MAX_VALUES_BYTES = 1024 * 1024
#: Pod Security admission: the check pods are privileged, so gShare's namespace must allow them.
NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "privileged", "app.kubernetes.io/managed-by": "gshare"}


def _timeout() -> float:
    """Seconds each apiserver call of the attach may take, in all (``GSHARE_PROBE_TIMEOUT``)."""
    return settings.GSHARE_PROBE_TIMEOUT


def _read_text(path: str, limit: int) -> str:
    """Read a UTF-8 text file of at most ``limit`` bytes; raises OSError, UnicodeDecodeError or ValueError (too large)."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit // 1024} KiB")
    return data.decode("utf-8")


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
class _State:
    kubeconfig: str = ""
    registered_kubeconfig: str = ""  # the least-privilege kubeconfig registration sends (step_credential)
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


def _api(state: _State) -> KubeGateway:
    """The gateway to the cluster being attached, each call bounded as a whole by ``GSHARE_PROBE_TIMEOUT`` (a trickling
    server is cut off)."""
    return KubeGateway.for_kubeconfig(state.config, server=state.server, call_timeout=_timeout())


def _status_reason(exc: KubeError) -> str:
    return f"HTTP {exc.status} {exc.reason}".strip()


def _name(obj: dict) -> str:
    """An object's ``metadata.name``."""
    return (obj.get("metadata") or {}).get("name") or ""


class Attach(RoutingStep):
    """Runs the steps of one attach; ``run()`` returns the cluster or raises :class:`AttachStopped`.

    Args:
        options: the flags.
        echo: called with each progress line (``[n/10] what ... result``).
    """

    def __init__(self, options: AttachOptions, echo: Callable[[str], None]):
        self.options = options
        self.echo = echo
        self.state = _State(started_at=timezone.now())
        self.rerun = fixes.shell_line(options.argv) if options.argv else "the same attach_cluster command"

    # ----------------------------------------------------------------- driver

    def run(self) -> dict:
        """Run the ten steps in order.

        Returns:
            The registered cluster as ``GET /api/v1/clusters/{id}`` shows it (connected, first inventory in).

        Raises:
            AttachStopped: a step found a problem it cannot fix; nothing after it ran.
        """
        steps = [
            ("check the flags and reach the cluster", self.step_reach),
            ("GPU node prerequisites", self.step_prerequisites),
            ("RuntimeClass nvidia and GPU node labels", self.step_runtime_class_and_labels),
            ("HAMi", self.step_hami),
            ("session routing", self.step_routing),
            ("control plane credential", self.step_credential),
            ("register with the control plane", self.step_register),
            ("operator", self.step_operator),
            ("storage", self.step_storage),
            ("connection test and first inventory", self.step_connection),
        ]
        for number, (what, step) in enumerate(steps, start=1):
            prefix = f"[{number}/{TOTAL_STEPS}] {what}"
            try:
                result = self._guarded(step)
            except AttachStopped as stop:
                self.echo(f"{prefix} ... FAILED: {stop.problem}")
                raise
            self.echo(f"{prefix} ... {result}")
        assert self.state.cluster is not None
        return self.state.cluster

    def _guarded(self, step: Callable[[], str]) -> str:
        """Run one step; every failure becomes an :class:`AttachStopped` with a fix, never a traceback."""
        server = self.state.server or "the apiserver"
        try:
            return step()
        except AttachStopped:
            raise
        except ControlPlaneError as exc:
            raise self._stop(f"the control plane at {self._api_url} answered: {exc.detail}"
                             + (f" (HTTP {exc.status}, code {exc.code})" if exc.code else ""),
                             _control_plane_fix(exc, self._api_url)) from None
        except (KubeRefused, KubeUnavailable) as exc:
            if not exc.status:
                raise self._stop(f"{server} stopped answering ({exc.cause_name})",
                                 f"check it is reachable from the control plane: curl -k --max-time 10 {server}/version") from None
            detail = exc.message or exc.reason
            if exc.status in (401, 403):
                raise self._stop(f"{server} refused a request ({_status_reason(exc)}: {detail})",
                                 "use a kubeconfig with cluster-admin rights (kubectl auth can-i '*' '*' --all-namespaces); on clusters "
                                 "that enforce Pod Security, allow privileged pods in gshare-system: kubectl label namespace "
                                 "gshare-system pod-security.kubernetes.io/enforce=privileged --overwrite") from None
            raise self._stop(f"{server} answered {_status_reason(exc)}: {detail}",
                             f"check the cluster's state: kubectl get --raw /readyz?verbose (server {server})") from None
        except OSError as exc:
            raise self._stop(f"{server} stopped answering ({type(exc).__name__})",
                             f"check it is reachable from the control plane: curl -k --max-time 10 {server}/version") from None
        except ApplicationError as exc:
            raise self._stop(f"{exc} (code {exc.code})", f"do what the message says (code {exc.code}, docs/errors.md)") from None
        except ValidationError as exc:
            raise self._stop(f"invalid value: {'; '.join(exc.messages)}", "correct the flag and re-run") from None

    @property
    def _api_url(self) -> str:
        return self.options.api_url or self.options.control_plane_url

    def _control_plane(self) -> ControlPlaneClient:
        return ControlPlaneClient(self._api_url, self.options.api_token, timeout=_timeout() + 5,
                                  long_timeout=max(_timeout(), settings.GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT) * 3 + 30)

    def _check_control_plane(self) -> str:
        """Refuse before anything touches the cluster: no token, a control plane that does not answer, a token that is
        not a staff token, or a release that does not work with this checkout's (whose operator chart is deployed)."""
        if not self.options.api_token:
            raise self._stop("no API token: the attach talks to the control plane through its API as a staff user",
                             "create a staff token where the control plane runs (manage.py create_api_token <staff user>), then "
                             "export GSHARE_API_TOKEN=<token> or pass --token-file <file holding it>")
        with self._control_plane() as api:
            try:
                served = api.version()
            except ControlPlaneError as exc:
                if exc.status == 401:
                    raise self._stop(f"the control plane at {self._api_url} refused the API token ({exc.code or 'HTTP 401'}: {exc.detail})",
                                     "create a new token (manage.py create_api_token <staff user>) and pass it in GSHARE_API_TOKEN "
                                     "or --token-file") from None
                raise self._stop(f"the control plane at {self._api_url} did not answer as gShare's API: {exc.detail}",
                                 _control_plane_fix(exc, self._api_url)) from None
            who = api.me()
        username, theirs, contract = who.get("username"), served.get("version"), served.get("operator_contract")
        if (not isinstance(username, str) or not username or not username.isprintable() or not isinstance(theirs, str)
                or not RELEASE.fullmatch(theirs)):
            raise self._stop(f"{self._api_url} answered, but not as gShare's API (no user name or release number)",
                             _control_plane_fix(ControlPlaneError(""), self._api_url))
        if who.get("is_staff") is not True:  # JSON true only: "yes" or 1 is not how the API says it
            raise self._stop(f"the API token belongs to {username[:150]!r}, who is not a staff user",
                             "use a staff user's token: manage.py create_api_token <staff user> (docs/tokens.md)")
        if not compatible(GSHARE_VERSION, theirs) or contract != GSHARE_API_VERSION:
            contract = str(contract)[:40] if isinstance(contract, str) else "?"
            raise self._stop(f"the control plane runs gShare {theirs} (operator contract {contract}); this checkout is "
                             f"{GSHARE_VERSION} ({GSHARE_API_VERSION}), whose operator chart the attach would deploy",
                             f"run the attach from a checkout of the control plane's release: git checkout v{theirs}")
        self._check_layout(served.get("cluster_layout"))
        return f"gShare {theirs} at {self._api_url} as {username[:150]}"

    def _check_layout(self, layout: Any) -> None:
        """The namespaces, Secret name and volume-move switch this machine grants rights on must be the control plane's
        (``GET /api/v1/version``'s ``cluster_layout``), or the credential would miss the rights the control plane uses."""
        if not isinstance(layout, dict):
            return  # a control plane of this release always sends it; nothing to compare against otherwise
        ours = cluster_layout()
        names = {"session_namespace": "GSHARE_SESSION_NAMESPACE", "operator_namespace": "GSHARE_OPERATOR_NAMESPACE",
                 "operator_token_secret": "GSHARE_OPERATOR_TOKEN_SECRET", "volume_move_enabled": "GSHARE_VOLUME_MOVE_ENABLED"}
        differ = [(key, layout.get(key), value) for key, value in ours.items() if key in layout and layout[key] != value]
        # The values go into a command line printed as the fix: only names Kubernetes accepts, or a boolean.
        if any(not (isinstance(theirs, bool) if isinstance(mine, bool) else isinstance(theirs, str) and K8S_NAME.fullmatch(theirs))
               for _, theirs, mine in differ):
            raise self._stop(f"{self._api_url} answered a cluster_layout that is not gShare's (not Kubernetes names)",
                             _control_plane_fix(ControlPlaneError(""), self._api_url))
        if differ:
            said = "; ".join(f"{names[key]} is {theirs!r} there, {mine!r} here" for key, theirs, mine in differ)
            fix = " ".join(f"{names[key]}={str(theirs).lower() if isinstance(theirs, bool) else theirs}" for key, theirs, _ in differ)
            raise self._stop(f"this machine's settings do not match the control plane's ({said})",
                             f"run the attach with the control plane's values: {fix} {self.rerun}")

    def _stop(self, problem: str, fix: str) -> AttachStopped:
        return AttachStopped(problem, f"{fix}\nthen re-run: {self.rerun}")

    def _manage(self, *command: str) -> str:
        """A manage.py command line run the way this one was (same interpreter and manage.py)."""
        return shlex.join([*self.options.manage, *command])

    def _check_inputs(self) -> None:
        """Refuse malformed flags before anything touches the cluster."""
        options = self.options
        checks = [("--name", options.name, cluster_name_validator), ("--session-domain", options.session_domain, dns_name_validator),
                  ("--ingress-node", options.ingress_node, dns_name_validator)]
        for flag, value, validator in checks:
            try:
                validator(value)
            except ValidationError:
                raise self._stop(f"{flag} {value!r} is not a lowercase DNS name ({validator.message})",
                                 f"pass a valid {flag}: it {validator.message}") from None
        for flag, value, what in (("--control-plane", options.control_plane_url, "as the cluster's pods reach it"),
                                  ("--api-url", options.api_url, "as this machine reaches it")):
            if flag == "--api-url" and not value:
                continue
            problem = _url_problem(value)
            if problem:
                # A URL with a password is not echoed: it would end up in terminals and CI logs.
                shown = value if "@" not in value else "<the URL given>"
                raise self._stop(f"{flag} {shown!r} is not an http(s) URL {problem}",
                                 f"pass the control plane's URL {what}, e.g. https://gshare.example.org")
        if options.routing and options.routing not in ROUTING_MODES:
            raise self._stop(f"--routing {options.routing!r} is not a routing mode",
                             f"pass --routing {ROUTING_GATEWAY_API} (Envoy Gateway, the default) or --routing {ROUTING_INGRESS_NGINX}")
        try:
            parse_gateway_flag(options.gateway)
        except ValueError as exc:
            raise self._stop(str(exc), "pass --gateway NAMESPACE/NAME, or leave it out for gshare-system/gshare-sessions") from None
        if options.operator_image:
            try:
                releases.split_image(options.operator_image)
            except ApplicationError as exc:
                raise self._stop(str(exc), "pass --operator-image as registry/repository:tag, e.g. ghcr.io/gshare/gshare:0.2.0") from None
        path = options.storage_values_path
        if path:
            try:
                values = yaml.safe_load(_read_text(path, MAX_VALUES_BYTES))
            except (OSError, ValueError, yaml.YAMLError) as exc:
                raise self._stop(f"cannot use --storage-values {path}: {fixes.unreadable_file_reason(exc)}",
                                 fixes.unreadable_file_fix(exc, path=path, flag="--storage-values")) from None
            try:
                self.state.storage = releases.storage_plan(values, path)
            except ApplicationError as exc:
                raise self._stop(str(exc), f"edit {path} (democratic-csi NFS values, see docs/attach.md#storage)") from None

    # ----------------------------------------------------------------- 1

    def step_reach(self) -> str:
        """Step 1: the flags are well-formed, the kubeconfig follows registration's rules and its apiserver answers."""
        self._check_inputs()
        path = self.options.kubeconfig_path
        try:
            text = _read_text(path, MAX_KUBECONFIG_BYTES)
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else ("not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc))
            raise self._stop(f"cannot use --kubeconfig {path}: {reason}", fixes.unreadable_file_fix(exc, path=path, flag="--kubeconfig")) from None
        try:
            valid = validate_kubeconfig(text, loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST)
        except KubeconfigError as exc:
            raise self._stop(f"{exc} (code {exc.code})", fixes.kubeconfig_fix(exc, text=text, path=path)) from None
        self.state.kubeconfig, self.state.config, self.state.server = valid.as_yaml(), valid.config, valid.server
        # Only local checks so far; the control plane is asked before anything is sent to the cluster.
        control_plane = self._check_control_plane()
        with _api(self.state) as kube:
            try:
                version = kube.version()
                nodes = kube.list(NODES)
                self.state.kube_system_uid = (kube.get(NAMESPACES, "kube-system").get("metadata") or {}).get("uid") or ""
            except KubeError as exc:
                if not exc.status:  # timeouts, connection refused, TLS errors
                    raise self._stop(f"the apiserver at {valid.server} did not answer ({exc.cause_name})",
                                     f"check it is reachable from the control plane: curl -k --max-time 10 {valid.server}/version") from None
                if exc.status in (401, 403):
                    raise self._stop(f"the apiserver at {valid.server} refused the kubeconfig's credentials ({_status_reason(exc)})",
                                     "use a kubeconfig with cluster-admin rights: kubectl auth can-i '*' '*' --all-namespaces") from None
                raise self._stop(f"the apiserver at {valid.server} answered {_status_reason(exc)}",
                                 f"check the server address: curl -k {valid.server}/version") from None
        self.state.git_version = str(version.get("gitVersion") or "")
        self.state.nodes = nodes
        if self.options.ingress_node not in {_name(n) for n in nodes}:
            listed = ", ".join(sorted(_name(n) for n in nodes)[:20])
            raise self._stop(f"--ingress-node {self.options.ingress_node} is not a node of this cluster",
                             f"pass one of its nodes as --ingress-node (the one the session domain's DNS points at): {listed}")
        return f"ok: {control_plane}; Kubernetes {self.state.git_version} at {valid.server}, {len(nodes)} nodes"

    # ----------------------------------------------------------------- check pods

    def _ensure_namespace(self, kube: KubeGateway, name: str) -> None:
        """Create gShare's namespace (privileged under Pod Security: the check pods need it), or label it so."""
        made = kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": NAMESPACE_LABELS}},
                           exists_ok=True)
        if made is None:  # it exists
            current = (kube.get(NAMESPACES, name).get("metadata") or {}).get("labels") or {}
            if any(current.get(k) != v for k, v in NAMESPACE_LABELS.items()):
                kube.patch(NAMESPACES, name, {"metadata": {"labels": NAMESPACE_LABELS}})

    def _run_checks(self, kind: str, node_names: list[str], targets: list[str] | None = None) -> dict[str, checks.CheckReport]:
        namespace = releases.operator_namespace()
        with _api(self.state) as kube:
            self._ensure_namespace(kube, namespace)
            names = {}
            for node in node_names:
                manifest = checks.check_pod(kind, node, namespace, targets=targets)
                name = manifest["metadata"]["name"]
                names[node] = name
                self._delete_pod(kube, namespace, name)
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
                            raise self._stop(
                                f"the check pod did not finish within {settings.GSHARE_ATTACH_CHECK_TIMEOUT:.0f} s on {', '.join(waiting)}",
                                f"see why: kubectl -n {namespace} describe pod {names[waiting[0]]} "
                                f"(the image {settings.GSHARE_ATTACH_CHECK_IMAGE} must be pullable on every node)")
                        time.sleep(0.2)
            finally:
                for name in names.values():
                    self._delete_pod(kube, namespace, name)
        return reports

    @staticmethod
    def _delete_pod(kube: KubeGateway, namespace: str, name: str) -> None:
        kube.delete(PODS, name, namespace=namespace, grace_period_seconds=0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if kube.get(PODS, name, namespace=namespace, missing_ok=True) is None:
                return
            time.sleep(0.1)

    # ----------------------------------------------------------------- 2

    def step_prerequisites(self) -> str:
        """Step 2: every GPU node has the NVIDIA driver, the container toolkit and containerd's ``nvidia`` runtime."""
        names = [_name(n) for n in self.state.nodes]
        reports = self._run_checks("node", names)
        problems: list[str] = []
        fixes: list[str] = []
        for node in names:
            report = reports[node]
            if not report.complete:
                problems.append(f"{node}: the check was cut short")
                fixes.append(f"kubectl -n {releases.operator_namespace()} logs {checks.check_pod_name('node', node)}  # on a re-run")
                continue
            gpus = checks.gpu_count(report)
            if not gpus:
                continue
            self.state.gpu_nodes[node] = gpus
            smi = report.items.get("nvidia-smi")
            if smi is None or smi.status != "ok":
                said = f": {smi.output[0]}" if smi and smi.output else ""
                problems.append(f"{node}: the NVIDIA driver is {'not working' if smi and smi.status == 'failed' else 'not installed'}"
                                f" (nvidia-smi {smi.status if smi else 'missing'}{said})")
                fixes.append(f"on {node}: install the NVIDIA driver (Ubuntu: sudo ubuntu-drivers install --gpgpu; "
                             "RHEL: sudo dnf module install nvidia-driver:latest-dkms), then reboot the node")
            if report.status("nvidia-ctk") != "ok":
                problems.append(f"{node}: the NVIDIA Container Toolkit is not installed (nvidia-ctk missing)")
                fixes.append(f"on {node}: install nvidia-container-toolkit (https://docs.nvidia.com/datacenter/cloud-native/"
                             "container-toolkit/latest/install-guide.html), then: sudo nvidia-ctk runtime configure "
                             "--runtime=containerd && sudo systemctl restart containerd")
            elif report.status("containerd-nvidia-runtime") != "ok":
                problems.append(f"{node}: containerd has no nvidia runtime registered")
                fixes.append(f"on {node}: sudo nvidia-ctk runtime configure --runtime=containerd && sudo systemctl restart containerd")
        if problems:
            raise self._stop("; ".join(problems), "\n".join(fixes))
        if not self.state.gpu_nodes:
            raise self._stop("no node of this cluster has an NVIDIA GPU (no 0x10de display controller on any PCI bus)",
                             "check the kubeconfig names the GPU cluster: kubectl get nodes -o wide")
        listed = ", ".join(f"{node} ({count} GPU{'s' if count > 1 else ''})" for node, count in sorted(self.state.gpu_nodes.items()))
        return f"ok: {listed}; driver, toolkit and containerd runtime present"

    # ----------------------------------------------------------------- 3

    def step_runtime_class_and_labels(self) -> str:
        """Step 3: RuntimeClass ``nvidia`` (handler ``nvidia``) and the GPU node labels."""
        with _api(self.state) as kube:
            runtime_class = "present"
            existing = kube.get(RUNTIME_CLASSES, "nvidia", missing_ok=True)
            if existing is None:
                kube.create({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})
                runtime_class = "created"
            elif existing.get("handler") != "nvidia":
                raise self._stop(f"RuntimeClass nvidia exists with handler {existing.get('handler')!r}, not 'nvidia'",
                                 "kubectl delete runtimeclass nvidia")
            labelled = 0
            for node in self.state.nodes:
                if _name(node) not in self.state.gpu_nodes:
                    continue
                labels = (node.get("metadata") or {}).get("labels") or {}
                wanted = {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE, GPU_MODE_LABEL: labels.get(GPU_MODE_LABEL) or DEFAULT_GPU_MODE}
                if all(labels.get(k) == v for k, v in wanted.items()):
                    continue
                kube.patch(NODES, _name(node), {"metadata": {"labels": wanted}})
                labelled += 1
        return f"ok: RuntimeClass nvidia {runtime_class}; {labelled} node(s) labelled, {len(self.state.gpu_nodes) - labelled} already labelled"

    # ----------------------------------------------------------------- helm

    def _install(self, release: releases.ChartRelease) -> str:
        try:
            result = install_release(self.state.kubeconfig, release, timeout=settings.GSHARE_ATTACH_HELM_TIMEOUT)
        except HelmInstallFailed as exc:
            oci = release.repo_url.startswith("oci://")
            source = (f"--version {release.version}" if oci else
                      f"--repo {release.repo_url} --version {release.version}" if release.repo_url else "")
            fix = (f"check it is reachable from the control plane: curl -k --max-time 10 {self.state.server}/version" if exc.unreachable
                   else f"check the chart can be fetched and rendered: helm template {release.release} {release.chart_ref} {source}".strip())
            raise self._stop(f"Helm could not install {release.what} (release {release.release} in {release.namespace}): {exc}", fix) from None
        return f"{release.what}: release {release.release} {result.action} (revision {result.revision})"

    # ----------------------------------------------------------------- 4

    def step_hami(self) -> str:
        """Step 4: HAMi pinned to the cluster's Kubernetes version; then wait until every GPU node advertises its GPUs."""
        try:
            release = releases.hami_release(self.state.git_version)
        except ApplicationError as exc:
            raise self._stop(str(exc), "set GSHARE_ATTACH_HAMI_CHART_VERSION (docs/configuration.md)") from None
        done = self._install(release)
        deadline = time.monotonic() + settings.GSHARE_ATTACH_GPU_TIMEOUT
        with _api(self.state) as kube:
            while True:
                missing, advertised = [], 0
                for name in sorted(self.state.gpu_nodes):
                    node = kube.get(NODES, name)
                    allocatable = (node.get("status") or {}).get("allocatable") or {}
                    count = int(allocatable.get("nvidia.com/gpu", "0") or 0)
                    if HAMI_REGISTER_ANNOTATION not in ((node.get("metadata") or {}).get("annotations") or {}) or count <= 0:
                        missing.append(name)
                    advertised += count
                if not missing:
                    break
                if time.monotonic() > deadline:
                    raise self._stop(f"HAMi's device plugin has not advertised GPUs on {', '.join(missing)} "
                                     f"within {settings.GSHARE_ATTACH_GPU_TIMEOUT:.0f} s",
                                     "see why: kubectl -n kube-system get pods -l app.kubernetes.io/component=hami-device-plugin "
                                     "-o wide; kubectl -n kube-system logs -l app.kubernetes.io/component=hami-device-plugin "
                                     "-c device-plugin")
                time.sleep(0.5)
        return f"ok: {done}; {advertised} vGPUs (nvidia.com/gpu) advertised on {len(self.state.gpu_nodes)} node(s)"

    # ----------------------------------------------------------------- 6

    def step_credential(self) -> str:
        """Step 6: ServiceAccount ``gshare-control-plane`` with exactly the control plane's rights, through the admin
        kubeconfig; its token's kubeconfig (same server and CA) is what registration sends."""
        namespace = releases.operator_namespace()
        with _api(self.state) as kube:
            self._ensure_namespace(kube, namespace)
            try:
                token = credential.apply_credential(kube)
            except credential.CredentialError as exc:
                raise self._stop(str(exc), f"kubectl -n {namespace} get secret {credential.TOKEN_SECRET_NAME} -o yaml") from None
        text = credential.credential_kubeconfig(self.state.config, token)
        self.state.registered_kubeconfig = validate_kubeconfig(text, loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST).as_yaml()
        return f"ok: ServiceAccount {namespace}/{credential.ACCOUNT_NAME} (least-privilege RBAC, token Secret {credential.TOKEN_SECRET_NAME})"

    # ----------------------------------------------------------------- 7

    def step_register(self) -> str:
        """Step 7: register through ``POST /api/v1/clusters`` (the control plane probes the cluster), or keep the
        existing registration of this cluster and bring its settings and credential up to date with ``PATCH``."""
        storage_class = self.state.storage.storage_class if self.state.storage else ""
        with self._control_plane() as api:
            existing = api.cluster_named(self.options.name)
            if existing is not None:
                known_uid = existing.get("kube_system_uid") or ""
                same = (known_uid == self.state.kube_system_uid if known_uid and self.state.kube_system_uid
                        else existing.get("apiserver_url") == self.state.server)
                if not same:
                    raise self._stop(f"the name {self.options.name} is registered for another cluster ({existing['id']} at "
                                     f"{existing.get('apiserver_url')}, kube-system uid {known_uid or 'unknown'})",
                                     f"pick another --name, or deregister the other one: DELETE /api/v1/clusters/{existing['id']}")
                changes: dict[str, str] = {key: value for key, value in (("session_domain", self.options.session_domain),
                                                                         ("ingress_node", self.options.ingress_node),
                                                                         ("volume_storage_class", storage_class),
                                                                         *self._routing_fields().items())
                                           if value and existing.get(key) != value}
                # The credential is sent every time: the control plane keeps it when it is the one it holds, else checks
                # that it reaches the same cluster (kube-system uid) and replaces it in place.
                try:
                    updated = api.update(existing["id"], {**changes, "kubeconfig": self.state.registered_kubeconfig})
                except ControlPlaneError as exc:
                    raise self._stop(f"the registration of {existing['name']} ({existing['id']}) could not be updated: {exc.detail} "
                                     f"(code {exc.code or exc.status})",
                                     fixes.registration_fix(_as_application_error(exc), rerun=self.options.argv,
                                                            session_domain=existing.get("session_domain") or "",
                                                            cluster_lookup=_lookup(api))) from None
                self.state.cluster = updated
                listed = f", updated {', '.join(sorted(changes))}" if changes else ""
                return f"ok: already registered as {existing['id']} (kept{listed}; credential checked)"
            try:
                cluster = api.register({"name": self.options.name, "kubeconfig": self.state.registered_kubeconfig,
                                        "session_domain": self.options.session_domain, "ingress_node": self.options.ingress_node,
                                        "volume_storage_class": storage_class, **self._routing_fields()})
            except ControlPlaneError as exc:
                if not exc.code:
                    raise
                raise self._stop(f"registration refused: {exc.detail} (code {exc.code})",
                                 fixes.registration_fix(_as_application_error(exc), rerun=self.options.argv,
                                                        cluster_lookup=_lookup(api))) from None
        self.state.cluster = cluster
        return f"ok: registered as {cluster['id']}"

    def _routing_fields(self) -> dict[str, str]:
        """The cluster's routing as step 5 set it up: ``routing``, and for gateway-api its Gateway's name and namespace."""
        state = self.state
        if state.routing != ROUTING_GATEWAY_API:
            return {"routing": state.routing} if state.routing else {}
        return {"routing": state.routing, "gateway_name": state.gateway_name, "gateway_namespace": state.gateway_namespace}

    # ----------------------------------------------------------------- 8

    def step_operator(self) -> str:
        """Step 8: the control plane writes the operator's token Secret (the token never reaches this machine), then
        install/upgrade ``charts/gshare-operator``."""
        cluster = self.state.cluster
        assert cluster is not None
        with _api(self.state) as kube:
            self._ensure_namespace(kube, releases.operator_namespace())
        retry = (f"retry the token alone: POST {self._api_url}/api/v1/clusters/{cluster['id']}/operator-token/push "
                 f"(or, where the control plane runs: manage.py rotate_operator_tokens --cluster {cluster['id']})")
        with self._control_plane() as api:
            try:
                pushed = api.operator_token_push(cluster["id"])
            except ControlPlaneError as exc:
                raise self._stop(f"the control plane could not write the operator token Secret: {exc.detail}"
                                 + (f" (code {exc.code})" if exc.code else ""), retry) from None
        try:
            release = releases.operator_release(cluster_id=cluster["id"], control_plane_url=self.options.control_plane_url,
                                                image=self.options.operator_image,
                                                storage_class=self.state.storage.storage_class if self.state.storage else "")
        except ApplicationError as exc:
            raise self._stop(str(exc), "fix --operator-image") from None
        done = self._install(release)
        expires = str(pushed.get("expires_at") or "?").replace("T", " ")[:16] + (" UTC" if pushed.get("expires_at") else "")
        secret = pushed.get("secret") or settings.GSHARE_OPERATOR_TOKEN_SECRET
        return f"ok: {done}; token Secret {secret} {pushed.get('secret_action') or 'written'} by the control plane (expires {expires})"

    # ----------------------------------------------------------------- 9

    def step_storage(self) -> str:
        """Step 9 (``--storage-values``): NFS client and server reachability on every node, then democratic-csi."""
        plan = self.state.storage
        if plan is None:
            return "skipped (no --storage-values)"
        targets = [f"{plan.server}:{port}" for port in plan.ports]
        names = [_name(n) for n in self.state.nodes]
        reports = self._run_checks("nfs", names, targets)
        problems, fixes = [], []
        for node in names:
            report = reports[node]
            if report.status("mount.nfs") != "ok":
                problems.append(f"{node}: no NFS client (mount.nfs missing)")
                fixes.append(f"on {node}: sudo apt-get install -y nfs-common (Debian/Ubuntu) or sudo dnf install -y nfs-utils (RHEL)")
            unreachable = [t for t in targets if report.status(f"tcp {t}") != "ok"]
            if unreachable:
                problems.append(f"{node}: cannot reach {', '.join(unreachable)}")
                fixes.append(f"open TCP {', '.join(str(p) for p in plan.ports)} on {plan.server} to {node} (firewall) and add "
                             f"{node}'s subnet to the export's allowed networks")
        if problems:
            raise self._stop("; ".join(problems), "\n".join(fixes))
        done = self._install(plan.release)
        return (f"ok: NFSv{plan.nfs_version} server reachable from {len(names)} node(s); {done}; "
                f"operator volume StorageClass {plan.storage_class}")

    # ----------------------------------------------------------------- 10

    def step_connection(self) -> str:
        """Step 10: the connection test passes and the operator's first inventory (after this attach began) arrives."""
        cluster = self.state.cluster
        assert cluster is not None
        with self._control_plane() as api:
            # Before the new operator reports, its session-path checks may be from an earlier run: not judged yet.
            self._refuse_failed(api.connection_test(cluster["id"]), ignore=SOFT_CHECKS | set(OPERATOR_CHECKS))
            deadline = time.monotonic() + settings.GSHARE_ATTACH_INVENTORY_TIMEOUT
            while True:
                current = api.cluster(cluster["id"])
                heartbeat = _parse_time(current.get("last_heartbeat_at"))
                if heartbeat is not None and heartbeat >= self.state.started_at:
                    break
                if time.monotonic() > deadline:
                    raise self._stop(f"the operator has sent no inventory within {settings.GSHARE_ATTACH_INVENTORY_TIMEOUT:.0f} s",
                                     f"see why: kubectl -n {releases.operator_namespace()} logs deploy/gshare-operator "
                                     f"(it must reach {self.options.control_plane_url})")
                time.sleep(0.5)
            result = api.connection_test(cluster["id"])
            # Now the operator's own checks from inside the cluster (session domain, verify) count, once it sent them.
            self._refuse_failed(result, ignore=SOFT_CHECKS)
            self.state.cluster = api.cluster(cluster["id"])
        return f"ok: {result.get('status')}; first inventory in ({self.state.cluster.get('node_count', 0)} GPU node(s))"

    def _refuse_failed(self, result: dict, *, ignore: frozenset[str] | set[str]) -> None:
        """Stop on the first failed check of a connection test outside ``ignore``; its sentence names the fix."""
        checks, details = result.get("checks"), result.get("detail") or {}
        if not isinstance(checks, dict) or not isinstance(details, dict):
            raise ControlPlaneError("the connection test answered without its checks, not gShare's API")
        for name, ok in checks.items():
            if not ok and name not in ignore:
                detail = str(details.get(name, ""))
                raise self._stop(f"connection test: {name} failed: {detail}", detail)


#: Connection-test checks that never stop the attach: the operator is only being deployed, and a cluster-admin
#: credential works (advisory; the attach registers a least-privilege one anyway), and an operator clock off the control
#: plane's is advisory too (the cluster page and the connection test keep naming its fix).
SOFT_CHECKS = frozenset({"operator_reporting", "credential_least_privilege", CLOCK_SYNCED})


def _url_problem(value: str) -> str:
    """"" when ``value`` is an http(s) URL with a host and nothing else (a path prefix is fine); else what is wrong, as
    a phrase ("(it has a user name or password)", ...). Credentials in the URL would replace the bearer token
    (``requests`` sends them as Basic auth); a query or fragment would swallow the API paths appended to it."""
    try:
        url = urllib.parse.urlsplit(value)
        url.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError:
        return "(it cannot be parsed)"
    if url.scheme not in ("http", "https") or not url.hostname or any(c.isspace() for c in value):
        return "(scheme http or https and a host are needed)"
    if url.username is not None or url.password is not None:
        return "(it has a user name or password)"
    if url.query or url.fragment or "?" in value or "#" in value:
        return "(it has a query or fragment)"
    return ""


def _parse_time(value: Any):
    """An RFC 3339 time from the API as an aware UTC datetime, or None."""
    return rfc3339.parse(value)


def _as_application_error(exc: ControlPlaneError) -> ApplicationError:
    """The control plane's refusal as the ApplicationError it was raised as there (code, detail, extra), for the fixes."""
    return ApplicationError(exc.detail, code=exc.code or "application_error", status=exc.status or 502, extra=exc.extra)


def _lookup(api: ControlPlaneClient) -> Callable[[str], dict | None]:
    """``clu_...`` id -> the cluster as the API shows it, or None when it cannot be read (for a fix's wording only)."""
    def lookup(cluster_id: str) -> dict | None:
        try:
            return api.cluster(cluster_id)
        except ControlPlaneError:
            return None
    return lookup


def _control_plane_fix(exc: ControlPlaneError, url: str) -> str:
    """What to do when the control plane's API did not answer as expected."""
    if exc.status == 0:
        return (f"check this machine reaches the control plane's API: curl -sS {url}/healthz (pass --api-url if it is "
                "reached at another address from here than from the cluster's pods)")
    if exc.status in (401, 403) and exc.code in ("not_authenticated", "authentication_failed", "token_expired", "token_revoked"):
        return "create a new token (manage.py create_api_token <staff user>) and pass it in GSHARE_API_TOKEN or --token-file"
    if exc.code:
        return f"do what the message says (code {exc.code}, docs/errors.md)"
    return f"check that {url} is the control plane's address: curl -sS {url}/api/v1/version -H 'Authorization: Bearer <token>'"
