from django.apps import AppConfig


class GshareConfig(AppConfig):
    """Project-wide models: API tokens and the internal JWT signing keys."""

    name = "gshare"
    verbose_name = "gShare"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the app's system checks."""
        from gshare import checks  # noqa: F401
