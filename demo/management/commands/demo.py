"""``manage.py demo [--port N] [--state-file PATH] [--smoke] [--bare-cluster NAME ...] [--idle-timeout SECONDS]
[--gateway-cluster NAME|none]``: run the whole system locally."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit.context import command_actor
from core.home import gshare_home
from demo import fleet
from demo.bare_cluster import check_name
from demo.runner import DemoError, DemoOptions, run_demo


def _terminate(signum, frame):
    raise KeyboardInterrupt


class Command(BaseCommand):
    """Start the control plane and two emulated GPU clusters; see README.md."""

    help = "Run gShare with two emulated GPU clusters (Ctrl-C stops everything)."

    def add_arguments(self, parser):  # noqa: D102
        parser.add_argument("--port", type=int, default=8000, help="Web server port on 127.0.0.1 (0 picks a free one; default 8000)")
        parser.add_argument("--state-file", type=Path, default=None, help="Where to write the JSON state (default .gshare/demo/state.json)")
        parser.add_argument("--smoke", action="store_true", help="Wait for every inventory, print the state as JSON, stop, exit")
        parser.add_argument("--inventory-interval", type=int, default=10, help="Operators' inventory interval in seconds (default 10)")
        parser.add_argument("--bare-cluster", action="append", default=[], metavar="NAME", dest="bare_clusters",
                            help="Also start an emulated GPU cluster with nothing installed, to attach with the printed "
                                 "command (repeatable; see docs/attach.md)")
        parser.add_argument("--gateway-cluster", default=None, metavar="NAME",
                            help="The fleet cluster whose sessions go through Gateway API (Envoy Gateway's HTTPRoute and "
                                 "extAuth; the others use ingress-nginx), or 'none' (default: "
                                 f"{fleet.GATEWAY_CLUSTER_DEFAULT})")
        parser.add_argument("--idle-timeout", type=int, default=None, metavar="SECONDS",
                            help="The default policy stops a session after this many seconds without a GPU kernel or a "
                                 "connection, warning a quarter of it before (a policy minute lasts a second; docs/idle.md)")

    @command_actor
    def handle(self, *args, port: int, state_file: Path | None, smoke: bool, inventory_interval: int,
               bare_clusters: list[str], idle_timeout: int | None, gateway_cluster: str | None,
               **options):  # noqa: D102
        try:
            for name in bare_clusters:
                check_name(name)
        except ValueError as exc:
            raise CommandError(f"--bare-cluster: {exc}") from None
        if idle_timeout is not None and not 1 <= idle_timeout <= 86400:
            raise CommandError("--idle-timeout: give a number of seconds from 1 to 86400 (e.g. 60)")
        if gateway_cluster is None:
            gateway_cluster = fleet.GATEWAY_CLUSTER_DEFAULT
        elif gateway_cluster == "none":
            gateway_cluster = None
        elif gateway_cluster not in [spec.name for spec in fleet.FLEET]:
            raise CommandError(f"--gateway-cluster: no fleet cluster {gateway_cluster!r}; give one of "
                               f"{', '.join(spec.name for spec in fleet.FLEET)} or none")
        if len(set(bare_clusters)) != len(bare_clusters):
            raise CommandError(f"--bare-cluster: a name is given twice ({', '.join(bare_clusters)}): give each once")
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, _terminate)  # also when started from a shell that ignores SIGINT
        options_ = DemoOptions(
            port=port,
            state_file=(state_file or gshare_home() / "demo" / "state.json").resolve(),
            smoke=smoke,
            inventory_interval=inventory_interval,
            bare_clusters=tuple(bare_clusters),
            idle_timeout=idle_timeout,
            gateway_cluster=gateway_cluster,
        )
        try:
            state = run_demo(options_)
        except KeyboardInterrupt:
            print("[demo] stopped", file=sys.stderr)
            return
        except DemoError as exc:
            raise CommandError(f"demo failed: {exc}") from None
        self.stdout.write(json.dumps(state, indent=2))
