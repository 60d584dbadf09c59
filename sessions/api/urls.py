"""Routes of the sessions API (collected under /api/v1/ by gshare/urls.py)."""

from rest_framework.routers import SimpleRouter

from sessions.api.views import SessionViewSet

router = SimpleRouter()
router.trailing_slash = "/?"
router.register("sessions", SessionViewSet, basename="session")

urlpatterns = router.urls
