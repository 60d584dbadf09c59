"""``{% console_result_list cl %}``: Django's ``{% result_list cl %}`` (the same table, the same HTML) with each
column resolved once per page instead of once per cell (``{% load console_list %}``).

Django's ``items_for_result`` looks every cell's column up again (a model field lookup that raises for each admin
method, the empty value, the CSS classes, ``format_html`` twice); on a 50-row, 12-column list that was most of the
page's render time. Lists with inline editing or in a popup keep Django's tag as it is.
"""

from __future__ import annotations

import datetime
import html

from django import template
from django.contrib.admin.templatetags import admin_list
from django.contrib.admin.templatetags.admin_urls import add_preserved_filters
from django.contrib.admin.utils import FieldIsAForeignKeyColumnName, _get_non_gfk_field, display_for_field, display_for_value
from django.core.exceptions import FieldDoesNotExist, ObjectDoesNotExist
from django.db import models
from django.urls import NoReverseMatch
from django.utils.safestring import mark_safe

register = template.Library()


def _escaped(value) -> str:
    """Django's ``conditional_escape`` without its lazy-string wrapper: safe strings as they are, the rest escaped."""
    if hasattr(value, "__html__"):
        return str(value.__html__())
    return html.escape(str(value))


def _column_plan(cl) -> list[tuple] | None:
    """Per column: ``(tag, classes, linked, kind, target, empty)`` as ``items_for_result`` would work them out for
    every cell; None when a column is of a kind this does not cover (then Django's tag renders the list)."""
    if cl.formset or cl.is_popup:
        return None
    model_admin, opts = cl.model_admin, cl.lookup_opts
    base_empty = model_admin.get_empty_value_display()
    plan, first = [], True
    for index, name in enumerate(cl.list_display):
        classes = f"field-{admin_list._coerce_field_name(name, index)}"
        if cl.list_display_links is None:
            linked = False
        else:
            linked = (first and not cl.list_display_links) or name in cl.list_display_links
        try:
            field = _get_non_gfk_field(opts, name)
        except (FieldDoesNotExist, FieldIsAForeignKeyColumnName):
            if callable(name):
                attr = name
            elif isinstance(name, str) and name != "__str__" and hasattr(model_admin, name):
                attr = getattr(model_admin, name)
            else:
                return None  # a model attribute or a lookup path: Django's own rules
            if getattr(attr, "boolean", False):
                return None
            kind, target, empty = "call", attr, getattr(attr, "empty_value_display", base_empty)
            if name == "action_checkbox":
                classes = "action-checkbox"
        else:
            if field.auto_created:
                return None
            kind = "fk" if isinstance(field.remote_field, models.ManyToOneRel) else "field"
            target, empty = field, base_empty
            if isinstance(field, models.DateField | models.TimeField | models.ForeignKey):
                classes += " nowrap"
        tag = "td"
        if linked:
            tag, first = ("th" if first else "td"), False
        plan.append((tag, classes, linked, kind, target, empty))
    return plan


def _cells(cl, plan, result) -> list[str]:
    cells = []
    for tag, classes, linked, kind, target, empty in plan:
        nowrap = ""
        try:
            if kind == "call":
                value = target(result)
                if isinstance(value, str) and value.strip() == "":
                    value = ""
                shown = display_for_value(value, empty, False)
                if isinstance(value, datetime.date | datetime.time):
                    nowrap = " nowrap"
            elif kind == "fk":
                related = getattr(result, target.name)
                shown = empty if related is None else related
            else:
                value = getattr(result, target.name)
                if isinstance(value, str) and value.strip() == "":
                    value = ""
                shown = display_for_field(value, target, empty, avoid_link=linked)
        except ObjectDoesNotExist:
            shown = empty
        text = _escaped(shown)
        if linked:
            try:
                url = cl.url_for_result(result)
            except NoReverseMatch:
                pass
            else:
                url = add_preserved_filters({"preserved_filters": cl.preserved_filters, "opts": cl.opts}, url)
                text = f'<a href="{_escaped(url)}">{text}</a>'
        cells.append(mark_safe(f'<{tag} class="{classes}{nowrap}">{text}</{tag}>'))  # noqa: S308 - every value escaped
    return cells


@register.inclusion_tag("admin/change_list_results.html")
def console_result_list(cl):
    """Django's ``result_list`` context (headers, hidden fields, rows), the rows built by :func:`_cells`."""
    plan = _column_plan(cl)
    if plan is None:
        return admin_list.result_list(cl)
    headers = list(admin_list.result_headers(cl))
    return {
        "cl": cl,
        "result_hidden_fields": list(admin_list.result_hidden_fields(cl)),
        "result_headers": headers,
        "num_sorted_fields": sum(1 for h in headers if h["sortable"] and h["sorted"]),
        "results": [admin_list.ResultList(None, _cells(cl, plan, result)) for result in cl.result_list],
    }
