"""``manage.py mint_operator_token <cluster_id> [--ttl SECONDS]``: print an operator token."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.context import command_actor
from clusters.operator_token.tokens import operator_token_mint
from core.exceptions import ApplicationError


class Command(BaseCommand):
    """Mint an RS256 operator token (``sub = operator:<cluster_id>``) and print it.

    A refusal is printed as ``<code>: <detail>`` (``invalid_ttl``, ``cluster_not_found``, ``cluster_deregistered``;
    docs/errors.md), exit status 1.
    """

    help = "Print an operator token for a cluster (RS256, subject operator:<cluster_id>)."

    def add_arguments(self, parser):  # noqa: D102
        parser.add_argument("cluster_id", help="The cluster's id (clu_...)")
        parser.add_argument("--ttl", type=int, default=settings.GSHARE_OPERATOR_TOKEN_TTL, help="Lifetime in seconds (default 604800 = 7 days)")

    @command_actor
    def handle(self, *args, cluster_id: str, ttl: int, **options):  # noqa: D102
        try:
            token = operator_token_mint(cluster_id=cluster_id, ttl=ttl)
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from None
        self.stdout.write(token)
