"""The console's session pages beyond the list: the Start session form, Open, Stop, Extend, and the live status the
session page follows (``SessionAdmin.get_urls`` in ``console/pages/sessions/admin.py`` routes them).

Every one of them calls the same service as the API (``session_create_idempotent``, ``session_connect``,
``session_stop``, ``session_extend``); a refusal (``ApplicationError``) is shown with the API's ``code`` and sentence, never a 500.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from billing import admission
from console.figures import credits_display
from console.options import service_errors
from console.pages.sessions import activity as console_activity
from console.pages.sessions import selectors as console_selectors
from core.exceptions import ApplicationError
from sessions import create, idle, lifecycle, runtime, selectors, services
from sessions.gpu_models import MAX_GPU_MODEL_LENGTH
from sessions.manifests import session_url
from sessions.models import Session
from sessions.permissions import may_open_any_session, may_open_session
from sessions.queue import instead

#: Phases the session page keeps following (its status is polled until the session runs or ends).
FOLLOWED_PHASES = (Session.Phase.QUEUED, Session.Phase.PENDING, Session.Phase.SCHEDULED, Session.Phase.STARTING, Session.Phase.STOPPING)


def utc(value: datetime | None) -> str:
    """``2026-12-01 11:40:05 UTC`` (empty for None)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


class _AnyVolumeIds(forms.MultipleChoiceField):
    """The form lists the user's own volumes, but any id posted goes to the service, which answers
    ``volume_not_found`` for one that is not theirs (the API's refusal, rather than "not a valid choice")."""

    def valid_value(self, value) -> bool:
        """Any printable id of at most 64 characters (what a volume id column holds); the service says whose it is."""
        return isinstance(value, str) and 0 < len(value) <= 64 and value.isprintable()


class _AnyGpuModels(forms.MultipleChoiceField):
    """The form lists the models free now, but any name posted goes to the service, which resolves it against the
    whole fleet (``sessions.gpu_models``) and answers ``gpu_model_unknown`` for one it lacks."""

    def valid_value(self, value) -> bool:
        """Any printable name the service could read (its own checks say the rest)."""
        return isinstance(value, str) and 0 < len(value) <= MAX_GPU_MODEL_LENGTH and value.isprintable()


