"""Routes of the operator-facing API (``/internal/v1/``)."""

from django.urls import path

from clusters.internal.views import InventoryView, TokenView

urlpatterns = [
    path("inventory", InventoryView.as_view(), name="internal-inventory"),
    path("token", TokenView.as_view(), name="internal-token"),
]
