from django.apps import AppConfig


class ClustersConfig(AppConfig):
    """Data-plane clusters, their nodes and GPU devices."""

    name = "clusters"
    verbose_name = "Clusters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Install the ``?cluster=`` rule in the audit trail's filter (audit sits below clusters)."""
        # Here, not at the top: both read models, which the app registry loads only after this module.
        from audit.api.filters import set_cluster_resolver
        from clusters.refs import cluster_public_id  # imports the models (see above)

        set_cluster_resolver(cluster_public_id)
