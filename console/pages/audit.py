"""Console: the audit trail (read-only: no add, no save, no delete), filtered by actor, action, cluster and time."""

from __future__ import annotations

from django.contrib import admin

from audit.models import AuditRecord
from console.scope import ClusterScopedAdmin

#: Actor kinds (the part before ``:``) offered by the "actor kind" filter.
ACTOR_KINDS = [
    ("api", "API (api:<user>)"), ("console", "console (console:<user>)"), ("command", "command (command:<name>)"),
    ("beat", "beat task (beat:<task>)"), ("operator", "operator (operator:<cluster>)"), ("system", "system"),
]


class ActorKindFilter(admin.SimpleListFilter):
    """Rows of one kind of actor."""

    title = "actor kind"
    parameter_name = "actor_kind"

    def lookups(self, request, model_admin):  # noqa: D102
        return ACTOR_KINDS

    def queryset(self, request, queryset):  # noqa: D102
        kind = self.value()
        if not kind:
            return queryset
        return queryset.filter(actor=kind) if kind == "system" else queryset.filter(actor__startswith=f"{kind}:")


@admin.register(AuditRecord)
class AuditRecordAdmin(ClusterScopedAdmin, admin.ModelAdmin):
    """Who did what: filter by actor, action, cluster and time; nothing can be added, changed or deleted. Narrowed to
    a cluster: the rows about it (by its id, whatever its name was then)."""

    list_display = ["at", "actor", "action", "object_type", "object_id", "object_repr", "cluster_name", "changed_fields", "source_address"]
    list_filter = [ActorKindFilter, ("actor", admin.AllValuesFieldListFilter), "action", ("cluster_name", admin.AllValuesFieldListFilter),
                   ("at", admin.DateFieldListFilter)]
    search_fields = ["actor", "object_id", "object_repr", "cluster", "cluster_name"]
    date_hierarchy = "at"
    fields = ["at", "actor", "action", "object_type", "object_id", "object_repr", "cluster", "cluster_name", "changes", "details",
              "source_address"]
    readonly_fields = fields
    show_full_result_count = False

    def narrow_to_cluster(self, qs, cluster):
        """Rows about ``cluster``: ``AuditRecord.cluster`` holds its public id (rows outlive their cluster)."""
        return qs.filter(cluster=cluster.public_id)

    @admin.display(description="fields changed")
    def changed_fields(self, obj: AuditRecord) -> str:
        """The names of the changed fields."""
        return ", ".join(sorted(obj.changes)) or "-"

    def has_add_permission(self, request) -> bool:
        """Rows are written by the services only."""
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        """The trail is append-only."""
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        """The trail is append-only."""
        return False

