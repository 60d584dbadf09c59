from django.apps import AppConfig


class GpuSessionsConfig(AppConfig):
    """GPU sessions. The label is ``gpu_sessions`` because ``django.contrib.sessions`` owns ``sessions``."""

    name = "sessions"
    label = "gpu_sessions"
    verbose_name = "GPU sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        """Connect the sessions' receivers: the cluster changes they follow (``clusters.signals``:
        ``sessions.lifecycle.subscriptions``), and a user's cached connect facts dropped whenever the user is saved or
        deleted (``sessions.connect.user_changed``), or their groups or permissions change (``permissions_changed``,
        ``group_deleted``). Register the sessions' Celery tasks, which ``sessions.lifecycle.outbox`` publishes by name."""
        # Here, not at the top: these read the app registry (models, the user model), which is ready only now.
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group
        from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

        from clusters import signals as cluster_signals
        from sessions import connect, tasks  # noqa: F401  (tasks: imported to register them)
        from sessions.lifecycle import subscriptions

        cluster_signals.cluster_routing_changed.connect(subscriptions.on_cluster_routing_changed, dispatch_uid="gshare-sessions-reapply")
        cluster_signals.session_domain_changing.connect(subscriptions.on_session_domain_changing,
                                                        dispatch_uid="gshare-sessions-domain-users")
        cluster_signals.cluster_deregistering.connect(subscriptions.on_cluster_deregistering, dispatch_uid="gshare-sessions-live")
        cluster_signals.capacity_changed.connect(subscriptions.on_capacity_changed, dispatch_uid="gshare-sessions-queue")
        post_save.connect(connect.user_changed, sender=settings.AUTH_USER_MODEL, dispatch_uid="gshare-connect-user-saved")
        post_delete.connect(connect.user_changed, sender=settings.AUTH_USER_MODEL, dispatch_uid="gshare-connect-user-deleted")
        user_model = get_user_model()
        for through, name in ((user_model.groups.through, "user-groups"), (user_model.user_permissions.through, "user-permissions"),
                              (Group.permissions.through, "group-permissions")):
            m2m_changed.connect(connect.permissions_changed, sender=through, dispatch_uid=f"gshare-connect-{name}")
        pre_delete.connect(connect.group_deleted, sender=Group, dispatch_uid="gshare-connect-group-deleted")
