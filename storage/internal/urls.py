"""Operator routes of the storage app (under ``/internal/v1/``)."""

from django.urls import path

from storage.internal.views import StorageReportView

urlpatterns = [
    path("storage", StorageReportView.as_view(), name="internal-storage"),
]
