"""A bare cluster for trying ``attach_cluster`` in the demo (``manage.py demo --bare-cluster NAME``).

``python -m demo.bare_cluster serve --name lab-c3 --folder .gshare/demo/lab-c3 --ready-file F`` runs, in one
process until SIGTERM:

* an emulated apiserver over TLS (client-go, so Helm, sends a kubeconfig's bearer token only over TLS) holding a
  cluster as it is before attach: GPU nodes without gShare's labels, HAMi or ``nvidia.com/gpu``, the namespaces
  ``default`` and ``kube-system``, no RuntimeClass, CRD, ingress controller or operator (``fleet.bare_cluster_objects``);
* the emulator's kubelet, scheduler and HAMi device-plugin stand-ins (``demo.emulator.controllers``), so attach's
  check pods run against the nodes' host facts, and HAMi's device plugin registers the GPUs once the HAMi chart is
  installed;
* ``OperatorKubelet``: the operator Deployment the operator chart installs, run as a local operator process.

Its admin kubeconfig is written to ``<folder>/admin.kubeconfig`` (mode 0600; the CA of the TLS server included).

The cluster is modelled on ``lab-c2`` (k3s v1.34.1+k3s1; a Tesla T4 node and an 8x H20 MIG node): the fixture
data of ``demo/data`` with the cluster name substituted, and object uids and GPU UUIDs derived from the name
(DERIVED: uuid5 of the name and the original value), so it can be registered next to lab-c1 and lab-c2 (GPU UUIDs
and the kube-system uid are unique across the control plane).

Host facts (``demo.emulator.HOST_FACTS``) live in ``<folder>/hosts.json``, ``{node: facts}``: written at start and
read again whenever the file changes, so editing it changes what a node's host has installed while the cluster
runs. By default one GPU node (``UNPREPARED_NODE``) lacks containerd's ``nvidia`` runtime, as a node where
``nvidia-ctk runtime configure --runtime=containerd`` was never run: attach stops at its prerequisite check and names
the fix. ``python -m demo.bare_cluster fix-node NAME NODE`` does the fix on the emulated host (it restores the node's
prepared facts in hosts.json).

This module must not import Django.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import signal
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import yaml

from demo import fleet
from demo.emulator import EmulatedCluster
from demo.emulator.controllers.host_facts import validate_hosts
from demo.operator_kubelet import OperatorKubelet

logger = logging.getLogger("demo.bare_cluster")

TEMPLATE = "lab-c2"
"""The fleet cluster a bare cluster is modelled on."""

UNPREPARED_NODE = "gpu-t4-01"
"""The GPU node whose host lacks containerd's ``nvidia`` runtime when the bare cluster starts (``DEFAULT_OVERRIDES``)."""

DEFAULT_OVERRIDES: dict[str, dict[str, Any]] = {UNPREPARED_NODE: {"containerd_nvidia_runtime": None}}

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DERIVED = uuid.UUID("0b6d6a52-3c1e-4f55-9f0c-2f7f1a7b5c31")  # HAND: fixed so derived values are stable


def check_name(name: str) -> str:
    """``name`` when it can name a bare cluster: a DNS label of at most 40 characters that is not a fleet cluster.

    Raises:
        ValueError: with what is wrong and what would do.
    """
    if not _NAME.fullmatch(name or ""):
        raise ValueError(f"bare cluster name {name!r}: use lowercase letters, digits and '-' (a DNS label, at most "
                         "40 characters), e.g. lab-c3")
    if name in {spec.name for spec in fleet.FLEET}:
        raise ValueError(f"bare cluster name {name!r} is a cluster the demo attaches itself: pick another, e.g. lab-c3")
    return name


def _derived_gpu_uuid(name: str, match: re.Match) -> str:
    return f"GPU-{uuid.uuid5(_DERIVED, f'{name}/{match.group(0)}')}"


def _rename(value: Any, name: str) -> Any:
    """``value`` (JSON-like) with the template's name replaced by ``name`` and GPU UUIDs derived from ``name``."""
    text = json.dumps(value).replace(TEMPLATE, name)
    return json.loads(_GPU_UUID.sub(lambda m: _derived_gpu_uuid(name, m), text))


def cluster_objects(name: str) -> list[dict[str, Any]]:
    """The objects of bare cluster ``name``: ``fleet.bare_cluster_objects(TEMPLATE)`` renamed, each ``metadata.uid``
    derived from ``name`` (so its kube-system namespace, the cluster's identity, differs from the template's)."""
    objects = _rename(fleet.bare_cluster_objects(TEMPLATE), name)
    for obj in objects:
        meta = obj.get("metadata") or {}
        if meta.get("uid"):
            meta["uid"] = str(uuid.uuid5(_DERIVED, f"{name}/{meta['uid']}"))
    return objects


