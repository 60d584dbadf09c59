"""``hack/cluster-bootstrap.sh storage``: install the democratic-csi driver on the current cluster, with no database.

    python -m attach.bootstrap_storage --values FILE [--kubeconfig PATH] [--timeout SECONDS]

It reads democratic-csi NFS Helm values (the chart's ``examples/*-nfs.yaml`` layout), checks them as attach's
``--storage-values`` does (:func:`attach.releases.storage_plan`) and installs chart ``democratic-csi`` as
release ``gshare-storage`` in namespace ``gshare-storage`` with the embedded Helm engine
(:func:`attach.helm.install_release`), on the cluster the ``helm`` command would use: ``--kubeconfig``,
else ``KUBECONFIG``, else ``~/.kube/config``, at its current context. Running it again upgrades the release, or
leaves it alone when the chart version and values are unchanged.

It runs on an operator's laptop, away from the control plane: Django is configured here with only the settings
the release plan reads (no ``DATABASES``, no apps), so importing it never starts the embedded PostgreSQL that
``gshare.settings`` starts when ``DATABASE_URL`` is unset. The chart's repository and version come from
``GSHARE_ATTACH_DEMOCRATIC_CSI_REPO`` / ``GSHARE_ATTACH_DEMOCRATIC_CSI_CHART_VERSION``, with the control plane's
defaults (:data:`CHART_DEFAULTS`; a test holds them equal to ``gshare/settings/base.py``).

Exit status: 0 installed, upgraded or unchanged; 1 the values, the kubeconfig or Helm refused (the message names
the fix); 2 a usage error.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import yaml

BASE_DIR = Path(__file__).resolve().parents[1]
#: The settings :func:`attach.releases.storage_plan` reads, with gshare/settings/base.py's defaults.
CHART_DEFAULTS = {
    "GSHARE_ATTACH_DEMOCRATIC_CSI_REPO": "https://democratic-csi.github.io/charts/",
    "GSHARE_ATTACH_DEMOCRATIC_CSI_CHART_VERSION": "0.15.0",
}
MAX_FILE_BYTES = 1024 * 1024
PROG = "hack/cluster-bootstrap.sh storage"


class BootstrapFailed(Exception):
    """The install cannot go on: ``problem`` says what is wrong, ``fix`` what to do about it."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def configure_settings(environ: Mapping[str, str]) -> None:
    """Configure Django's settings with only what the release plan needs, unless something configured them first.

    Args:
        environ: the environment (``GSHARE_ATTACH_DEMOCRATIC_CSI_*`` override :data:`CHART_DEFAULTS`).
    """
    from django.conf import settings

    if settings.configured:
        return
    chart = {key: environ.get(key) or default for key, default in CHART_DEFAULTS.items()}
    settings.configure(BASE_DIR=BASE_DIR, **chart)


