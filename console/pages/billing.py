"""Console pages for credits: accounts (read-only balances, a "Grant credits" action), the read-only ledger, usage
samples, prices and policies. Every change goes through the billing services, so the console and the API share one
validation."""

from __future__ import annotations

import uuid
from datetime import UTC

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count
from django.template.response import TemplateResponse

from billing import admission, selectors, services
from billing.models import CreditAccount, LedgerEntry, Policy, Price, UsageSample
from clusters.models import Cluster
from console.access import OwnObjectsAdmin, is_researcher
from console.options import ConsoleModelAdmin, ReadOnlyModelAdmin, service_errors
from console.scope import ClusterScopedAdmin
from core.exceptions import ApplicationError


def _actor(request) -> str:
    """``console:<username>``: who wrote a ledger entry from the console."""
    return f"console:{request.user.get_username()}"


class GrantCreditsForm(forms.Form):
    """The "Grant credits" action's form. ``idempotency_key`` is generated when the page is shown, so submitting the
    same page twice (a double click, a browser retry) grants once."""

    # Text, not a DecimalField: ``parse_amount`` judges it, so the console refuses what the grants API refuses, in its words.
    amount = forms.CharField(max_length=60, help_text="Credits for each selected account, > 0, at most 6 decimal places")
    reason = forms.CharField(max_length=500, help_text="Why (shown in the ledger)")
    idempotency_key = forms.CharField(max_length=100, widget=forms.HiddenInput)

    def clean_amount(self):  # noqa: D102
        try:
            return services.parse_amount(self.cleaned_data["amount"])
        except ApplicationError as exc:
            raise ValidationError(exc.console_detail, code=exc.code) from None


class CreditAccountForm(forms.ModelForm):
    """Adding an account names only its user (the balance moves only through ledger entries)."""

    class Meta:
        model = CreditAccount
        fields = ["user"]


def _prices_for_people(prices: dict) -> dict:
    """``billing.selectors.price_list()`` with each model's memory in GiB (one decimal) for *My credits*."""
    for row in prices["models"]:
        row["memory_gib"] = f"{row['memory_mib'] / 1024:.1f}".removesuffix(".0")
    return prices


