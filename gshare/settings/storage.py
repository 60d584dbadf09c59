"""Storage settings (storage/): pool capacity fallbacks, CSI reading freshness, volume moves. See docs/storage.md."""

from .env import env

#: Fleet default capacity of a pool, GiB (2^30 bytes), used for a pool without ``manual_capacity_gb`` when no fresh
#: CSI reading exists. Unset: no fleet default (the pool falls back to its storage node's disk, else is unknown).
STORAGE_POOL_CAPACITY_GB = env.int("STORAGE_POOL_CAPACITY_GB", default=None)
#: A CSIStorageCapacity reading older than this many seconds no longer counts (the pool falls back and says so).
GSHARE_STORAGE_READING_MAX_AGE = env.int("GSHARE_STORAGE_READING_MAX_AGE", default=600)
#: ``POST /api/v1/storage/volumes/{id}/move`` (hand a volume's PVC to another cluster); off until tested against a real driver.
GSHARE_VOLUME_MOVE_ENABLED = env.bool("GSHARE_VOLUME_MOVE_ENABLED", default=False)
