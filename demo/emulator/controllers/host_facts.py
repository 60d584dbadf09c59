"""Host facts and gShare's attach checks.

What ``manage.py attach_cluster`` finds out about a node it learns from short-lived check pods (scripts in
``attach/checks.py``) and from HAMi's device plugin registering the node once HAMi is installed. Both
depend on the host (PCI bus, driver, toolkit, containerd config, NFS client, network), which is not in the
Kubernetes API: the emulator keeps it as per-node "host facts" (``KubeApiEmulator.hosts``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

HOST_FACTS: dict[str, str] = {
    "nvidia_pci": "number of NVIDIA display/3D controllers on the PCI bus (int, 0 for a CPU node)",
    "nvidia_smi": "verbatim output of `nvidia-smi -L` (str), None: nvidia-smi not installed",
    "nvidia_smi_error": "nvidia-smi is installed but fails with this output (str), None: it works",
    "nvidia_ctk": "verbatim output of `nvidia-ctk --version` (str), None: not installed",
    "containerd_nvidia_runtime": "containerd config file registering the `nvidia` runtime (str), None: none does",
    "mount_nfs": "path of the `mount.nfs` helper (str), None: no NFS client",
    "reachable": "TCP targets `host:port` the node can connect to (list of str)",
    "hami_register": "the hami.io/node-nvidia-register value HAMi's device plugin writes on the node (str), None: none",
}
"""Keys of a node's host facts (all optional; a missing key means absent/none/nothing) and what they mean."""

CHECK_POD_LABEL = "app.kubernetes.io/name"
CHECK_POD_LABEL_VALUE = "gshare-attach-check"
"""Label (key, value) of gShare's attach check pods."""

CHECK_KIND_LABEL = "gshare.io/check"
"""Label of a check pod naming its script: ``node`` (GPU prerequisites) or ``nfs`` (NFS client and reachability)."""

CHECK_KINDS = ("node", "nfs")

CHECK_TARGETS_ENV = "GSHARE_CHECK_TARGETS"
"""Environment variable of an ``nfs`` check pod's first container: space-separated ``host:port`` targets."""

CHECK_PREFIX = "gshare-check "

_OPTIONAL_TEXT_FACTS = ("nvidia_smi", "nvidia_smi_error", "nvidia_ctk", "containerd_nvidia_runtime", "mount_nfs",
                        "hami_register")


def validate_host_facts(node: str, facts: Mapping[str, Any]) -> dict[str, Any]:
    """Check one node's host facts (keys and types of ``HOST_FACTS``) and return a deep copy.

    Raises:
        ValueError: not a mapping, an unknown key, or a value of the wrong type.
    """
    if not isinstance(facts, Mapping):
        raise ValueError(f"host facts of node {node!r} must be an object, not {type(facts).__name__}")
    unknown = sorted(set(facts) - set(HOST_FACTS))
    if unknown:
        raise ValueError(f"host facts of node {node!r}: unknown key(s) {', '.join(map(repr, unknown))} "
                         f"(known: {', '.join(HOST_FACTS)})")
    pci = facts.get("nvidia_pci", 0)
    if isinstance(pci, bool) or not isinstance(pci, int) or pci < 0:
        raise ValueError(f"host facts of node {node!r}: nvidia_pci must be an integer >= 0, not {pci!r}")
    for key in _OPTIONAL_TEXT_FACTS:
        if facts.get(key) is not None and not isinstance(facts[key], str):
            raise ValueError(f"host facts of node {node!r}: {key} must be a string or null, not {facts[key]!r}")
    reachable = facts.get("reachable", [])
    if not isinstance(reachable, list | tuple) or not all(isinstance(t, str) for t in reachable):
        raise ValueError(f"host facts of node {node!r}: reachable must be a list of 'host:port' strings, "
                         f"not {reachable!r}")
    return copy.deepcopy({k: list(v) if k == "reachable" else v for k, v in facts.items()})