class StartSessionForm(forms.Form):
    """The Start session form: the fields of ``POST /api/v1/sessions`` and a per-form idempotency key.

    Ranges (GPUs, MiB, cores %) are checked by the service, as for the API, so its refusal and code are shown.
    """

    WHOLE, SHARE = "whole", "share"

    image = forms.CharField(max_length=512, help_text="A suggestion from the list, or any image reference.")
    name = forms.CharField(max_length=63, required=False, help_text="Optional label.")
    gpus = forms.IntegerField(label="GPUs", initial=1, help_text="How many GPUs (1 to 16).")
    share = forms.ChoiceField(
        label="Each GPU", choices=[(WHOLE, "Whole GPUs (each one yours alone)"), (SHARE, "A share of each GPU (HAMi)")],
        initial=WHOLE, widget=forms.RadioSelect,
    )
    gpu_memory_mib = forms.IntegerField(label="GPU memory (MiB per GPU)", required=False, max_value=2**31 - 1,
                                        help_text="For a share: MiB of each GPU's memory. Empty: all of it (priced as a whole GPU).")
    gpu_cores = forms.IntegerField(label="GPU cores (% of one GPU)", required=False,
                                   help_text="For a share: 1 to 100 percent of each GPU's cores, at least one HAMi slot (10 % when a GPU "
                                             "is split 10). Empty: all of them (priced as a whole GPU).")
    gpu_models = _AnyGpuModels(
        label="GPU model", required=False, widget=forms.CheckboxSelectMultiple,
        help_text="The models you accept (any of those ticked); none ticked: any model. Free: GPUs with nothing on them now.",
    )
    cluster = forms.CharField(required=False, max_length=100, widget=forms.Select, help_text="Automatic: placement picks a cluster with room.")
    volumes = _AnyVolumeIds(required=False, widget=forms.CheckboxSelectMultiple, help_text="Your volumes, mounted at /data/<volume name>.")
    # Text, not a DecimalField: the service checks the hours (sessions.runtime.hours_parse), so its refusal and code show.
    runtime_hours = forms.CharField(label="Time limit (hours)", required=False, max_length=32,
                                    widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 8}))
    # Text too: the service checks them (sessions.resources), so its refusal and code show.
    cpu = forms.CharField(label="CPU cores per session", required=False, max_length=32,
                          widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 8}))
    memory_gib = forms.CharField(label="Memory (GiB) per session", required=False, max_length=32,
                                 widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 8}))
    queue = forms.BooleanField(label="Wait in the queue when nothing is free", required=False, initial=True,
                               help_text="The session starts by itself when GPUs free; the page shows your place and when.")
    idempotency_key = forms.CharField(max_length=150, widget=forms.HiddenInput)

    def __init__(self, *args, owner, **kwargs):
        super().__init__(*args, **kwargs)
        self.owner = owner
        self.refusal: ApplicationError | None = None
        self.suggestions = console_selectors.suggested_images()
        self.fields["image"].widget.attrs.update({"list": "gs-suggested-images", "autocomplete": "off", "size": 60,
                                                  "placeholder": self.suggestions[0].image if self.suggestions else "quay.io/jupyter/base-notebook"})
        self.fields["gpus"].widget.attrs.update({"min": 1, "max": create.MAX_GPUS})
        self.fields["gpu_memory_mib"].widget.attrs.update({"min": 1, "step": 1})
        self.fields["gpu_cores"].widget.attrs.update({"min": 1, "max": 100})
        self.fields["cluster"].widget.choices = [("", "Automatic")] + [
            (c.public_id, f"{c.name}: {c.get_status_display().split(' (')[0].lower()}") for c in console_selectors.start_clusters()
        ]
        self.gpu_model_rows = console_selectors.start_gpu_models()
        memory = console_selectors.start_gpu_memory()
        self.fields["gpu_models"].choices = [
            (model, f"{model}: {free} of {total} free, {memory[model] + ' per GPU, ' if memory.get(model) else ''}"
                    f"{credits_display(price)} credits per GPU-hour") for model, free, total, price in self.gpu_model_rows
        ]
        self.fields["volumes"].choices = [
            (v.public_id, f"{v.name} ({v.quota_gb} GiB{', on ' + v.cluster.name if v.cluster_id else ''})")
            for v in console_selectors.start_volumes(owner=owner)
        ]
        policy = admission.policy_for(owner)
        limit = policy.max_runtime_hours
        self._resource_fields(policy)
        self.fields["runtime_hours"].help_text = (
            f"How long the session may hold its GPUs, from now: at most {limit.normalize():f} hours (your limit); empty: all of it. "
            "You are warned before the end and may extend it up to your limit." if limit else
            "How long the session may hold its GPUs, from now. Empty: no limit (your policy sets none).")
        if not self.is_bound:
            self.initial.setdefault("idempotency_key", uuid.uuid4().hex)
            if limit:
                self.initial.setdefault("runtime_hours", f"{limit.normalize():f}")

    def _resource_fields(self, policy) -> None:
        """CPU and memory: the policy's default per GPU × the GPUs filled in (``sessions.js`` follows the GPU count until
        the field is edited), its maximum per GPU in the help."""
        gpus = self.initial.get("gpus") or self.fields["gpus"].initial
        for name, default, most, unit in (("cpu", policy.default_cpu_per_gpu, policy.max_cpu_per_gpu, "cores"),
                                          ("memory_gib", policy.default_memory_gib_per_gpu, policy.max_memory_gib_per_gpu, "GiB")):
            per_gpu = f"{Decimal(default).normalize():f}"
            self.fields[name].widget.attrs.update({"data-gs-per-gpu": per_gpu})
            self.fields[name].help_text = (
                f"For the whole session (its pod's request and limit{', and /dev/shm gets half of it' if name == 'memory_gib' else ''}): "
                f"by default {per_gpu} {unit} per GPU × the GPUs, at most {Decimal(most).normalize():f} {unit} per GPU (your limit)."
                + (" Empty: the default." if default else " Empty: none asked."))
            if not self.is_bound and default:
                self.initial.setdefault(name, f"{(Decimal(default) * gpus).normalize():f}")

    def clean(self):  # noqa: D102
        data = super().clean()
        if data.get("share") == self.WHOLE:
            data["gpu_memory_mib"] = data["gpu_cores"] = None
        elif data.get("share") == self.SHARE and data.get("gpu_memory_mib") is None and data.get("gpu_cores") is None:
            self.add_error("gpu_memory_mib", "A share needs GPU memory (MiB), GPU cores (%), or both; or choose whole GPUs.")
        return data

    def request(self) -> dict:
        """The keyword arguments of ``session_create`` this (valid) form asks for."""
        data = self.cleaned_data
        return {
            "image": data["image"], "name": data.get("name") or "", "gpus": data["gpus"], "gpu_memory_mib": data["gpu_memory_mib"],
            "gpu_cores": data["gpu_cores"], "cluster": data.get("cluster") or None, "volumes": list(data.get("volumes") or []),
            "gpu_models": list(data.get("gpu_models") or []),
            "runtime_hours": (data.get("runtime_hours") or "").strip() or None,
            "cpu": (data.get("cpu") or "").strip() or None, "memory_gib": (data.get("memory_gib") or "").strip() or None,
            "queue": bool(data.get("queue")),
        }

    def start(self) -> Session | None:
        """Start the session (``session_create_idempotent`` with the form's key: a double submit gets the first
        session back). Returns the session, or None when the form is invalid or the service refused (``refusal``)."""
        if not self.is_valid():
            return None
        try:
            session, _ = create.session_create_idempotent(owner=self.owner, idempotency_key=self.cleaned_data["idempotency_key"],
                                                            **self.request())
        except ApplicationError as exc:
            self.refusal = exc
            return None
        return session


