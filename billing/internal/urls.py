"""Operator routes of the billing app (under ``/internal/v1/``)."""

from django.urls import path

from billing.internal.views import UsageView

urlpatterns = [
    path("usage", UsageView.as_view(), name="internal-usage"),
]
