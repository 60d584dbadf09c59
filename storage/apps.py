from django.apps import AppConfig


class StorageConfig(AppConfig):
    """Storage pools and volumes on the shared NFS pool (models arrive with the volumes issue)."""

    name = "storage"
    verbose_name = "Storage"
    default_auto_field = "django.db.models.BigAutoField"
