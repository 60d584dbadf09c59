"""``manage.py demo --bare-cluster NAME``: the demo's side of the bare clusters (``demo.bare_cluster``).

For each name: a child ``python -m demo.bare_cluster serve`` (supervised like the demo's other children), and for all
of them one loopback chart repository (``demo.charts``) in the demo process. ``attach_command`` is what the demo
prints and writes to the state file: the attach command to run from another shell, with the demo's API token and the
``GSHARE_ATTACH_*`` settings that point attach at that chart repository.

This module must not import Django.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from demo import bare_cluster
from demo.charts import ChartRepository
from demo.processes import ProcessGroup, python_argv

SESSION_DOMAIN_SUFFIX = ".gshare.localhost"
"""Session domains of the demo's clusters are ``<name>.gshare.localhost``: browsers resolve ``*.localhost`` to
loopback, where the demo ingress answers for every cluster."""


#: The shell line that runs the first bare cluster's attach command from the state file: ``$STATE`` when set (a demo
#: started with ``--state-file``), else the default path. README.md and docs/attach.md show the same line.
STATE_EVAL = ("""eval "$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["bare_clusters"][0]"""
              """["attach_command"])' "${STATE:-.gshare/demo/state.json}")\"""")


def attach_command(*, name: str, kubeconfig: str, control_plane: str, session_domain: str, ingress_node: str,
                   api_token: str, attach_env: dict[str, str]) -> str:
    """The shell command that attaches bare cluster ``name`` to the demo's control plane (POSIX shell quoting).

    Args:
        name: the cluster's name (``--name``).
        kubeconfig: its admin kubeconfig, relative to the checkout when inside it (``--kubeconfig``).
        control_plane: the control plane's URL the cluster's operator calls (``--control-plane``; the demo's
            internal host, where the API answers too).
        session_domain: ``--session-domain``.
        ingress_node: ``--ingress-node``.
        api_token: the demo's staff API token (``GSHARE_API_TOKEN``).
        attach_env: settings to set for the command: the ``GSHARE_ATTACH_*`` of ``ChartRepository.attach_environment``
            and ``GSHARE_LOOPBACK_ALLOWLIST`` with the cluster's loopback apiserver.

    Returns:
        ``GSHARE_API_TOKEN=... GSHARE_ATTACH_...=... hack/attach-cluster.sh --kubeconfig ... --name ...
        --control-plane ... --session-domain ... --ingress-node ...`` on one line.
    """
    env = {"GSHARE_API_TOKEN": api_token, **attach_env}
    prefix = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
    flags = [("--kubeconfig", kubeconfig), ("--name", name), ("--control-plane", control_plane),
             ("--session-domain", session_domain), ("--ingress-node", ingress_node)]
    return f"{prefix} hack/attach-cluster.sh " + " ".join(f"{flag} {shlex.quote(value)}" for flag, value in flags)


def _shown_path(path: Path, checkout: Path) -> str:
    """``path`` relative to ``checkout`` when inside it (the printed command is run from the checkout), else absolute."""
    try:
        return str(path.resolve().relative_to(checkout.resolve()))
    except ValueError:
        return str(path.resolve())


