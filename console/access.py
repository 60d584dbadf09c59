"""Who may use which console page: staff by their Django permissions, researchers (active users who are not staff)
only the pages made for them, and there only their own objects.

- The console site lets any active user log in (:meth:`console.site.ConsoleSite.has_permission`).
- A page for researchers mixes in :class:`OwnObjectsAdmin` and names the path to the owner (``owner_lookup``): a
  researcher's list, detail pages and actions see only rows they own; another user's object answers 404 (the
  admin's "does not exist" redirect is not used for them, so nothing tells whether the id exists), and so does an
  action POSTed with another user's row selected.
- Every other page keeps Django's permission checks: a researcher holds no model permission, so it answers 403.
- Their sidebar and index list only those pages, under their ``researcher_title`` (:func:`researcher_app_list`).
"""

from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.http import Http404
from django.urls import reverse

#: The name of the one sidebar/index section a researcher sees.
RESEARCHER_SECTION = "My gShare"


def is_researcher(user) -> bool:
    """An active, authenticated user who is not staff."""
    return bool(user and user.is_authenticated and user.is_active and not user.is_staff)


class ConsoleAuthenticationForm(AdminAuthenticationForm):
    """The console's login form: any active user may log in (staff and researchers, one address, one form).

    Unlike Django's admin form it does not refuse users who are not staff, and its error does not speak of a "staff
    account". An inactive user is refused with the same error as a wrong password (Django's ``ModelBackend`` does not
    authenticate them), so the form does not tell whether the account exists.
    """

    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "Please enter the correct %(username)s and password. Note that both fields may be case-sensitive.",
    }

    def confirm_login_allowed(self, user) -> None:
        """Refuse an inactive user only (``AuthenticationForm``'s rule), not users who are not staff."""
        AuthenticationForm.confirm_login_allowed(self, user)


