"""Encryption at rest for secrets (kubeconfigs, private keys), with ``cryptography``'s MultiFernet.

Keys come from ``GSHARE_ENCRYPTION_KEYS`` (comma-separated urlsafe-base64 Fernet keys): the first
encrypts, every key decrypts, so a key is rotated by putting a new one first, running
``manage.py rotate_encryption_keys`` (re-encrypts every secret with the first key), then dropping
the old one. Chosen over django-fernet-encrypted-fields and friends because MultiFernet is the
maintained primitive they all wrap, and it gives exactly the first-encrypts/all-decrypt rule.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.db import models


def local_encryption_key(home: Path) -> str:
    """Return the local development key, generating it on first use.

    Args:
        home: the gShare home folder (``.gshare/``); the key lives in ``home/encryption.key``, mode 0600.

    Returns:
        A urlsafe-base64 Fernet key (44 characters).
    """
    path = home / "encryption.key"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(Fernet.generate_key().decode())
    return path.read_text().strip()


def _fernet() -> MultiFernet:
    from django.conf import settings

    return MultiFernet([Fernet(key.encode()) for key in settings.GSHARE_ENCRYPTION_KEYS])


def encrypt_text(plaintext: str) -> str:
    """Encrypt ``plaintext`` with the first key of ``GSHARE_ENCRYPTION_KEYS``.

    Returns:
        A Fernet token (ASCII text), authenticated, with a timestamp.
    """
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt_text(token: str) -> str:
    """Decrypt a Fernet token made with any key of ``GSHARE_ENCRYPTION_KEYS``.

    Raises:
        cryptography.fernet.InvalidToken: when no configured key decrypts it (a key was dropped
            too early, or the ciphertext was altered).
    """
    return _fernet().decrypt(token.encode()).decode()


def rotate_text(token: str) -> str:
    """Re-encrypt a token under the first key (MultiFernet.rotate); the plaintext never leaves memory."""
    return _fernet().rotate(token.encode()).decode()


class EncryptedTextField(models.TextField):
    """A text column whose value is stored as a Fernet token and read back as plaintext.

    Never shown in the admin (the model admins exclude it) and never serialized by the API.
    """

    description = "Text encrypted at rest with MultiFernet"

    def from_db_value(self, value, expression, connection):  # noqa: D102
        if value is None or value == "":
            return value
        return decrypt_text(value)

    def get_prep_value(self, value):  # noqa: D102
        value = super().get_prep_value(value)
        if value is None or value == "":
            return value
        return encrypt_text(value)


__all__ = ["EncryptedTextField", "InvalidToken", "decrypt_text", "encrypt_text", "local_encryption_key", "rotate_text"]


def encryption_rotate_all() -> dict[str, int]:
    """Re-encrypt every ``EncryptedTextField`` value of every model with the first key.

    Runs in one transaction, row by row with ``SELECT ... FOR UPDATE``; plaintext never leaves memory.

    Returns:
        ``{"<app_label>.<Model>.<field>": rows re-encrypted}``.

    Raises:
        cryptography.fernet.InvalidToken: a value no configured key decrypts (nothing is changed).
    """
    from django.apps import apps
    from django.db import connection, transaction

    counts: dict[str, int] = {}
    with transaction.atomic():
        for model in apps.get_models():
            for field in model._meta.concrete_fields:
                if not isinstance(field, EncryptedTextField):
                    continue
                table, column, pk = model._meta.db_table, field.column, model._meta.pk.column
                with connection.cursor() as cursor:
                    cursor.execute(f'SELECT "{pk}", "{column}" FROM "{table}" ORDER BY "{pk}" FOR UPDATE')
                    rows = cursor.fetchall()
                    for key, value in rows:
                        if value:
                            cursor.execute(f'UPDATE "{table}" SET "{column}" = %s WHERE "{pk}" = %s', [rotate_text(value), key])
                counts[f"{model._meta.label}.{field.name}"] = sum(1 for _, value in rows if value)
    return counts
