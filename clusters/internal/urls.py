"""Routes of the operator-facing API (``/internal/v1/``)."""

from django.urls import path

from clusters.internal.views import InventoryView

urlpatterns = [
    path("inventory", InventoryView.as_view(), name="internal-inventory"),
]
