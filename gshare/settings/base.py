"""Core Django settings for the control plane (database, apps, DRF, the API)."""

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from gshare import embedded

from .env import PRODUCTION, env

BASE_DIR = Path(__file__).resolve().parent.parent.parent

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is not set: set it to a long random string.")
    SECRET_KEY = "gshare-local-development-only-not-a-secret"

DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["*"] if not PRODUCTION else [])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
#: Hosts on which the internal plane (``/internal/``, ``/.well-known/``, ``/metrics``) answers; on any other
#: host those paths answer 404 (gshare/middleware.py). Matched like ALLOWED_HOSTS against request.get_host(),
#: port stripped. Production has no default: the Helm chart sets the api Service's in-cluster names, the pod
#: IP and ingress.internalPlane.host.
GSHARE_INTERNAL_HOSTS = env.list("GSHARE_INTERNAL_HOSTS", default=[] if PRODUCTION else ["127.0.0.1", "[::1]"])
if PRODUCTION and not GSHARE_INTERNAL_HOSTS:
    raise ImproperlyConfigured(
        "GSHARE_INTERNAL_HOSTS is not set: name the hosts the data-plane clusters reach /internal and /.well-known at "
        "(comma-separated, e.g. gshare-internal.example.com,gshare-api.gshare.svc); every other host answers 404 there."
    )

INSTALLED_APPS = [
    "console.apps.ConsoleConfig",
    "console.apps.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_filters",
    "django_celery_beat",
    "identity.apps.IdentityConfig",
    "clusters",
    "sessions.apps.GpuSessionsConfig",
    "storage",
    "billing",
    "audit",
    "demo",
]

MIDDLEWARE = [
    "core.middleware.ApiErrorsMiddleware",
    "gshare.middleware.InternalHostsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "console.scope.ClusterScopeMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "audit.middleware.AuditActorMiddleware",
]

ROOT_URLCONF = "gshare.urls"
WSGI_APPLICATION = "gshare.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.scope.console_scope",
            ],
        },
    },
]

#: A command that runs away from the control plane (``attach_cluster`` on an operator's laptop; manage.py sets it):
#: no database, no Redis, no encryption key. Anything that would query the database raises instead.
CLIENT_ONLY = env.bool("GSHARE_CLIENT_ONLY", default=False)

# Database: DATABASE_URL, else the embedded PostgreSQL (see gshare/embedded.py).
if not CLIENT_ONLY and not env.str("DATABASE_URL", default=""):
    if PRODUCTION:
        raise ImproperlyConfigured("DATABASE_URL is not set: point it at the control plane's PostgreSQL.")
    env.ENVIRON["DATABASE_URL"] = embedded.embedded_database_url()
DATABASES = {"default": {"ENGINE": "django.db.backends.dummy"} if CLIENT_ONLY else env.db("DATABASE_URL")}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=0)
# A database host that drops packets must not hold a request (connect verify answers 503 fast) for the OS's TCP timeout.
DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=5))

# Redis: REDIS_URL, else the embedded Redis.
if not CLIENT_ONLY and not env.str("REDIS_URL", default=""):
    if PRODUCTION:
        raise ImproperlyConfigured("REDIS_URL is not set: point it at the control plane's Redis.")
    env.ENVIRON["REDIS_URL"] = embedded.embedded_redis_url()
# A client-only command never dials Redis: the name below cannot resolve (RFC 6761 .invalid).
REDIS_URL = env.str("REDIS_URL", default="redis://client-only.invalid:6379/0")

# Encryption at rest (core/crypto.py): Fernet keys, first encrypts, all decrypt.
GSHARE_ENCRYPTION_KEYS = env.list("GSHARE_ENCRYPTION_KEYS", default=[])
if not GSHARE_ENCRYPTION_KEYS and not CLIENT_ONLY:
    if PRODUCTION:
        raise ImproperlyConfigured(
            "GSHARE_ENCRYPTION_KEYS is not set: generate one with "
            "`python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`."
        )
    from core.crypto import local_encryption_key

    GSHARE_ENCRYPTION_KEYS = [local_encryption_key(embedded.gshare_home())]

