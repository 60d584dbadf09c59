"""Console pages for sessions and their GPU reservations.

Sessions (for researchers: **My sessions**, their own only, ``OwnObjectsAdmin``): phase badge, owner, cluster, node,
GPUs, started (UTC), cost so far, URL, and per-row Open and Stop; the Start session form and the session page that
follows a new session until it runs (views in ``console/pages/sessions/actions.py``). Rows are history, never edited or deleted
here. Reservations and suggested images are staff pages.
"""

from __future__ import annotations

import html

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import Http404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing.selectors import session_hourly_cost
from console.access import OwnObjectsAdmin, is_researcher
from console.changelist import LeanChangeList
from console.figures import credits_display
from console.links import row_url_format
from console.options import ConsoleModelAdmin, ReadOnlyModelAdmin
from console.pages.sessions import actions as console
from console.pages.sessions import activity as console_activity
from console.pages.sessions import selectors as console_selectors
from console.scope import ClusterScopedAdmin
from sessions import lifecycle
from sessions.manifests import session_url
from sessions.models import Allocation, Session, SuggestedImage
from sessions.permissions import SessionRights


def _esc(value) -> str:
    """``value`` HTML-escaped, as Django's ``escape`` does it (``html.escape`` of its text) without its lazy-string
    wrapper: the list's columns escape a dozen values a row, and the wrapper was most of their cost."""
    return html.escape(str(value))


