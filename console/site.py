"""The console's admin site: navigation in the operator's guide's words, and a fleet dashboard on its index page.

Navigation (:data:`SECTIONS`): the sidebar, the index and the section pages list **Resources**, **Sessions**,
**Credits**, **Access** and **Schedules** instead of Django's one group per app. A section page lives at
``/<section>/`` (``/resources/``...); an app's own page (``/clusters/``, ``/billing/``...) redirects to the section
holding its models. Each user sees only the sections with a page they may view (Django's ``has_module_permission``
and ``get_model_perms``, as the stock admin checks them).
"""

from __future__ import annotations

from django.contrib import admin
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import re_path, reverse
from django.utils import timezone
from django.utils.text import capfirst

from console.access import ConsoleAuthenticationForm, is_researcher, researcher_app_list
from console.charts import usage_chart_svg
from console.dashboard import dashboard
from console.home import researcher_home
from console.scope import console_cluster

#: ``(slug, title, [(app_label, model_name), ...])``: the sections, in order, and their pages, in order. A registered
#: model not listed here joins its app's section (:data:`APP_SECTIONS`) after the listed ones; a model of an app not
#: mapped there keeps a group of its own, after the sections.
SECTIONS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("resources", "Resources", [
        ("clusters", "cluster"), ("clusters", "node"), ("clusters", "gpudevice"), ("storage", "volume"),
        ("storage", "storagepool"), ("storage", "storagecapacityreading"), ("storage", "nodedisk"),
    ]),
    ("sessions", "Sessions", [("gpu_sessions", "session"), ("gpu_sessions", "allocation")]),
    ("credits", "Credits", [
        ("billing", "creditaccount"), ("billing", "ledgerentry"), ("billing", "price"), ("billing", "policy"),
        ("billing", "grant"), ("billing", "usagesample"),
    ]),
    ("access", "Access", [
        ("auth", "user"), ("auth", "group"), ("gshare", "apitoken"), ("gshare", "signingkey"), ("audit", "auditrecord"),
    ]),
    ("schedules", "Schedules", [
        ("django_celery_beat", "periodictask"), ("django_celery_beat", "intervalschedule"),
        ("django_celery_beat", "crontabschedule"), ("django_celery_beat", "clockedschedule"),
        ("django_celery_beat", "solarschedule"),
    ]),
]

#: The section of each app's models (also where ``/<app_label>/`` redirects).
APP_SECTIONS: dict[str, str] = {
    "clusters": "resources", "storage": "resources", "gpu_sessions": "sessions", "billing": "credits",
    "auth": "access", "gshare": "access", "audit": "access", "django_celery_beat": "schedules",
}

#: Navigation labels (and changelist titles) that are not the model's plural: the guide's words.
NAV_LABELS: dict[tuple[str, str], str] = {
    ("clusters", "node"): "Node management",
    ("clusters", "gpudevice"): "GPU management",
    ("gshare", "apitoken"): "API tokens",
    ("gpu_sessions", "allocation"): "GPU reservations",
}


def nav_label(opts) -> str:
    """The console's name for a model's list (``Node management``, ``GPU devices``...), from its ``_meta``."""
    return NAV_LABELS.get((opts.app_label, opts.model_name)) or capfirst(opts.verbose_name_plural)


def section_of(opts) -> tuple[str, str] | None:
    """``(slug, title)`` of the section a model (its ``_meta``) is listed in, or None outside every section."""
    slug = APP_SECTIONS.get(opts.app_label)
    for section, title, models in SECTIONS:
        if (opts.app_label, opts.model_name) in models or section == slug:
            return section, title
    return None