@dataclass
class BareClusters:
    """The demo's running bare clusters and their chart repository.

    Attributes:
        clusters: one ``demo.bare_cluster.BareCluster.ready_info()`` dict per cluster, in the order given.
        repository: the chart repository (None until started).
    """

    clusters: list[dict[str, Any]] = field(default_factory=list)
    repository: ChartRepository | None = None

    @staticmethod
    def wipe(workdir: Path, names: list[str]) -> None:
        """Remove what an earlier run left of bare clusters (these names, and every folder of ``workdir`` holding a
        ``hosts.json``: a bare cluster of a run with other names) and of the chart repository."""
        earlier = [p.parent.name for p in workdir.glob("*/hosts.json")] if workdir.is_dir() else []
        for name in {*names, *earlier}:
            shutil.rmtree(workdir / name, ignore_errors=True)
        shutil.rmtree(workdir / "chart-repo", ignore_errors=True)

    def start(self, names: list[str], workdir: Path, group: ProcessGroup, *, cwd: Path, env: dict[str, str],
              inventory_interval: int, wait_for_file: Callable[[Path, str, ProcessGroup], dict]) -> BareClusters:
        """Start the chart repository and one supervised child per bare cluster; return once each has its apiserver.

        Args:
            names: bare cluster names (checked with ``bare_cluster.check_name``).
            workdir: the demo's folder; each cluster gets ``<workdir>/<name>``, the repository ``<workdir>/chart-repo``.
            group: the demo's process group.
            cwd: the checkout (children's working directory).
            env: the children's environment.
            inventory_interval: the operators' inventory interval, seconds.
            wait_for_file: the demo's ``(path, what, group) -> JSON`` wait for a ready file.

        Raises:
            ValueError: a bad or repeated name.
        """
        if len(set(names)) != len(names):
            raise ValueError(f"--bare-cluster names repeat: {', '.join(names)}")
        for name in names:
            bare_cluster.check_name(name)
        self.repository = ChartRepository(workdir / "chart-repo").start()
        started = []
        for name in names:
            folder = workdir / name
            folder.mkdir(parents=True, exist_ok=True)
            ready = folder / "ready.json"
            ready.unlink(missing_ok=True)

            def argv(port: int, name=name, folder=folder, ready=ready) -> list[str]:
                return python_argv("-m", "demo.bare_cluster", "serve", "--name", name, "--folder", str(folder), "--port",
                                   str(port), "--ready-file", str(ready), "--inventory-interval", str(inventory_interval))

            started.append((ready, group.start(f"bare-{name}", argv(0), env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd), argv))
        for ready, child, argv in started:
            info = wait_for_file(ready, f"the bare cluster {child.name.removeprefix('bare-')}", group)
            child.argv = argv(urlsplit(info["url"]).port)  # a restart comes back where the kubeconfig points
            self.clusters.append(info)
        return self

    def allowlist(self) -> list[str]:
        """``host:port`` of each bare cluster's apiserver (for ``GSHARE_LOOPBACK_ALLOWLIST``)."""
        return [urlsplit(info["url"]).netloc for info in self.clusters]

    def ingress_entries(self) -> list[dict[str, str]]:
        """The demo ingress's ``{"name", "session_domain", "kubeconfig"}`` entry of each bare cluster."""
        return [{"name": info["name"], "session_domain": f"{info['name']}{SESSION_DOMAIN_SUFFIX}",
                 "kubeconfig": info["kubeconfig"]} for info in self.clusters]

    def state(self, *, api_token: str, control_plane: str, checkout: Path) -> list[dict[str, Any]]:
        """The state file's ``bare_clusters``: ``[{"name", "admin_kubeconfig", "attach_command", "session_domain",
        "ingress_node", "hosts_file", "fix_command"}]`` (``fix_command`` prepares ``bare_cluster.UNPREPARED_NODE``)."""
        assert self.repository is not None or not self.clusters
        entries = []
        for info in self.clusters:
            kubeconfig = _shown_path(Path(info["kubeconfig"]), checkout)
            session_domain = f"{info['name']}{SESSION_DOMAIN_SUFFIX}"
            command = attach_command(name=info["name"], kubeconfig=kubeconfig, control_plane=control_plane,
                                     session_domain=session_domain, ingress_node=info["ingress_node"],
                                     api_token=api_token, attach_env={
                                         **self.repository.attach_environment(),
                                         # the attach command checks the kubeconfig as registration does, which
                                         # refuses loopback apiservers unless allowed (the demo allows its own)
                                         "GSHARE_LOOPBACK_ALLOWLIST": urlsplit(info["url"]).netloc,
                                     })
            entries.append({
                "name": info["name"], "admin_kubeconfig": str(Path(info["kubeconfig"]).resolve()),
                "attach_command": command, "session_domain": session_domain, "ingress_node": info["ingress_node"],
                "hosts_file": info["hosts_file"],
                "fix_command": (f".venv/bin/python -m demo.bare_cluster fix-node {info['name']} {bare_cluster.UNPREPARED_NODE} "
                                f"--folder {shlex.quote(_shown_path(Path(info['kubeconfig']).parent, checkout))}"),
            })
        return entries

    def stop(self) -> None:
        """Stop the chart repository (the children stop with the demo's process group)."""
        if self.repository is not None:
            self.repository.stop()