class AllocationInline(admin.TabularInline):
    """The GPU shares placement reserved for the session."""

    model = Allocation
    fields = ["device", "memory_mib", "cores", "exclusive"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    template = "admin/gpu_sessions/session/allocations_inline.html"

    def get_queryset(self, request):  # noqa: D102
        return super().get_queryset(request).select_related("device")

    def has_add_permission(self, request, obj=None) -> bool:  # noqa: D102
        return False


class ClusterListFilter(admin.RelatedFieldListFilter):
    """Django's filter by cluster, reading the clusters without their kubeconfigs (never shown; each is decrypted
    when read): the clusters that are not deregistered, and the deregistered ones a row still names (history)."""

    def field_choices(self, field, request, model_admin):  # noqa: D102
        related = field.related_model
        qs = related._default_manager.defer("kubeconfig").filter(
            ~Q(status=related.Status.DEREGISTERED) | Q(pk__in=field.model._default_manager.values(field.attname)))
        ordering = self.field_admin_ordering(field, request, model_admin)
        return [(c.pk, str(c)) for c in (qs.order_by(*ordering) if ordering else qs)]


#: What the list's rows read of a session's owner and cluster (its name and link, the session's URL, Open).
_ROW_OWNER_FIELDS = frozenset({"id", "username"})
_ROW_CLUSTER_FIELDS = frozenset({"id", "public_id", "name", "session_domain", "status"})
#: A session's columns no row shows (the reported devices, messages, request bookkeeping).
_ROW_SESSION_DEFERRED = ("devices", "message", "last_status_at", "stop_requested_at", "idempotency_key", "request_fingerprint", "image")


class SessionChangeList(LeanChangeList):
    """The sessions list's changelist: the page's rows without the columns no row shows, theirs or their owner's
    and cluster's (building 50 whole sessions, users and clusters was half of reading the page)."""

    def page_queryset(self, qs):  # noqa: D102
        owner = qs.model._meta.get_field("owner").related_model
        cluster = qs.model._meta.get_field("cluster").related_model
        return qs.defer(
            *_ROW_SESSION_DEFERRED,
            *(f"owner__{f.name}" for f in owner._meta.concrete_fields if f.name not in _ROW_OWNER_FIELDS),
            *(f"cluster__{f.name}" for f in cluster._meta.concrete_fields if f.name not in _ROW_CLUSTER_FIELDS),
        )


class ActivityListFilter(admin.SimpleListFilter):
    """Sessions by GPU activity: idle (``sessions.selectors.idle_sessions``, what the dashboard's Idle GPUs tile counts),
    busy, unknown (``console_selectors.filter_activity``)."""

    title = "activity"
    parameter_name = "activity"

    def lookups(self, request, model_admin):  # noqa: D102
        return list(console_selectors.ACTIVITY_CHOICES)

    def queryset(self, request, queryset):  # noqa: D102
        return console_selectors.filter_activity(queryset, self.value() or "", now=request_now(request))


def request_now(request):
    """The request's one "now" (every cell of a list judged at the same moment)."""
    return request.__dict__.setdefault("_gshare_now", timezone.now())


@admin.register(Session)
class SessionAdmin(OwnObjectsAdmin, ClusterScopedAdmin, ReadOnlyModelAdmin):
    """Sessions: phase, where they run, what they cost so far, their URL; Open, Stop and Start session.

    Read-only records (a session is never deleted here: that would drop its GPU reservations while its pod runs);
    Start, Open and Stop call the session services. Researchers see, start, open and stop their own only; staff
    need the ``add_session`` / ``change_session`` permissions to start / stop, and ``change_session`` (or superuser)
    to open another user's running session (``sessions.permissions``).
    The list narrows to the console's cluster.
    """

    cluster_lookup = "cluster"
    owner_lookup = "owner"
    researcher_title = "My sessions"
    researcher_order = 10
    list_display = ["session_id", "phase_badge", "activity_cell", "owner", "cluster_name", "node", "gpus_asked", "started", "cost",
                    "url_link"]
    list_display_links = ["session_id"]
    list_filter = ["phase", ActivityListFilter, ("cluster", ClusterListFilter)]
    list_select_related = ["owner", "cluster", "activity"]
    list_per_page = 50
    search_fields = ["public_id", "name", "owner__username", "image"]
    readonly_fields = [
        "public_id", "name", "owner", "cluster", "requested_cluster", "url_full", "image", "gpus_asked", "phase_badge", "node",
        "gpu_devices", "volumes", "message", "stop_reason_text", "stopped_by", "rate", "cost", "created", "started", "ends", "ended",
        "last_status",
    ]
    fields = readonly_fields
    inlines = [AllocationInline]
    actions = ["stop"]
    change_list_template = "admin/gpu_sessions/session/change_list.html"
    change_form_template = "admin/gpu_sessions/session/change_form.html"

    def get_queryset(self, request):  # noqa: D102
        qs = console_selectors.with_cost_so_far(self.plain_queryset(request))
        return console_selectors.with_activity(qs, now=request_now(request))

    def plain_queryset(self, request):
        """The sessions this user may see, with owner and cluster, without the cost so far (a sum over the ledger that
        only the list and the session's page show)."""
        # The cluster's kubeconfig is never shown: not decrypting it once per row (a third of the list's time).
        return super().get_queryset(request).select_related("owner", "cluster").defer("cluster__kubeconfig")

    def get_object(self, request, object_id, from_field=None):
        """The session (see ``OwnObjectsAdmin.get_object``), read once per request: the session's page asks for it
        twice (its Open/Stop and Django's form)."""
        memo = request.__dict__.setdefault("_gshare_sessions", {})
        key = (object_id, from_field)
        if key not in memo:
            memo[key] = super().get_object(request, object_id, from_field)
        return memo[key]

    def action_object(self, request, object_id: str) -> Session | None:
        """The session for Open, Stop and the status poll: :meth:`plain_queryset`'s row, None when there is none.

        Raises:
            Http404: for a researcher, another user's (or a missing) session, as on its page.
        """
        try:
            session = self.plain_queryset(request).get(pk=Session._meta.pk.to_python(object_id))
        except (Session.DoesNotExist, ValidationError, ValueError):
            session = None
        if session is None and is_researcher(request.user):
            raise Http404("No such object.")
        return session

    def get_changelist(self, request, **kwargs):
        """Django's changelist counting once and sorting the page on its ordering's columns alone
        (``console.changelist.LeanChangeList``), reading of the owner and cluster only what the rows show."""
        return SessionChangeList

    def get_readonly_fields(self, request, obj=None):
        """The session page's fields; for a researcher the owner and clusters as plain names (the user and cluster
        pages are staff pages)."""
        if not is_researcher(request.user):
            return self.readonly_fields
        plain = {"owner": "owner_name", "cluster": "cluster_name", "requested_cluster": "requested_cluster_name"}
        return [plain.get(name, name) for name in self.readonly_fields]

    def get_fields(self, request, obj=None):  # noqa: D102
        return self.get_readonly_fields(request, obj)

    def list_title(self, request) -> str:
        """"My sessions" for a researcher, "Sessions" for staff."""
        return "My sessions" if is_researcher(request.user) else "Sessions"

    def get_list_filter(self, request):
        """Researchers filter their sessions by phase and activity only (a cluster filter would list the fleet's clusters)."""
        return ["phase", ActivityListFilter] if is_researcher(request.user) else super().get_list_filter(request)

    def has_stop_permission(self, request) -> bool:
        """Researchers stop their own sessions (the queryset holds no other); staff need the permission to change
        sessions."""
        return is_researcher(request.user) or self.model_permission(request, "change")

    def session_rights(self, request) -> SessionRights:
        """This user's Open and Stop rights, for the rows, the page and its status poll alike."""
        return SessionRights(request.user, may_stop=self.has_stop_permission(request))

    def has_start_permission(self, request) -> bool:
        """Researchers start their own sessions; staff need the permission to add sessions."""
        return is_researcher(request.user) or self.model_permission(request, "add")

    def get_list_display(self, request):
        """The columns, and the row's Open / Stop buttons (which depend on what this user may do)."""
        rights = self.session_rights(request)
        next_url = _esc(reverse(f"{self.admin_site.name}:gpu_sessions_session_changelist"))
        urls = {verb: row_url_format(f"{self.admin_site.name}:gpu_sessions_session_{verb}") for verb in ("open", "stop")}

        @admin.display(description="Actions")
        def row_actions(obj: Session) -> str:
            # Buttons of the changelist's own form (one form, CSRF included): formaction sends it to the row's URL.
            buttons = []
            actions = rights.actions(obj)
            if actions.open:
                buttons.append(("open", "Open", "gs-open"))
            if actions.stop:
                buttons.append(("stop", "Stop", "gs-stop"))
            if not buttons:
                return "-"
            public_id = _esc(obj.public_id)
            return mark_safe(" ".join(  # noqa: S308 - every value escaped
                f'<button type="submit" class="gs-button {css}" formaction="{_esc(urls[verb].format(obj.pk))}" formmethod="post" '
                f'name="next" value="{next_url}" aria-label="{label} {public_id}">{label}</button>'
                for verb, label, css in buttons
            ))

        # The admin's own columns as its bound methods: Django then calls them without first looking each name up as
        # a model field (a FieldDoesNotExist raised and caught per cell). The same headers, classes and sorting; the
        # linked column stays a name (list_display_links matches names).
        columns = [name if name in self.list_display_links or not hasattr(type(self), name) else getattr(self, name)
                   for name in self.list_display]
        now = request_now(request)

        @admin.display(description="activity")
        def activity_cell(obj: Session) -> str:
            return self.activity_cell(obj, now)

        columns = [activity_cell if name == "activity_cell" else column for name, column in zip(self.list_display, columns, strict=True)]
        return [*columns, row_actions]

    def action_checkbox(self, obj: Session) -> str:
        """The row's action checkbox, as Django renders it, without a widget template per row (the header's
        select-all box is Django's, by this method's name)."""
        return mark_safe(f'<input type="checkbox" name="{ACTION_CHECKBOX_NAME}" value="{obj.pk}" class="action-select" '  # noqa: S308
                         f'aria-label="Select this object for an action - {_esc(obj.public_id)}">')

    def get_urls(self):
        """The admin's URLs with ``start/``, ``<id>/open/``, ``<id>/stop/`` and ``<id>/status/`` first."""
        wrap = self.admin_site.admin_view

        def start(request):
            return console.start_view(self, request)

        def open_(request, object_id):
            return console.open_view(self, request, object_id)

        def stop(request, object_id):
            return console.stop_view(self, request, object_id)

        def status(request, object_id):
            return console.status_view(self, request, object_id)

        def by_id(request, public_id):
            return console.by_id_view(self, request, public_id)

        def idle_exemption(request, object_id):
            return console.idle_exemption_view(self, request, object_id)

        def extend(request, object_id):
            return console.extend_view(self, request, object_id)

        def alternative(request, object_id):
            return console.alternative_view(self, request, object_id)

        def queue(request):
            return console.queue_page(self, request)

        return [
            path("start/", wrap(start), name="gpu_sessions_session_start"),
            path("queue/", wrap(require_GET(queue)), name="gpu_sessions_session_queue"),
            path("ended/<str:public_id>/", wrap(require_GET(by_id)), name="gpu_sessions_session_by_id"),
            path("<path:object_id>/open/", wrap(require_POST(open_)), name="gpu_sessions_session_open"),
            path("<path:object_id>/stop/", wrap(require_http_methods(["GET", "POST"])(stop)), name="gpu_sessions_session_stop"),
            path("<path:object_id>/status/", wrap(require_GET(status)), name="gpu_sessions_session_status"),
            path("<path:object_id>/idle-exemption/", wrap(idle_exemption), name="gpu_sessions_session_idle_exemption"),
            path("<path:object_id>/extend/", wrap(require_POST(extend)), name="gpu_sessions_session_extend"),
            path("<path:object_id>/alternative/", wrap(require_POST(alternative)), name="gpu_sessions_session_alternative"),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        """The list, titled "My sessions" for researchers, with the Start session button."""
        extra_context = {**(extra_context or {}), "title": self.list_title(request),
                         "can_start": self.has_start_permission(request)}
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The session's page, with Open and Stop, following the session (status poll) until it runs or ends."""
        session = self.get_object(request, object_id)
        extra = {}
        if session is not None:
            actions = self.session_rights(request).actions(session)
            extra = {
                "session": session, "can_open": actions.open, "can_stop": actions.stop,
                "follow": session.phase in console.FOLLOWED_PHASES, "list_title": self.list_title(request),
                # A queued session holds no GPU yet: its Queue section says where it stands, there is no activity.
                "activity": (None if session.phase == Session.Phase.QUEUED
                             else console_activity.activity_view(session, now=request_now(request))),
                "exemption_form": console.IdleExemptionForm() if console.may_exempt(request.user, session) else None,
                "time_limit": console.time_limit_view(session, user=request.user, now=request_now(request)),
                "queue": console.queue_view(session),
            }
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), **extra})

    @admin.display(description="session", ordering="public_id")
    def session_id(self, obj: Session) -> str:
        """The session's id (``ses_...``), the link to its page."""
        return obj.public_id

    @admin.display(description="activity")
    def activity_cell(self, obj: Session, now=None) -> str:
        """``idle · stops 14:05`` / ``idle 20 min`` / ``busy 87 %`` / ``unknown`` (the sentence on hover):
        ``console_activity.activity_summary`` at ``now`` (the list passes its request's moment)."""
        summary = console_activity.activity_summary(obj, now=now or timezone.now())
        return mark_safe(f'<span class="gs-activity gs-activity-{_esc(summary.kind)}" title="{_esc(summary.title)}">'  # noqa: S308
                         f"{_esc(summary.text)}</span>")

    @admin.display(description="stopped by")
    def stopped_by(self, obj: Session) -> str:
        """Who asked it to stop (its ``session_stop`` audit row's actor), or "-"."""
        if not (obj.stop_reason or obj.stop_requested_at):
            return "-"
        return console_selectors.stopped_by(obj) or "-"

    @admin.display(description="time limit", ordering="ends_at")
    def ends(self, obj: Session) -> str:
        """When its time limit stops it (``ends_at``, UTC), or "none"."""
        return console.utc(obj.ends_at) if obj.ends_at else "none"

    @admin.display(description="stop reason")
    def stop_reason_text(self, obj: Session) -> str:
        """Why it was asked to stop (``stop_reason``), or "-"."""
        return obj.get_stop_reason_display() if obj.stop_reason else "-"

    @admin.display(description="phase", ordering="phase")
    def phase_badge(self, obj: Session) -> str:
        """The phase as a coloured badge; a queued session's adds its place and estimated start."""
        phase = _esc(obj.phase)
        badge = f'<span class="gs-phase gs-phase-{phase.lower()}" data-phase="{phase}">{phase}</span>'
        if obj.phase == Session.Phase.QUEUED:
            estimate = console.utc(obj.estimated_start) if obj.estimated_start else "no estimate"
            badge += f' <span class="gs-queue-cell">#{_esc(obj.queue_position or "?")} · {_esc(estimate)}</span>'
        return mark_safe(badge)  # noqa: S308

    @admin.display(description="cluster", ordering="cluster__name")
    def cluster_name(self, obj: Session) -> str:
        """The cluster's name (its id on hover)."""
        if obj.cluster is None:
            return "-"
        return mark_safe(f'<span title="{_esc(obj.cluster.public_id)}">{_esc(obj.cluster.name)}</span>')  # noqa: S308

    @admin.display(description="owner")
    def owner_name(self, obj: Session) -> str:  # noqa: D102
        return obj.owner.get_username()

    @admin.display(description="requested cluster")
    def requested_cluster_name(self, obj: Session) -> str:  # noqa: D102
        return obj.requested_cluster.name if obj.requested_cluster_id else "automatic"

    @admin.display(description="GPUs", ordering="gpus")
    def gpus_asked(self, obj: Session) -> str:
        """``2 whole`` or ``1 × 4000 MiB, 25% cores`` (a HAMi share of each GPU: a value left out is all of it, what
        HAMi gives and what is reserved and priced, docs/billing.md "What a share takes"), then `` of <model> or <model>``
        when the session accepts only some GPU models."""
        models = f" of {' or '.join(obj.gpu_models)}" if obj.gpu_models else ""
        if obj.whole_gpus:
            return f"{obj.gpus} whole{models}"
        memory = f"{obj.gpu_memory_mib} MiB" if obj.gpu_memory_mib is not None else "all memory"
        cores = f"{obj.gpu_cores}% cores" if obj.gpu_cores is not None else "all cores"
        return f"{obj.gpus} × {memory}, {cores}{models}"

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: Session) -> str:
        """When its pod started running (UTC; date over time in the list), or "not yet"."""
        text = console.utc(obj.started_at)
        if not text:
            return "not yet" if obj.is_live else "never"
        day, time = text.split(" ", 1)
        return mark_safe(f'<span class="gs-day">{_esc(day)}</span> <span class="gs-time">{_esc(time)}</span>')  # noqa: S308

    @admin.display(description="created")
    def created(self, obj: Session) -> str:  # noqa: D102
        return console.utc(obj.created_at)

    @admin.display(description="ended")
    def ended(self, obj: Session) -> str:  # noqa: D102
        return console.utc(obj.ended_at) or "-"

    @admin.display(description="last status")
    def last_status(self, obj: Session) -> str:  # noqa: D102
        return console.utc(obj.last_status_at) or "-"

    @admin.display(description="cost so far", ordering="cost_so_far")
    def cost(self, obj: Session) -> str:
        """Credits charged to the session so far (``console_selectors.with_cost_so_far``), as a person reads them
        (``console.figures.credits_display``; the exact figure on hover)."""
        value = getattr(obj, "cost_so_far", None)
        if value is None:
            value = console_selectors.cost_so_far(obj)
        return format_html('<span class="gs-credits" title="{} credits">{}</span>', value or 0, credits_display(value or 0))

    @admin.display(description="credits per hour")
    def rate(self, obj: Session) -> str:
        """What the live session costs per hour (``billing.selectors.session_hourly_cost``: the rate its usage is
        charged at), "-" once it ended."""
        if not obj.is_live:
            return "-"
        value = session_hourly_cost(obj)
        return format_html('<span class="gs-credits" id="session-rate" title="{} credits per hour">{} per hour</span>', value,
                           credits_display(value))

    @admin.display(description="URL")
    def url_link(self, obj: Session) -> str:
        """Where the session is served (the connect path at its cluster's session domain), as a link (the
        whole URL on hover; Open adds the connect token)."""
        url = session_url(obj)
        if not url:
            return "-"
        url = _esc(url)
        return mark_safe(f'<a href="{url}" title="{url}" class="gs-url" rel="noopener noreferrer">URL</a>')  # noqa: S308

    @admin.display(description="URL")
    def url_full(self, obj: Session) -> str:
        """The session's URL, whole, as a link (its page)."""
        url = session_url(obj)
        return format_html('<a href="{}" rel="noopener noreferrer">{}</a>', url, url) if url else "-"

    @admin.display(description="GPU devices")
    def gpu_devices(self, obj: Session) -> str:
        """The GPU UUIDs HAMi allocated, as the operator reported them."""
        return ", ".join(map(str, obj.devices or [])) or "-"

    @admin.action(description="Stop", permissions=["stop"])
    def stop(self, request, queryset):
        """Stop each selected session (idempotent), once confirmed: first the confirmation page listing them
        (``console.stop_confirmation``), whose form posts the same action with ``post=yes``."""
        if request.POST.get(console.CONFIRM_FIELD) != console.CONFIRM_VALUE:
            sessions = list(queryset.prefetch_related("volumes").order_by("pk"))
            hidden = [("action", "stop"), *((ACTION_CHECKBOX_NAME, str(session.pk)) for session in sessions)]
            return console.stop_confirmation(self, request, sessions, hidden=hidden, cancel_url=request.get_full_path())
        for session in queryset:
            lifecycle.session_stop(session=session)
        self.message_user(request, f"{queryset.count()} session(s) stopping", messages.SUCCESS)


@admin.register(SuggestedImage)
class SuggestedImageAdmin(ConsoleModelAdmin):
    """Images suggested on the Start session form (staff keep the list; any other image may still be typed)."""

    list_display = ["image", "description", "position"]
    list_editable = ["description", "position"]
    search_fields = ["image", "description"]
    ordering = ["position", "image"]


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
