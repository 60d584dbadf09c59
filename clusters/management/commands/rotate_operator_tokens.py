"""``manage.py rotate_operator_tokens [--cluster ID] [--dry-run] [--force]``: push fresh operator tokens."""

from django.core.management.base import BaseCommand, CommandError

from audit.context import command_actor
from clusters.operator_token.rotation import Outcome, operator_tokens_rotate
from core.exceptions import ApplicationError


class Command(BaseCommand):
    """Mint a fresh token for each cluster that is due and write it into the cluster's Secret.

    One line per cluster: ``<name> <id> <outcome> ...``. Exits 1 when any rotation failed (the failure is
    recorded on the cluster and shown as a warning in the API and the console). A refusal of the whole run is
    printed as ``<code>: <detail>`` (``cluster_not_found``, ``cluster_deregistered``; docs/errors.md).
    """

    help = (
        "Push a fresh operator token into each due cluster's Secret (gshare-system/gshare-operator-internal-jwt) "
        "through its apiserver. --cluster rotates that cluster whether due or not."
    )

    def add_arguments(self, parser):  # noqa: D102
        parser.add_argument("--cluster", dest="cluster_id", metavar="ID", help="only this cluster (clu_...), due or not")
        parser.add_argument("--dry-run", action="store_true", help="show what would be rotated; change nothing, dial nothing")
        parser.add_argument("--force", action="store_true", help="rotate every cluster, even those rotated in the last 12 h")

    @command_actor
    def handle(self, *args, cluster_id: str | None, dry_run: bool, force: bool, **options):  # noqa: D102
        try:
            results = operator_tokens_rotate(cluster_id=cluster_id, dry_run=dry_run, force=force)
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from None
        for result in results:
            expires = result.expires_at.isoformat() if result.expires_at else "-"
            line = f"{result.cluster_name} {result.cluster_id} {result.outcome} generation={result.generation} expires_at={expires}"
            if result.outcome == Outcome.FAILED:
                self.stderr.write(f"{line} {result.code}: {result.detail}")
            else:
                self.stdout.write(f"{line} {result.detail}".rstrip())
        if not results:
            self.stdout.write("no registered cluster")
        failed = [result for result in results if not result.ok]
        if failed:
            raise CommandError(
                f"{len(failed)} rotation(s) failed: fix the cause named above, then run "
                "`manage.py rotate_operator_tokens --cluster <id>` (the daily rotation also retries)."
            )
