"""Console pages for storage pools and volumes (the "Resources → Volumes" group), and the read-only capacity readings
and node disks the operators report. Every change goes through the storage services, so the console and the API
share one validation."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from billing.models import MAX_CAPACITY_GB
from billing.storage_charges import storage_pricing
from clusters.models import Cluster
from console.access import OwnObjectsAdmin, is_researcher
from console.options import ConsoleModelAdmin, ReadOnlyModelAdmin, service_errors
from console.scope import ClusterScopedAdmin
from core.exceptions import ApplicationError
from storage import selectors, services
from storage.capacity import format_bytes, pools_usability
from storage.models import GIB, NodeDisk, StorageCapacityReading, StoragePool, Volume

_LIVE = ~Q(volumes__status=Volume.Status.DELETED)


class StoragePoolForm(forms.ModelForm):
    """The pool form: ``clean`` runs ``storage.services.pool_validate`` on the state ``pool_create`` / ``pool_update``
    would save (the API's checks, on the same values the API would pass)."""

    class Meta:
        model = StoragePool
        fields = ["name", "cluster", "storage_class", "sharing", "allowed_clusters", "manual_capacity_gb", "storage_node"]

    def clean(self):  # noqa: D102
        data = super().clean()
        if self.errors:
            return data
        with service_errors(self):
            services.pool_validate(
                pool=self.instance if self.instance.pk else None,
                name=data["name"], cluster=data["cluster"], storage_class=data["storage_class"], sharing=data["sharing"],
                allowed_clusters=self.allowed_clusters(), manual_capacity_gb=data.get("manual_capacity_gb"),
                storage_node=data.get("storage_node") or "",
            )
        return data

    def allowed_clusters(self) -> list:
        """The allowed clusters the services get: those picked, as the API passes them (allowed clusters with sharing
        ``all`` are refused, not dropped), except that switching an existing pool to ``all`` without touching them
        clears them, as ``pool_update`` does."""
        picked = list(self.cleaned_data.get("allowed_clusters") or [])
        if self.instance.pk and "allowed_clusters" not in self.changed_data and self.cleaned_data["sharing"] == StoragePool.Sharing.ALL:
            return []
        return picked


@admin.register(StoragePool)
class StoragePoolAdmin(ClusterScopedAdmin, ConsoleModelAdmin):
    """Storage pools: where each capacity number comes from, what is allocated; actions call the storage services.
    Narrowed to a cluster: the pools it may use by their sharing (``storage.selectors.pools_shared_with``)."""

    form = StoragePoolForm
    list_display = ["name", "public_id", "cluster", "storage_class", "sharing", "capacity", "capacity_source", "allocated", "volumes", "capacity_updated_at"]
    list_filter = ["cluster", "sharing", "capacity_source"]
    list_select_related = ["cluster"]
    search_fields = ["name", "public_id", "storage_class"]
    filter_horizontal = ["allowed_clusters"]
    fields = [
        "public_id", "name", "cluster", "storage_class", "sharing", "allowed_clusters", "manual_capacity_gb", "storage_node",
        "capacity", "capacity_source", "capacity_note", "capacity_updated_at", "usable_on", "created_at",
    ]
    readonly_fields = ["public_id", "capacity", "capacity_source", "capacity_note", "capacity_updated_at", "usable_on", "created_at"]
    actions = ["refresh_capacity", "delete_pools"]

    def narrow_to_cluster(self, qs, cluster):  # noqa: D102
        return qs.filter(selectors.pools_shared_with(cluster))

    def get_queryset(self, request):  # noqa: D102
        return super().get_queryset(request).annotate(
            _allocated_gb=Coalesce(Sum("volumes__quota_gb", filter=_LIVE), 0), _volumes=Count("volumes", filter=_LIVE)
        )

    def has_delete_permission(self, request, obj=None) -> bool:
        """Use the *Delete* action: it goes through ``pool_delete`` (refused while volumes live on the pool)."""
        return False

    def save_model(self, request, obj, form, change):
        """Create or change the pool through ``pool_create`` / ``pool_update``."""
        data = form.cleaned_data
        allowed = form.allowed_clusters()
        if change:
            changes = {name: data[name] for name in form.changed_data if name in services.POOL_EDITABLE_FIELDS}
            if "allowed_clusters" in changes:
                changes["allowed_clusters"] = allowed
            services.pool_update(pool=obj, changes=changes)
            obj.refresh_from_db()
            return
        pool = services.pool_create(
            name=data["name"], cluster=data["cluster"], storage_class=data["storage_class"], sharing=data["sharing"],
            allowed_clusters=allowed, manual_capacity_gb=data.get("manual_capacity_gb"), storage_node=data.get("storage_node") or "",
        )
        obj.pk, obj.public_id, obj.created_at = pool.pk, pool.public_id, pool.created_at
        obj._state.adding = False

    def save_related(self, request, form, formsets, change):
        """``allowed_clusters`` was set by the service; nothing else is related."""

    @admin.display(description="capacity", ordering="capacity_bytes")
    def capacity(self, obj: StoragePool) -> str:
        """The stored capacity, e.g. ``2048 GiB``."""
        return format_bytes(obj.capacity_bytes)

    @admin.display(description="allocated", ordering="_allocated_gb")
    def allocated(self, obj: StoragePool) -> str:
        """Sum of the quotas of its volumes that are not deleted."""
        return format_bytes(int(obj._allocated_gb) * GIB)

    @admin.display(description="volumes", ordering="_volumes")
    def volumes(self, obj: StoragePool) -> int:
        """Volumes on it that are not deleted."""
        return obj._volumes

    @admin.display(description="usable on")
    def usable_on(self, obj: StoragePool) -> str:
        """Each cluster its sharing names, usable or not (its StorageClass there), with the reason (change page only)."""
        if not obj.pk:
            return "-"
        uses = pools_usability([obj])[obj.pk].uses
        return format_html_join("", "<div>{} {}: {}</div>", (("usable on" if u.usable else "NOT usable on", u.cluster.name, u.reason) for u in uses))

    @admin.action(description="Refresh capacity now", permissions=["change"])
    def refresh_capacity(self, request, queryset):
        """Re-resolve the selected pools' capacity now (``pools_refresh_capacity``)."""
        pools = list(StoragePool.objects.filter(pk__in=queryset.values("pk")).select_related("cluster").order_by("pk"))
        services.pools_refresh_capacity(pools=pools)
        for pool in pools:
            self.message_user(request, f"{pool.name}: {format_bytes(pool.capacity_bytes)} ({pool.capacity_source}): {pool.capacity_note}", messages.SUCCESS)

    @admin.action(description="Delete (refused while volumes live on the pool)", permissions=["change"])
    def delete_pools(self, request, queryset):
        """Delete each selected pool through ``pool_delete``."""
        for pool in queryset:
            try:
                services.pool_delete(pool=pool)
                self.message_user(request, f"{pool.name}: deleted", messages.SUCCESS)
            except ApplicationError as exc:
                self.message_user(request, f"{pool.name}: {exc.console_detail}", messages.ERROR)


class VolumeForm(forms.ModelForm):
    """The volume form: only the quota changes, through ``volume_update_quota`` (the capacity gate) in ``clean``."""

    class Meta:
        model = Volume
        fields = ["quota_gb"]

    def clean(self):  # noqa: D102
        data = super().clean()
        if self.errors or "quota_gb" not in self.changed_data:
            return data
        try:
            # The console's change view runs in one transaction: a later failure undoes this too.
            services.volume_update_quota(volume=self.instance, quota_gb=data["quota_gb"])
        except ApplicationError as exc:
            raise ValidationError(exc.console_detail, code=exc.code) from None
        return data


class VolumeCreateForm(forms.ModelForm):
    """A researcher's new volume: name, quota and, optionally, the pool and the cluster it will be mounted on.
    ``clean`` creates it through ``storage.services.volume_create`` for ``owner`` (set by ``VolumeAdmin.get_form``:
    the requesting user), so the capacity gate and the name rules are the API's; a refusal is shown on the form."""

    storage_pool = forms.ModelChoiceField(queryset=StoragePool.objects.order_by("name"), required=False, label="Storage pool",
                                          empty_label="Automatic (the pool with most free room)")
    mount_cluster = forms.ModelChoiceField(queryset=Cluster.objects.registered().order_by("name"),
                                           required=False, label="Mounted on", empty_label="Any cluster",
                                           help_text="The cluster its first session will run on: only pools usable there are taken")
    owner = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Offer only what a volume can be created on: pools usable on some cluster, clusters where some pool is usable.
        pool_ids, cluster_ids = selectors.usable_pools_and_clusters()
        self.fields["storage_pool"].queryset = StoragePool.objects.filter(pk__in=pool_ids).order_by("name")
        self.fields["mount_cluster"].queryset = Cluster.objects.registered().filter(pk__in=cluster_ids).order_by("name")
        self.fields["quota_gb"].help_text = self._price_text()

    def _price_text(self) -> SafeString:
        """The quota's help: the price per GiB-month and what the entered size costs a month (rendered by the server
        for a size already entered, and kept current while typing by console/console.js from the price in
        micro-credits, in integer arithmetic)."""
        pricing = storage_pricing(quota_gb=1)
        entered = self.data.get(self.add_prefix("quota_gb")) if self.is_bound else None
        cost = ""
        if entered and str(entered).isdigit() and 0 < int(entered) <= MAX_CAPACITY_GB:
            cost = f": {int(entered)} GiB cost {storage_pricing(quota_gb=int(entered))['monthly_credits']} credits a month"
        return format_html(
            "The PVC's request; it can grow later, never shrink. Charged {} credits per GiB-month ({} days) for the quota "
            'held<span data-gs-storage-cost data-gs-price-micro="{}">{}</span>.',
            pricing["credits_per_gb_month"], pricing["month_days"], int(pricing["credits_per_gb_month"].scaleb(6)), cost,
        )

    class Meta:
        model = Volume
        fields = ["name", "quota_gb"]
        labels = {"quota_gb": "Size (GiB)"}
        help_texts = {"name": "A DNS label (lower-case letters, digits, '-'); sessions mount it at /data/ followed by this name"}

    def clean(self):  # noqa: D102
        data = super().clean()
        if self.errors:
            return data
        with service_errors(self, field="quota_gb"):
            # The console's add view runs in one transaction: a later failure undoes this too.
            self.instance = services.volume_create(owner=self.owner, name=data["name"], quota_gb=data["quota_gb"],
                                                   pool=data.get("storage_pool"), cluster=data.get("mount_cluster"))
        return data

@admin.register(Volume)
class VolumeAdmin(OwnObjectsAdmin, ClusterScopedAdmin, ConsoleModelAdmin):
    """Volumes: owner, pool, the cluster holding the PVC and why it is stuck; the quota grows through the gate.

    A researcher's **My volumes**: their own volumes only; they create one (``volume_create``, owner themselves), raise
    its quota (``volume_update_quota``) and delete it when no live session mounts it (``volume_delete``), like staff."""

    owner_lookup = "owner"
    researcher_title = "My volumes"
    researcher_order = 20
    researcher_can_add = True
    researcher_can_change = True

    form = VolumeForm
    list_display = ["name", "public_id", "owner", "quota_gb", "pool", "cluster", "status", "short_status_message", "created_at"]
    list_filter = ["cluster", "pool", "status"]
    list_select_related = ["owner", "pool", "cluster"]
    search_fields = ["name", "public_id", "owner__username", "claim_name"]
    fields = [
        "public_id", "name", "owner", "quota_gb", "monthly_cost", "pool", "cluster", "claim_name", "pv_name", "status",
        "status_message", "status_reported_at", "created_at", "deleted_at",
    ]
    readonly_fields = [name for name in fields if name != "quota_gb"]
    actions = ["delete_volumes"]

    def has_add_permission(self, request) -> bool:
        """Volumes are created by their owners: here (a researcher's own) or through ``POST /api/v1/storage/volumes``."""
        return is_researcher(request.user)

    def get_list_display(self, request):  # noqa: D102
        display = super().get_list_display(request)
        return [name for name in display if name != "owner"] if is_researcher(request.user) else display

    def get_list_filter(self, request):
        """Researchers filter their volumes by status only (the pool and cluster filters list every pool and cluster)."""
        return ["status"] if is_researcher(request.user) else super().get_list_filter(request)

    def get_fields(self, request, obj=None):  # noqa: D102
        return ["name", "quota_gb", "storage_pool", "mount_cluster"] if obj is None else super().get_fields(request, obj)

    def get_form(self, request, obj=None, change=False, **kwargs):
        """The add page's form is :class:`VolumeCreateForm`, owned by the requesting user; the change page's the quota."""
        if obj is not None:
            return super().get_form(request, obj, change, **kwargs)
        kwargs["form"] = VolumeCreateForm
        kwargs["fields"] = VolumeCreateForm.Meta.fields
        form = super().get_form(request, obj, change, **kwargs)
        form.owner = request.user  # a class made for this request by modelform_factory
        return form

    def save_related(self, request, form, formsets, change):
        """Nothing is related: the services saved the volume."""

    def has_delete_permission(self, request, obj=None) -> bool:
        """Use the *Delete* action: it goes through ``volume_delete`` (PVC first, the row is kept)."""
        return False

    def get_readonly_fields(self, request, obj=None):  # noqa: D102
        if obj is None:
            return []
        return self.researcher_fields(request, obj, self.fields if obj.status == Volume.Status.DELETED else self.readonly_fields)

    def save_model(self, request, obj, form, change):
        """Nothing to save: the form's ``clean`` created the volume (``volume_create``) or raised its quota
        (``volume_update_quota``)."""

    @admin.display(description="monthly cost")
    def monthly_cost(self, obj: Volume) -> str:
        """What the quota costs per month (30 days), and the price per GiB-month."""
        pricing = storage_pricing(quota_gb=obj.quota_gb)
        return (f"{pricing['monthly_credits']} credits ({pricing['credits_per_gb_month']} per GiB-month of "
                f"{pricing['month_days']} days)")

    @admin.display(description="status message")
    def short_status_message(self, obj: Volume) -> str:
        """Why the PVC is not bound (first 80 characters)."""
        message = obj.status_message or ""
        return message if len(message) <= 80 else message[:79] + "…"

    @admin.action(description="Delete (and its PVC; refused while a live session mounts it)", permissions=["change"])
    def delete_volumes(self, request, queryset):
        """Delete each selected volume through ``volume_delete``."""
        for volume in queryset:
            try:
                services.volume_delete(volume=volume)
                self.message_user(request, f"{volume.name} ({volume.public_id}): deleted", messages.SUCCESS)
            except ApplicationError as exc:
                self.message_user(request, f"{volume.name} ({volume.public_id}): {exc.console_detail}", messages.ERROR)


@admin.register(StorageCapacityReading)
class StorageCapacityReadingAdmin(ClusterScopedAdmin, ReadOnlyModelAdmin):
    """The latest CSIStorageCapacity reading per cluster and StorageClass (``POST /internal/v1/storage``); read-only."""

    list_display = ["storage_class", "cluster", "capacity", "object_count", "read_at", "received_at"]
    list_filter = ["cluster"]
    list_select_related = ["cluster"]
    search_fields = ["storage_class"]
    fields = ["cluster", "storage_class", "capacity_bytes", "object_count", "read_at", "received_at"]
    readonly_fields = fields

    @admin.display(description="capacity", ordering="capacity_bytes")
    def capacity(self, obj: StorageCapacityReading) -> str:
        """The reading, e.g. ``2048 GiB``."""
        return format_bytes(obj.capacity_bytes)


@admin.register(NodeDisk)
class NodeDiskAdmin(ClusterScopedAdmin, ReadOnlyModelAdmin):
    """Nodes' system drives as the operators report them (the last capacity stand-in of a pool); read-only."""

    list_display = ["node", "cluster", "disk", "read_at"]
    list_filter = ["cluster"]
    list_select_related = ["cluster"]
    search_fields = ["node"]
    fields = ["cluster", "node", "disk_bytes", "read_at"]
    readonly_fields = fields

    @admin.display(description="disk", ordering="disk_bytes")
    def disk(self, obj: NodeDisk) -> str:
        """The drive's size, e.g. ``100 GiB``."""
        return format_bytes(obj.disk_bytes)
