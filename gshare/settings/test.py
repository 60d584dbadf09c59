"""Test settings: the base settings with Celery eager, so tasks run in the test's transaction."""

from . import *  # noqa: F401,F403
from .env import env

CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
GSHARE_PROBE_TIMEOUT = 3.0
GSHARE_JWT_KEY_BITS = 2048
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Two suites on one server (two checkouts, or CI's two passes) need two test databases.
_test_db = env.str("GSHARE_TEST_DATABASE", default="")
if _test_db:
    DATABASES["default"]["TEST"] = {"NAME": _test_db}  # noqa: F405
