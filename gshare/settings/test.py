"""Test settings: the base settings with Celery eager, so tasks run in the test's transaction."""

from . import *  # noqa: F401,F403
from .env import env

CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
GSHARE_PROBE_TIMEOUT = env.float("GSHARE_TEST_PROBE_TIMEOUT", default=3.0)  # raise it on a machine under heavy load
GSHARE_JWT_KEY_BITS = 2048
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The internal plane answers on loopback, on pytest-django's live server (http://localhost:<port>) and on the
# test client's host; tests of the public side send another Host (tests/core/test_internal_hosts.py).
GSHARE_INTERNAL_HOSTS = env.list("GSHARE_INTERNAL_HOSTS", default=["127.0.0.1", "[::1]", "localhost", "testserver"])
# Admission (billing/admission.py): users without a Policy row start sessions on any non-negative balance here
# (production default: 1 hour of the requested resources), so tests that are not about credits need no grants.
# Admission tests set policies and this setting explicitly.
GSHARE_BILLING_DEFAULT_MIN_BALANCE_HOURS = 0

# Two suites on one server (two checkouts, or CI's two passes) need two test databases.
_test_db = env.str("GSHARE_TEST_DATABASE", default="")
if _test_db:
    DATABASES["default"]["TEST"] = {"NAME": _test_db}  # noqa: F405
# Every console read is computed for its request (no reuse across requests: tests change the data between them).
GSHARE_CONSOLE_CACHE_SECONDS = 0

# pytest-xdist runs the suite in several worker processes: each gets its own test database (pytest-django adds the
# worker's suffix) and its own Redis database, so one worker's cache.clear() or rate-limit keys never reach another.
_xdist_worker = env.str("PYTEST_XDIST_WORKER", default="")
if _xdist_worker.startswith("gw") and _xdist_worker[2:].isdigit():
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    from gshare.embedded import celery_broker_url

    def _redis_db(url: str, db: int) -> str:
        parts = urlsplit(url)
        if parts.scheme == "unix":  # unix:///path/to/socket?db=N (urlunsplit would drop the empty authority's "//")
            query = dict(parse_qsl(parts.query))
            query["db"] = str(db)
            return f"unix://{parts.path}?{urlencode(query)}"
        return urlunsplit(parts._replace(path=f"/{db}"))

    _parts = urlsplit(REDIS_URL)  # noqa: F405
    _base_db = int(dict(parse_qsl(_parts.query)).get("db") or ("" if _parts.scheme == "unix" else _parts.path.strip("/")) or 0)
    REDIS_URL = _redis_db(REDIS_URL, (_base_db + 1 + int(_xdist_worker[2:])) % 16)  # noqa: F405
    env.ENVIRON["REDIS_URL"] = REDIS_URL
    CACHES["default"]["LOCATION"] = REDIS_URL  # noqa: F405
    CELERY_BROKER_URL = celery_broker_url(REDIS_URL)

# pytest-django's live server (Django's LiveServerThread) serves files from MEDIA_ROOT for every path under MEDIA_URL,
# before the application; with Django's default "" that is every path, from the working directory (the checkout), so a
# test's request for /pyproject.toml got the file and an overlong path a 500 from os.stat. gShare has no media.
MEDIA_URL = "/media/"
