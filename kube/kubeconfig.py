"""Validation of a kubeconfig submitted for registration, before anything is dialled.

Rules (each a refusal with a stable code, see ``docs/errors.md``):

* ``kubeconfig_invalid``: not YAML, not a mapping, no ``current-context``, the context names a
  cluster or user that is not defined, no ``server``, or data left as ``DATA+OMITTED`` /
  ``REDACTED`` by ``kubectl config view``; a kept key of the wrong type (``insecure-skip-tls-verify``
  must be a YAML boolean, every other kept key a string, ``*-data`` base64); a token that is not
  printable ASCII, or a username/password that cannot go into an HTTP header; YAML aliases that
  expand beyond ``MAX_EXPANDED_NODES`` nodes or refer to themselves (an "alias bomb").
* ``kubeconfig_exec_forbidden``: the user has ``exec`` or ``auth-provider``: running it would
  execute a command on the control plane.
* ``kubeconfig_local_file``: the cluster or user points at a file (``certificate-authority``,
  ``client-certificate``, ``client-key``, ``tokenFile``): the control plane never opens a path
  named in a kubeconfig.
* ``kubeconfig_localhost``: the server is on loopback or the unspecified address (127.0.0.0/8,
  ::1, ``localhost``, 0.0.0.0, ::): from the control plane that is the control plane itself.
  Exact ``host:port`` pairs in ``GSHARE_LOOPBACK_ALLOWLIST`` are let through (the demo fleet).

Only the context named by ``current-context`` is used; the others are dropped before storing.
Format: kubeconfig v1 (``clientcmd/api/v1`` in Kubernetes).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import yaml

from core.exceptions import ApplicationError
from kube.errors import KUBECONFIG_EXEC_FORBIDDEN, KUBECONFIG_INVALID, KUBECONFIG_LOCAL_FILE, KUBECONFIG_LOCALHOST

SERVICE_ACCOUNT_FIX = (
    "Register a kubeconfig that authenticates with a ServiceAccount token "
    "(`token:`) and inline `certificate-authority-data` (see docs/attach-a-cluster.md)."
)
_PLACEHOLDERS = ("DATA+OMITTED", "REDACTED")
_FILE_KEYS_CLUSTER = ("certificate-authority",)
_FILE_KEYS_USER = ("client-certificate", "client-key", "tokenFile")
_DATA_KEYS_CLUSTER = ("certificate-authority-data",)
_DATA_KEYS_USER = ("client-certificate-data", "client-key-data")
# Only these keys are kept (anything else, e.g. extensions or YAML alias bombs, is dropped before storing),
# each with the type the Kubernetes client needs (a string "false" would turn TLS verification off).
_CLUSTER_KEYS = {"server": str, "certificate-authority-data": str, "insecure-skip-tls-verify": bool, "tls-server-name": str}
_USER_KEYS = {"token": str, "client-certificate-data": str, "client-key-data": str, "username": str, "password": str}
#: Most nodes a kubeconfig may have once its YAML aliases are expanded (a real one has a few hundred).
MAX_EXPANDED_NODES = 50_000


class KubeconfigError(ApplicationError):
    """400: the kubeconfig cannot be used; ``code`` says why."""

    status = 400
    code = KUBECONFIG_INVALID


@dataclass(frozen=True)
class ValidKubeconfig:
    """A kubeconfig reduced to its current context.

    Attributes:
        config: kubeconfig dict with exactly one cluster, user and context (the current one).
        server: the apiserver URL (``https://host:port``).
        context: the context name.
    """

    config: dict
    server: str
    context: str

    def as_yaml(self) -> str:
        """Return the reduced kubeconfig as YAML text (what is stored, encrypted)."""
        return yaml.safe_dump(self.config, sort_keys=False)


class _AliasBomb(Exception):
    pass


def _expanded_size(root: yaml.Node) -> int:
    """Nodes in the document once every alias is expanded, counted without expanding anything.

    Raises:
        _AliasBomb: more than ``MAX_EXPANDED_NODES``, or an alias inside its own anchor (a cycle).
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _AliasBomb("an alias refers to the node that contains it")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [item for pair in node.value for item in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_EXPANDED_NODES:
                raise _AliasBomb(f"its aliases expand to more than {MAX_EXPANDED_NODES} nodes")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)


class _KubeconfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a document whose aliases expand too far (checked before constructing)."""

    def compose_document(self):
        node = super().compose_document()
        if node is not None:
            _expanded_size(node)
        return node


def _load_yaml(text: str):
    loader = _KubeconfigLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _type_name(value) -> str:
    return {bool: "a boolean", str: "a string", int: "a number", float: "a number", list: "a list", dict: "a mapping"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _check_types(section: dict, types: dict[str, type], what: str) -> None:
    """Refuse a kept key whose value is not of the type the Kubernetes client needs (the value is never quoted)."""
    for key, expected in types.items():
        if key not in section:
            continue
        value = section[key]
        if expected is bool and type(value) is not bool:
            raise KubeconfigError(
                f"The {what}'s `{key}` must be a YAML boolean (`{key}: true` or `{key}: false`, unquoted), not "
                f"{_type_name(value)}: write it unquoted, or remove it to verify the apiserver's certificate."
            )
        if expected is str and not isinstance(value, str):
            raise KubeconfigError(
                f"The {what}'s `{key}` must be a string, not {_type_name(value)}: paste the value from "
                "`kubectl config view --raw --minify --flatten`."
            )


def _named(entries, key: str, name: str) -> dict | None:
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(key), dict):
            return entry[key]
    return None


def _check_data(section: dict, keys: tuple[str, ...], what: str) -> None:
    for key in keys:
        if key not in section:
            continue
        value = section[key]
        if any(p in value for p in _PLACEHOLDERS):
            raise KubeconfigError(
                f"The {what}'s `{key}` is a placeholder (as printed by `kubectl config view`): "
                "export the kubeconfig with `kubectl config view --raw --minify`."
            )
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise KubeconfigError(f"The {what}'s `{key}` is not valid base64: paste the value from `kubectl config view --raw --minify`.") from None


def is_loopback_host(host: str) -> bool:
    """Return True for a host that means "this machine": 127.0.0.0/8, ::1, 0.0.0.0, ::, localhost."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def _is_local_target(host: str, port: int) -> bool:
    """True when ``host`` is, or resolves to, an address of this machine or a link-local one.

    Every address ``getaddrinfo`` returns is checked (numeric forms such as ``2130706433``, ``0x7f000001``
    or ``127.1`` resolve without DNS). A name that does not resolve is left to the probe, which then
    reports the cluster unreachable.
    """
    if is_loopback_host(host):
        return True
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        return False
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_loopback or address.is_unspecified or address.is_link_local:
            return True
    return False


def validate_kubeconfig(text: str, *, loopback_allowlist: list[str] | tuple[str, ...] = ()) -> ValidKubeconfig:
    """Parse and check a kubeconfig without opening any file or network connection.

    Args:
        text: the kubeconfig as YAML (or JSON) text.
        loopback_allowlist: ``host:port`` strings that may be on loopback anyway.

    Returns:
        The kubeconfig reduced to its current context.

    Raises:
        KubeconfigError: with code ``kubeconfig_invalid``, ``kubeconfig_exec_forbidden``,
            ``kubeconfig_local_file`` or ``kubeconfig_localhost``.
    """
    if not isinstance(text, str) or not text.strip():
        raise KubeconfigError("The kubeconfig is empty: paste the output of `kubectl config view --raw --minify`.")
    try:
        data = _load_yaml(text)
    except _AliasBomb as exc:
        raise KubeconfigError(
            f"The kubeconfig's YAML aliases (`&anchor` / `*alias`) cannot be used: {exc}. A kubeconfig needs none: paste the "
            "output of `kubectl config view --raw --minify --flatten`."
        ) from None
    except RecursionError:
        raise KubeconfigError("The kubeconfig nests too deeply to be a kubeconfig: paste the output of `kubectl config view --raw --minify`.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise KubeconfigError(f"The kubeconfig is not valid YAML{where}: paste the output of `kubectl config view --raw --minify`.") from None
    if not isinstance(data, dict):
        raise KubeconfigError("The kubeconfig is not a YAML mapping: paste the output of `kubectl config view --raw --minify`.")

    context_name = data.get("current-context")
    if not context_name or not isinstance(context_name, str):
        raise KubeconfigError("The kubeconfig has no `current-context`: set one with `kubectl config use-context <name>` and export again.")
    context = _named(data.get("contexts"), "context", context_name)
    if context is None:
        raise KubeconfigError(f"The current context {context_name!r} is not defined under `contexts`: export with `kubectl config view --raw --minify`.")
    cluster_name, user_name = context.get("cluster"), context.get("user")
    for key, value in (("cluster", cluster_name), ("user", user_name)):
        if value is not None and not isinstance(value, str):
            raise KubeconfigError(
                f"The `{key}` of context {context_name!r} must be a string (the name of an entry under `{key}s`), not {_type_name(value)}: "
                "export the kubeconfig with `kubectl config view --raw --minify --flatten`."
            )
    cluster = _named(data.get("clusters"), "cluster", cluster_name) if cluster_name else None
    if cluster is None:
        raise KubeconfigError(f"Context {context_name!r} names cluster {cluster_name!r}, which is not defined under `clusters`.")
    user = _named(data.get("users"), "user", user_name) if user_name else None
    if user is None:
        raise KubeconfigError(f"Context {context_name!r} names user {user_name!r}, which is not defined under `users`.")

    if "exec" in user or "auth-provider" in user:
        kind = "exec" if "exec" in user else "auth-provider"
        raise KubeconfigError(
            f"User {user_name!r} authenticates with `{kind}`, which would run a command on the control plane. {SERVICE_ACCOUNT_FIX}",
            code=KUBECONFIG_EXEC_FORBIDDEN,
        )
    for section, keys, what in ((cluster, _FILE_KEYS_CLUSTER, "cluster"), (user, _FILE_KEYS_USER, "user")):
        for key in keys:
            if section.get(key):
                raise KubeconfigError(
                    f"The {what}'s `{key}` points at a file; the control plane never opens a path named in a kubeconfig. "
                    f"Inline it as `{key}-data` (`kubectl config view --raw --minify --flatten`), or use a `token:`. {SERVICE_ACCOUNT_FIX}"
                    if key != "tokenFile"
                    else f"The user's `tokenFile` points at a file; the control plane never opens a path named in a kubeconfig. "
                    f"Put the token itself in `token:`. {SERVICE_ACCOUNT_FIX}",
                    code=KUBECONFIG_LOCAL_FILE,
                )
    if cluster.get("proxy-url"):
        raise KubeconfigError(
            "The cluster's `proxy-url` is not supported: the control plane dials the apiserver directly. Remove it.",
        )
    _check_types(cluster, _CLUSTER_KEYS, "cluster")
    _check_types(user, _USER_KEYS, "user")
    _check_data(cluster, _DATA_KEYS_CLUSTER, "cluster")
    _check_data(user, _DATA_KEYS_USER, "user")
    token = user.get("token")
    if token is not None and any(p in token for p in _PLACEHOLDERS):
        raise KubeconfigError("The user's `token` is a placeholder: export the kubeconfig with `kubectl config view --raw --minify`.")
    for key in ("token", "username", "password"):
        value = user.get(key)
        if value is not None and any(ch in value for ch in "\r\n\x00"):
            raise KubeconfigError(f"The user's `{key}` must be a single-line string: paste it again without line breaks.")
    # Sent in an HTTP header (``Authorization: Bearer <token>`` / Basic): a token is printable ASCII (a
    # ServiceAccount token is a JWT); a username or password must at least be Latin-1 without control characters.
    if token is not None and not all(" " <= ch <= "~" for ch in token):
        raise KubeconfigError(
            "The user's `token` contains a character that is not printable ASCII, so it cannot be sent in an HTTP header: "
            "paste the token again (`kubectl -n <namespace> create token <serviceaccount>`), without quotes or other characters around it."
        )
    for key in ("username", "password"):
        value = user.get(key)
        if value is not None and not all(" " <= ch <= "~" or "\xa0" <= ch <= "\xff" for ch in value):
            raise KubeconfigError(
                f"The user's `{key}` contains a character that cannot be sent in an HTTP header (only Latin-1 letters, no control "
                "characters): use a ServiceAccount token instead (`token:`)."
            )
    if not (token or ("client-certificate-data" in user and "client-key-data" in user) or ("username" in user and "password" in user)):
        raise KubeconfigError(f"User {user_name!r} has no credentials: {SERVICE_ACCOUNT_FIX}")

    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeconfigError(f"Cluster {cluster_name!r} has no `server`: it must be the apiserver URL, e.g. https://k8s.example.com:6443.")
    parts = urlsplit(server)
    try:
        port = parts.port
    except ValueError:
        raise KubeconfigError(f"The server {server!r} has an invalid port: use the apiserver URL, e.g. https://k8s.example.com:6443.") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise KubeconfigError(f"The server {server!r} is not an http(s) URL: use the apiserver URL, e.g. https://k8s.example.com:6443.")
    if parts.username or parts.password:
        raise KubeconfigError("The server URL carries credentials: remove `user:password@` from it and put credentials under `users`.")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise KubeconfigError(f"The server {server!r} has a path or query: use only scheme, host and port, e.g. https://k8s.example.com:6443.")
    port = port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname.rstrip(".")
    host_port = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    allowed = host_port in set(loopback_allowlist)
    if not allowed:
        if _is_local_target(host, port):
            raise KubeconfigError(
                f"The server {server!r} is (or resolves to) a loopback, unspecified or link-local address: from the control plane "
                "that is the control plane itself or its host. Use an address of the cluster's apiserver that the control plane can "
                "reach (for k3s, replace 127.0.0.1 in /etc/rancher/k3s/k3s.yaml with the node's address).",
                code=KUBECONFIG_LOCALHOST,
            )
        if parts.scheme != "https":
            raise KubeconfigError(
                f"The server {server!r} is plain http: the ServiceAccount token would cross the network in clear. Use the apiserver's https URL."
            )

    reduced = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": str(cluster_name), "cluster": {k: cluster[k] for k in _CLUSTER_KEYS if k in cluster}}],
        "users": [{"name": str(user_name), "user": {k: user[k] for k in _USER_KEYS if k in user}}],
        "contexts": [{"name": context_name, "context": {"cluster": str(cluster_name), "user": str(user_name)}}],
        "current-context": context_name,
    }
    namespace = context.get("namespace")
    if isinstance(namespace, str) and namespace:
        reduced["contexts"][0]["context"]["namespace"] = namespace
    return ValidKubeconfig(config=reduced, server=server, context=context_name)
