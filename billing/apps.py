from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Credit accounts, prices, usage samples and the ledger (models arrive with the credits issue)."""

    name = "billing"
    verbose_name = "Billing"
    default_auto_field = "django.db.models.BigAutoField"
