"""Console pages for clusters, nodes and GPUs. The kubeconfig is never shown."""

from __future__ import annotations

import re
from datetime import UTC

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import mark_safe

from clusters import services
from clusters.diagnosis import clock_verdict, cluster_problems
from clusters.models import Cluster, GpuDevice, Node
from clusters.operator_token import rotation as token_rotation
from console.dashboard import age
from console.links import list_url, row_url
from console.options import ConsoleModelAdmin, ReadOnlyModelAdmin, service_errors
from console.pages.clusters import cards as admin_cards
from console.pages.clusters import selectors as console
from console.pages.clusters.cards import GpuCardList
from console.scope import ClusterScopedAdmin
from core.exceptions import ApplicationError


def _age(value) -> str:
    return "never" if value is None else f"{age((timezone.now() - value).total_seconds())} ago"


def _age_html(value):
    """``12 s ago`` with the full UTC time on hover (``never`` when there is none)."""
    if value is None:
        return mark_safe('<span class="gs-muted">never</span>')
    utc = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return format_html('<time class="gs-age" datetime="{}" title="{}">{}</time>', value.isoformat(), utc, _age(value))


def _bar(meter: console.Meter, *, caption: str | None = None, compact: bool = False):
    """A labelled percent bar (``role=meter`` with its numbers, so it reads the same without the picture); ``compact``
    shows the caption alone (the label is in it)."""
    return format_html(
        '<div class="gs-meter gs-{}{}" role="meter" aria-label="{}" aria-valuemin="0" aria-valuemax="{}" aria-valuenow="{}" title="{}">'
        '<div class="gs-meter-head"><span class="gs-meter-label">{}</span><span class="gs-meter-value">{}</span></div>'
        '<div class="gs-meter-track"><div class="gs-meter-fill" style="width: {}%"></div></div></div>',
        meter.level, " gs-compact" if compact else "", meter.label, meter.total, meter.used, f"{meter.label}: {meter.text} reserved ({meter.percent} %)",
        meter.label, caption or meter.text, meter.percent,
    )


def _label_chips(labels: dict | None, *, limit: int | None = None):
    """Kubernetes labels as ``key=value`` chips; past ``limit``, one "+N more" chip listing the rest on hover."""
    pairs = console.node_labels(labels)
    if not pairs:
        return mark_safe('<span class="gs-muted">none</span>')
    shown, rest = (pairs, []) if limit is None else (pairs[:limit], pairs[limit:])
    chips = format_html_join(
        "", '<span class="gs-chip" title="{0}={1}"><span class="gs-chip-key">{0}</span>{2}</span>',
        ((k, v, format_html('<span class="gs-chip-value">{}</span>', v) if v else "") for k, v in shown),
    )
    more = ""
    if rest:
        more = format_html('<span class="gs-chip gs-chip-more" title="{}">+{} more</span>', ", ".join(f"{k}={v}" for k, v in rest), len(rest))
    return format_html('<div class="gs-chips{}">{}{}</div>', " gs-chips-all" if limit is None else "", chips, more)


#: Badge colour of each cluster status.
STATUS_BADGES = {
    Cluster.Status.CONNECTED: "ok", Cluster.Status.DEGRADED: "warn", Cluster.Status.UNREACHABLE: "bad",
    Cluster.Status.PENDING: "info", Cluster.Status.DEREGISTERED: "off",
}


#: Backticked commands in a problem's sentence, shown as code.
_CODE = re.compile(r"`([^`]+)`")


class ConsoleCss:
    """The stylesheet of the Resources pages (cards, bars, badges, chips), served by the project."""

    css = {"all": ["console/gpus.css"]}


def _actor(request) -> str:
    """``console:<username>``: who did it, for the ``gshare.audit`` lines."""
    return f"console:{request.user.get_username()}"


