from django.apps import AppConfig


class IdentityConfig(AppConfig):
    """Who is calling: users' API tokens and the RS256 keys that sign internal JWTs.

    The label stays ``gshare`` (the app these models were created in), so their tables, content types, permissions
    and migration history are unchanged: moving the code needed no data migration.
    """

    name = "identity"
    label = "gshare"
    verbose_name = "gShare"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the app's system checks."""
        from identity import checks  # noqa: F401  (registering the checks is importing them)