def _back(request, session: Session, admin) -> HttpResponseRedirect:
    """To the posted ``next`` (a console path) or the session's page."""
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        target = reverse(f"{admin.admin_site.name}:gpu_sessions_session_change", args=[session.pk])
    return HttpResponseRedirect(target)


def _session_or_404(admin, request, object_id: str) -> Session:
    # A researcher gets 404 for another user's session; staff for a missing one.
    session = admin.action_object(request, object_id)
    if session is None:
        raise Http404("No such session.")
    return session


def start_view(admin, request):
    """``<sessions>/start/``: the Start session form; on success, to the session's page."""
    if not admin.has_start_permission(request):
        raise PermissionDenied
    if request.method == "POST":
        form = StartSessionForm(request.POST, owner=request.user)
        session = form.start()
        if session is not None and session.phase == Session.Phase.QUEUED:
            estimate = f"expected to start at {utc(session.estimated_start)}" if session.estimated_start else "no estimate yet"
            messages.success(request, f"Nothing is free for session {session.public_id} now: it waits in the queue at position "
                                      f"{session.queue_position} ({estimate}) and starts by itself; this page follows it.")
            return HttpResponseRedirect(reverse(f"{admin.admin_site.name}:gpu_sessions_session_change", args=[session.pk]))
        if session is not None:
            messages.success(request, f"Session {session.public_id} placed on {session.cluster.name if session.cluster else '-'}: "
                                      "this page follows it until it runs.")
            return HttpResponseRedirect(reverse(f"{admin.admin_site.name}:gpu_sessions_session_change", args=[session.pk]))
    else:
        form = StartSessionForm(owner=request.user)
    context = {
        **admin.admin_site.each_context(request),
        "opts": admin.opts, "title": "Start session", "form": form, "refusal": form.refusal,
        "list_title": admin.list_title(request), "media": admin.media + form.media,
    }
    return TemplateResponse(request, "admin/gpu_sessions/session/start.html", context)