#: Operator token facts shown read-only on a cluster's page (never the token: only the cluster's Secret holds it).
OPERATOR_TOKEN_FIELDS = [
    "operator_token_warning", "credential_generation", "operator_token_expires_at", "operator_token_rotated_at",
    "operator_token_rotation_attempted_at", "operator_token_rotation_error",
    "operator_refused_since", "operator_refused_at", "operator_refused_reason",
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
    #: How many live sessions the change re-applies (a routing change), for the message after the save.
    sessions_reapplied = 0

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
            self.sessions_reapplied = self.instance.sessions_reapplied


class ClusterStatusFilter(admin.SimpleListFilter):
    """Clusters by status, named as the status badges name them."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):  # noqa: D102
        return [(value, value) for value in Cluster.Status.values]

    def queryset(self, request, queryset):  # noqa: D102
        return queryset.filter(status=self.value()) if self.value() in Cluster.Status.values else queryset


@admin.register(Cluster)
class ClusterAdmin(ClusterScopedAdmin, ConsoleModelAdmin):
    """Clusters: status badge, heartbeat age, counts; actions call the cluster services. With a cluster chosen in
    the top bar the list shows that cluster only."""

    list_display = [
        "name", "public_id", "status_badge", "kubernetes_version", "heartbeat_age", "node_count", "gpu_count", "session_routing",
        "operator_token",
    ]
    list_display_links = ["name"]
    list_filter = [ClusterStatusFilter]
    Media = ConsoleCss
    search_fields = ["name", "public_id"]
    fields = [
        "problems", "public_id", "name", "apiserver_url", "status", "kubernetes_version", "session_domain", "routing",
        "gateway_name", "gateway_namespace", "routing_report", "ingress_node", "volume_storage_class", "last_heartbeat_at",
        "clock_synced", "credential_privilege", "last_connection_test", "last_connection_test_at",
        "registered_at", "deregistered_at", *OPERATOR_TOKEN_FIELDS,
    ]
    readonly_fields = [
        "problems", "public_id", "name", "apiserver_url", "status", "kubernetes_version", "routing_report", "last_heartbeat_at",
        "clock_synced", "credential_privilege",
        "last_connection_test", "last_connection_test_at", "registered_at", "deregistered_at", *OPERATOR_TOKEN_FIELDS,
    ]
    actions = ["connection_test", "deregister", "rotate_operator_token", "revoke_operator_tokens"]
    form = ClusterForm

    def get_queryset(self, request):  # noqa: D102
        return super().get_queryset(request).annotate(
            _node_count=Count("nodes", distinct=True), _gpu_count=Count("devices", distinct=True)
        )

    def narrow_to_cluster(self, qs, cluster: Cluster):
        """The chosen cluster's own row."""
        return qs.filter(pk=cluster.pk)

    def changelist_view(self, request, extra_context=None):
        """Django's changelist (actions kept), titled "Clusters"."""
        return super().changelist_view(request, {"title": "Clusters", **(extra_context or {})})

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
        audit row); a routing change says how many live sessions it re-applies."""
        if form.sessions_reapplied:
            self.message_user(request, f"{obj.name}: routing changed; {form.sessions_reapplied} live session(s) are re-applied so their "
                                       "routes follow.", messages.INFO)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Cluster):
        """The status as a coloured badge (the long label on hover)."""
        return format_html(
            '<span class="gs-badge gs-badge-{}" title="{}">{}</span>', STATUS_BADGES.get(obj.status, "info"), obj.get_status_display(), obj.status
        )

    @admin.display(description="session domain", ordering="session_domain")
    def session_routing(self, obj: Cluster):
        """The session domain with the routing mode under it (no column of its own: the list fits 1400 px); the Gateway
        of ``gateway-api`` (``namespace/name``), or ingress-nginx's retirement, on hover."""
        title = (f"Gateway {obj.gateway_namespace}/{obj.gateway_name}" if obj.routing == Cluster.Routing.GATEWAY_API
                 else obj.get_routing_display())
        return format_html('{}<br><span class="gs-muted" title="{}">{}</span>', obj.session_domain or "-", title, obj.routing)

    @admin.display(description="routing (last connection test)")
    def routing_report(self, obj: Cluster) -> str:
        """What the last connection test found routing the sessions (``routing`` of its report): controller, Gateway,
        and the sentence with the fix; "not tested" before one ran in the current mode."""
        report = obj.last_connection_test if isinstance(obj.last_connection_test, dict) else {}
        routing = report.get("routing") if isinstance(report.get("routing"), dict) else None
        if routing is None or routing.get("mode") != obj.routing:
            return "not tested in this mode (run the connection test)"
        found = {True: "found", False: "not found", None: "unknown"}
        summary = f"controller {found.get(routing.get('controller'), 'unknown')}"
        if obj.routing == Cluster.Routing.GATEWAY_API:
            summary += ", Gateway " + {True: "programmed", False: "not programmed"}.get(routing.get("gateway_programmed"), "unknown")
        warn = routing.get("controller") is False or routing.get("gateway_programmed") is False
        return format_html('<span class="{}">{}.</span> {}', "gs-warning" if warn else "", summary, str(routing.get("detail") or ""))

    @admin.display(description="heartbeat", ordering="last_heartbeat_at")
    def heartbeat_age(self, obj: Cluster):
        """How long ago the operator last reported (the UTC time on hover)."""
        return _age_html(obj.last_heartbeat_at)

    @admin.display(description="nodes", ordering="_node_count")
    def node_count(self, obj: Cluster):
        """GPU nodes in the latest inventory, linked to Node management narrowed to the cluster."""
        url = list_url("admin:clusters_node_changelist")
        return format_html('<a href="{}?cluster={}">{}</a>', url, obj.public_id, obj._node_count)

    @admin.display(description="GPUs", ordering="_gpu_count")
    def gpu_count(self, obj: Cluster):
        """GPUs in the latest inventory, linked to GPU management narrowed to the cluster."""
        url = list_url("admin:clusters_gpudevice_changelist")
        return format_html('<a href="{}?cluster={}">{}</a>', url, obj.public_id, obj._gpu_count)

    @admin.display(description="operator token", ordering="operator_token_expires_at")
    def operator_token(self, obj: Cluster) -> str:
        """Expiry of the newest operator token; a short warning (the full sentence on hover) when something needs doing."""
        state = token_rotation.operator_token_state(obj)
        expires = f"expires {state.expires_at:%Y-%m-%d %H:%M} UTC" if state.expires_at else "no token"
        if not state.warning:
            return expires
        label = "callbacks refused" if state.refused_since else "rotation failed" if state.last_rotation_error else expires
        return format_html('<span class="gs-warning" title="{}">⚠ {}</span>', state.warning, label)

    @admin.display(description="clock_synced")
    def clock_synced(self, obj: Cluster):
        """The operator's clock against the control plane's (``clusters.diagnosis.clock_verdict``): ok with the offset,
        a warning with the offset and the fix (NTP on the operator's node), or unknown."""
        verdict = clock_verdict(obj)
        label = {True: "ok", False: "⚠ off", None: "unknown"}[verdict.ok]
        return format_html('<span class="{}">{}:</span> {}', "gs-warning" if verdict.ok is False else "", label, verdict.detail)

    @admin.display(description="kubernetes credential")
    def credential_privilege(self, obj: Cluster) -> str:
        """What the last connection test found about the stored kubeconfig's rights: a warning with the fix when it is
        cluster-admin (``credential_least_privilege`` false), "least privilege", "unknown" (the apiserver did not answer
        the review: the check is left out), or "not tested"."""
        report = obj.last_connection_test if isinstance(obj.last_connection_test, dict) else {}
        checks = report.get("checks") if isinstance(report.get("checks"), dict) else {}
        ok = checks.get("credential_least_privilege")
        if ok is None and checks.get("apiserver_reachable") is True:
            return "unknown (the apiserver did not answer the connection test's SelfSubjectAccessReview)"
        if ok is None:
            return "not tested (run the connection test)"
        if ok:
            return "least privilege (ServiceAccount gshare-control-plane)"
        details = report.get("detail") if isinstance(report.get("detail"), dict) else {}
        detail = str(details.get("credential_least_privilege") or "")
        return format_html('<span class="gs-warning">⚠ cluster-admin credential stored.</span> {}', detail)

    @admin.display(description="problems")
    def problems(self, obj: Cluster):
        """Every known problem with its fix, in red (``clusters.diagnosis.cluster_problems``), or "none known"."""
        found = cluster_problems(obj)
        if not found:
            return "none known"
        items = format_html_join(
            "", '<li class="gs-problem"><code>{}</code>: {}</li>',
            ((p.check, mark_safe(_CODE.sub(r"<code>\1</code>", escape(p.detail)))) for p in found),  # noqa: S308 - escaped first
        )
        return format_html('<ul class="gs-problems" role="alert">{}</ul>', items)

    @admin.display(description="operator token warning")
    def operator_token_warning(self, obj: Cluster) -> str:
        """The warning of :func:`clusters.operator_token.rotation.operator_token_state`, or "none"."""
        return token_rotation.operator_token_state(obj).warning or "none"

    # Every action changes state: it needs the change permission (a view-only staff user sees none of them).
    @admin.action(description="Rotate the operator token now", permissions=["change"])
    def rotate_operator_token(self, request, queryset):
        """Push a fresh operator token into each selected cluster's Secret."""
        for cluster in queryset:
            try:
                result = token_rotation.operator_token_push(cluster)
            except ApplicationError as exc:
                self.message_user(request, f"{cluster.name}: {exc.console_detail}", messages.ERROR)
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
                self.message_user(request, f"{cluster.name}: {exc.console_detail}", messages.ERROR)
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
                self.message_user(request, f"{cluster.name}: {exc.console_detail}", messages.ERROR)


