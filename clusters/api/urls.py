"""Routes of the clusters API (collected under /api/v1/ by gshare/urls.py)."""

from rest_framework.routers import SimpleRouter

from clusters.api.views import ClusterViewSet, GpuViewSet, NodeViewSet

router = SimpleRouter()
router.trailing_slash = "/?"  # accept /api/v1/clusters and /api/v1/clusters/ alike (no redirect)
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")

urlpatterns = router.urls
