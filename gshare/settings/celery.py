"""Celery settings: Redis as broker, django-celery-beat's database scheduler; the Redis timeouts.

Every Redis operation is bounded by ``GSHARE_REDIS_TIMEOUT`` (publish and cache alike), so a stalled or stopped
Redis makes an API request fail its publish within about that long instead of holding a web thread: kombu's Redis
transport waits forever on a socket that never answers unless ``socket_timeout`` is set, and reconnects for
``broker_connection_timeout`` (4 s) per attempt. A publish that fails is not lost: the database row is the outbox,
and the ``sessions.reconcile`` beat task publishes what is still due (docs/sessions.md, "When Redis is down").
"""

from gshare.embedded import celery_broker_url

from .base import CACHES, REDIS_URL
from .env import env

#: Seconds one Redis operation (connect, a publish, a cache read or write) may take before it fails.
GSHARE_REDIS_TIMEOUT = env.float("GSHARE_REDIS_TIMEOUT", default=1.0)

CELERY_BROKER_URL = celery_broker_url(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_TIMEOUT = GSHARE_REDIS_TIMEOUT
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # redis-py: a connect or a reply that takes longer fails (the default, None, waits forever on a silent socket).
    "socket_timeout": GSHARE_REDIS_TIMEOUT,
    "socket_connect_timeout": GSHARE_REDIS_TIMEOUT,
    # kombu: one connection attempt when a publish finds no connection (the default retries for
    # broker_connection_timeout); the worker's own reconnect loop (broker_connection_max_retries) is not affected.
    "max_retries": 0,
}
# One quick retry, so a pooled connection that Redis dropped (a restart) is replaced and the publish goes through;
# a broker that does not answer fails the publish after one socket timeout.
CELERY_TASK_PUBLISH_RETRY = True
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}

# The cache is the same Redis: bound it the same way (Django's RedisCache passes OPTIONS to redis-py's pool).
CACHES["default"].setdefault("OPTIONS", {}).update(socket_timeout=GSHARE_REDIS_TIMEOUT, socket_connect_timeout=GSHARE_REDIS_TIMEOUT)

#: Seconds a session may stay Scheduled (apply due) or Stopping (delete due) before ``sessions.reconcile`` publishes
#: its task again; longer than a task's usual retry chain (sessions/tasks.py: about 30 s of backoff), so a chain still
#: retrying is rarely doubled (and a doubled one is harmless: both tasks are idempotent).
GSHARE_SESSION_RECONCILE_AFTER = env.int("GSHARE_SESSION_RECONCILE_AFTER", default=90)
