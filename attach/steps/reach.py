"""Step 1 of ``attach_cluster``: the flags are well-formed, the control plane's API answers as the same release with a
staff token, and the kubeconfig (checked by registration's rules) reaches its apiserver. Nothing is sent to the cluster
before the control plane has answered."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError

from attach import fixes, releases
from attach.api_client import ControlPlaneError
from attach.context import StepContext, control_plane_fix, name_of, read_text, status_reason
from attach.steps.ingress import parse_gateway_flag
from contract import GSHARE_API_VERSION, ROUTING_GATEWAY_API, ROUTING_INGRESS_NGINX, ROUTING_MODES
from core.exceptions import ApplicationError
from core.layout import cluster_layout
from core.names import cluster_name_validator, dns_name_validator
from core.version import GSHARE_VERSION, compatible
from kube import KubeError
from kube.gateway import NAMESPACES, NODES
from kube.kubeconfig import KubeconfigError, validate_kubeconfig

TITLE = "check the flags and reach the cluster"
#: A Kubernetes object name (RFC 1123 subdomain: namespaces and Secret names are within it).
K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
#: A release number as ``GET /api/v1/version`` gives it (core/version.py); the fix "git checkout v<it>" is built from it.
RELEASE = re.compile(r"v?[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?([-+][0-9A-Za-z.]{1,40})?")
MAX_KUBECONFIG_BYTES = 256 * 1024  # as POST /api/v1/clusters
MAX_VALUES_BYTES = 1024 * 1024


def run(ctx: StepContext) -> str:
    """Check the flags, the control plane and the kubeconfig; read the cluster's version, nodes and identity.

    Sets ``state.kubeconfig``, ``config``, ``server``, ``git_version``, ``nodes``, ``kube_system_uid`` and (with
    ``--storage-values``) ``storage``.
    """
    check_inputs(ctx)
    state, path = ctx.state, ctx.options.kubeconfig_path
    try:
        text = read_text(path, MAX_KUBECONFIG_BYTES)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else ("not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc))
        raise ctx.stop(f"cannot use --kubeconfig {path}: {reason}", fixes.unreadable_file_fix(exc, path=path, flag="--kubeconfig")) from None
    try:
        valid = validate_kubeconfig(text, loopback_allowlist=settings.GSHARE_LOOPBACK_ALLOWLIST)
    except KubeconfigError as exc:
        raise ctx.stop(f"{exc} (code {exc.code})", fixes.kubeconfig_fix(exc, text=text, path=path)) from None
    state.kubeconfig, state.config, state.server = valid.as_yaml(), valid.config, valid.server
    # Only local checks so far; the control plane is asked before anything is sent to the cluster.
    control_plane = check_control_plane(ctx)
    with ctx.kube() as kube:
        try:
            version = kube.version()
            nodes = kube.list(NODES)
            state.kube_system_uid = (kube.get(NAMESPACES, "kube-system").get("metadata") or {}).get("uid") or ""
        except KubeError as exc:
            if not exc.status:  # timeouts, connection refused, TLS errors
                raise ctx.stop(f"the apiserver at {valid.server} did not answer ({exc.cause_name})",
                               f"check it is reachable from the control plane: curl -k --max-time 10 {valid.server}/version") from None
            if exc.status in (401, 403):
                raise ctx.stop(f"the apiserver at {valid.server} refused the kubeconfig's credentials ({status_reason(exc)})",
                               "use a kubeconfig with cluster-admin rights: kubectl auth can-i '*' '*' --all-namespaces") from None
            raise ctx.stop(f"the apiserver at {valid.server} answered {status_reason(exc)}",
                           f"check the server address: curl -k {valid.server}/version") from None
    state.git_version = str(version.get("gitVersion") or "")
    state.nodes = nodes
    if ctx.options.ingress_node not in {name_of(n) for n in nodes}:
        listed = ", ".join(sorted(name_of(n) for n in nodes)[:20])
        raise ctx.stop(f"--ingress-node {ctx.options.ingress_node} is not a node of this cluster",
                       f"pass one of its nodes as --ingress-node (the one the session domain's DNS points at): {listed}")
    return f"ok: {control_plane}; Kubernetes {state.git_version} at {valid.server}, {len(nodes)} nodes"


def check_inputs(ctx: StepContext) -> None:
    """Refuse malformed flags before anything touches the cluster; reads ``--storage-values`` into ``state.storage``.

    Raises:
        AttachStopped: a flag is malformed; the fix says what a valid one looks like.
    """
    options = ctx.options
    validated = [("--name", options.name, cluster_name_validator), ("--session-domain", options.session_domain, dns_name_validator),
                 ("--ingress-node", options.ingress_node, dns_name_validator)]
    for flag, value, validator in validated:
        try:
            validator(value)
        except ValidationError:
            raise ctx.stop(f"{flag} {value!r} is not a lowercase DNS name ({validator.message})",
                           f"pass a valid {flag}: it {validator.message}") from None
    for flag, value, what in (("--control-plane", options.control_plane_url, "as the cluster's pods reach it"),
                              ("--api-url", options.api_url, "as this machine reaches it")):
        if flag == "--api-url" and not value:
            continue
        problem = url_problem(value)
        if problem:
            # A URL with a password is not echoed: it would end up in terminals and CI logs.
            shown = value if "@" not in value else "<the URL given>"
            raise ctx.stop(f"{flag} {shown!r} is not an http(s) URL {problem}",
                           f"pass the control plane's URL {what}, e.g. https://gshare.example.org")
    if options.routing and options.routing not in ROUTING_MODES:
        raise ctx.stop(f"--routing {options.routing!r} is not a routing mode",
                       f"pass --routing {ROUTING_GATEWAY_API} (Envoy Gateway, the default) or --routing {ROUTING_INGRESS_NGINX}")
    try:
        parse_gateway_flag(options.gateway)
    except ValueError as exc:
        raise ctx.stop(str(exc), "pass --gateway NAMESPACE/NAME, or leave it out for gshare-system/gshare-sessions") from None
    if options.operator_image:
        try:
            releases.split_image(options.operator_image)
        except ApplicationError as exc:
            raise ctx.stop(str(exc), "pass --operator-image as registry/repository:tag, e.g. ghcr.io/gshare/gshare:0.2.0") from None
    path = options.storage_values_path
    if path:
        try:
            values = yaml.safe_load(read_text(path, MAX_VALUES_BYTES))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ctx.stop(f"cannot use --storage-values {path}: {fixes.unreadable_file_reason(exc)}",
                           fixes.unreadable_file_fix(exc, path=path, flag="--storage-values")) from None
        try:
            ctx.state.storage = releases.storage_plan(values, path)
        except ApplicationError as exc:
            raise ctx.stop(str(exc), f"edit {path} (democratic-csi NFS values, see docs/attach.md#storage)") from None


def check_control_plane(ctx: StepContext) -> str:
    """Refuse before anything touches the cluster: no token, a control plane that does not answer, a token that is not
    a staff token, or a release that does not work with this checkout's (whose operator chart is deployed).

    Returns:
        The phrase step 1 prints about the control plane (release, address, user).

    Raises:
        AttachStopped: one of the above; the fix names the token to create or the checkout to use.
    """
    api_url = ctx.api_url
    if not ctx.options.api_token:
        raise ctx.stop("no API token: the attach talks to the control plane through its API as a staff user",
                       "create a staff token where the control plane runs (manage.py create_api_token <staff user>), then "
                       "export GSHARE_API_TOKEN=<token> or pass --token-file <file holding it>")
    with ctx.control_plane() as api:
        try:
            served = api.version()
        except ControlPlaneError as exc:
            if exc.status == 401:
                raise ctx.stop(f"the control plane at {api_url} refused the API token ({exc.code or 'HTTP 401'}: {exc.detail})",
                               "create a new token (manage.py create_api_token <staff user>) and pass it in GSHARE_API_TOKEN "
                               "or --token-file") from None
            raise ctx.stop(f"the control plane at {api_url} did not answer as gShare's API: {exc.detail}",
                           control_plane_fix(exc, api_url)) from None
        who = api.me()
    username, theirs, contract = who.get("username"), served.get("version"), served.get("operator_contract")
    if (not isinstance(username, str) or not username or not username.isprintable() or not isinstance(theirs, str)
            or not RELEASE.fullmatch(theirs)):
        raise ctx.stop(f"{api_url} answered, but not as gShare's API (no user name or release number)",
                       control_plane_fix(ControlPlaneError(""), api_url))
    if who.get("is_staff") is not True:  # JSON true only: "yes" or 1 is not how the API says it
        raise ctx.stop(f"the API token belongs to {username[:150]!r}, who is not a staff user",
                       "use a staff user's token: manage.py create_api_token <staff user> (docs/tokens.md)")
    if not compatible(GSHARE_VERSION, theirs) or contract != GSHARE_API_VERSION:
        contract = str(contract)[:40] if isinstance(contract, str) else "?"
        raise ctx.stop(f"the control plane runs gShare {theirs} (operator contract {contract}); this checkout is "
                       f"{GSHARE_VERSION} ({GSHARE_API_VERSION}), whose operator chart the attach would deploy",
                       f"run the attach from a checkout of the control plane's release: git checkout v{theirs}")
    _check_layout(ctx, served.get("cluster_layout"))
    return f"gShare {theirs} at {api_url} as {username[:150]}"


def _check_layout(ctx: StepContext, layout: Any) -> None:
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
        raise ctx.stop(f"{ctx.api_url} answered a cluster_layout that is not gShare's (not Kubernetes names)",
                       control_plane_fix(ControlPlaneError(""), ctx.api_url))
    if differ:
        said = "; ".join(f"{names[key]} is {theirs!r} there, {mine!r} here" for key, theirs, mine in differ)
        fix = " ".join(f"{names[key]}={str(theirs).lower() if isinstance(theirs, bool) else theirs}" for key, theirs, _ in differ)
        raise ctx.stop(f"this machine's settings do not match the control plane's ({said})",
                       f"run the attach with the control plane's values: {fix} {ctx.rerun}")


def url_problem(value: str) -> str:
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
