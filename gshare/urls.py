"""URL map: the console (admin), the public API and its documentation (signed-in users only), the operator API, the JWKS."""

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from core import views
from core.api import meta as api_meta
from identity import views as identity_views
from metrics.views import metrics
from sessions.internal.views import connect_ext_authz, connect_verify

api_v1 = [
    path("", include("clusters.api.urls")),
    path("", include("sessions.api.urls")),
    path("", include("storage.api.urls")),
    path("", include("billing.api.urls")),
    path("", include("audit.api.urls")),
    path("version", api_meta.version, name="api-version"),
    path("me", api_meta.me, name="api-me"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The browsable documentation (Swagger UI, its assets from drf-spectacular-sidecar): linked from the console.
    path("docs/", views.signed_in_or_login(SpectacularSwaggerView.as_view(url_name="schema")), name="api-docs"),
]

internal_v1 = [
    path("", include("clusters.internal.urls")),
    path("", include("sessions.internal.urls")),
    path("", include("storage.internal.urls")),
    path("", include("billing.internal.urls")),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("internal/v1/", include(internal_v1)),
    path("internal/connect/verify", connect_verify, name="connect-verify"),
    # Envoy's ext_authz check, any method, the original path after the prefix. InternalHostsMiddleware answers it
    # before the rest of the stack (its Host is a session domain); the route names it for reverse() and this map.
    re_path(r"^internal/connect/ext-authz/", connect_ext_authz, name="connect-ext-authz"),
    path(".well-known/gshare-internal-jwks.json", identity_views.jwks, name="jwks"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("internal/ping", views.ping, name="ping"),
    re_path(r"^(api|internal)/", views.json_not_found),
    # Last: the console's catch-all would shadow the routes above.
    path("", admin.site.urls),
]
