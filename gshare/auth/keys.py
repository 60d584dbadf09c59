"""Services for the RS256 signing keys of internal JWTs (stored in ``gshare.SigningKey``)."""

from __future__ import annotations

import secrets

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings
from django.db import transaction

from gshare.models import SigningKey

# A fixed advisory-lock id so two processes never both create "the first" key.
_KEY_LOCK_ID = 0x6753_4B45  # "gSKE"


def _generate_key_pair() -> tuple[str, str]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=settings.GSHARE_JWT_KEY_BITS)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    return private_pem, public_pem


@transaction.atomic
def signing_key_ensure() -> SigningKey:
    """Return the active signing key, creating the first one if there is none.

    Serialised with a PostgreSQL advisory lock, so concurrent first calls create one key.

    Returns:
        The newest ``SigningKey`` with status ``active``.
    """
    key = SigningKey.objects.filter(status=SigningKey.Status.ACTIVE).order_by("-created_at").first()
    if key is not None:
        return key
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_KEY_LOCK_ID])
    key = SigningKey.objects.filter(status=SigningKey.Status.ACTIVE).order_by("-created_at").first()
    if key is not None:
        return key
    return signing_key_create()


@transaction.atomic
def signing_key_create() -> SigningKey:
    """Create a new active signing key; earlier active keys become ``published`` (verify only).

    Returns:
        The new ``SigningKey``; its ``kid`` is 16 random hex characters.
    """
    private_pem, public_pem = _generate_key_pair()
    SigningKey.objects.filter(status=SigningKey.Status.ACTIVE).update(status=SigningKey.Status.PUBLISHED)
    key = SigningKey(kid=secrets.token_hex(8), private_key_pem=private_pem, public_key_pem=public_pem)
    key.full_clean()
    key.save()
    return key
