"""Changelist helpers for the console's big lists: the same page as Django's ``ChangeList``, fewer queries.

Django's ``ChangeList.get_results`` counts the filtered rows (the paginator), then counts every row again for the
search box's "(N total)" even when nothing narrows the list, and sorts the page's rows with every joined column.
:class:`LeanChangeList` counts once when no filter or search is in effect, takes a count its caller already has,
and sorts on the ordering's columns alone before reading the page's rows whole.
"""

from __future__ import annotations

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import InvalidPage
from django.db.models import QuerySet
from django.urls import reverse


class LeanChangeList(ChangeList):
    """A ``ChangeList`` whose :meth:`get_results` shows the same counts and rows with fewer, narrower queries.

    Subclasses may override :meth:`known_count` (the filtered rows' number, when another query of theirs already
    counted them) and :meth:`page_rows` (what to do with the page's rows once read).
    """

    def known_count(self, request) -> int | None:
        """The number of rows the filters and search keep, when already known (no COUNT query then); None here."""
        return None

    def _narrowed(self) -> bool:
        # Filters, search or a date drill-down: only then can the full count differ from the filtered one.
        return bool(self.has_active_filters or self.query or (self.date_hierarchy and self.date_hierarchy in str(self.params)))

    def get_results(self, request):
        """As Django's: ``result_count``, ``full_result_count``, ``result_list`` (a list: the page's rows in the
        list's order), ``paginator``, ``multi_page``, ``can_show_all``, ``show_admin_actions``.

        Raises:
            IncorrectLookupParameters: the page number is out of range (Django answers with the first page).
        """
        paginator = self.model_admin.get_paginator(request, self.queryset, self.list_per_page)
        known = self.known_count(request)
        if known is not None:
            paginator.__dict__["count"] = known  # Paginator.count is a cached_property: prime it
        result_count = paginator.count
        full_result_count = None
        if self.model_admin.show_full_result_count:
            full_result_count = self.root_queryset.count() if self._narrowed() else result_count
        can_show_all = result_count <= self.list_max_show_all
        multi_page = result_count > self.list_per_page
        if (self.show_all and can_show_all) or not multi_page:
            result_list = self.queryset._clone()
        else:
            try:
                page = paginator.validate_number(self.page_num)
            except InvalidPage as error:
                raise IncorrectLookupParameters from error
            bottom = (page - 1) * self.list_per_page
            result_list = self.queryset[bottom:bottom + self.list_per_page]
        self.result_count = result_count
        self.show_full_result_count = self.model_admin.show_full_result_count
        self.show_admin_actions = not self.show_full_result_count or bool(full_result_count)
        self.full_result_count = full_result_count
        self.result_list = self.page_rows(request, _read_page(result_list, self.page_queryset))
        self.can_show_all = can_show_all
        self.multi_page = multi_page
        self.paginator = paginator

    def page_queryset(self, qs: QuerySet) -> QuerySet:
        """The query reading the page's rows whole (by id), e.g. narrowed to the columns the page shows."""
        return qs

    def page_rows(self, request, rows: list) -> list:
        """The page's rows as the template reads them (here: unchanged)."""
        return rows

    def url_for_result(self, result) -> str:
        """As Django's (the row's change page), with one ``reverse`` per page rather than one per row."""
        pk = getattr(result, self.pk_attname)
        if not isinstance(pk, int):
            return super().url_for_result(result)
        if "_change_url" not in self.__dict__:
            name = f"admin:{self.opts.app_label}_{self.opts.model_name}_change"
            self._change_url = reverse(name, args=(0,), current_app=self.model_admin.admin_site.name).replace("/0/", "/{}/")
        return self._change_url.format(pk)


def _read_page(qs: QuerySet, page_queryset=lambda qs: qs) -> list:
    """The rows of ``qs`` (a page, ordered) in its order, in two steps when it joins other tables: their
    ids sorted on the ordering's columns alone (a narrow sort), then those rows whole with their joins and
    prefetches. Sorting every joined column of thousands of rows to keep a page of them cost more than both."""
    if not qs.query.select_related:
        return list(qs)
    # Also on a page that is the whole list: the same queries whatever the number of rows.
    ids = list(qs.values_list("pk", flat=True))
    if not ids:
        return []
    full = qs._chain()
    full.query.clear_limits()
    rows = {row.pk: row for row in page_queryset(full.order_by().filter(pk__in=ids))}
    return [rows[pk] for pk in ids if pk in rows]
