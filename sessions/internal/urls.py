"""Operator routes of the sessions app (under ``/internal/v1/``)."""

from django.urls import path

from sessions.internal.views import ActivityView, StatusView

urlpatterns = [
    path("status", StatusView.as_view(), name="internal-status"),
    path("activity", ActivityView.as_view(), name="internal-activity"),
]
