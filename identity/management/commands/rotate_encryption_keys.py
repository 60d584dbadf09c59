"""``manage.py rotate_encryption_keys``: re-encrypt every secret with the first key."""

from django.core.management.base import BaseCommand

from core.crypto import encryption_rotate_all


class Command(BaseCommand):
    """Re-encrypt every encrypted column with the first key of ``GSHARE_ENCRYPTION_KEYS``."""

    help = "Re-encrypt every secret at rest with the first key of GSHARE_ENCRYPTION_KEYS (then the old keys can be dropped)."

    def handle(self, *args, **options):  # noqa: D102
        counts = encryption_rotate_all()
        for label, count in counts.items():
            self.stdout.write(f"{label}: {count} value(s) re-encrypted")
