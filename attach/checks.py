"""Node checks of ``attach_cluster``: short-lived privileged pods that look at each node's host and print what they find.

A check pod is bound to its node (``spec.nodeName``, no scheduler involved), mounts the host's root
filesystem read-only at ``/host``, runs a POSIX shell script and exits 0; the attach command reads its log
(``pods/log``) and deletes it. The script prints one line per item, in this grammar (raw tool output lines
follow their item line verbatim)::

    gshare-check nvidia-pci found <n> | none        NVIDIA (vendor 0x10de) display/3D controllers in /sys/bus/pci
    gshare-check nvidia-smi ok | missing | failed   + the output of `nvidia-smi -L`
    gshare-check nvidia-ctk ok | missing            + the output of `nvidia-ctk --version`
    gshare-check containerd-nvidia-runtime ok <config file> | missing
    gshare-check mount.nfs ok <path> | missing
    gshare-check tcp <host:port> ok | unreachable
    gshare-check done

The last three items are the NFS check (``GSHARE_CHECK_TARGETS``: space-separated ``host:port``). The image
(``GSHARE_ATTACH_CHECK_IMAGE``, default busybox) needs ``sh``, ``chroot``, ``grep``, ``nc`` and ``timeout``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

CHECK_LABEL = "app.kubernetes.io/name"
CHECK_LABEL_VALUE = "gshare-attach-check"
CHECK_KIND_LABEL = "gshare.io/check"
PREFIX = "gshare-check "

# Where containerd keeps its configuration: kubeadm/most distributions, drop-ins written by
# `nvidia-ctk runtime configure` (toolkit >= 1.17 with containerd 2 imports), k3s and RKE2.
CONTAINERD_CONFIGS = (
    "/etc/containerd/config.toml",
    "/etc/containerd/conf.d/*.toml",
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
)

NODE_SCRIPT = r"""
n=0
for d in /sys/bus/pci/devices/*; do
  [ -r "$d/vendor" ] || continue
  if [ "$(cat "$d/vendor")" = "0x10de" ]; then
    case "$(cat "$d/class")" in 0x03*) n=$((n+1)) ;; esac
  fi
done
if [ "$n" -eq 0 ]; then echo "gshare-check nvidia-pci none"; echo "gshare-check done"; exit 0; fi
echo "gshare-check nvidia-pci found $n"
if chroot /host sh -c 'command -v nvidia-smi' >/dev/null 2>&1; then
  if out=$(chroot /host nvidia-smi -L 2>&1); then echo "gshare-check nvidia-smi ok"; else echo "gshare-check nvidia-smi failed"; fi
  printf '%s\n' "$out"
else
  echo "gshare-check nvidia-smi missing"
fi
if chroot /host sh -c 'command -v nvidia-ctk' >/dev/null 2>&1; then
  echo "gshare-check nvidia-ctk ok"; chroot /host nvidia-ctk --version 2>&1
else
  echo "gshare-check nvidia-ctk missing"
fi
found=""
for f in CONFIGS; do
  if [ -f "/host$f" ] && grep -Eq 'runtimes\.("nvidia"|nvidia)\]' "/host$f"; then found="$f"; break; fi
done
if [ -n "$found" ]; then echo "gshare-check containerd-nvidia-runtime ok $found"; else echo "gshare-check containerd-nvidia-runtime missing"; fi
echo "gshare-check done"
""".replace("CONFIGS", " ".join(CONTAINERD_CONFIGS))

NFS_SCRIPT = r"""
p=$(chroot /host sh -c 'command -v mount.nfs || for f in /sbin/mount.nfs /usr/sbin/mount.nfs; do [ -x "$f" ] && echo "$f" && break; done' 2>/dev/null)
if [ -n "$p" ]; then echo "gshare-check mount.nfs ok $p"; else echo "gshare-check mount.nfs missing"; fi
for t in $GSHARE_CHECK_TARGETS; do
  if timeout 5 nc -z -w 3 "${t%:*}" "${t##*:}" >/dev/null 2>&1; then echo "gshare-check tcp $t ok"; else echo "gshare-check tcp $t unreachable"; fi
done
echo "gshare-check done"
"""


def check_pod_name(kind: str, node: str) -> str:
    """A stable pod name for ``kind`` (``node``/``nfs``) on ``node``, at most 63 characters."""
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    stem = re.sub(r"[^a-z0-9-]", "-", node.lower())[:40].strip("-")
    return f"gshare-check-{kind}-{stem}-{digest}"


def check_pod(kind: str, node: str, namespace: str, *, targets: list[str] | None = None) -> dict[str, Any]:
    """The manifest of a check pod.

    Args:
        kind: ``node`` (GPU prerequisites) or ``nfs`` (NFS client and reachability).
        node: the node to run on (bound with ``spec.nodeName``; tolerates every taint).
        namespace: where to create it (``gshare-system``).
        targets: for ``nfs``: ``host:port`` strings to try.

    Returns:
        A ``v1/Pod`` dict: privileged, host network and PID namespaces, the host's ``/`` read-only at ``/host``,
        ``restartPolicy: Never``, ``activeDeadlineSeconds`` 120.
    """
    env = [{"name": "GSHARE_CHECK_TARGETS", "value": " ".join(targets or [])}] if kind == "nfs" else []
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": check_pod_name(kind, node),
            "namespace": namespace,
            "labels": {CHECK_LABEL: CHECK_LABEL_VALUE, CHECK_KIND_LABEL: kind},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 120,
            "hostNetwork": True,
            "hostPID": True,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "check",
                "image": settings.GSHARE_ATTACH_CHECK_IMAGE,
                "command": ["/bin/sh", "-c", NODE_SCRIPT if kind == "node" else NFS_SCRIPT],
                "env": env,
                "securityContext": {"privileged": True},
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                "volumeMounts": [{"name": "host", "mountPath": "/host", "readOnly": True}],
            }],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        },
    }


@dataclass
class CheckItem:
    """One item of a check log: ``status`` (``ok``, ``missing``, ``failed``, ``found``, ``none``, ``unreachable``),
    ``detail`` (the rest of the item line) and ``output`` (the raw tool output lines after it)."""

    status: str
    detail: str = ""
    output: list[str] = field(default_factory=list)


@dataclass
class CheckReport:
    """A parsed check log: ``items`` by name (``tcp`` items as ``tcp <host:port>``) and whether it ``complete``d."""

    items: dict[str, CheckItem] = field(default_factory=dict)
    complete: bool = False

    def status(self, name: str) -> str:
        """The status of item ``name`` ("" when the log does not have it)."""
        item = self.items.get(name)
        return item.status if item else ""


def parse_check_log(text: str) -> CheckReport:
    """Parse a check pod's log (grammar in the module docstring).

    Args:
        text: the pod's log.

    Returns:
        A :class:`CheckReport`; ``complete`` is False when the ``done`` line is missing (the script was cut short).
    """
    report = CheckReport()
    current: CheckItem | None = None
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            if current is not None and line.strip():
                current.output.append(line)
            continue
        words = line[len(PREFIX):].split()
        if not words:
            continue
        if words[0] == "done":
            report.complete = True
            current = None
            continue
        if words[0] == "tcp" and len(words) >= 3:
            name, status, detail = f"tcp {words[1]}", words[2], ""
        else:
            name, status, detail = words[0], (words[1] if len(words) > 1 else ""), " ".join(words[2:])
        current = CheckItem(status=status, detail=detail)
        report.items[name] = current
    return report


def gpu_count(report: CheckReport) -> int:
    """NVIDIA GPUs on the PCI bus according to ``report`` (0 for a node without any)."""
    item = report.items.get("nvidia-pci")
    if item is None or item.status != "found":
        return 0
    try:
        return int(item.detail.split()[0])
    except (ValueError, IndexError):
        return 0