def _read_text(path: str) -> str:
    with open(path, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES // 1024} KiB")
    return data.decode("utf-8")


def _unusable(exc: Exception, path: str, flag: str) -> BootstrapFailed:
    from attach.fixes import unreadable_file_fix, unreadable_file_reason  # reads settings: see install()

    return BootstrapFailed(f"cannot use {flag} {path}: {unreadable_file_reason(exc)}", unreadable_file_fix(exc, path=path, flag=flag))


def kubeconfig_target(path: str | None, environ: Mapping[str, str]) -> tuple[str, str, str]:
    """Which cluster Helm will talk to, for the progress line and for refusing early.

    Follows kubectl's rules: ``path``, else every file in ``KUBECONFIG`` (``os.pathsep``-separated; the first file
    that sets ``current-context`` decides it, the first file that defines a context or cluster name wins), else
    ``~/.kube/config``.

    Args:
        path: ``--kubeconfig`` or None.
        environ: the environment (``KUBECONFIG``, ``HOME``).

    Returns:
        ``(where, context, server)``: the file(s) read, the current context and its cluster's server URL.

    Raises:
        BootstrapFailed: no kubeconfig file, one that cannot be read as YAML, or no usable current context.
    """
    if path:
        files = [path]
    elif environ.get("KUBECONFIG"):
        files = [name for name in environ["KUBECONFIG"].split(os.pathsep) if name]
    else:
        files = [str(Path(environ.get("HOME") or Path.home()) / ".kube" / "config")]
    current, contexts, clusters, read = "", {}, {}, []
    for name in files:
        if not path and not os.path.exists(name):
            continue  # kubectl skips missing KUBECONFIG entries
        try:
            config = yaml.safe_load(_read_text(name)) or {}
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise _unusable(exc, name, "--kubeconfig") from None
        if not isinstance(config, dict):
            raise BootstrapFailed(f"{name} is not a kubeconfig (a YAML mapping)",
                                  f"export one: kubectl config view --raw --minify --flatten > {shlex.quote(name)}")
        read.append(name)
        current = current or str(config.get("current-context") or "")
        for entry in config.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name"):
                contexts.setdefault(str(entry["name"]), entry.get("context") or {})
        for entry in config.get("clusters") or []:
            if isinstance(entry, dict) and entry.get("name"):
                clusters.setdefault(str(entry["name"]), entry.get("cluster") or {})
    if not read:
        raise BootstrapFailed(f"no kubeconfig: {', '.join(files)} does not exist",
                              "pass --kubeconfig PATH, or set KUBECONFIG to the cluster's kubeconfig")
    where = ", ".join(read)
    if not current or current not in contexts:
        names = ", ".join(sorted(contexts)) or "none"
        raise BootstrapFailed(f"{where} has no current context{f' ({current!r} is not defined)' if current else ''}",
                              f"choose one (defined: {names}): kubectl config use-context <name>")
    cluster = clusters.get(str((contexts[current] or {}).get("cluster") or ""), {})
    return where, current, str(cluster.get("server") or "?")


def install(*, values_path: str, kubeconfig_path: str | None, environ: Mapping[str, str], timeout: int,
            echo: Callable[[str], None] = print) -> int:
    """Check the values, then install or upgrade democratic-csi as ``gshare-storage`` (module docstring).

    Args:
        values_path: ``--values``: democratic-csi NFS Helm values.
        kubeconfig_path: ``--kubeconfig`` or None (``KUBECONFIG`` / ``~/.kube/config``).
        environ: the environment.
        timeout: seconds Helm may spend in all.
        echo: where progress lines go.

    Returns:
        The Helm release's revision.

    Raises:
        BootstrapFailed: unusable values or kubeconfig, or Helm refused (its message, credentials redacted).
    """
    configure_settings(environ)
    # After configure_settings: these read Django's settings when imported, and this command configures its own.
    from attach import helm, releases
    from core.exceptions import ApplicationError

    try:
        values = yaml.safe_load(_read_text(values_path))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise _unusable(exc, values_path, "--values") from None
    try:
        plan = releases.storage_plan(values, values_path)
    except ApplicationError as exc:
        raise BootstrapFailed(str(exc), f"edit {shlex.quote(values_path)} (democratic-csi NFS values, see docs/attach.md)") from None
    where, context, server = kubeconfig_target(kubeconfig_path, environ)
    release = plan.release
    echo(f"{release.what}, NFSv{plan.nfs_version} server {plan.server}: release {release.release} in namespace "
         f"{release.namespace}")
    echo(f"cluster: context {context} ({server}) from {where}")
    try:
        result = helm.install_release(None, release, timeout=timeout, kubeconfig_path=kubeconfig_path)
    except helm.HelmInstallFailed as exc:
        fix = (f"check that the apiserver answers: kubectl --context {shlex.quote(context)} get --raw /version"
               if exc.unreachable else
               f"check the chart renders with these values: helm template {release.release} {release.chart} "
               f"--repo {release.repo_url} --version {release.version} --values {shlex.quote(values_path)}")
        raise BootstrapFailed(f"Helm could not install democratic-csi: {exc}", fix) from None
    echo(f"{result.action}: democratic-csi {result.chart_version}, revision {result.revision}")
    echo(f"read the values back: helm -n {release.namespace} get values {release.release} > csi-values.yaml")
    return result.revision


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Command-line entry point; returns the exit status (usage errors exit 2 through argparse)."""
    parser = argparse.ArgumentParser(prog=PROG, description="Install the democratic-csi driver as Helm release "
                                     "gshare-storage in namespace gshare-storage of the current cluster.")
    parser.add_argument("--values", required=True, metavar="FILE", help="democratic-csi NFS Helm values")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig (default: KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--timeout", type=int, default=300, metavar="SECONDS", help="Helm's budget (default 300)")
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    try:
        install(values_path=args.values, kubeconfig_path=args.kubeconfig, environ=environ, timeout=args.timeout)
    except BootstrapFailed as exc:
        print(f"FAILED: {exc.problem}", file=sys.stderr)
        print(f"fix: {exc.fix}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
