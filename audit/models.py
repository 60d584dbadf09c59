"""The audit trail: ``AuditRecord``, one append-only row per change (who, what, on which object, fields changed).

Rows are written by ``audit.services.audit_record`` only. The table refuses ``UPDATE`` and ``DELETE`` in the
database itself (a trigger, migration 0001); ``save`` of an existing row and ``delete`` refuse here too, so a
mistake fails loudly in Python before PostgreSQL refuses it.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AuditRecordImmutable(Exception):
    """An audit row was about to be changed or deleted: the trail is append-only."""


class AuditRecordQuerySet(models.QuerySet):
    """Bulk changes are refused like single ones (the database trigger would refuse them anyway)."""

    def update(self, **kwargs):  # noqa: D102
        raise AuditRecordImmutable("Audit records are append-only: they cannot be changed.")

    def delete(self):  # noqa: D102
        raise AuditRecordImmutable("Audit records are append-only: they cannot be deleted.")


class AuditRecord(models.Model):
    """Who did what, when, to which object.

    Attributes:
        at: when (UTC).
        actor: who: ``api:<user>``, ``console:<user>``, ``command:<name>``, ``beat:<task>``, ``operator:<cluster id>``,
            or ``system`` (a service called outside any of these, e.g. from a shell or a test).
        action: what (``Action``).
        object_type, object_id, object_repr: the object: its kind, its id (``clu_...``, ``ses_...``, a key's kid,
            a token's jti ...) and a readable name (a cluster's name, a volume's name ...).
        cluster, cluster_name: the cluster the object belongs to (its public id and its name at that moment), if any.
        changes: ``{field: {"old": value, "new": value}}``; a secret field is only ``{field: {"secret": true}}``.
        details: other non-secret facts (a token's generation, the keys a rotation replaced ...).
        source_address: the client address (``REMOTE_ADDR``) for a change made over HTTP, else empty.
    """

    class Action(models.TextChoices):
        CLUSTER_REGISTER = "cluster_register", "cluster registered"
        CLUSTER_UPDATE = "cluster_update", "cluster changed"
        CLUSTER_DEREGISTER = "cluster_deregister", "cluster deregistered"
        OPERATOR_TOKEN_MINT = "operator_token_mint", "operator token minted"
        OPERATOR_TOKEN_ROTATE = "operator_token_rotate", "operator token rotated (pushed to the cluster)"
        OPERATOR_TOKEN_ROTATE_FAILED = "operator_token_rotate_failed", "operator token rotation failed"
        OPERATOR_TOKENS_REVOKE = "operator_tokens_revoke", "operator tokens revoked"
        OPERATOR_TOKEN_EXCHANGE = "operator_token_exchange", "operator token exchanged"
        OPERATOR_TOKEN_EXCHANGE_THROTTLED = "operator_token_exchange_throttled", "operator token exchanges throttled"
        SIGNING_KEY_ROTATE = "signing_key_rotate", "signing key rotated"
        SIGNING_KEY_IMPORT = "signing_key_import", "signing key imported"
        SIGNING_KEY_RETIRE = "signing_key_retire", "signing key retired"
        POOL_CREATE = "pool_create", "storage pool created"
        POOL_UPDATE = "pool_update", "storage pool changed"
        POOL_DELETE = "pool_delete", "storage pool deleted"
        VOLUME_CREATE = "volume_create", "volume created"
        VOLUME_UPDATE = "volume_update", "volume changed"
        VOLUME_DELETE = "volume_delete", "volume deleted"
        VOLUME_MOVE = "volume_move", "volume moved"
        CREDIT_GRANT = "credit_grant", "credits granted"
        PRICE_CREATE = "price_create", "price created"
        PRICE_UPDATE = "price_update", "price changed"
        PRICE_DELETE = "price_delete", "price deleted"
        POLICY_CREATE = "policy_create", "policy created"
        POLICY_UPDATE = "policy_update", "policy changed"
        POLICY_DELETE = "policy_delete", "policy deleted"
        SESSION_CREATE = "session_create", "session created"
        SESSION_STOP = "session_stop", "session stopped"
        SESSION_IDLE_EXEMPT = "session_idle_exempt", "session exempted from the idle policy"
        SESSION_EXTEND = "session_extend", "session time limit extended"
        SESSION_ADMIT = "session_admit", "queued session started"
        SESSION_PRIORITY = "session_priority", "queued session's priority changed"
        API_TOKEN_CREATE = "api_token_create", "API token created"
        API_TOKEN_REVOKE = "api_token_revoke", "API token revoked"

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=200, db_index=True)
    # No ``choices`` on the column: a new action is a code change, not a migration (the service checks ``Action``).
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=32)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    cluster = models.CharField(max_length=32, blank=True, db_index=True, help_text="The cluster's public id (clu_...), if any")
    cluster_name = models.CharField(max_length=63, blank=True)
    changes = models.JSONField(default=dict, blank=True)
    details = models.JSONField(default=dict, blank=True)
    source_address = models.GenericIPAddressField(null=True, blank=True, unpack_ipv4=True)

    objects = AuditRecordQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id"], name="audit_object_idx")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_type}:{self.object_id}"

    def save(self, *args, **kwargs) -> None:
        """Insert only: an existing row is never written again."""
        if not self._state.adding:
            raise AuditRecordImmutable("Audit records are append-only: this one cannot be changed.")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        """Refused: the audit trail is append-only."""
        raise AuditRecordImmutable("Audit records are append-only: they cannot be deleted.")
