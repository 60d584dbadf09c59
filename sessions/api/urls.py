"""Routes of the sessions API (collected under /api/v1/ by gshare/urls.py)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from sessions.api.views import QueueView, SessionViewSet

router = SimpleRouter()
router.trailing_slash = "/?"
router.register("sessions", SessionViewSet, basename="session")

urlpatterns = [path("queue", QueueView.as_view(), name="queue"), *router.urls]