def open_view(admin, request, object_id: str):
    """POST ``<session>/open/``: mint a connect link (``session_connect``) and send the browser there, to the
    session's own cluster hostname; refused (a message, back to the page) when the session does not run; 403
    without the right to open it (its owner, or ``may_open_any_session``: staff holding ``change_session``)."""
    session = _session_or_404(admin, request, object_id)
    if not may_open_session(request.user, session):  # a researcher's own session (another's is a 404 above)
        raise PermissionDenied
    try:
        url = services.session_connect(session=session, user=request.user)
    except ApplicationError as exc:
        admin.message_user(request, f"Cannot open {session.public_id} ({exc.code}): {exc.console_detail}", messages.ERROR)
        return _back(request, session, admin)
    response = HttpResponseRedirect(url)
    response["Cache-Control"] = "no-store"  # the link carries a token
    return response


#: The POST field (and value) that confirms a Stop, as Django's delete confirmation posts ``post=yes``.
CONFIRM_FIELD, CONFIRM_VALUE = "post", "yes"


def stop_consequences(session: Session) -> dict:
    """What stopping ``session`` ends, for the confirmation page: ``{"session", "gpus" (count), "gpus_text"
    (``"8 whole GPUs"`` / ``"2 shares of a GPU"``), "started" (UTC text or ""), "live" (False: already ended or
    stopping, nothing to lose), "volumes" (names of the volumes kept)}``."""
    if session.whole_gpus:
        gpus_text = f"{session.gpus} whole GPU{'s' if session.gpus != 1 else ''}"
    else:
        gpus_text = f"{session.gpus} share{'s' if session.gpus != 1 else ''} of a GPU"
    return {
        "session": session, "gpus": session.gpus, "gpus_text": gpus_text, "started": utc(session.started_at),
        "live": session.is_live and session.phase != Session.Phase.STOPPING,
        "volumes": [v.name for v in session.volumes.all()],
    }


def stop_confirmation(admin, request, sessions: list[Session], *, hidden: list[tuple[str, str]], cancel_url: str) -> TemplateResponse:
    """The Stop confirmation page (Django's delete-confirmation pattern: a form that posts ``post=yes`` back with
    ``hidden`` fields, a plain link back, no JavaScript needed): each session's GPUs, start and kept volumes, and
    what is lost (its processes and whatever it wrote outside its volumes)."""
    items = [stop_consequences(session) for session in sessions]
    context = {
        **admin.admin_site.each_context(request),
        "opts": admin.opts, "title": "Stop session?" if len(items) == 1 else f"Stop {len(items)} sessions?",
        "items": items, "gpus": sum(item["gpus"] for item in items if item["live"]), "hidden": hidden,
        "confirm_field": CONFIRM_FIELD, "confirm_value": CONFIRM_VALUE, "cancel_url": cancel_url,
        "list_title": admin.list_title(request),
    }
    return TemplateResponse(request, "admin/gpu_sessions/session/stop_confirmation.html", context)


def stop_view(admin, request, object_id: str):
    """``<session>/stop/``: GET, or a POST without ``post=yes`` (the Stop buttons of the list and the page), shows
    the confirmation page; a POST with ``post=yes`` calls ``session_stop`` (idempotent) and goes back to ``next``;
    403 without the right to stop sessions."""
    session = _session_or_404(admin, request, object_id)
    if not admin.has_stop_permission(request):
        raise PermissionDenied
    if request.method != "POST" or request.POST.get(CONFIRM_FIELD) != CONFIRM_VALUE:
        back = _back(request, session, admin)["Location"] if request.method == "POST" else \
            reverse(f"{admin.admin_site.name}:gpu_sessions_session_change", args=[session.pk])
        return stop_confirmation(admin, request, [session], hidden=[("next", back)], cancel_url=back)
    try:
        session = lifecycle.session_stop(session=session)
    except ApplicationError as exc:
        admin.message_user(request, f"Cannot stop {session.public_id} ({exc.code}): {exc.console_detail}", messages.ERROR)
        return _back(request, session, admin)
    admin.message_user(request, f"Session {session.public_id} is {session.phase}.", messages.SUCCESS)
    return _back(request, session, admin)


