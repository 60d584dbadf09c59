"""Console pages for clusters, nodes and GPUs. The kubeconfig is never shown."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.html import format_html

from clusters import services, token_rotation
from clusters.models import Cluster, GpuDevice, Node
from gshare.console.options import ConsoleModelAdmin, ReadOnlyModelAdmin, service_errors
from gshare.exceptions import ApplicationError


def _age(value) -> str:
    if value is None:
        return "never"
    seconds = int((timezone.now() - value).total_seconds())
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def _actor(request) -> str:
    """``console:<username>``: who did it, for the ``gshare.audit`` lines."""
    return f"console:{request.user.get_username()}"


#: Operator token facts shown read-only on a cluster's page (never the token: only the cluster's Secret holds it).
OPERATOR_TOKEN_FIELDS = [
    "operator_token_warning", "credential_generation", "operator_token_expires_at", "operator_token_rotated_at",
    "operator_token_rotation_attempted_at", "operator_token_rotation_error",
]


class ClusterForm(forms.ModelForm):
    """The cluster form: once the fields are clean, the change is made by ``cluster_update`` (the API's PATCH), and its
    refusal (``session_domain_taken``, ``cluster_has_live_sessions``, ...) is shown on the form with nothing changed.

    The change is written during validation so that a refusal decided under the cluster's row lock is a form error,
    not a 500; the console's change view runs in one transaction and this form has no inline forms that could fail
    after it.
    """

    #: ``console:<username>``, set per request by :meth:`ClusterAdmin.get_form`.
    actor = "console"

    class Meta:
        model = Cluster
        fields = list(services.EDITABLE_FIELDS)

    def _post_clean(self):
        super()._post_clean()
        if self.errors or self.instance.pk is None:
            return
        changes = {name: self.cleaned_data[name] for name in self.changed_data if name in services.EDITABLE_FIELDS}
        if not changes:
            return
        with service_errors(self), transaction.atomic():
            self.instance = services.cluster_update(cluster=self.instance, changes=changes, actor=self.actor)


@admin.register(Cluster)
class ClusterAdmin(ConsoleModelAdmin):
    """Clusters: status, heartbeat age, counts; actions call the cluster services."""

    list_display = [
        "name", "public_id", "status", "kubernetes_version", "heartbeat_age", "node_count", "gpu_count", "session_domain", "operator_token",
    ]
    list_filter = ["status"]
    search_fields = ["name", "public_id"]
    fields = [
        "public_id", "name", "apiserver_url", "status", "kubernetes_version", "session_domain", "ingress_node",
        "volume_storage_class", "last_heartbeat_at", "last_connection_test", "last_connection_test_at",
        "registered_at", "deregistered_at", *OPERATOR_TOKEN_FIELDS,
    ]
    readonly_fields = [
        "public_id", "name", "apiserver_url", "status", "kubernetes_version", "last_heartbeat_at",
        "last_connection_test", "last_connection_test_at", "registered_at", "deregistered_at", *OPERATOR_TOKEN_FIELDS,
    ]
    actions = ["connection_test", "deregister", "rotate_operator_token", "revoke_operator_tokens"]
    form = ClusterForm

    def get_queryset(self, request):  # noqa: D102
        return super().get_queryset(request).annotate(
            _node_count=Count("nodes", distinct=True), _gpu_count=Count("devices", distinct=True)
        )

    def has_add_permission(self, request) -> bool:
        """Clusters are added through ``POST /api/v1/clusters`` (the probe needs the kubeconfig)."""
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        """Rows are kept for history; use the *Deregister* action."""
        return False

    def get_form(self, request, obj=None, **kwargs):  # noqa: D102
        form = super().get_form(request, obj, **kwargs)
        form.actor = _actor(request)
        return form

    def save_model(self, request, obj, form, change):
        """Nothing to save: ``ClusterForm`` made the change through ``cluster_update`` (the API's validation and
        audit row)."""

    @admin.display(description="heartbeat", ordering="last_heartbeat_at")
    def heartbeat_age(self, obj: Cluster) -> str:
        """How long ago the operator last reported."""
        return _age(obj.last_heartbeat_at)

    @admin.display(description="nodes", ordering="_node_count")
    def node_count(self, obj: Cluster) -> int:
        """GPU nodes in the latest inventory."""
        return obj._node_count

    @admin.display(description="GPUs", ordering="_gpu_count")
    def gpu_count(self, obj: Cluster) -> int:
        """GPUs in the latest inventory."""
        return obj._gpu_count

    @admin.display(description="operator token", ordering="operator_token_expires_at")
    def operator_token(self, obj: Cluster) -> str:
        """Expiry of the newest operator token; a short warning (the full sentence on hover) when something needs doing."""
        state = token_rotation.operator_token_state(obj)
        expires = f"expires {state.expires_at:%Y-%m-%d %H:%M} UTC" if state.expires_at else "no token"
        if not state.warning:
            return expires
        label = "rotation failed" if state.last_rotation_error else expires
        return format_html('<span title="{}" style="color: #ba2121">⚠ {}</span>', state.warning, label)

    @admin.display(description="operator token warning")
    def operator_token_warning(self, obj: Cluster) -> str:
        """The warning of :func:`clusters.token_rotation.operator_token_state`, or "none"."""
        return token_rotation.operator_token_state(obj).warning or "none"

    # Every action changes state: it needs the change permission (a view-only staff user sees none of them).
    @admin.action(description="Rotate the operator token now", permissions=["change"])
    def rotate_operator_token(self, request, queryset):
        """Push a fresh operator token into each selected cluster's Secret."""
        for cluster in queryset:
            try:
                result = token_rotation.operator_token_push(cluster)
            except ApplicationError as exc:
                self.message_user(request, f"{cluster.name}: {exc.detail}", messages.ERROR)
                continue
            expires = f"{result.expires_at:%Y-%m-%d %H:%M} UTC"
            self.message_user(request, f"{cluster.name}: operator token rotated ({result.detail}), expires {expires}", messages.SUCCESS)

    @admin.action(description="Revoke all operator tokens (the operator is locked out until the next rotation)", permissions=["change"])
    def revoke_operator_tokens(self, request, queryset):
        """Bump each selected cluster's credential generation: every token issued before is refused."""
        for cluster in queryset:
            generation = token_rotation.operator_tokens_revoke(cluster_id=cluster.public_id, actor=_actor(request))
            self.message_user(
                request, f"{cluster.name}: operator tokens revoked (generation {generation}); run “Rotate the operator token now” to let its operator back in.",
                messages.WARNING,
            )

    @admin.action(description="Run the connection test", permissions=["change"])
    def connection_test(self, request, queryset):
        """Probe each selected cluster now and report its status."""
        for cluster in queryset:
            try:
                report = services.cluster_connection_test(cluster=cluster)
            except ApplicationError as exc:
                self.message_user(request, f"{cluster.name}: {exc.detail}", messages.ERROR)
                continue
            failed = [name for name, ok in report["checks"].items() if not ok]
            level = messages.SUCCESS if not failed else messages.WARNING
            self.message_user(request, f"{cluster.name}: {report['status']}" + (f" (failed: {', '.join(failed)})" if failed else ""), level)

    @admin.action(description="Deregister", permissions=["change"])
    def deregister(self, request, queryset):
        """Deregister each selected cluster (refused while anything runs on it)."""
        for cluster in queryset:
            try:
                services.cluster_deregister(cluster=cluster, actor=_actor(request))
                self.message_user(request, f"{cluster.name}: deregistered", messages.SUCCESS)
            except ApplicationError as exc:
                self.message_user(request, f"{cluster.name}: {exc.detail}", messages.ERROR)


@admin.register(Node)
class NodeAdmin(ReadOnlyModelAdmin):
    """GPU nodes, read-only: the operator's inventory owns them. Deleting one here would delete the reservations of the
    sessions on its GPUs (and the operator would report the node again moments later), so the console cannot; a node
    that is gone disappears with the next inventory snapshot, and deregistering the cluster drops the rest."""

    list_display = ["name", "cluster", "gpu_mode", "ready", "gpus", "seen", "inventory_error"]
    list_filter = ["cluster", "ready", "gpu_mode"]
    list_select_related = ["cluster"]
    search_fields = ["name"]
    readonly_fields = ["cluster", "name", "labels", "gpu_mode", "ready", "inventory_error", "last_seen_at", "missing_since"]
    fields = readonly_fields

    def get_queryset(self, request):  # noqa: D102
        return super().get_queryset(request).annotate(_gpus=Count("devices"))

    @admin.display(description="GPUs", ordering="_gpus")
    def gpus(self, obj: Node) -> int:
        """GPUs on this node."""
        return obj._gpus

    @admin.display(description="last seen", ordering="last_seen_at")
    def seen(self, obj: Node) -> str:
        """How long ago the node was last reported."""
        return _age(obj.last_seen_at)


@admin.register(GpuDevice)
class GpuDeviceAdmin(ReadOnlyModelAdmin):
    """GPUs, read-only: the operator's inventory owns them, and deleting one would delete the reservations placement
    made on it (see :class:`NodeAdmin`)."""

    list_display = ["uuid", "model", "cluster", "node", "index", "memory_mib", "split_count", "cores", "health", "mode"]
    list_filter = ["cluster", "model", "health"]
    list_select_related = ["cluster", "node"]
    search_fields = ["uuid", "model"]
    readonly_fields = ["cluster", "node", "uuid", "index", "model", "memory_mib", "split_count", "cores", "health", "mode", "last_seen_at",
                       "missing_since"]
    fields = readonly_fields
