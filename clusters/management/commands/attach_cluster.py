"""``manage.py attach_cluster``: prepare a GPU cluster, register it and deploy its operator (attach.run).

It runs on any machine that has the cluster's admin kubeconfig and a staff API token: it reaches the control plane only
through its public API, and ``manage.py`` runs it with ``GSHARE_CLIENT_ONLY`` set (settings without a database or
Redis: gshare/settings/base.py)."""

from __future__ import annotations

import os
import re
import stat
import sys

from django.core.management.base import BaseCommand, CommandError

from attach.fixes import invocation
from attach.run import Attach, AttachOptions, AttachStopped
from audit.context import command_actor
from contract import (
    GATEWAY_NAME_DEFAULT,
    GATEWAY_NAMESPACE_DEFAULT,
    ROUTING_GATEWAY_API,
    ROUTING_INGRESS_NGINX,
    ROUTING_MODES,
)

#: Environment variable holding the staff API token (when ``--token-file`` is not given).
TOKEN_ENV = "GSHARE_API_TOKEN"
MAX_TOKEN_FILE_BYTES = 4096
#: What an HTTP header can carry as a bearer token (gShare's are ``gsh_<key id>_<secret>``, URL-safe base64).
TOKEN_SHAPE = re.compile(r"[\x21-\x7e]{1,1024}")


class Command(BaseCommand):
    # Django's system checks inspect the database configuration; the attach has none.
    requires_system_checks: list[str] = []
    help = (
        "Attach a GPU cluster in ten idempotent steps: check the nodes, install the nvidia RuntimeClass, HAMi and "
        "session routing (Envoy Gateway and a Gateway, or ingress-nginx), register the cluster, "
        "deploy its operator (and NFS storage), wait for its first inventory. "
        "Re-run it to repair a half-finished attach or to roll the operator forward (docs/attach.md)."
    )

    def add_arguments(self, parser):  # noqa: D102
        parser.add_argument("--kubeconfig", required=True, metavar="PATH", help="kubeconfig with cluster-admin rights, inline credentials")
        parser.add_argument("--name", required=True, help="the cluster's name in gShare (1-63 characters)")
        parser.add_argument("--control-plane", required=True, metavar="URL", help="the control plane's URL as the cluster's pods reach it")
        parser.add_argument("--session-domain", required=True, metavar="HOST", help="hostname the cluster's ingress serves sessions at")
        parser.add_argument("--ingress-node", required=True, metavar="NODE",
                            help="node that runs the session proxy (Envoy, or ingress-nginx); the session domain resolves to it")
        parser.add_argument("--storage-values", metavar="PATH", help="democratic-csi NFS Helm values: check NFS on every node, install the CSI driver")
        parser.add_argument("--routing", choices=ROUTING_MODES, default="",
                            help=f"how sessions are reached: {ROUTING_GATEWAY_API} (Envoy Gateway, the default) or {ROUTING_INGRESS_NGINX} "
                                 "(retired upstream, no security patches since 2026-03-24)")
        parser.add_argument("--gateway", metavar="NAMESPACE/NAME", default="",
                            help=f"the Gateway session routes attach to (default {GATEWAY_NAMESPACE_DEFAULT}/{GATEWAY_NAME_DEFAULT}; "
                                 "created when missing)")
        parser.add_argument("--skip-ingress", action="store_true",
                            help="install no routing controller: use the one the cluster runs (an ingress-nginx IngressClass or an "
                                 "Envoy Gateway GatewayClass)")
        parser.add_argument("--operator-image", metavar="IMAGE", help="operator image repository:tag (default: the chart's)")
        parser.add_argument("--token-file", metavar="PATH",
                            help=f"file holding a staff API token (default: the {TOKEN_ENV} environment variable)")
        parser.add_argument("--api-url", metavar="URL",
                            help="where this machine reaches the control plane's API, when not at --control-plane")

    @command_actor
    def handle(self, *args, **options):  # noqa: D102
        # "then re-run:" names what the user ran: `python manage.py attach_cluster ...`, or hack/attach-cluster.sh
        # (which sets GSHARE_ATTACH_INVOKED_AS); nothing specific under call_command.
        rerun, manage = invocation(argv=sys.argv, orig_argv=getattr(sys, "orig_argv", sys.argv), environ=os.environ)
        token = self._token(options["token_file"])
        attach_options = AttachOptions(
            kubeconfig_path=options["kubeconfig"], name=options["name"], control_plane_url=options["control_plane"].rstrip("/"),
            session_domain=options["session_domain"], ingress_node=options["ingress_node"],
            storage_values_path=options["storage_values"], skip_ingress=options["skip_ingress"],
            routing=options["routing"] or "", gateway=options["gateway"] or "",
            operator_image=options["operator_image"], api_token=token, api_url=(options["api_url"] or "").rstrip("/"),
            argv=rerun, manage=manage,
        )
        attach = Attach(attach_options, echo=lambda line: self.stdout.write(line))
        try:
            cluster = attach.run()
        except AttachStopped as stop:
            self.stderr.write(f"\nThe attach stopped. To fix it:\n{stop.fix}")
            raise CommandError(stop.problem, returncode=1) from None
        self.stdout.write(self.style.SUCCESS(f"\nCluster {cluster['name']} is attached as {cluster['id']}."))

    @staticmethod
    def _token(path: str | None) -> str:
        """The staff API token from ``--token-file`` (first line, at most 4 KiB) or ``GSHARE_API_TOKEN``; "" when neither.

        Raises:
            CommandError: the file cannot be read or is too large, or what it (or the variable) holds is not one word of
                printable ASCII (an HTTP header could not carry it); the value itself is never shown.
        """
        if not path:
            token = os.environ.get(TOKEN_ENV, "").strip()
            if token and not TOKEN_SHAPE.fullmatch(token):
                raise CommandError(f"{TOKEN_ENV} is not an API token (one word of printable ASCII, gsh_...): set it to the "
                                   "token manage.py create_api_token printed", returncode=2)
            return token
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device would block or never end
                raise CommandError(f"--token-file {path} is not a regular file: put the token in a file", returncode=2)
            with open(path, "rb") as handle:
                data = handle.read(MAX_TOKEN_FILE_BYTES + 1)
        except OSError as exc:
            raise CommandError(f"cannot read --token-file {path}: {exc.strerror or exc}", returncode=2) from None
        if len(data) > MAX_TOKEN_FILE_BYTES:
            raise CommandError(f"--token-file {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes: it must hold only the token",
                               returncode=2)
        lines = data.decode("utf-8", errors="replace").strip().splitlines()
        token = lines[0].strip() if lines else ""
        if token and not TOKEN_SHAPE.fullmatch(token):
            raise CommandError(f"--token-file {path} does not hold an API token on its first line: it is not an API token (one "
                               "word of printable ASCII, gsh_...)", returncode=2)
        return token