def by_id_view(admin, request, public_id: str):
    """GET ``<sessions>/ended/<public id>/``: the link of the "session ended" page a cluster shows for a stopped
    session's URL (``sessions.ended``), to the session's page, which says when it ended, why and who stopped it; 404
    for a session this user may not see (a researcher's other sessions, as their pages) and for an unknown id."""
    session = admin.plain_queryset(request).filter(public_id=public_id[:64]).values_list("pk", flat=True).first()
    if session is None:
        raise Http404("No such session.")
    return HttpResponseRedirect(reverse(f"{admin.admin_site.name}:gpu_sessions_session_change", args=[session]))


def status_view(admin, request, object_id: str):
    """GET ``<session>/status/``: what the session page follows: ``{"id", "phase", "message", "node", "url",
    "started_at", "ended_at", "follow", "can_open", "can_stop", "queue_position", "estimated_start", "waiting_for"}``
    (times UTC); 403 without the right to view it."""
    session = _session_or_404(admin, request, object_id)
    if not admin.has_view_permission(request, session):
        raise PermissionDenied
    actions = admin.session_rights(request).actions(session)
    return JsonResponse({
        "id": session.public_id, "phase": session.phase, "message": session.message, "node": session.node,
        "url": session_url(session), "started_at": utc(session.started_at), "ended_at": utc(session.ended_at),
        "follow": session.phase in FOLLOWED_PHASES, "can_open": actions.open, "can_stop": actions.stop,
        "queue_position": session.queue_position, "estimated_start": utc(session.estimated_start), "waiting_for": session.waiting_for,
    }, headers={"Cache-Control": "no-store"})


def may_exempt(user, session: Session) -> bool:
    """Whether the session page offers ``user`` the idle exemption form: a live session, and a user who may open any
    session (``sessions.idle.session_idle_exempt``'s own rule; researchers never see the form)."""
    return session.is_live and may_open_any_session(user)


