"""Operator routes of the sessions app (under ``/internal/v1/``)."""

from django.urls import path

from sessions.internal.views import StatusView

urlpatterns = [
    path("status", StatusView.as_view(), name="internal-status"),
]