#: Largest request body, bytes (a 5,000-node inventory snapshot is about 12 MiB).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("GSHARE_MAX_BODY_BYTES", default=32 * 1024 * 1024)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("GSHARE_STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
if not PRODUCTION:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise serves from finders; it only wants the folder
WHITENOISE_USE_FINDERS = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    # Bearer API tokens first, then the console's login session (CSRF enforced on unsafe methods) for browser use.
    "DEFAULT_AUTHENTICATION_CLASSES": ["identity.authentication.ApiTokenAuthentication",
                                       "identity.authentication.ConsoleSessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["core.api.base.SafeJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "core.api.base.Pagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "core.api.base.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
#: The largest page any list answers (``?limit=`` above it is served as this many rows).
GSHARE_API_MAX_PAGE_SIZE = env.int("GSHARE_API_MAX_PAGE_SIZE", default=1000)
SPECTACULAR_SETTINGS = {
    "TITLE": "gShare control plane API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and the docs page answer signed-in users only (the console's login session or an API token): the
    # schema maps every route, the internal plane's included.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # The API documentation's assets come from drf-spectacular-sidecar, served by the project (never a CDN).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Each reader sees the operations they may call (core/api/schema.py): drf-spectacular keeps an operation only
    # when the view's permissions admit the caller; the operators' /internal/ routes are left out, operations are
    # tagged by resource and docstrings' reStructuredText is turned into the CommonMark Swagger UI renders.
    "SERVE_PUBLIC": False,
    "PREPROCESSING_HOOKS": ["core.api.schema.public_endpoints_only"],
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "core.api.schema.tag_and_render"],
    "ENUM_NAME_OVERRIDES": {"ClusterStatusEnum": "clusters.models.Cluster.Status"},
}

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": "gshare"},
}

# --- clusters ---------------------------------------------------------------------------------
#: Seconds the registration probe and the connection test may take in all (each apiserver call is
#: bounded by what is left of it).
GSHARE_PROBE_TIMEOUT = env.float("GSHARE_PROBE_TIMEOUT", default=10.0)
#: ``host:port`` pairs on loopback that registration accepts anyway (the demo's emulated apiservers).
GSHARE_LOOPBACK_ALLOWLIST = env.list("GSHARE_LOOPBACK_ALLOWLIST", default=[])
#: A cluster whose operator has not reported for this many seconds counts as not reporting.
GSHARE_HEARTBEAT_STALE_SECONDS = env.int("GSHARE_HEARTBEAT_STALE_SECONDS", default=120)
#: Seconds an operator's clock may be off the control plane's: a status report observed further ahead is refused
#: (409 ``report_from_future``), and a reported offset beyond it fails the ``clock_synced`` check (docs/attach.md).
GSHARE_CLOCK_SKEW_TOLERANCE = env.float("GSHARE_CLOCK_SKEW_TOLERANCE", default=30.0)

