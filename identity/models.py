"""Project-wide models: users' API tokens and the RS256 keys that sign internal JWTs."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.crypto import EncryptedTextField


class ApiToken(models.Model):
    """A user's bearer token for the public API. Only its SHA-256 is stored.

    The token text is ``gsh_<key_id>_<secret>``: ``key_id`` (8 chars, stored in clear) finds the
    row, the SHA-256 hex digest of the whole token is compared in constant time.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="default")
    key_id = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"
        verbose_name_plural = "API tokens"

    def __str__(self) -> str:
        return f"{self.user} / {self.name} ({self.key_id})"


class SigningKey(models.Model):
    """An RS256 key pair that signs internal JWTs (operator and connect tokens).

    The private half is PEM (PKCS#8) encrypted at rest; the public half is published in the JWKS
    while the key is not retired, so tokens it signed stay verifiable during a rotation.

    Life cycle (``identity.keys``): ``active`` (signs; exactly one) -> ``published`` when a
    rotation or an import replaces it, with ``retire_after`` set to the latest moment a token it
    signed can still be valid (the moment it stopped signing + the longest token lifetime + the
    verification leeway + a margin) -> ``retired`` once that moment has passed. A published key
    whose ``retire_after`` has passed is treated as retired even before a task marks it so.
    """

    class Status(models.TextChoices):
        ACTIVE = "active", "Active (signs new tokens)"
        PUBLISHED = "published", "Published (verifies only)"
        RETIRED = "retired", "Retired (neither signs nor verifies)"

    kid = models.CharField(max_length=64, unique=True)
    private_key_pem = EncryptedTextField()
    public_key_pem = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(default=timezone.now, help_text="When the key was created and started signing (UTC)")
    retired_at = models.DateTimeField(null=True, blank=True)
    retire_after = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="Set when the key stops signing: every token it signed has expired by then (UTC); the key is retired after it",
    )
    imported = models.BooleanField(
        default=False, editable=False,
        help_text="Imported with manage.py import_signing_key: the scheduled rotation leaves an imported active key alone",
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kid} ({self.status})"
