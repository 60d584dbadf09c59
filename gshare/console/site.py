"""The console's admin site, with a fleet dashboard on its index page."""

from django.contrib import admin


class ConsoleSite(admin.AdminSite):
    """The gShare operator console (Django admin), served at ``/``.

    The index adds a fleet table (``templates/admin/index.html``): every registered cluster with
    status, heartbeat age, node and GPU counts, in one query.
    """

    site_header = "gShare console"
    site_title = "gShare console"
    index_title = "Fleet"

    def index(self, request, extra_context=None):
        """Render the admin index with ``fleet`` (annotated clusters that are not deregistered)."""
        from clusters.selectors import cluster_list

        extra_context = {**(extra_context or {}), "fleet": list(cluster_list(include_deregistered=False))}
        return super().index(request, extra_context)
