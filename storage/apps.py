from django.apps import AppConfig


class StorageConfig(AppConfig):
    """Storage pools and volumes on the shared NFS pool(s); in the console, the "Resources → Volumes" group."""

    name = "storage"
    verbose_name = "Resources → Volumes"
    default_auto_field = "django.db.models.BigAutoField"