# --- attach_cluster (attach) -----------------------------------------------------------
#: Helm chart repositories and pinned chart versions attach_cluster installs (point them at a mirror
#: for air-gapped fleets).
GSHARE_ATTACH_HAMI_REPO = env.str("GSHARE_ATTACH_HAMI_REPO", default="https://project-hami.github.io/HAMi/")
GSHARE_ATTACH_HAMI_CHART_VERSION = env.str("GSHARE_ATTACH_HAMI_CHART_VERSION", default="2.7.1")
GSHARE_ATTACH_INGRESS_NGINX_REPO = env.str("GSHARE_ATTACH_INGRESS_NGINX_REPO", default="https://kubernetes.github.io/ingress-nginx")
GSHARE_ATTACH_INGRESS_NGINX_CHART_VERSION = env.str("GSHARE_ATTACH_INGRESS_NGINX_CHART_VERSION", default="4.13.3")
#: Envoy Gateway's chart (``gateway-helm``) is published as an OCI artifact: an ``oci://`` base (the chart name is
#: appended) or an HTTP chart repository (a mirror, or the tests' loopback repository).
GSHARE_ATTACH_ENVOY_GATEWAY_REPO = env.str("GSHARE_ATTACH_ENVOY_GATEWAY_REPO", default="oci://docker.io/envoyproxy")
GSHARE_ATTACH_ENVOY_GATEWAY_CHART_VERSION = env.str("GSHARE_ATTACH_ENVOY_GATEWAY_CHART_VERSION", default="v1.9.0")
GSHARE_ATTACH_DEMOCRATIC_CSI_REPO = env.str("GSHARE_ATTACH_DEMOCRATIC_CSI_REPO", default="https://democratic-csi.github.io/charts/")
GSHARE_ATTACH_DEMOCRATIC_CSI_CHART_VERSION = env.str("GSHARE_ATTACH_DEMOCRATIC_CSI_CHART_VERSION", default="0.15.0")
#: Image of the node check pods (needs sh, chroot, grep, nc, timeout).
GSHARE_ATTACH_CHECK_IMAGE = env.str("GSHARE_ATTACH_CHECK_IMAGE", default="busybox:1.36")
#: Seconds attach_cluster waits for check pods, for GPUs to be advertised, for Helm, for the first inventory.
GSHARE_ATTACH_CHECK_TIMEOUT = env.float("GSHARE_ATTACH_CHECK_TIMEOUT", default=180.0)
GSHARE_ATTACH_GPU_TIMEOUT = env.float("GSHARE_ATTACH_GPU_TIMEOUT", default=300.0)
GSHARE_ATTACH_HELM_TIMEOUT = env.int("GSHARE_ATTACH_HELM_TIMEOUT", default=300)
GSHARE_ATTACH_INVENTORY_TIMEOUT = env.float("GSHARE_ATTACH_INVENTORY_TIMEOUT", default=300.0)
#: Seconds attach_cluster waits for the session Gateway to be Programmed (gateway-api routing).
GSHARE_ATTACH_GATEWAY_TIMEOUT = env.float("GSHARE_ATTACH_GATEWAY_TIMEOUT", default=300.0)

# --- sessions ---------------------------------------------------------------------------------
#: ``binpack`` (fill the busiest node first) or ``spread`` (the idlest first).
GSHARE_PLACEMENT_POLICY = env.str("GSHARE_PLACEMENT_POLICY", default="binpack")
if GSHARE_PLACEMENT_POLICY not in ("binpack", "spread"):
    raise ImproperlyConfigured("GSHARE_PLACEMENT_POLICY must be binpack or spread.")
#: Prepare session creation's big statements on the server (``core.prepared``). Off by default: unsafe behind a
#: transaction-mode pooler without prepared-statement tracking (PgBouncer before 1.21).
GSHARE_DB_PREPARED_STATEMENTS = env.bool("GSHARE_DB_PREPARED_STATEMENTS", default=False)
#: Namespace of GShareSession objects on every cluster (must match the operator's).
GSHARE_SESSION_NAMESPACE = env.str("GSHARE_SESSION_NAMESPACE", default="gshare-sessions")
#: The control plane's URL as the clusters' ingress controllers reach it (for the connect auth-url).
GSHARE_CONTROL_PLANE_URL = env.str("GSHARE_CONTROL_PLANE_URL", default="http://127.0.0.1:8000")
#: Scheme of session URLs (``https://<session_domain>/s/<id>/``).
GSHARE_SESSION_SCHEME = env.str("GSHARE_SESSION_SCHEME", default="https")
#: Port of session URLs (``<scheme>://<session_domain>:<port>/s/<id>/``); 0 leaves it out (the scheme's default port).
#: The demo sets it to its loopback ingress's port; a cluster's ingress serves 443.
GSHARE_SESSION_PORT = env.int("GSHARE_SESSION_PORT", default=0)
if not 0 <= GSHARE_SESSION_PORT <= 65535:
    raise ImproperlyConfigured("GSHARE_SESSION_PORT must be a TCP port (1-65535), or 0 for the scheme's default.")
#: Lifetime of a connect link's token, seconds.
GSHARE_CONNECT_TOKEN_TTL = env.int("GSHARE_CONNECT_TOKEN_TTL", default=300)
#: Lifetime of the connect cookie set on the first visit, seconds.
GSHARE_CONNECT_COOKIE_TTL = env.int("GSHARE_CONNECT_COOKIE_TTL", default=43200)
#: How long connect verification may cache a session's facts, seconds (changes invalidate at once).
GSHARE_CONNECT_CACHE_SECONDS = env.int("GSHARE_CONNECT_CACHE_SECONDS", default=30)