class OwnObjectsAdmin:
    """Mixin (before the ``ModelAdmin`` base) for a page researchers use: they see and act on their own rows only.

    Attributes:
        owner_lookup: ORM path from the model to its owning user (``"owner"``, ``"account__user"``...).
        researcher_title: the page's name for researchers (``"My volumes"``): the list's title, the sidebar entry.
        researcher_order: where the page comes in their section (smaller first).
        researcher_can_add: whether a researcher may use the add page (the form must set the owner itself).
        researcher_can_change / researcher_can_delete: the same for change and delete of their own rows.

    A ``has_*_permission`` method defined on the admin class itself comes before this mixin's in the MRO: such a
    method must ask :func:`is_researcher` (or call ``super()``) itself.
    """

    owner_lookup: str = "owner"
    researcher_title: str = ""
    researcher_order: int = 100
    researcher_can_add: bool = False
    researcher_can_change: bool = False
    researcher_can_delete: bool = False

    def get_queryset(self, request):  # noqa: D102
        qs = super().get_queryset(request)
        if is_researcher(request.user):
            qs = qs.filter(**{self.owner_lookup: request.user})
        return qs

    def get_object(self, request, object_id, from_field=None):
        """The object, looked up in :meth:`get_queryset`; for a researcher, another user's (or a missing) object is 404."""
        obj = super().get_object(request, object_id, from_field)
        if obj is None and is_researcher(request.user):
            raise Http404("No such object.")
        return obj

    def researcher_fields(self, request, obj, names):
        """``names`` (a change page's fields or read-only fields) as a researcher sees them: without the owner (it is
        them) and with each foreign key shown as plain text, since Django links a read-only foreign key to the related
        object's change page, a staff page. Staff and the add page get ``names`` unchanged."""
        if obj is None or not is_researcher(request.user):
            return names
        owner = self.owner_lookup.split("__", 1)[0] if "__" not in self.owner_lookup else None
        return [self._as_text(name) for name in names if name != owner]

    def _as_text(self, name):
        if not isinstance(name, str):
            return name
        try:
            field = self.opts.get_field(name)
        except FieldDoesNotExist:
            return name
        if not (field.many_to_one or field.one_to_one) or not field.concrete:
            return name
        cache = self.__dict__.setdefault("_researcher_text_fields", {})
        if name not in cache:
            def show(obj, _name=name):
                value = getattr(obj, _name)
                return "-" if value is None else str(value)

            show.__name__ = name
            show.short_description = field.verbose_name
            cache[name] = show  # one callable per field: the change page matches fields to read-only fields by identity
        return cache[name]

    def get_fields(self, request, obj=None):  # noqa: D102
        return self.researcher_fields(request, obj, super().get_fields(request, obj))

    def get_readonly_fields(self, request, obj=None):  # noqa: D102
        return self.researcher_fields(request, obj, super().get_readonly_fields(request, obj))

    def _owns(self, request, obj) -> bool:
        if obj is None:
            return True
        if "__" not in self.owner_lookup:
            # The owner's key is on the row already: no query per permission check (a page asks several times).
            field = self.opts.get_field(self.owner_lookup)
            return getattr(obj, field.attname) == request.user.pk
        return self.get_queryset(request).filter(pk=obj.pk).exists()

    def changelist_view(self, request, extra_context=None):
        """The list; for a researcher titled ``researcher_title``, and an action POSTed with a row they do not own
        selected answers 404 (it would otherwise run on the rows left, silently)."""
        if is_researcher(request.user):
            if request.method == "POST" and request.POST.get("action"):
                selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
                try:
                    owned = self.get_queryset(request).filter(pk__in=selected).count()
                except (ValueError, TypeError, ValidationError):  # a pk the field cannot take
                    raise Http404("No such object.") from None
                if owned != len(set(selected)):
                    raise Http404("No such object.")
            if self.researcher_title:
                extra_context = {"title": self.researcher_title, **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    def has_module_permission(self, request) -> bool:  # noqa: D102
        return is_researcher(request.user) or super().has_module_permission(request)

    def has_view_permission(self, request, obj=None) -> bool:  # noqa: D102
        if is_researcher(request.user):
            return self._owns(request, obj)
        return super().has_view_permission(request, obj)

    def has_add_permission(self, request, *args) -> bool:  # noqa: D102
        if is_researcher(request.user):
            return self.researcher_can_add
        return super().has_add_permission(request, *args)

    def has_change_permission(self, request, obj=None) -> bool:  # noqa: D102
        if is_researcher(request.user):
            return self.researcher_can_change and self._owns(request, obj)
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:  # noqa: D102
        if is_researcher(request.user):
            return self.researcher_can_delete and self._owns(request, obj)
        return super().has_delete_permission(request, obj)


def researcher_app_list(site, request) -> list[dict]:
    """The sidebar/index app list of a researcher: one section (:data:`RESEARCHER_SECTION`) holding the
    :class:`OwnObjectsAdmin` pages they may view, named by ``researcher_title``, ordered by ``researcher_order``.

    Args:
        site: the ``AdminSite`` (its ``_build_app_dict`` keeps Django's permission checks).
        request: the researcher's request.

    Returns:
        ``[app_dict]`` in the shape of ``AdminSite.get_app_list`` (empty when no page is theirs).
    """
    entries = []
    for app in site._build_app_dict(request).values():
        for model in app["models"]:
            model_admin = site._registry.get(model["model"])
            if not isinstance(model_admin, OwnObjectsAdmin):
                continue
            entries.append((model_admin.researcher_order, {**model, "name": model_admin.researcher_title or model["name"]}))
    if not entries:
        return []
    entries.sort(key=lambda entry: (entry[0], entry[1]["name"]))
    return [{
        "name": RESEARCHER_SECTION,
        "app_label": "my",
        "app_url": reverse("admin:index", current_app=site.name),
        "has_module_perms": True,
        "models": [model for _, model in entries],
    }]
