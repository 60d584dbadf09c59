"""Console: the audit trail (read-only: no add, no save, no delete) and a mixin that audits plain console edits."""

from __future__ import annotations

from django.contrib import admin
from django.db import transaction
from django.db.models import Model

from audit import services
from audit.models import AuditRecord

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
class AuditRecordAdmin(admin.ModelAdmin):
    """Who did what: filter by actor, action, cluster and time; nothing can be added, changed or deleted."""

    list_display = ["at", "actor", "action", "object_type", "object_id", "object_repr", "cluster_name", "changed_fields", "source_address"]
    list_filter = [ActorKindFilter, ("actor", admin.AllValuesFieldListFilter), "action", ("cluster_name", admin.AllValuesFieldListFilter),
                   ("at", admin.DateFieldListFilter)]
    search_fields = ["actor", "object_id", "object_repr", "cluster", "cluster_name"]
    date_hierarchy = "at"
    fields = ["at", "actor", "action", "object_type", "object_id", "object_repr", "cluster", "cluster_name", "changes", "details",
              "source_address"]
    readonly_fields = fields
    show_full_result_count = False

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


class AuditedModelAdmin(admin.ModelAdmin):
    """A ``ModelAdmin`` whose saves and deletions are audited: for console pages that edit rows without a service.

    Set ``audit_actions = (create, update, delete)`` (``AuditRecord.Action`` values) and ``audit_fields`` (the
    fields compared, many-to-many included). The row is written after the object and its many-to-many fields are
    saved (``save_related``), in the page's transaction, with the fields that changed, old and new; a deletion
    writes one row per object, in the deletion's transaction.
    """

    audit_actions: tuple[str, str, str] = ()
    audit_fields: tuple[str, ...] = ()

    def audit_state(self, obj: Model) -> dict:
        """``{field: value}`` of ``audit_fields`` (a relation as the related objects' ids)."""
        state = {}
        for name in self.audit_fields:
            field = obj._meta.get_field(name)
            if field.many_to_many:
                state[name] = sorted(services.plain(getattr(obj, name).all())) if obj.pk else []
            else:
                state[name] = services.plain(getattr(obj, name))
        return state

    def save_model(self, request, obj, form, change):  # noqa: D102
        previous = type(obj).objects.filter(pk=obj.pk).first() if change and obj.pk else None
        obj._audit_before = self.audit_state(previous) if previous is not None else None
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):  # noqa: D102
        super().save_related(request, form, formsets, change)
        obj = form.instance
        before, after = getattr(obj, "_audit_before", None), self.audit_state(obj)
        create, update, _ = self.audit_actions
        if before is None:
            services.audit_record(action=create, obj=obj, object_repr=str(obj), changes=services.created(after))
        elif changes := services.diff(before, after):
            services.audit_record(action=update, obj=obj, object_repr=str(obj), changes=changes)

    def delete_model(self, request, obj):  # noqa: D102
        with transaction.atomic():
            self._audit_deleted(obj)
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):  # noqa: D102
        with transaction.atomic():
            for obj in queryset:
                self._audit_deleted(obj)
            super().delete_queryset(request, queryset)

    def _audit_deleted(self, obj: Model) -> None:
        changes = {name: (value, None) for name, value in self.audit_state(obj).items()}
        services.audit_record(action=self.audit_actions[2], obj=obj, object_repr=str(obj), changes=changes)
