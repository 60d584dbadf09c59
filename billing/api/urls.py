"""Routes of the billing API (collected under /api/v1/ by gshare/urls.py)."""

from rest_framework.routers import SimpleRouter

from billing.api.views import AccountViewSet, AccrualViewSet, GrantViewSet, LedgerViewSet, PriceListViewSet

router = SimpleRouter()
router.trailing_slash = "/?"
router.register("billing/account", AccountViewSet, basename="billing-account")
router.register("billing/ledger", LedgerViewSet, basename="billing-ledger")
router.register("billing/accruals", AccrualViewSet, basename="billing-accrual")
router.register("billing/grants", GrantViewSet, basename="billing-grant")
router.register("prices", PriceListViewSet, basename="price")

urlpatterns = router.urls