class ConsoleSite(admin.AdminSite):
    """The gShare operator console (Django admin), served at ``/``.

    The index adds a fleet table (``console/templates/admin/index.html``): every registered cluster with
    status, heartbeat age, node and GPU counts, in one query.
    """

    site_header = "gShare console"
    site_title = "gShare console"
    index_title = "Fleet"
    #: No "View site" link: the console is the site.
    site_url = None
    login_form = ConsoleAuthenticationForm

    def has_permission(self, request) -> bool:
        """Any active user may use the console (researchers too): each page then checks its own permissions
        (``console.access``: staff by their Django permissions, researchers their own objects only)."""
        return bool(request.user.is_authenticated and request.user.is_active)

    def get_urls(self):
        """Django's admin URLs, with the section pages (``/resources/``...) first."""
        slugs = "|".join(slug for slug, _title, _models in SECTIONS)
        return [
            re_path(rf"^(?P<section>{slugs})/$", self.admin_view(self.section_index), name="console_section"),
            *super().get_urls(),
        ]

    def get_app_list(self, request, app_label=None):
        """The navigation: one entry per section of :data:`SECTIONS` the user may see (only the pages they may
        view or change in it), then any app outside the sections, as Django builds it.

        Args:
            app_label: a section's slug (that section only) or an app label (Django's one-app list, for callers of
                the stock admin API).

        Returns:
            Django's ``app_list`` shape: ``[{"name", "app_label", "app_url", "has_module_perms", "models": [...]}]``;
            ``app_label`` of a section is its slug.
        """
        # Once per request and label: the index page asks twice (the sidebar's ``available_apps`` and its own list),
        # and each build checks every registered model's permissions and reverses its URLs.
        memo = request.__dict__.setdefault("_console_app_lists", {})
        if app_label not in memo:
            memo[app_label] = self._app_list(request, app_label)
        return memo[app_label]

    def _app_list(self, request, app_label=None):
        if app_label is None and is_researcher(request.user):
            return researcher_app_list(self, request)  # one section of their own pages: My sessions, My volumes...
        section_slugs = {slug for slug, _title, _models in SECTIONS}
        if app_label is not None and app_label not in section_slugs:
            return super().get_app_list(request, app_label)
        apps = self._build_app_dict(request)
        models = {}
        for app in apps.values():
            for model in app["models"]:
                opts = model["model"]._meta
                model["name"] = nav_label(opts)
                models[(opts.app_label, opts.model_name)] = model
        sections = []
        for slug, title, listed in SECTIONS:
            rows = [models.pop(key) for key in listed if key in models]
            rows += sorted((models.pop(key) for key in [k for k in models if APP_SECTIONS.get(k[0]) == slug]),
                           key=lambda m: m["name"])
            if rows:
                sections.append({
                    "name": title, "app_label": slug, "has_module_perms": True, "models": rows,
                    "app_url": reverse("admin:console_section", kwargs={"section": slug}, current_app=self.name),
                })
        if app_label is not None:
            return [s for s in sections if s["app_label"] == app_label]
        others = {}
        for (label, _name), model in models.items():
            others.setdefault(label, {**apps[label], "models": []})["models"].append(model)
        for app in sorted(others.values(), key=lambda a: a["name"].lower()):
            app["models"].sort(key=lambda m: m["name"])
            sections.append(app)
        return sections

    def section_index(self, request, section: str, extra_context=None):
        """A section's page (``/resources/``...): its lists, as Django's app index shows an app's; 404 when the user
        may see none of them."""
        app_list = self.get_app_list(request, section)
        if not app_list:
            raise Http404("The requested admin page does not exist.")
        context = {
            **self.each_context(request),
            "title": app_list[0]["name"],
            "subtitle": None,
            "app_list": app_list,
            "app_label": section,
            **(extra_context or {}),
        }
        request.current_app = self.name
        return TemplateResponse(request, "admin/console/section_index.html", context)

    def app_index(self, request, app_label, extra_context=None):
        """``/<app_label>/``: redirects to the section holding the app's models (``/clusters/`` → ``/resources/``)."""
        section = APP_SECTIONS.get(app_label)
        if section is None:
            return super().app_index(request, app_label, extra_context)
        return HttpResponseRedirect(reverse("admin:console_section", kwargs={"section": section}, current_app=self.name))

    def index(self, request, extra_context=None):
        """The console's home: for a researcher, their home page (``console.home``: their live and queued sessions,
        credits and runway, what is free now, Start session); for staff who may view clusters (``clusters.view_cluster``;
        superusers may), the dashboard (``console.dashboard``: tiles, the 24-hour chart, the fleet table) narrowed to the
        top bar's cluster; below it, the navigation, for everyone."""
        context = dict(extra_context or {})
        if is_researcher(request.user):  # their home page (console.home): sessions, credits, free GPUs, Start session
            context.setdefault("title", "My gShare")
            context["home"] = researcher_home(request, site_name=self.name, now=timezone.now())
        if request.user.is_staff and request.user.has_perm("clusters.view_cluster"):  # the tiles show the fleet
            cluster = console_cluster(request)
            board = dashboard(cluster=cluster)
            context["dashboard"] = board
            context["dashboard_chart"] = usage_chart_svg(board.chart, scope=f"cluster {cluster.name}" if cluster else "all clusters")
        return super().index(request, context)
