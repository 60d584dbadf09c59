from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo fleet: emulated data-plane clusters and the ``manage.py demo`` command."""

    name = "demo"
    verbose_name = "Demo fleet"
