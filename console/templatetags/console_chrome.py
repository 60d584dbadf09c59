"""Template tags of the console's chrome: the Cluster selector's "narrowed to" line, list titles and breadcrumbs in
the navigation's words (``{% load console %}``)."""

from __future__ import annotations

from urllib.parse import urlencode

from django import template
from django.contrib import admin
from django.urls import reverse

from console.access import RESEARCHER_SECTION, is_researcher
from console.scope import PARAM, ClusterScopedAdmin, console_cluster, same_site_path
from console.site import nav_label, section_of

register = template.Library()


@register.simple_tag(takes_context=True)
def console_narrowed(context, cl):
    """The cluster the changelist ``cl`` is narrowed to, or None (not narrowed, or a list that does not narrow)."""
    request = context.get("request")
    if request is None or cl is None or not isinstance(cl.model_admin, ClusterScopedAdmin):
        return None
    return console_cluster(request)


@register.simple_tag(takes_context=True)
def console_all_clusters_url(context) -> str:
    """The current page with ``?cluster=all`` (the scope middleware stores it and comes back here without it), as a
    path the browser cannot read as another host (``same_site_path``); the page number is dropped, since the wider
    list pages differently."""
    request = context["request"]
    params = request.GET.copy()
    for name in (PARAM, "p"):
        params.pop(name, None)
    return f"{same_site_path(request)}?{urlencode([*params.lists(), (PARAM, ['all'])], doseq=True)}"


@register.simple_tag
def console_list_title(cl, title: str = "") -> str:
    """A changelist's title: the list's name in the navigation (``Node management``, ``Ledger entries``) in place of
    Django's "Select … to change"; a title the admin class passed, and a popup's "Select …", are kept."""
    if cl is None:
        return title
    if (not title or title == cl.title) and not cl.is_popup:
        return nav_label(cl.opts)
    return title or cl.title


@register.simple_tag(takes_context=True)
def console_crumbs(context, opts) -> dict:
    """The breadcrumbs above a model's pages in the navigation's words: ``{"section": {"name", "url"} or None,
    "label"}``, e.g. Resources › GPU management; for a researcher, their own section and the page's name there
    (My gShare › My volumes)."""
    request = context.get("request")
    if request is not None and is_researcher(request.user):
        model_admin = admin.site._registry.get(opts.model)
        return {"section": {"name": RESEARCHER_SECTION, "url": reverse("admin:index")},
                "label": getattr(model_admin, "researcher_title", "") or nav_label(opts)}
    found = section_of(opts)
    section = None
    if found is not None:
        section = {"name": found[1], "url": reverse("admin:console_section", kwargs={"section": found[0]})}
    return {"section": section, "label": nav_label(opts)}
