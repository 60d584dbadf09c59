"""``manage.py attach_cluster``: prepare a GPU cluster, register it and deploy its operator (clusters.attach.steps)."""

from __future__ import annotations

import os
import sys

from django.core.management.base import BaseCommand, CommandError

from audit.context import command_actor
from clusters.attach.fixes import invocation
from clusters.attach.steps import Attach, AttachOptions, AttachStopped


class Command(BaseCommand):
    help = (
        "Attach a GPU cluster in nine idempotent steps: check the nodes, install the nvidia RuntimeClass, HAMi and "
        "ingress-nginx, register the cluster, deploy its operator (and NFS storage), wait for its first inventory. "
        "Re-run it to repair a half-finished attach or to roll the operator forward (docs/attach.md)."
    )

    def add_arguments(self, parser):  # noqa: D102
        parser.add_argument("--kubeconfig", required=True, metavar="PATH", help="kubeconfig with cluster-admin rights, inline credentials")
        parser.add_argument("--name", required=True, help="the cluster's name in gShare (1-63 characters)")
        parser.add_argument("--control-plane", required=True, metavar="URL", help="the control plane's URL as the cluster's pods reach it")
        parser.add_argument("--session-domain", required=True, metavar="HOST", help="hostname the cluster's ingress serves sessions at")
        parser.add_argument("--ingress-node", required=True, metavar="NODE", help="node that runs ingress-nginx (the session domain resolves to it)")
        parser.add_argument("--storage-values", metavar="PATH", help="democratic-csi NFS Helm values: check NFS on every node, install the CSI driver")
        parser.add_argument("--skip-ingress", action="store_true", help="do not install ingress-nginx (the cluster has an ingress controller)")
        parser.add_argument("--operator-image", metavar="IMAGE", help="operator image repository:tag (default: the chart's)")

    @command_actor
    def handle(self, *args, **options):  # noqa: D102
        # "then re-run:" names what the user ran: `python manage.py attach_cluster ...`, or hack/attach-cluster.sh
        # (which sets GSHARE_ATTACH_INVOKED_AS); nothing specific under call_command.
        rerun, manage = invocation(argv=sys.argv, orig_argv=getattr(sys, "orig_argv", sys.argv), environ=os.environ)
        attach_options = AttachOptions(
            kubeconfig_path=options["kubeconfig"], name=options["name"], control_plane_url=options["control_plane"].rstrip("/"),
            session_domain=options["session_domain"], ingress_node=options["ingress_node"],
            storage_values_path=options["storage_values"], skip_ingress=options["skip_ingress"],
            operator_image=options["operator_image"], argv=rerun, manage=manage,
        )
        attach = Attach(attach_options, echo=lambda line: self.stdout.write(line))
        try:
            cluster = attach.run()
        except AttachStopped as stop:
            self.stderr.write(f"\nThe attach stopped. To fix it:\n{stop.fix}")
            raise CommandError(stop.problem, returncode=1) from None
        self.stdout.write(self.style.SUCCESS(f"\nCluster {cluster.name} is attached as {cluster.public_id}."))
