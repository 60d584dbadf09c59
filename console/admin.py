"""Registers every domain's console pages on the site (Django's admin autodiscovery imports this module)."""

from console.pages import audit, billing, credentials, storage  # noqa: F401  (importing registers the pages)
from console.pages.clusters import admin as clusters_admin  # noqa: F401
from console.pages.sessions import admin as sessions_admin  # noqa: F401
