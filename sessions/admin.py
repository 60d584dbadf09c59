"""Console pages for sessions (read-only records; the Stop action calls the session service)."""

from __future__ import annotations

from django.contrib import admin, messages

from sessions import services
from sessions.manifests import session_url
from sessions.models import Allocation, Session


class AllocationInline(admin.TabularInline):
    """The GPU shares placement reserved for the session."""

    model = Allocation
    fields = ["device", "memory_mib", "cores", "exclusive"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def get_queryset(self, request):  # noqa: D102
        return super().get_queryset(request).select_related("device")

    def has_add_permission(self, request, obj=None) -> bool:  # noqa: D102
        return False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    """Sessions: phase, where they run, their URL; the Stop action stops them."""

    list_display = ["public_id", "owner", "cluster", "phase", "node", "gpus", "gpu_memory_mib", "gpu_cores", "created_at"]
    list_filter = ["cluster", "phase"]
    list_select_related = ["owner", "cluster"]
    search_fields = ["public_id", "name", "owner__username", "image"]
    readonly_fields = [
        "public_id", "name", "owner", "cluster", "requested_cluster", "url", "image", "gpus", "gpu_memory_mib", "gpu_cores",
        "phase", "node", "devices", "volumes", "message", "created_at", "started_at", "ended_at", "last_status_at",
    ]
    fields = readonly_fields
    inlines = [AllocationInline]
    actions = ["stop"]

    def has_add_permission(self, request) -> bool:
        """Sessions are started through ``POST /api/v1/sessions`` (placement needs the request)."""
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        """Rows are history; use the Stop action."""
        return False

    @admin.display(description="URL")
    def url(self, obj: Session) -> str:
        """Where the session is served."""
        return session_url(obj) or "-"

    @admin.action(description="Stop", permissions=["change"])
    def stop(self, request, queryset):
        """Stop each selected session (idempotent)."""
        for session in queryset:
            services.session_stop(session=session)
        self.message_user(request, f"{queryset.count()} session(s) stopping", messages.SUCCESS)