def prepared_hosts(name: str) -> dict[str, dict[str, Any]]:
    """Host facts of bare cluster ``name`` with every GPU node prepared (``fleet.cluster_hosts`` of the template,
    renamed; ``nvidia-smi -L`` and HAMi's register value carry the derived GPU UUIDs)."""
    return _rename(fleet.cluster_hosts(TEMPLATE), name)


def node_names(name: str) -> list[str]:
    """The node names of bare cluster ``name``, control plane first."""
    return [str(obj["metadata"]["name"]) for obj in cluster_objects(name) if obj["kind"] == "Node"]


def ingress_node(name: str) -> str:
    """The node to pass as ``--ingress-node``: the template's ingress node, renamed (the control-plane node)."""
    return fleet.cluster_spec(TEMPLATE).ingress_node.replace(TEMPLATE, name)


def default_hosts(name: str) -> dict[str, dict[str, Any]]:
    """``prepared_hosts(name)`` with ``DEFAULT_OVERRIDES`` applied: what the bare cluster starts with."""
    hosts = prepared_hosts(name)
    for node, facts in DEFAULT_OVERRIDES.items():
        hosts[node] = {**hosts[node], **facts}
    return hosts


def folder_of(name: str) -> Path:
    """``<GSHARE_HOME or ./.gshare>/demo/<name>``, the folder ``manage.py demo`` gives bare cluster ``name``."""
    home = os.environ.get("GSHARE_HOME") or Path(__file__).resolve().parents[1] / ".gshare"
    return Path(home).resolve() / "demo" / name


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    tmp.replace(path)


