from django.apps import AppConfig


class GpuSessionsConfig(AppConfig):
    """GPU sessions. The label is ``gpu_sessions`` because ``django.contrib.sessions`` owns ``sessions``."""

    name = "sessions"
    label = "gpu_sessions"
    verbose_name = "GPU sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        """Drop a user's cached connect facts whenever the user is saved or deleted (``sessions.connect.user_changed``),
        or their groups or permissions change (``permissions_changed``, ``group_deleted``)."""
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group
        from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

        from sessions import connect

        post_save.connect(connect.user_changed, sender=settings.AUTH_USER_MODEL, dispatch_uid="gshare-connect-user-saved")
        post_delete.connect(connect.user_changed, sender=settings.AUTH_USER_MODEL, dispatch_uid="gshare-connect-user-deleted")
        user_model = get_user_model()
        for through, name in ((user_model.groups.through, "user-groups"), (user_model.user_permissions.through, "user-permissions"),
                              (Group.permissions.through, "group-permissions")):
            m2m_changed.connect(connect.permissions_changed, sender=through, dispatch_uid=f"gshare-connect-{name}")
        pre_delete.connect(connect.group_deleted, sender=Group, dispatch_uid="gshare-connect-group-deleted")