@admin.register(CreditAccount)
class CreditAccountAdmin(OwnObjectsAdmin, ConsoleModelAdmin):
    """Accounts: balance (read-only: it moves only through the ledger), the usage accrued in open billing periods, when
    balance − accrued went below zero; grant credits.

    A researcher's **My credits** (the list's address): their balance, holds, available credits, burn per hour, their
    policy's limits and their ledger entries, read-only (:meth:`my_credits_view`)."""

    owner_lookup = "user"
    researcher_title = "My credits"
    researcher_order = 30
    #: Ledger entries per page of *My credits*.
    my_ledger_page_size = 50

    form = CreditAccountForm
    list_display = ["user", "balance", "accrued", "below_zero_since", "created_at"]
    list_select_related = ["user"]
    list_filter = [("below_zero_since", admin.EmptyFieldListFilter)]
    search_fields = ["user__username", "user__email"]
    ordering = ["user__username", "id"]
    readonly_fields = ["balance", "accrued", "below_zero_since", "created_at"]
    actions = ["grant_credits"]

    def changelist_view(self, request, extra_context=None):
        """Staff: Django's list of accounts. A researcher: :meth:`my_credits_view` (a POST, as no action is offered
        to them, answers 403)."""
        if is_researcher(request.user):
            if request.method != "GET":
                raise PermissionDenied
            return self.my_credits_view(request)
        return super().changelist_view(request, extra_context)

    def my_credits_view(self, request):
        """*My credits*: ``billing.selectors.account_summary`` (balance, holds, available, burn per hour), the policy
        that applies (``billing.admission.policy_for``) and ``billing.selectors.ledger_list`` newest first, paged by
        ``?p=`` (a constant number of queries per page)."""
        user = request.user
        summary = selectors.account_summary(user)
        policy = admission.policy_for(user)
        allowed = None
        if policy.allowed_clusters is not None:
            allowed = list(Cluster.objects.filter(pk__in=policy.allowed_clusters).order_by("name").values_list("name", flat=True))
        paginator = Paginator(selectors.ledger_list(user=user), self.my_ledger_page_size)
        page = paginator.get_page(request.GET.get("p"))
        context = {
            **self.admin_site.each_context(request),
            "title": self.researcher_title,
            "subtitle": None,
            "opts": self.opts,
            "summary": summary,
            "prices": _prices_for_people(selectors.price_list()),
            "policy": policy,
            "allowed_clusters": allowed,
            "page": page,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/billing/creditaccount/my_credits.html", context)

    def get_fields(self, request, obj=None):  # noqa: D102
        return ["user"] if obj is None else self.researcher_fields(request, obj, ["user", "balance", "accrued", "below_zero_since",
                                                                                  "created_at"])

    def get_readonly_fields(self, request, obj=None):  # noqa: D102
        return self.readonly_fields if obj is None else self.researcher_fields(request, obj, ["user", *self.readonly_fields])

    def has_change_permission(self, request, obj=None) -> bool:
        """Accounts are read-only: credits move with the *Grant credits* action (or ``POST /api/v1/billing/grants``)."""
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        """Accounts are kept: the ledger refers to them."""
        return False

    def has_grant_permission(self, request) -> bool:
        """Granting writes a ledger entry: it needs the permission to add ledger entries."""
        return request.user.has_perm("billing.add_ledgerentry")

    def save_model(self, request, obj, form, change):
        """Create the account through ``account_for`` (zero balance; nothing happens when the user has one)."""
        account = services.account_for(form.cleaned_data["user"])
        obj.pk, obj.balance, obj.created_at = account.pk, account.balance, account.created_at
        obj._state.adding = False

    @admin.action(description="Grant credits", permissions=["grant"])
    def grant_credits(self, request, queryset):
        """Ask for an amount and a reason (an intermediate page), then ``credit_grant`` for each selected account."""
        accounts = list(queryset.select_related("user").order_by("pk"))
        if "apply" in request.POST:
            form = GrantCreditsForm(request.POST)
            if form.is_valid():
                data = form.cleaned_data
                for account in accounts:
                    try:
                        entry, created = services.credit_grant(
                            user=account.user, amount=data["amount"], reason=data["reason"],
                            idempotency_key=f"console:{data['idempotency_key']}:{account.user_id}", created_by=_actor(request),
                        )
                    except ApplicationError as exc:
                        self.message_user(request, f"{account.user}: {exc.console_detail}", messages.ERROR)
                        continue
                    verb = "granted" if created else "already granted by this form (nothing more)"
                    self.message_user(request, f"{account.user}: {entry.amount} credits {verb}; balance {entry.balance_after}.",
                                      messages.SUCCESS if created else messages.WARNING)
                return None
        else:
            form = GrantCreditsForm(initial={"idempotency_key": uuid.uuid4().hex})
        return TemplateResponse(request, "admin/billing/creditaccount/grant_credits.html", {
            **self.admin_site.each_context(request),
            "title": "Grant credits",
            "opts": self.model._meta,
            "form": form,
            "accounts": accounts,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        })


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ClusterScopedAdmin, ReadOnlyModelAdmin):
    """The ledger: read-only (append-only; entries are written by grants, usage ingestion and the billing period close
    only, and never changed or deleted); a charge names its billing period and how many samples it covers. Narrowed to
    a cluster: the entries of its sessions (grants and other entries without a session are hidden then)."""

    cluster_lookup = "session__cluster"
    # A bill's columns; the usage windows, GPU-seconds and author are on each entry's page.
    list_display = ["id", "created_at", "account", "kind", "amount", "balance_after", "session", "period", "sample_count", "idle",
                    "reason"]
    list_select_related = ["account__user", "session"]
    list_filter = ["kind", "created_at"]
    search_fields = ["idempotency_key", "account__user__username", "session__public_id", "reason", "created_by"]
    show_full_result_count = False

    @admin.display(description="billing period", ordering="period_start")
    def period(self, obj: LedgerEntry) -> str:
        """Charges of a period: ``YYYY-MM-DD HH:MM–HH:MM UTC`` (the end's date too when it is another day); else empty."""
        if obj.period_start is None or obj.period_end is None:
            return ""
        start, end = obj.period_start.astimezone(UTC), obj.period_end.astimezone(UTC)
        until = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
        return f"{start:%Y-%m-%d %H:%M}–{until} UTC"

    @admin.display(description="idle credits", ordering="idle_credits")
    def idle(self, obj: LedgerEntry) -> str:
        """End entries (a session the idle policy stopped): the credits it burned while idle; empty ("-") for other kinds."""
        if obj.kind != LedgerEntry.Kind.END or obj.idle_credits is None:
            return ""
        return format(obj.idle_credits, "f")