class BareCluster:
    """Bare cluster ``name`` served from this process (see the module docstring).

    Args:
        name: the cluster's name (``check_name``).
        folder: its folder: ``admin.kubeconfig``, ``hosts.json``, ``operator/`` (the operator's token, log and usage
            queue) are written there.
        port: the apiserver's port on 127.0.0.1 (0: a free one).
        operator_env: environment for the operator process, set last (see ``OperatorKubelet``).
    """

    def __init__(self, name: str, folder: Path, *, port: int = 0, operator_env: dict[str, str] | None = None):
        self.name, self.folder = check_name(name), Path(folder)
        self.hosts_path = self.folder / "hosts.json"
        self.kubeconfig_path = self.folder / "admin.kubeconfig"
        self._port, self._operator_env = port, operator_env
        self.cluster: EmulatedCluster | None = None
        self.kubelet: OperatorKubelet | None = None
        self._hosts_seen: tuple[float, int] | None = None

    def start(self) -> BareCluster:
        """Start the apiserver, write ``admin.kubeconfig`` and ``hosts.json``, start the operator's kubelet."""
        self.folder.mkdir(parents=True, exist_ok=True)
        hosts = default_hosts(self.name)
        self.cluster = EmulatedCluster(cluster_objects(self.name), version=fleet.cluster_version(TEMPLATE),
                                       token=secrets.token_urlsafe(24), port=self._port, hosts=hosts, tls=True,
                                       pod_startup_seconds=fleet.DEMO_POD_STARTUP_SECONDS).start()
        _write_private(self.kubeconfig_path, yaml.safe_dump(self.cluster.kubeconfig(self.name), sort_keys=False))
        self.hosts_path.write_text(json.dumps(hosts, indent=2) + "\n", encoding="utf-8")
        stat = self.hosts_path.stat()
        self._hosts_seen = (stat.st_mtime, stat.st_size)
        operator_dir = self.folder / "operator"
        operator_dir.mkdir(exist_ok=True)
        env = {"GSHARE_USAGE_QUEUE_PATH": str(operator_dir / "usage-queue.sqlite3"), **(self._operator_env or {})}
        self.kubelet = OperatorKubelet(self.cluster, self.kubeconfig_path, operator_dir, extra_env=env)
        return self

    def sync_hosts(self) -> list[str]:
        """Apply ``hosts.json`` if it changed since last read: the nodes whose facts differ get them.

        Returns:
            The nodes changed (``[]`` when the file is unchanged, unreadable or invalid; the latter two are logged).
        """
        assert self.cluster is not None
        try:
            stat = self.hosts_path.stat()
            if (stat.st_mtime, stat.st_size) == self._hosts_seen:
                return []
            self._hosts_seen = (stat.st_mtime, stat.st_size)
            wanted = validate_hosts(json.loads(self.hosts_path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            logger.warning("%s: %s is not usable (%s); the host facts stay as they were", self.name, self.hosts_path, exc)
            return []
        current = self.cluster.hosts
        changed = sorted(node for node in set(wanted) | set(current) if wanted.get(node) != current.get(node))
        for node in changed:
            self.cluster.set_host(node, wanted.get(node))
            logger.info("%s: host facts of node %s changed: %s", self.name, node, json.dumps(wanted.get(node)))
        return changed

    def ready_info(self) -> dict[str, Any]:
        """``{"name", "url", "kubeconfig", "hosts_file", "nodes", "ingress_node", "pid"}`` for the ready file."""
        assert self.cluster is not None
        return {"name": self.name, "url": self.cluster.url, "kubeconfig": str(self.kubeconfig_path),
                "hosts_file": str(self.hosts_path), "nodes": node_names(self.name), "ingress_node": ingress_node(self.name),
                "pid": os.getpid()}

    def stop(self) -> None:
        """Stop the operator process and the apiserver."""
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.cluster is not None:
            self.cluster.stop()


def fix_node(name: str, node: str, folder: Path | None = None) -> dict[str, Any]:
    """Prepare ``node``'s host in the running bare cluster ``name``: its prepared facts go into ``hosts.json``.

    Returns:
        The node's facts now in ``hosts.json``.

    Raises:
        ValueError: no such node, or no ``hosts.json`` (the bare cluster is not running).
    """
    path = (folder or folder_of(name)) / "hosts.json"
    prepared = prepared_hosts(name)
    if node not in prepared:
        raise ValueError(f"{name} has no node {node!r}; its nodes: {', '.join(sorted(prepared))}")
    if not path.exists():
        raise ValueError(f"{path} does not exist: start the demo with --bare-cluster {name} first")
    hosts = json.loads(path.read_text(encoding="utf-8"))
    hosts[node] = prepared[node]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(hosts, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return prepared[node]


def _serve(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    env = {"GSHARE_INVENTORY_INTERVAL": str(args.inventory_interval), "GSHARE_USAGE_INTERVAL": str(args.inventory_interval),
           "GSHARE_VOLUME_SYNC_INTERVAL": str(args.inventory_interval)}
    bare = BareCluster(args.name, Path(args.folder), port=args.port, operator_env=env)
    try:
        bare.start()
        if args.ready_file:
            ready = Path(args.ready_file)
            tmp = ready.with_name(ready.name + ".tmp")
            tmp.write_text(json.dumps(bare.ready_info()), encoding="utf-8")
            tmp.replace(ready)
        logger.info("bare cluster %s: apiserver %s, admin kubeconfig %s, host facts %s", bare.name, bare.cluster.url,
                    bare.kubeconfig_path, bare.hosts_path)
        while not stop.wait(0.5):
            bare.sync_hosts()
    finally:
        bare.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring).

    ``python -m demo.bare_cluster serve --name NAME --folder DIR [--port N] [--ready-file PATH]
    [--inventory-interval S]``: serve until SIGTERM/SIGINT; the ready file gets ``BareCluster.ready_info()``.

    ``python -m demo.bare_cluster fix-node NAME NODE [--folder DIR]``: prepare a node's host (``fix_node``).

    Returns:
        The exit code: 0, 2 for bad arguments (or a refused fix).
    """
    parser = argparse.ArgumentParser(prog="python -m demo.bare_cluster", description="A bare cluster for the demo's attach.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a bare cluster until SIGTERM")
    serve.add_argument("--name", required=True)
    serve.add_argument("--folder", required=True)
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--ready-file")
    serve.add_argument("--inventory-interval", type=int, default=10, help="the operator's inventory interval, seconds")
    fix = commands.add_parser("fix-node", help="prepare a node's host: containerd's nvidia runtime and every GPU prerequisite")
    fix.add_argument("name")
    fix.add_argument("node")
    fix.add_argument("--folder", help="the bare cluster's folder (default .gshare/demo/NAME, or $GSHARE_HOME/demo/NAME)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # the operator's kubelet polls every 0.2 s
    if args.command == "fix-node":
        try:
            fix_node(args.name, args.node, Path(args.folder) if args.folder else None)
        except ValueError as exc:
            print(f"fix-node: {exc}", file=sys.stderr)
            return 2
        print(f"{args.name}: node {args.node} prepared (NVIDIA driver, container toolkit, containerd's nvidia runtime, "
              "NFS client), as `hack/cluster-bootstrap.sh prereqs --gpu` does on a real node; re-run the attach command")
        return 0
    try:
        return _serve(args)
    except ValueError as exc:
        print(f"demo.bare_cluster: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
