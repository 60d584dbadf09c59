"""Pausing CPython's cyclic garbage collector around a bulk build of short-lived objects.

A queue pass builds a picture of the whole fleet (``sessions.queue.snapshot``: one object per GPU, 80,000 on a
fleet of 10,000 nodes) and throws it away at the end. Each allocation counts towards the collector's generation-0
threshold, so a build that size triggers hundreds of collections, and the older generations' collections walk every
object the pass is still building, none of which is garbage yet: measured in ``bench/queue.py``, a third of the
pass. The objects hold no reference cycles of their own; reference counting frees them when the pass drops them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector for the block (process-wide, as ``gc.disable``), then restore it as it was.
    Nested uses and a collector already disabled by the caller are left as they were. Reference counting goes on: only
    garbage in reference cycles waits until the collector runs again after the block."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
