"""``manage.py import_signing_key --file PATH``: make a supplied RSA private key the active signing key.

Exit status: 0 when the key was imported or was already on record in any status (nothing changed: an
active key stays active, a replaced or retired key is not reactivated, and the output says which); 1
when it is refused (unreadable file, not an unencrypted RSA PEM of at least 2048 bits with public
exponent 65537). The key is never printed; messages name the key by its ``kid`` only.
"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit.context import command_actor
from core.exceptions import ApplicationError
from identity.keys import MAX_KEY_FILE_BYTES, signing_key_import


class Command(BaseCommand):
    """Import an RSA private key PEM (PKCS#1 or PKCS#8) as the active signing key; idempotent."""

    help = (
        "Import an unencrypted RSA private key (PEM, PKCS#1 or PKCS#8, >= 2048 bits) as the active signing key of "
        "internal JWTs. The previous active key keeps verifying until every token it signed has expired. "
        "Importing a key already on record (active, replaced or retired) changes nothing and says so (exit 0)."
    )

    def add_arguments(self, parser):  # noqa: D102
        parser.add_argument("--file", required=True, dest="path", help="Path of the PEM file (e.g. a mounted Secret)")

    @command_actor
    def handle(self, *args, path: str, **options):  # noqa: D102
        try:
            with Path(path).open("rb") as handle:
                pem = handle.read(MAX_KEY_FILE_BYTES + 1)
        except OSError as exc:
            raise CommandError(f"signing_key_invalid: cannot read {path} ({exc.strerror or type(exc).__name__}): check the path.") from None
        try:
            rotation = signing_key_import(pem)
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from None
        if not rotation.created:
            self.stdout.write(f"No change: {rotation.reason}; the active signing key is {rotation.active.kid}.")
            return
        self.stdout.write(f"Imported: signing key {rotation.active.kid} is active; new tokens are signed with it.")
        for old in rotation.replaced:
            self.stdout.write(f"Previous key {old.kid} keeps verifying until {old.retire_after.isoformat()}, then it is retired.")
