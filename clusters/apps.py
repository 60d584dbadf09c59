from django.apps import AppConfig


class ClustersConfig(AppConfig):
    """Data-plane clusters, their nodes and GPU devices."""

    name = "clusters"
    verbose_name = "Clusters"
    default_auto_field = "django.db.models.BigAutoField"
