"""``manage.py rotate_signing_key``: make a new RS256 key the active signing key of internal JWTs."""

from django.core.management.base import BaseCommand

from audit.context import command_actor
from identity.keys import signing_key_rotate


class Command(BaseCommand):
    """Rotate the signing key now; the previous key keeps verifying until every token it signed has expired."""

    help = (
        "Generate a new RS256 signing key and make it active (new tokens carry its kid). The previous key stays in "
        "the JWKS, verify-only, until every token it signed has expired (30 days + leeway), then it is retired. "
        "Keys already past that time are retired now."
    )

    @command_actor
    def handle(self, *args, **options):  # noqa: D102
        rotation = signing_key_rotate()
        self.stdout.write(f"Signing key {rotation.active.kid} is active: new tokens are signed with it.")
        for old in rotation.replaced:
            self.stdout.write(f"Previous key {old.kid} keeps verifying until {old.retire_after.isoformat()}, then it is retired.")
        if rotation.retired:
            self.stdout.write(f"Retired (every token they signed has expired): {', '.join(rotation.retired)}.")
