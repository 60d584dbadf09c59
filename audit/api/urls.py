"""Routes of the audit API (collected under /api/v1/ by gshare/urls.py)."""

from rest_framework.routers import SimpleRouter

from audit.api.views import AuditViewSet

router = SimpleRouter()
router.trailing_slash = "/?"
router.register("audit", AuditViewSet, basename="audit")

urlpatterns = router.urls