class NodeModeFilter(admin.SimpleListFilter):
    """Nodes by HAMi mode (the ``gshare.io/gpu-mode`` label; "unset" for nodes without it)."""

    title = "HAMi mode"
    parameter_name = "mode"

    def lookups(self, request, model_admin):  # noqa: D102
        modes = Node.objects.order_by("gpu_mode").values_list("gpu_mode", flat=True).distinct()
        return [(mode or "-", mode or "unset") for mode in modes]

    def queryset(self, request, queryset):  # noqa: D102
        if self.value() is None:
            return queryset
        return queryset.filter(gpu_mode="" if self.value() == "-" else self.value())


class NodeGpusFilter(admin.SimpleListFilter):
    """Nodes by what their GPUs can still take (the placement summary)."""

    title = "GPUs"
    parameter_name = "gpus"

    def lookups(self, request, model_admin):  # noqa: D102
        return [("free", "With a free GPU"), ("open", "Open for shares"), ("full", "Full (nothing open)")]

    def queryset(self, request, queryset):  # noqa: D102
        if self.value() == "free":
            return queryset.filter(free_devices__gt=0)
        if self.value() == "open":
            return queryset.filter(open_devices__gt=0)
        if self.value() == "full":
            return queryset.filter(open_devices=0, free_devices=0)
        return queryset