@admin.register(UsageSample)
class UsageSampleAdmin(ClusterScopedAdmin, ReadOnlyModelAdmin):
    """Usage samples as the operators reported them (``POST /internal/v1/usage``), and the held time no sample covered
    (``gap``, ``billing.held``), with their price share and cost; read-only: they are the evidence of what was charged."""

    list_display = ["sample_id", "cluster", "session", "device_uuid", "gpu_model", "start", "end", "share", "cost", "billing_period",
                    "gap", "entry_id", "received_at"]
    list_select_related = ["cluster", "session"]
    list_filter = ["cluster", "gap"]
    search_fields = ["sample_id", "session__public_id", "device_uuid"]
    show_full_result_count = False


class PriceForm(forms.ModelForm):
    """The price form: ``clean`` runs ``billing.services.price_validate`` (the checks of ``price_set``)."""

    # Text, not a DecimalField: ``parse_amount`` judges it (the same refusal, in the same words, as ``price_set``).
    credits_per_gpu_hour = forms.CharField(max_length=60, help_text="Credits per GPU-hour, >= 0, at most 6 decimal places")

    class Meta:
        model = Price
        fields = ["gpu_model", "credits_per_gpu_hour"]

    def clean(self):  # noqa: D102
        data = super().clean()
        if self.errors:
            return data
        gpu_model = self.instance.gpu_model if self.instance.pk else data.get("gpu_model") or ""
        with service_errors(self, field="credits_per_gpu_hour"):
            candidate = services.price_validate(price=Price(pk=self.instance.pk, gpu_model=gpu_model,
                                                            credits_per_gpu_hour=data["credits_per_gpu_hour"]))
            data["credits_per_gpu_hour"] = candidate.credits_per_gpu_hour
        return data


class _PriceAndPolicyAdmin(ConsoleModelAdmin):
    """Saves and deletes through the billing services (``save_model`` / ``delete_model`` / ``delete_queryset``)."""

    def save_related(self, request, form, formsets, change):
        """The service set every field, ``allowed_clusters`` included; nothing else is related."""

    def _adopt(self, obj, saved) -> None:
        """Make the admin's unsaved ``obj`` the row the service saved (its redirect and log entry need the pk)."""
        for field in obj._meta.concrete_fields:
            setattr(obj, field.attname, getattr(saved, field.attname))
        obj._state.adding = False

    def delete_queryset(self, request, queryset):
        """The changelist's delete action: each row through ``delete_model``."""
        for obj in queryset:
            self.delete_model(request, obj)


@admin.register(Price)
class PriceAdmin(_PriceAndPolicyAdmin):
    """Credits per GPU-hour per GPU model (the model as inventory reports it); the row without a model is the default.
    Saved through ``price_set``, deleted through ``price_delete``."""

    form = PriceForm
    list_display = ["model", "credits_per_gpu_hour", "updated_at"]
    search_fields = ["gpu_model"]

    def get_readonly_fields(self, request, obj=None):
        """A price belongs to its model: the model is named when adding, then fixed (add a row for another model)."""
        return ["gpu_model", "updated_at"] if obj is not None else []

    def save_model(self, request, obj, form, change):  # noqa: D102
        self._adopt(obj, services.price_set(gpu_model=obj.gpu_model, credits_per_gpu_hour=form.cleaned_data["credits_per_gpu_hour"]))

    def delete_model(self, request, obj):  # noqa: D102
        services.price_delete(price=obj)

    @admin.display(description="GPU model", ordering="gpu_model")
    def model(self, obj: Price) -> str:
        """The model, or "(default)" for the default price."""
        return obj.gpu_model or "(default: every model without its own price)"


