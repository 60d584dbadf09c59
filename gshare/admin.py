"""Console pages for API tokens and signing keys (secrets are never shown)."""

from django.contrib import admin, messages

from gshare.auth.tokens import api_token_revoke
from gshare.models import ApiToken, SigningKey


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """API tokens: who, when; the token itself is never stored, its hash never shown."""

    list_display = ["user", "name", "key_id", "created_at", "last_used_at", "revoked_at"]
    list_select_related = ["user"]
    fields = ["user", "name", "key_id", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = fields
    list_filter = ["revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        """Tokens are created with ``manage.py create_api_token`` (the text is shown once)."""
        return False

    @admin.action(description="Revoke", permissions=["change"])
    def revoke(self, request, queryset):
        """Revoke each selected token."""
        for token in queryset:
            api_token_revoke(token=token)
        self.message_user(request, f"{queryset.count()} token(s) revoked", messages.SUCCESS)


@admin.register(SigningKey)
class SigningKeyAdmin(admin.ModelAdmin):
    """Internal JWT signing keys: kid, status and public half only."""

    list_display = ["kid", "status", "imported", "created_at", "retire_after", "retired_at"]
    fields = ["kid", "status", "imported", "public_key_pem", "created_at", "retire_after", "retired_at"]
    readonly_fields = fields

    def has_add_permission(self, request) -> bool:  # noqa: D102
        return False
