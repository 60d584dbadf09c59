from django.apps import AppConfig


class GpuSessionsConfig(AppConfig):
    """GPU sessions. The label is ``gpu_sessions`` because ``django.contrib.sessions`` owns ``sessions``."""

    name = "sessions"
    label = "gpu_sessions"
    verbose_name = "GPU sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        """Drop a user's cached connect facts whenever the user is saved or deleted (``sessions.connect.user_changed``)."""
        from django.conf import settings
        from django.db.models.signals import post_delete, post_save

        from sessions import connect

        post_save.connect(connect.user_changed, sender=settings.AUTH_USER_MODEL, dispatch_uid="gshare-connect-user-saved")
        post_delete.connect(connect.user_changed, sender=settings.AUTH_USER_MODEL, dispatch_uid="gshare-connect-user-deleted")
