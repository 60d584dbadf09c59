"""Console pages for API tokens and signing keys (secrets are never shown)."""

from django.contrib import admin, messages

from gshare.auth.tokens import api_token_revoke
from gshare.console.options import ReadOnlyModelAdmin
from gshare.models import ApiToken, SigningKey


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyModelAdmin):
    """API tokens: who, when; the token itself is never stored, its hash never shown. Read-only (tokens are created
    with ``manage.py create_api_token``, the text shown once); the Revoke action ends one and keeps its row."""

    list_display = ["user", "name", "key_id", "created_at", "last_used_at", "revoked_at"]
    list_select_related = ["user"]
    fields = ["user", "name", "key_id", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = fields
    list_filter = ["revoked_at"]
    actions = ["revoke"]

    def has_revoke_permission(self, request) -> bool:
        """Revoking changes the token: it needs the permission to change API tokens."""
        return self.model_permission(request, "change")

    @admin.action(description="Revoke", permissions=["revoke"])
    def revoke(self, request, queryset):
        """Revoke each selected token."""
        for token in queryset:
            api_token_revoke(token=token)
        self.message_user(request, f"{queryset.count()} token(s) revoked", messages.SUCCESS)


@admin.register(SigningKey)
class SigningKeyAdmin(ReadOnlyModelAdmin):
    """Internal JWT signing keys: kid, status and public half only. Read-only: deleting a key would refuse every
    operator token it signed; keys rotate with ``manage.py rotate_signing_key`` and retire on their own."""

    list_display = ["kid", "status", "imported", "created_at", "retire_after", "retired_at"]
    fields = ["kid", "status", "imported", "public_key_pem", "created_at", "retire_after", "retired_at"]
    readonly_fields = fields
