"""``manage.py revoke_operator_tokens <cluster_id>``: refuse every operator token of a cluster at once."""

from django.core.management.base import BaseCommand, CommandError

from audit.context import command_actor, current_actor
from clusters.operator_token.rotation import operator_tokens_revoke
from core.exceptions import ApplicationError


class Command(BaseCommand):
    """Bump the cluster's credential generation: every token issued before is refused (401 ``token_revoked``).

    Writes an audit row (actor ``command:revoke_operator_tokens``). The operator stays locked out until a token of the new
    generation reaches it: ``manage.py rotate_operator_tokens --cluster <id>`` (or the daily rotation). A refusal
    is printed as ``<code>: <detail>`` (``cluster_not_found``; docs/errors.md), exit status 1.
    """

    help = "Revoke every operator token of a cluster at once (bumps its credential generation)."

    def add_arguments(self, parser):  # noqa: D102
        parser.add_argument("cluster_id", help="The cluster's id (clu_...)")

    @command_actor
    def handle(self, *args, cluster_id: str, **options):  # noqa: D102
        try:
            generation = operator_tokens_revoke(cluster_id=cluster_id, actor=current_actor())
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from None
        self.stdout.write(
            f"{cluster_id}: operator tokens revoked; credential generation is now {generation}. "
            f"Push a new token now: manage.py rotate_operator_tokens --cluster {cluster_id}"
        )
