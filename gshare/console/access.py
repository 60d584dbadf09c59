"""Who may use which console page: staff by their Django permissions, researchers (active users who are not staff)
only the pages made for them, and there only their own objects.

- The console site lets any active user log in (:meth:`gshare.console.site.ConsoleSite.has_permission`).
- A page for researchers mixes in :class:`OwnObjectsAdmin` and names the path to the owner (``owner_lookup``): a
  researcher's list, detail pages and actions see only rows they own; another user's object answers 404 (the
  admin's "does not exist" redirect is not used for them, so nothing tells whether the id exists).
- Every other page keeps Django's permission checks: a researcher holds no model permission, so it answers 403.
"""

from __future__ import annotations

from django.http import Http404


def is_researcher(user) -> bool:
    """An active, authenticated user who is not staff."""
    return bool(user and user.is_authenticated and user.is_active and not user.is_staff)


class OwnObjectsAdmin:
    """Mixin (before the ``ModelAdmin`` base) for a page researchers use: they see and act on their own rows only.

    Attributes:
        owner_lookup: ORM path from the model to its owning user (``"owner"``, ``"account__user"``...).
        researcher_can_add: whether a researcher may use the add page (the form must set the owner itself).
        researcher_can_change / researcher_can_delete: the same for change and delete of their own rows.
    """

    owner_lookup: str = "owner"
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

    def _owns(self, request, obj) -> bool:
        if obj is None:
            return True
        return self.get_queryset(request).filter(pk=obj.pk).exists()

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