@admin.register(Node)
class NodeAdmin(ClusterScopedAdmin, ReadOnlyModelAdmin):
    """Node management: GPU nodes, read-only (the operator's inventory owns them). Deleting one here would delete the
    reservations of the sessions on its GPUs (and the operator would report the node again moments later), so the
    console cannot; a node that is gone disappears with the next inventory snapshot, and deregistering the cluster
    drops the rest.

    Each row: ready, HAMi mode, GPUs (count, free, open for shares), load (the busier of memory and cores reserved),
    labels as chips, last report age, and a link to the node's GPU cards. Sums are annotations
    (:func:`console.pages.clusters.selectors.node_rows`): the page's queries do not grow with its rows.
    """

    cluster_lookup = "cluster"
    list_display = ["node_name", "ready_badge", "gpus", "free", "open_for_shares", "load_bar", "label_chips", "seen", "cards"]
    list_display_links = None  # node_name links the node itself (and its cluster: no nested links)
    list_filter = ["ready", NodeModeFilter, NodeGpusFilter]
    search_fields = ["name", "cluster__name"]
    ordering = ["cluster_name", "name"]
    readonly_fields = ["cluster", "name", "ready", "gpu_mode", "gpus", "free", "open_for_shares", "load_bar", "cards", "all_labels",
                       "inventory_error", "last_report", "missing_since"]
    fields = readonly_fields
    list_per_page = 50
    Media = ConsoleCss

    #: Chips shown in a row before "+N more" (the rest on hover; all on the node's page).
    LABELS_SHOWN = 4

    def get_queryset(self, request):  # noqa: D102
        return console.node_rows(super().get_queryset(request))

    def changelist_view(self, request, extra_context=None):
        """Django's changelist, titled "Node management"."""
        return super().changelist_view(request, {"title": "Node management", **(extra_context or {})})

    @admin.display(description="node", ordering="name")
    def node_name(self, obj: Node):
        """The node's name and its cluster (linked); a warning when the operator could not read its HAMi annotation or lost it."""
        notes = []
        if obj.inventory_error:
            notes.append(format_html('<span class="gs-badge gs-badge-bad" title="{}">inventory error</span>', obj.inventory_error))
        if obj.missing_since:
            notes.append(format_html('<span class="gs-badge gs-badge-warn" title="missing since {}">missing</span>',
                                     obj.missing_since.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")))
        cluster = format_html('<a href="{}">{}</a>', row_url("admin:clusters_cluster_change", obj.cluster_id), obj.cluster.name)
        return format_html(
            '<span class="gs-node-cell"><a class="gs-nowrap gs-node" href="{}">{}</a><span class="gs-sub">on {}{}</span></span>',
            row_url("admin:clusters_node_change", obj.pk), obj.name, cluster, format_html_join("", " {}", ((n,) for n in notes)),
        )

    @admin.display(description="ready · HAMi mode", ordering="ready")
    def ready_badge(self, obj: Node):
        """Ready or not, as a badge, over the node's HAMi mode."""
        return format_html(
            '<span class="gs-node-cell"><span class="gs-badge gs-badge-{}">{}</span>{}</span>',
            "ok" if obj.ready else "bad", "Ready" if obj.ready else "Not ready", self.hami_mode(obj),
        )

    @admin.display(description="HAMi mode", ordering="gpu_mode")
    def hami_mode(self, obj: Node):
        """The node's ``gshare.io/gpu-mode`` label (``hami-core``, ...), or a dash."""
        if not obj.gpu_mode:
            return mark_safe('<span class="gs-muted">—</span>')
        return format_html('<code class="gs-mode">{}</code>', obj.gpu_mode)

    @admin.display(description="GPUs", ordering="gpu_total")
    def gpus(self, obj: Node) -> int:
        """GPUs on this node."""
        return obj.gpu_total

    @admin.display(description="free", ordering="free_devices")
    def free(self, obj: Node) -> int:
        """Healthy GPUs with nothing reserved on them."""
        return obj.free_devices

    @admin.display(description="open for shares", ordering="open_devices")
    def open_for_shares(self, obj: Node) -> int:
        """Healthy GPUs a share may still go to (not held whole, split count not reached)."""
        return obj.open_devices

    @admin.display(description="load")
    def load_bar(self, obj: Node):
        """The busier of memory and cores reserved, as a percent bar (both on hover)."""
        meter = console.node_load(obj)
        if meter.total == 0:
            return mark_safe('<span class="gs-muted">no GPUs</span>')
        return _bar(meter, caption=f"{meter.percent} % {meter.label.lower()}", compact=True)

    @admin.display(description="labels")
    def label_chips(self, obj: Node):
        """A few of the node's Kubernetes labels as ``key=value`` chips (gShare, GPU and HAMi ones first), the rest
        as "+N more" (listed on hover and on the node's page)."""
        return _label_chips(obj.labels, limit=self.LABELS_SHOWN)

    @admin.display(description="labels")
    def all_labels(self, obj: Node):
        """Every label of the node, as chips."""
        return _label_chips(obj.labels)

    @admin.display(description="last report")
    def seen(self, obj: Node):
        """How long ago the node was last reported (the UTC time on hover)."""
        return _age_html(obj.reported_at)

    @admin.display(description="last report")
    def last_report(self, obj: Node):
        """When the operator last reported the node (``Node.reported_at``)."""
        return obj.reported_at

    @admin.display(description="GPU cards")
    def cards(self, obj: Node):
        """A link to GPU management filtered to this node."""
        url = list_url("admin:clusters_gpudevice_changelist")
        return format_html('<a class="gs-link-button" href="{}?node={}">GPU cards&nbsp;→</a>', url, obj.pk)


class GpuUseFilter(admin.SimpleListFilter):
    """GPUs by whether a live session holds them."""

    title = "use"
    parameter_name = "use"

    def lookups(self, request, model_admin):  # noqa: D102
        return [("free", "Free"), ("in_use", "In use")]

    def queryset(self, request, queryset):  # noqa: D102
        if self.value() in ("free", "in_use"):
            return console.gpus_in_use(queryset, self.value() == "in_use")
        return queryset


class GpuHealthFilter(admin.SimpleListFilter):
    """GPUs by the health the operator reported."""

    title = "health"
    parameter_name = "health"

    def lookups(self, request, model_admin):  # noqa: D102
        return [("healthy", "Healthy"), ("unhealthy", "Unhealthy")]

    def queryset(self, request, queryset):  # noqa: D102
        if self.value() in ("healthy", "unhealthy"):
            return queryset.filter(health=self.value() == "healthy")
        return queryset


class GpuNodeFilter(admin.SimpleListFilter):
    """The GPUs of one node (``?node=<id>``, the link from Node management). Lists only the chosen node: a fleet's
    thousand nodes would not fit a sidebar, and the search box finds the rest."""

    title = "node"
    parameter_name = "node"

    def lookups(self, request, model_admin):  # noqa: D102
        value = self.value()
        if not value:
            return []
        node = Node.objects.filter(pk=value).values_list("pk", "name", "cluster_name").first() if value.isdigit() else None
        if node is None:
            return [(value, "unknown node")]
        pk, name, cluster_name = node
        return [(str(pk), f"{name} ({cluster_name})")]

    def queryset(self, request, queryset):  # noqa: D102
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(node_id=int(value)) if value.isdigit() else queryset.none()


@admin.register(GpuDevice)
class GpuDeviceAdmin(ClusterScopedAdmin, ReadOnlyModelAdmin):
    """GPU management: one card per GPU (``console/templates/admin/clusters/gpudevice/change_list.html``), read-only: the
    operator's inventory owns them, and deleting one would delete the reservations placement made on it (see
    :class:`NodeAdmin`).

    A card: model, index, short UUID (whole on hover, copy button), node, health; bars for memory, cores and HAMi
    split slots reserved; the sessions holding it. Two queries for the page's cards whatever their number
    (:func:`console.pages.clusters.selectors.gpu_card_queryset`).
    """

    cluster_lookup = "cluster"
    list_display = ["uuid", "model", "cluster", "node", "index", "memory_mib", "split_count", "cores", "health", "mode"]
    list_filter = ["model", GpuHealthFilter, GpuUseFilter, GpuNodeFilter]
    search_fields = ["uuid", "model", "node__name"]
    ordering = ["node__cluster_name", "node__name", "index"]  # the node keeps its cluster's name: no join to sort
    list_per_page = 48
    readonly_fields = ["cluster", "node", "uuid", "index", "model", "health", "mode", "memory_mib", "split_count", "cores", "physical",
                       "reserved", "sm_utilization", "holding_sessions", "last_report", "missing_since"]
    fields = readonly_fields

    class Media:
        css = ConsoleCss.css
        js = ["console/copy.js"]

    def get_queryset(self, request):  # noqa: D102
        return console.gpu_card_queryset(super().get_queryset(request))

    def get_changelist(self, request, **kwargs):  # noqa: D102
        return GpuCardList

    @admin.display(description="last report")
    def last_report(self, obj: GpuDevice):
        """When the operator last reported the GPU (``GpuDevice.reported_at``)."""
        return obj.reported_at

    @admin.display(description="physical")
    def physical(self, obj: GpuDevice):
        """The GPU's physical memory and cores, and HAMi's scaled figures (``memory_mib``, ``cores`` above) labelled as
        such (``console.pages.clusters.selectors.physical_figures``)."""
        return mark_safe(admin_cards.physical_html(console.physical_figures(obj), obj))  # noqa: S308 - escaped there

    @admin.display(description="reserved")
    def reserved(self, obj: GpuDevice):
        """The card's three bars: memory, cores and HAMi split slots reserved by live sessions."""
        card = console.gpu_card(obj)
        return format_html('<div class="gs-meters gs-detail-meters">{}{}{}</div>', _bar(card.memory), _bar(card.cores), _bar(card.slots))

    @admin.display(description="SM utilization")
    def sm_utilization(self, obj: GpuDevice) -> str:
        """What its Running sessions report for it (``console.pages.clusters.selectors.gpu_utilization``), or "—"."""
        value = console.gpu_utilization([obj], {obj.pk: console.gpu_card(obj).holders}, now=timezone.now()).get(obj.pk)
        return "— (no fresh reading)" if value is None else f"{value} %"

    @admin.display(description="sessions on this GPU")
    def holding_sessions(self, obj: GpuDevice):
        """The live sessions holding the GPU: id (linked), owner, share."""
        holders = console.gpu_card(obj).holders
        if not holders:
            return mark_safe('<span class="gs-muted">none</span>')
        rows = format_html_join(
            "", '<li><a class="gs-session" href="{}">{}</a><span class="gs-owner">{} · {}</span><span class="gs-share">{}</span></li>',
            ((row_url("admin:gpu_sessions_session_change", h.session_pk), h.public_id, h.owner, h.phase, h.share) for h in holders),
        )
        return format_html('<div class="gs-holders gs-detail-holders"><ul>{}</ul></div>', rows)

    def changelist_view(self, request, extra_context=None):
        """Django's changelist, titled "GPU management", rendered as cards."""
        return super().changelist_view(request, {"title": "GPU management", **(extra_context or {})})
