from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit trail: one append-only row per change made by a person or a program."""

    name = "audit"
    verbose_name = "Audit trail"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:  # noqa: D102
        from audit import context  # its Celery signal receivers connect once the app registry is ready

        context.connect_celery_signals()
