"""Routes of the storage API (collected under /api/v1/ by gshare/urls.py)."""

from rest_framework.routers import SimpleRouter

from storage.api.views import StoragePoolViewSet, StorageSummaryViewSet, VolumeViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # accept /api/v1/storage/pools and /api/v1/storage/pools/ alike (no redirect)
router.register("storage/pools", StoragePoolViewSet, basename="storage-pool")
router.register("storage/volumes", VolumeViewSet, basename="volume")
router.register("storage/summary", StorageSummaryViewSet, basename="storage-summary")

urlpatterns = router.urls
