"""``manage.py create_api_token <username> [--name NAME]``: print a new API token for a user."""

from django.core.management.base import BaseCommand, CommandError

from audit.context import command_actor
from core.exceptions import ApplicationError
from identity.tokens import api_token_create


class Command(BaseCommand):
    """Create an API token and print it once (only its hash is stored)."""

    help = "Create an API token for a user and print it (shown once; only its SHA-256 is stored)."

    def add_arguments(self, parser):  # noqa: D102
        parser.add_argument("username")
        parser.add_argument("--name", default="default", help="A label for the token (e.g. laptop, ci)")

    @command_actor
    def handle(self, *args, username: str, name: str, **options):  # noqa: D102
        try:
            _, text = api_token_create(username=username, name=name)
        except ApplicationError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(text)
