"""Console pages for API tokens and signing keys (secrets are never shown).

API tokens are also a researcher's page (**My API tokens**, ``console.access.OwnObjectsAdmin``): they list,
create and revoke their own tokens. A new token's text is shown once, on the page after creation: it is kept,
encrypted (``core.crypto``), in the login session only until that page has been rendered, and is never stored
elsewhere, logged or audited.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.cache import add_never_cache_headers

from console.access import OwnObjectsAdmin, is_researcher
from console.options import ReadOnlyModelAdmin
from core.crypto import decrypt_text, encrypt_text
from identity.models import ApiToken, SigningKey
from identity.tokens import api_token_create, api_token_revoke

#: Login-session key holding the just-created token (``{"pk": <ApiToken pk>, "text": <Fernet token of its text>}``).
#: Stored in login sessions, so its value outlives a release: a token created just before an upgrade is shown (and
#: removed from the session) by the page after it.
NEW_TOKEN_SESSION_KEY = "gshare.console.new_api_token"


class ApiTokenCreateForm(forms.ModelForm):
    """Creating a token names it only; it belongs to whoever creates it."""

    class Meta:
        model = ApiToken
        fields = ["name"]
        help_texts = {"name": "What the token is for (a laptop, a CI job...), shown in this list"}


@admin.register(ApiToken)
class ApiTokenAdmin(OwnObjectsAdmin, ReadOnlyModelAdmin):
    """API tokens: who, when; the token itself is never stored, its hash never shown. The Revoke action ends one and
    keeps its row. Staff see every user's tokens, read-only (they create theirs with ``manage.py create_api_token``);
    a researcher sees, creates (for themselves, the text shown once) and revokes their own (**My API tokens**)."""

    owner_lookup = "user"
    researcher_title = "My API tokens"
    researcher_order = 40
    researcher_can_add = True

    add_form_template = "admin/change_form.html"
    list_display = ["user", "name", "key_id", "created_at", "last_used_at", "revoked_at"]
    list_select_related = ["user"]
    fields = ["user", "name", "key_id", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = fields
    list_filter = ["revoked_at"]
    actions = ["revoke"]

    def get_list_display(self, request):  # noqa: D102
        return [name for name in self.list_display if name != "user"] if is_researcher(request.user) else self.list_display

    def get_form(self, request, obj=None, change=False, **kwargs):
        """The add page's form asks for a name only (the other fields are set by ``api_token_create``)."""
        if obj is None:
            kwargs["form"] = ApiTokenCreateForm
            kwargs["fields"] = ["name"]
        return super().get_form(request, obj, change, **kwargs)

    def get_fields(self, request, obj=None):  # noqa: D102
        return ["name"] if obj is None else super().get_fields(request, obj)

    def get_readonly_fields(self, request, obj=None):  # noqa: D102
        return [] if obj is None else super().get_readonly_fields(request, obj)

    def has_revoke_permission(self, request) -> bool:
        """Revoking changes the token: a researcher may revoke their own (the list holds only those), staff need the
        permission to change API tokens."""
        if is_researcher(request.user):
            return True
        return self.model_permission(request, "change")

    def add_view(self, request, form_url="", extra_context=None):
        """The add page, titled "Create API token", with a single Save button."""
        # One button: whatever is pressed, the next page is the one showing the token (response_add).
        context = {"title": "Create API token", "show_save_and_add_another": False, "show_save_and_continue": False}
        return super().add_view(request, form_url, {**context, **(extra_context or {})})

    def save_model(self, request, obj, form, change):
        """Create the token through ``api_token_create`` for the requesting user; its text goes, encrypted, to the
        login session for the next page (:meth:`created_view`) and nowhere else."""
        row, text = api_token_create(username=request.user.get_username(), name=form.cleaned_data["name"])
        for field in obj._meta.concrete_fields:
            setattr(obj, field.attname, getattr(row, field.attname))
        obj._state.adding = False
        request.session[NEW_TOKEN_SESSION_KEY] = {"pk": row.pk, "text": encrypt_text(text)}

    def response_add(self, request, obj, post_url_continue=None):
        """After creating: the page that shows the token's text, once."""
        return HttpResponseRedirect(reverse("admin:gshare_apitoken_created", args=[obj.pk], current_app=self.admin_site.name))

    def get_urls(self):
        """Django's URLs plus ``<id>/created/`` (the page after creation)."""
        created = path("<path:object_id>/created/", self.admin_site.admin_view(self.created_view), name="gshare_apitoken_created")
        return [created, *super().get_urls()]

    def created_view(self, request, object_id):
        """``<id>/created/``: the new token's text if this is the first time the page is shown after creating it;
        afterwards (a reload, another visit) only that it is no longer shown. Another user's token is 404 to a
        researcher; the page is never cached."""
        obj = self.get_object(request, object_id)
        if obj is None or not self.has_view_permission(request, obj):
            raise Http404("No such API token.")
        pending = request.session.get(NEW_TOKEN_SESSION_KEY)
        text = None
        if pending and pending.get("pk") == obj.pk:
            del request.session[NEW_TOKEN_SESSION_KEY]
            text = decrypt_text(pending["text"])
        context = {
            **self.admin_site.each_context(request),
            "title": "API token created" if text else "API token",
            "subtitle": None,
            "opts": self.opts,
            "token": obj,
            "token_text": text,
            "changelist_url": reverse("admin:gshare_apitoken_changelist", current_app=self.admin_site.name),
        }
        request.current_app = self.admin_site.name
        response = TemplateResponse(request, "admin/gshare/apitoken/created.html", context)
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke", permissions=["revoke"])
    def revoke(self, request, queryset):
        """Revoke each selected token."""
        for token in queryset:
            api_token_revoke(token=token)
        self.message_user(request, f"{queryset.count()} token(s) revoked", messages.SUCCESS)


@admin.register(SigningKey)
class SigningKeyAdmin(ReadOnlyModelAdmin):
    """Internal JWT signing keys: kid, status and public half only. Read-only: deleting a key would refuse every
    operator token it signed; keys rotate with ``manage.py rotate_signing_key`` and retire on their own."""

    list_display = ["kid", "status", "imported", "created_at", "retire_after", "retired_at"]
    fields = ["kid", "status", "imported", "public_key_pem", "created_at", "retire_after", "retired_at"]
    readonly_fields = fields
