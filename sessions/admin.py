"""Console pages for sessions and their GPU reservations (read-only records; the Stop action calls the session service)."""

from __future__ import annotations

from django.contrib import admin, messages

from gshare.console.options import ReadOnlyModelAdmin
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
class SessionAdmin(ReadOnlyModelAdmin):
    """Sessions: phase, where they run, their URL; read-only (a session is never deleted here: that would drop its GPU
    reservations while its pod runs). The Stop action stops them through ``session_stop``."""

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

    def has_stop_permission(self, request) -> bool:
        """Stopping changes the session: it needs the permission to change sessions. (Sessions are started through
        ``POST /api/v1/sessions``, placement needs the request; rows are history, never deleted.)"""
        return self.model_permission(request, "change")

    @admin.display(description="URL")
    def url(self, obj: Session) -> str:
        """Where the session is served."""
        return session_url(obj) or "-"

    @admin.action(description="Stop", permissions=["stop"])
    def stop(self, request, queryset):
        """Stop each selected session (idempotent)."""
        for session in queryset:
            services.session_stop(session=session)
        self.message_user(request, f"{queryset.count()} session(s) stopping", messages.SUCCESS)


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyModelAdmin):
    """What placement reserved on each GPU for live sessions; read-only (released when the session ends)."""

    list_display = ["session", "phase", "device", "node", "cluster", "memory_mib", "cores", "exclusive"]
    list_filter = ["device__cluster", "exclusive"]
    list_select_related = ["session", "device__node", "device__cluster"]
    search_fields = ["session__public_id", "device__uuid", "device__node__name"]
    fields = ["session", "device", "memory_mib", "cores", "exclusive"]
    readonly_fields = fields

    @admin.display(description="phase", ordering="session__phase")
    def phase(self, obj: Allocation) -> str:
        """The session's phase."""
        return obj.session.phase

    @admin.display(description="node", ordering="device__node__name")
    def node(self, obj: Allocation) -> str:
        """The GPU's node."""
        return obj.device.node.name

    @admin.display(description="cluster", ordering="device__cluster__name")
    def cluster(self, obj: Allocation) -> str:
        """The GPU's cluster."""
        return obj.device.cluster.name
