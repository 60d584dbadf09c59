"""A Helm chart repository on loopback serving the stand-in charts attach installs (``demo/data/charts``).

``attach_cluster`` fetches HAMi, Envoy Gateway (``gateway-helm``), ingress-nginx and democratic-csi from the repositories
named by the settings ``GSHARE_ATTACH_{HAMI,ENVOY_GATEWAY,INGRESS_NGINX,DEMOCRATIC_CSI}_REPO``; the attach tests and
``manage.py demo --bare-cluster`` point all four at one ``ChartRepository``, so nothing leaves loopback. The charts are the stand-ins described in
``demo/data/charts/README.md`` (packaged with ``helm_python``, the embedded Helm engine attach uses).

This module must not import Django.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from pathlib import Path
from typing import Any

import yaml

CHARTS_DIR = Path(__file__).resolve().parent / "data" / "charts"
"""The stand-in chart sources: one folder per chart (``Chart.yaml``, ``values.yaml``, ``templates/``)."""

#: Fixed timestamps keep index.yaml identical between runs (Helm only displays them).
_CREATED = "2026-11-01T00:00:00Z"

#: ``GSHARE_ATTACH_*`` setting prefix of each chart (``<prefix>_REPO``, ``<prefix>_CHART_VERSION``).
SETTING_PREFIXES = {"hami": "GSHARE_ATTACH_HAMI", "ingress-nginx": "GSHARE_ATTACH_INGRESS_NGINX",
                    "gateway-helm": "GSHARE_ATTACH_ENVOY_GATEWAY", "democratic-csi": "GSHARE_ATTACH_DEMOCRATIC_CSI"}


def chart_versions() -> dict[str, str]:
    """``{chart name: version}`` of the stand-in charts, read from their ``Chart.yaml``."""
    versions = {}
    for chart_dir in sorted(p for p in CHARTS_DIR.iterdir() if (p / "Chart.yaml").exists()):
        meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))
        versions[meta["name"]] = str(meta["version"])
    return versions


def build_repository(root: Path) -> Path:
    """Package every chart of ``CHARTS_DIR`` into ``root`` and write the repository's ``index.yaml``.

    Args:
        root: an existing, writable folder (the repository's document root).

    Returns:
        The path of ``index.yaml``: ``{"apiVersion": "v1", "entries": {name: [{Chart.yaml fields, "urls":
        [archive file name], "created", "digest": sha256 hex}]}, "generated"}`` (Helm's repository index format).
    """
    import helm_python as helm  # imported here: the demo imports this module only with --bare-cluster

    entries: dict[str, list[dict[str, Any]]] = {}
    for chart_dir in sorted(p for p in CHARTS_DIR.iterdir() if (p / "Chart.yaml").exists()):
        archive = Path(helm.package(chart_dir, destination=root))
        meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))
        entries[meta["name"]] = [{
            **meta, "urls": [archive.name], "created": _CREATED,
            "digest": hashlib.sha256(archive.read_bytes()).hexdigest(),
        }]
    index = root / "index.yaml"
    index.write_text(yaml.safe_dump({"apiVersion": "v1", "entries": entries, "generated": _CREATED}), encoding="utf-8")
    return index


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 -- http.server's signature
        pass


class ChartRepository:
    """``build_repository(root)`` served over HTTP on 127.0.0.1 from a background thread.

    Usage: ``repo = ChartRepository(tmp).start()``; ``repo.url`` (``http://127.0.0.1:<port>``, no trailing slash)
    is what the ``GSHARE_ATTACH_*_REPO`` settings take; ``repo.stop()``.
    """

    def __init__(self, root: Path, port: int = 0):
        self.root, self._port = Path(root), port
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> ChartRepository:
        """Package the charts and start serving; returns ``self``."""
        self.root.mkdir(parents=True, exist_ok=True)
        build_repository(self.root)
        handler = functools.partial(_QuietHandler, directory=str(self.root))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        threading.Thread(target=self._server.serve_forever, name="chart-repository", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        """The repository URL, e.g. ``http://127.0.0.1:41234``."""
        if self._server is None:
            raise RuntimeError("the chart repository is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def attach_environment(self) -> dict[str, str]:
        """The settings that point ``attach_cluster`` at this repository and its chart versions, as environment
        variables (``gshare/settings/base.py`` reads them): ``{"GSHARE_ATTACH_HAMI_REPO": url,
        "GSHARE_ATTACH_HAMI_CHART_VERSION": "2.7.1", ...}`` for the four charts."""
        versions = chart_versions()
        env = {}
        for chart, prefix in SETTING_PREFIXES.items():
            env[f"{prefix}_REPO"] = self.url
            env[f"{prefix}_CHART_VERSION"] = versions[chart]
        return env

    def stop(self) -> None:
        """Stop serving (the packaged files stay in ``root``)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