#: The policy fields the console edits (``allowed_clusters`` aside), as ``policy_set`` takes them.
_POLICY_FIELDS = ("max_sessions", "max_gpus", "max_volume_gb", "min_balance_hours", "grace_seconds", "idle_timeout_minutes", "idle_warning_minutes",
                  "max_runtime_hours", "runtime_warning_minutes", "default_cpu_per_gpu", "default_memory_gib_per_gpu", "max_cpu_per_gpu",
                  "max_memory_gib_per_gpu")


class PolicyForm(forms.ModelForm):
    """The policy form: ``clean`` runs ``billing.services.policy_validate`` (the checks of ``policy_set``)."""

    class Meta:
        model = Policy
        fields = ["user", "max_sessions", "max_gpus", "max_volume_gb", "allowed_clusters", "min_balance_hours", "grace_seconds", "idle_timeout_minutes",
                  "idle_warning_minutes", "max_runtime_hours", "runtime_warning_minutes", "default_cpu_per_gpu", "default_memory_gib_per_gpu",
                  "max_cpu_per_gpu", "max_memory_gib_per_gpu"]

    #: Fields a form may leave empty: they keep their default (forms and scripts made before them still save).
    _DEFAULTED = ("default_cpu_per_gpu", "default_memory_gib_per_gpu", "max_cpu_per_gpu", "max_memory_gib_per_gpu")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in self._DEFAULTED:
            if name in self.fields:
                self.fields[name].required = False
        seconds = settings.GSHARE_IDLE_POLICY_MINUTE_SECONDS
        if seconds != 60:  # a shortened minute (the demo): say so where the minutes are typed
            note = f" Here a policy minute lasts {seconds} s (GSHARE_IDLE_POLICY_MINUTE_SECONDS)."
            for name in ("idle_timeout_minutes", "idle_warning_minutes"):
                if name in self.fields:
                    self.fields[name].help_text = f"{self.fields[name].help_text}.{note}"

    def clean(self):  # noqa: D102
        data = super().clean()
        if self.errors:
            return data
        for name in self._DEFAULTED:
            if data.get(name) is None:
                data[name] = getattr(self.instance, name) if self.instance.pk else Policy._meta.get_field(name).get_default()
        user = self.instance.user if self.instance.pk else data.get("user")
        with service_errors(self):
            services.policy_validate(policy=Policy(pk=self.instance.pk, user=user, **{name: data.get(name) for name in _POLICY_FIELDS}))
        return data


@admin.register(Policy)
class PolicyAdmin(_PriceAndPolicyAdmin):
    """Limits per user; the policy without a user is the default for users without their own. Saved through
    ``policy_set``, deleted through ``policy_delete``."""

    form = PolicyForm
    list_display = ["owner", "max_sessions", "max_gpus", "max_volume_gb", "allowed", "min_balance_hours", "grace_seconds", "idle_timeout_minutes",
                    "idle_warning_minutes", "max_runtime_hours", "runtime_warning_minutes", "updated_at"]
    list_select_related = ["user"]
    search_fields = ["user__username"]
    filter_horizontal = ["allowed_clusters"]

    def get_queryset(self, request):  # noqa: D102
        return super().get_queryset(request).annotate(_allowed=Count("allowed_clusters"))

    def get_readonly_fields(self, request, obj=None):
        """A policy belongs to its user (or is the default): named when adding, then fixed."""
        return ["user", "updated_at"] if obj is not None else []

    def save_model(self, request, obj, form, change):  # noqa: D102
        data = form.cleaned_data
        saved = services.policy_set(user=obj.user, allowed_clusters=list(data.get("allowed_clusters") or []),
                                    **{name: data.get(name) for name in _POLICY_FIELDS})
        self._adopt(obj, saved)

    def delete_model(self, request, obj):  # noqa: D102
        services.policy_delete(policy=obj)

    @admin.display(description="user", ordering="user__username")
    def owner(self, obj: Policy) -> str:
        """The user, or "(default)"."""
        return obj.user.get_username() if obj.user_id else "(default: every user without their own)"

    @admin.display(description="allowed clusters", ordering="_allowed")
    def allowed(self, obj: Policy) -> str:
        """How many clusters are allowed ("all" when none is listed)."""
        return str(obj._allowed) if obj._allowed else "all"
