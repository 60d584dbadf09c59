"""Short reuse of slow console reads across requests: ``GSHARE_CONSOLE_CACHE_SECONDS`` (default 3; 0 turns it off,
as the tests do), in Django's cache (shared by the web workers). Only for figures a few seconds old may show: the
dashboard's chart, storage and credits tiles, GPU management's totals when nothing narrows the list."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.cache import cache

DEFAULT_SECONDS = 3
log = logging.getLogger(__name__)


def reused(key: str, compute):
    """``compute()``, or its result from the last ``GSHARE_CONSOLE_CACHE_SECONDS`` seconds under ``key``. An
    unreachable cache computes it again rather than failing the page.

    Args:
        key: what the value is of, scope included (``console:dashboard:chart:all``).
        compute: a function of no arguments returning a picklable value other than None.
    """
    seconds = getattr(settings, "GSHARE_CONSOLE_CACHE_SECONDS", DEFAULT_SECONDS)
    if seconds <= 0:
        return compute()
    try:
        value = cache.get(key)
    except Exception:  # noqa: BLE001 - the cache is an optimisation: Redis down must not break the page
        log.warning("console cache unreachable; computing %s", key, exc_info=True)
        return compute()
    if value is None:
        value = compute()
        try:
            cache.set(key, value, seconds)
        except Exception:  # noqa: BLE001
            log.warning("console cache unreachable; %s not kept", key, exc_info=True)
    return value
