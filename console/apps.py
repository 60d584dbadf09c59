from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class ConsoleConfig(AppConfig):
    """The console's own app: its templates, static files, template tags and pages (``console.admin`` registers
    every domain's pages on the site)."""

    name = "console"
    verbose_name = "Console"


class ConsoleAdminConfig(AdminConfig):
    """Replaces the default admin site with :class:`console.site.ConsoleSite`."""

    default_site = "console.site.ConsoleSite"
