from django.apps import AppConfig


class GpuSessionsConfig(AppConfig):
    """GPU sessions. The label is ``gpu_sessions`` because ``django.contrib.sessions`` owns ``sessions``."""

    name = "sessions"
    label = "gpu_sessions"
    verbose_name = "GPU sessions"
    default_auto_field = "django.db.models.BigAutoField"