class IdleExemptionForm(forms.Form):
    """Exempt a session from the idle policy until a time (UTC), for a reason; or end the exemption (the
    ``end`` button). ``clean`` calls ``sessions.idle.session_idle_exempt``; its refusal is shown on the form."""

    until = forms.DateTimeField(
        label="Until (UTC)", required=False, input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="When the exemption ends, at most a year ahead.",
    )
    reason = forms.CharField(max_length=500, required=False, help_text="Why the session may stay idle (audited).")

    def __init__(self, *args, session: Session | None = None, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.session, self.user = session, user
        self.ending = bool(self.data.get("end"))
        self.activity = None

    def clean(self):  # noqa: D102
        data = super().clean()
        if self.errors:
            return data
        until = None if self.ending else data.get("until")
        if not self.ending and until is None:
            self.add_error("until", "Say until when, e.g. tomorrow 18:00 UTC; or end the exemption.")
            return data
        if until is not None:
            until = until.astimezone(UTC)  # the form's time zone is UTC (settings.TIME_ZONE)
        with service_errors(self):
            self.activity = idle.session_idle_exempt(session=self.session, user=self.user, until=until,
                                                     reason="" if self.ending else data.get("reason") or "")
        return data


def idle_exemption_view(admin, request, object_id: str):
    """``<session>/idle-exemption/``: GET the exemption form, POST it (``session_idle_exempt``): back to the
    session's page with a message, or the form again with the service's refusal; 403 for a user who may not exempt
    (a researcher's other sessions are a 404, as on their page)."""
    session = _session_or_404(admin, request, object_id)
    if not may_open_any_session(request.user):
        raise PermissionDenied
    if request.method == "POST":
        form = IdleExemptionForm(request.POST, session=session, user=request.user)
        if form.is_valid():
            row = form.activity
            if row.exempt_until and row.exempt_reason:  # an ended exemption keeps its moment, without a reason
                text = f"Session {session.public_id} is exempt from the idle policy until {console_activity.utc(row.exempt_until)}."
            else:
                text = f"Session {session.public_id} is no longer exempt from the idle policy."
            admin.message_user(request, text, messages.SUCCESS)
            return HttpResponseRedirect(reverse(f"{admin.admin_site.name}:gpu_sessions_session_change", args=[session.pk]))
    else:
        form = IdleExemptionForm(session=session, user=request.user)
    context = {
        **admin.admin_site.each_context(request),
        "opts": admin.opts, "title": f"Idle policy exemption of {session.public_id}", "form": form, "session": session,
        "list_title": admin.list_title(request),
    }
    return TemplateResponse(request, "admin/gpu_sessions/session/idle_exemption.html", context)


def may_extend(user, session: Session) -> bool:
    """Whether the session page offers ``user`` the Extend form: a live session, not stopping, with a time limit, and
    its owner or a user who may open any session (``sessions.runtime.session_extend``'s own rule)."""
    return session.offers_stop and session.ends_at is not None and (session.owner_id == user.pk or may_open_any_session(user))


def time_limit_view(session: Session, *, user, now: datetime) -> dict | None:
    """What the session page's Time limit section shows, or None for a session without one or no longer live:
    ``ends_at`` (UTC text), ``warning`` (the policy's ``runtime_warning_minutes`` before it, as the API's
    ``ends_soon``), ``max_hours`` (the owner's ``max_runtime_hours``), ``can_extend``, ``staff`` (extends past the policy)."""
    if session.ends_at is None or not session.offers_stop:
        return None
    policy = admission.policy_for(session.owner)
    return {"ends_at": utc(session.ends_at), "warning": runtime.runtime_warning(session=session, policy=policy, now=now),
            "max_hours": policy.max_runtime_hours, "can_extend": may_extend(user, session), "staff": may_open_any_session(user)}


def extend_view(admin, request, object_id: str):
    """POST ``<session>/extend/`` with ``hours``: ``session_extend`` (audited), then back to the session's page with its
    new end, or with the service's refusal (its code and sentence) as an error message."""
    session = _session_or_404(admin, request, object_id)
    try:
        session = runtime.session_extend(session=session, user=request.user, hours=request.POST.get("hours", ""))
    except ApplicationError as exc:
        admin.message_user(request, f"Cannot extend {session.public_id} ({exc.code}): {exc.console_detail}", messages.ERROR)
        return _back(request, session, admin)
    admin.message_user(request, f"Session {session.public_id} now ends at {utc(session.ends_at)}.", messages.SUCCESS)
    return _back(request, session, admin)


def queue_view(session: Session) -> dict | None:
    """What a queued session's page shows (``queue.html``): position, estimate, why it waits, the alternatives; None for
    a session not queued."""
    if session.phase != Session.Phase.QUEUED:
        return None
    return {"position": session.queue_position, "estimated_start": utc(session.estimated_start), "waiting_for": session.waiting_for,
            "queued_at": utc(session.queued_at), "expires_at": utc(session.queue_expires_at),
            "alternatives": list(enumerate(session.alternatives or []))}


def alternative_view(admin, request, object_id: str):
    """POST ``<session>/alternative/``: start the queued session's alternative number ``index`` instead
    (``sessions.queue.instead.alternative_take``), to the new session's page; a refusal is shown on this page."""
    session = _session_or_404(admin, request, object_id)
    try:
        index = int(request.POST.get("index", ""))
    except ValueError:
        index = -1
    try:
        started = instead.alternative_take(session=session, index=index, user=request.user)
    except ApplicationError as exc:
        messages.error(request, exc.console_detail)
        return HttpResponseRedirect(reverse(f"{admin.admin_site.name}:gpu_sessions_session_change", args=[session.pk]))
    messages.success(request, f"Started {started.public_id} instead of {session.public_id}, which left the queue.")
    return HttpResponseRedirect(reverse(f"{admin.admin_site.name}:gpu_sessions_session_change", args=[started.pk]))


def queue_page(admin, request):
    """GET ``<sessions>/queue/``: the fleet's queue in order (staff: everyone's; a researcher: their own), with position,
    owner, request, estimate and why each waits."""
    rows = list(selectors.queue_list(user=request.user).select_related(None).select_related("owner", "requested_cluster"))
    context = {**admin.admin_site.each_context(request), "opts": admin.opts, "title": "Queue", "rows": rows,
               "list_title": admin.list_title(request)}
    return TemplateResponse(request, "admin/gpu_sessions/session/queue.html", context)