def validate_hosts(hosts: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Check ``{node name: host facts}`` (see ``validate_host_facts``); None means no facts. Returns a deep copy.

    Raises:
        ValueError: not a mapping of node names to facts, or bad facts.
    """
    if hosts is None:
        return {}
    if not isinstance(hosts, Mapping):
        raise ValueError(f"hosts must be an object {{node name: facts}}, not {type(hosts).__name__}")
    return {str(node): validate_host_facts(str(node), facts) for node, facts in hosts.items()}


def _tool_output(text: str, *, substituted: bool) -> list[str]:
    """Lines a tool's output adds to a check log.

    ``substituted``: printed as ``printf '%s\\n' "$(tool)"`` (trailing newlines dropped, one added, so an empty
    output is one empty line); otherwise printed as the tool wrote it (a missing final newline is added so the
    next item starts a line, as real tools end their output with one).
    """
    if substituted:
        return text.rstrip("\n").split("\n")
    if not text:
        return []
    return text.removesuffix("\n").split("\n")


def node_check_log(facts: Mapping[str, Any]) -> str:
    """The log of a ``gshare.io/check: node`` pod on a host with these facts (``attach/checks.py``
    ``NODE_SCRIPT``): ``nvidia-pci``, then (with at least one NVIDIA GPU) ``nvidia-smi``, ``nvidia-ctk`` and
    ``containerd-nvidia-runtime``, each followed by the tool's raw output where it has one, then ``done``."""
    lines: list[str] = []
    count = int(facts.get("nvidia_pci") or 0)
    if count < 1:
        lines.append(f"{CHECK_PREFIX}nvidia-pci none")
    else:
        lines.append(f"{CHECK_PREFIX}nvidia-pci found {count}")
        if facts.get("nvidia_smi_error") is not None:
            lines.append(f"{CHECK_PREFIX}nvidia-smi failed")
            lines.extend(_tool_output(facts["nvidia_smi_error"], substituted=True))
        elif facts.get("nvidia_smi") is not None:
            lines.append(f"{CHECK_PREFIX}nvidia-smi ok")
            lines.extend(_tool_output(facts["nvidia_smi"], substituted=True))
        else:
            lines.append(f"{CHECK_PREFIX}nvidia-smi missing")
        if facts.get("nvidia_ctk") is not None:
            lines.append(f"{CHECK_PREFIX}nvidia-ctk ok")
            lines.extend(_tool_output(facts["nvidia_ctk"], substituted=False))
        else:
            lines.append(f"{CHECK_PREFIX}nvidia-ctk missing")
        if facts.get("containerd_nvidia_runtime"):
            lines.append(f"{CHECK_PREFIX}containerd-nvidia-runtime ok {facts['containerd_nvidia_runtime']}")
        else:
            lines.append(f"{CHECK_PREFIX}containerd-nvidia-runtime missing")
    lines.append(f"{CHECK_PREFIX}done")
    return "\n".join(lines) + "\n"


def nfs_check_log(facts: Mapping[str, Any], targets: Iterable[str]) -> str:
    """The log of a ``gshare.io/check: nfs`` pod on a host with these facts (``NFS_SCRIPT``): ``mount.nfs``, one
    ``tcp <host:port> ok|unreachable`` per target in order (reachable: listed in the ``reachable`` fact), ``done``."""
    lines = [f"{CHECK_PREFIX}mount.nfs ok {facts['mount_nfs']}" if facts.get("mount_nfs")
             else f"{CHECK_PREFIX}mount.nfs missing"]
    reachable = set(facts.get("reachable") or ())
    lines.extend(f"{CHECK_PREFIX}tcp {target} {'ok' if target in reachable else 'unreachable'}" for target in targets)
    lines.append(f"{CHECK_PREFIX}done")
    return "\n".join(lines) + "\n"


def _pod_labelled(pod: Mapping[str, Any], key: str) -> str | None:
    meta = pod.get("metadata") or {}
    value = (meta.get("labels") or {}).get(key)
    return value if value is not None else (meta.get("annotations") or {}).get(key)


def check_pod_kind(pod: Mapping[str, Any]) -> str | None:
    """``node``/``nfs`` for a gShare attach check pod bound to a node (label ``app.kubernetes.io/name:
    gshare-attach-check``, ``spec.nodeName`` set, ``gshare.io/check`` label, or annotation, ``node``/``nfs``), else
    None (an ordinary pod)."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(CHECK_POD_LABEL) != CHECK_POD_LABEL_VALUE:
        return None
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    kind = _pod_labelled(pod, CHECK_KIND_LABEL)
    return kind if kind in CHECK_KINDS else None


def check_targets(pod: Mapping[str, Any]) -> list[str]:
    """``GSHARE_CHECK_TARGETS`` of the pod's first container, split as the shell splits ``$GSHARE_CHECK_TARGETS``."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    for env in containers[0].get("env") or []:
        if env.get("name") == CHECK_TARGETS_ENV:
            return str(env.get("value") or "").split()
    return []
