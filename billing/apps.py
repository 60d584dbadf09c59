from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Credits: accounts and the ledger, prices, usage samples (`POST /internal/v1/usage`), policies and admission."""

    name = "billing"
    verbose_name = "Billing"
    default_auto_field = "django.db.models.BigAutoField"
