"""Base classes of the console's pages and forms: refusals of the services become form errors, never a 500, and
read-only records offer no way to change or delete them.

- :class:`ConsoleModelAdmin`: every console page. A POSTed action the user may not run (``delete_selected`` where
  deleting is refused, an action that needs a permission they lack) answers 403 instead of Django's "No action
  selected"; an ``ApplicationError`` raised while saving or deleting (a race the form's check could not see) rolls
  the whole change back and comes back as an error message.
- :class:`ReadOnlyModelAdmin`: records the console only shows (inventory rows, the ledger, usage samples, ...): no add,
  change or delete permission, a change page without a submit row, no delete action.
- :func:`service_errors`: run a service's check inside a form's ``clean`` and show its refusal on the form.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseRedirect

from core.exceptions import ApplicationError


@contextmanager
def service_errors(form: forms.BaseForm, *, field: str | None = None) -> Iterator[None]:
    """Run a service call inside ``form.clean()`` and turn its refusal into form errors (nothing raised).

    Args:
        form: the form being cleaned.
        field: the form field an ``ApplicationError`` belongs to (None: shown above the form).

    ``ApplicationError`` becomes an error with its ``detail`` (the API's sentence) and ``code``; a Django
    ``ValidationError`` from the service's ``full_clean`` goes on the fields it names, or above the form (prefixed
    with the field's name) for a field the form does not show.
    """
    try:
        yield
    except ApplicationError as exc:
        form.add_error(field if field in form.fields else None, ValidationError(exc.console_detail, code=exc.code))
    except ValidationError as exc:
        if not hasattr(exc, "error_dict"):
            form.add_error(field if field in form.fields else None, exc)
            return
        for name, errors in exc.error_dict.items():
            if name in form.fields:
                form.add_error(name, errors)
            else:
                form.add_error(None, [f"{name}: {message}" if name != "__all__" else message for e in errors for message in e.messages])


class ConsoleModelAdmin(admin.ModelAdmin):
    """Base of every console page (see the module docstring)."""

    def changelist_view(self, request, extra_context=None):
        """Refuse (403) a POSTed action that is not offered to this user; otherwise Django's changelist."""
        if request.method == "POST":
            offered = self.get_actions(request)
            posted = [name for name in request.POST.getlist("action") if name]
            if any(name not in offered for name in posted):
                raise PermissionDenied
        try:
            return super().changelist_view(request, extra_context)
        except ApplicationError as exc:
            return self._refused(request, exc)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        """Django's add/change page; a refusal while saving rolls back (the view's transaction) and is shown."""
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ApplicationError as exc:
            return self._refused(request, exc)

    def delete_view(self, request, object_id, extra_context=None):
        """Django's delete page; a refusal of the delete service rolls back and is shown."""
        try:
            return super().delete_view(request, object_id, extra_context)
        except ApplicationError as exc:
            return self._refused(request, exc)

    def _refused(self, request, exc: ApplicationError):
        # Outside the view's atomic block: whatever the failed save or delete wrote is already rolled back.
        self.message_user(request, exc.console_detail, messages.ERROR)
        return HttpResponseRedirect(request.get_full_path())


class ReadOnlyModelAdmin(ConsoleModelAdmin):
    """A record the console only shows: no add, change or delete (the change page renders read-only, without a
    submit row; the changelist has no delete action; POSTs to the change and delete URLs answer 403).

    Actions that change state through a service declare their own permission (``has_<name>_permission``), since the
    change permission is always False here.
    """

    change_form_template = "admin/console/read_only_change_form.html"

    def has_add_permission(self, request, obj=None) -> bool:  # noqa: D102
        return False

    def has_change_permission(self, request, obj=None) -> bool:  # noqa: D102
        return False

    def has_delete_permission(self, request, obj=None) -> bool:  # noqa: D102
        return False

    def model_permission(self, request, action: str) -> bool:
        """Whether the user holds the model's Django permission ``action`` (``"change"``, ...), for actions that
        call a service (e.g. Stop on sessions)."""
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.{action}_{opts.model_name}")
