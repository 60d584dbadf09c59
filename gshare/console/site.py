"""The console's admin site."""

from django.contrib import admin


class ConsoleSite(admin.AdminSite):
    """The gShare operator console (Django admin), served at ``/``."""

    site_header = "gShare console"
    site_title = "gShare console"
    index_title = "Fleet"
