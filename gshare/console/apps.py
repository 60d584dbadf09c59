from django.contrib.admin.apps import AdminConfig


class ConsoleAdminConfig(AdminConfig):
    """Replaces the default admin site with :class:`gshare.console.site.ConsoleSite`."""

    default_site = "gshare.console.site.ConsoleSite"
