"""The error codes of storage: pools, volumes, volume moves and the operator's storage reports. The volume codes a
session's placement answers too (``volume_moving``, ``volume_not_mountable``...) live here."""

from __future__ import annotations

# --------------------------------------------------------------------------- pools
POOL_NOT_FOUND = "pool_not_found"
"""404: no storage pool has that id."""

POOL_NAME_TAKEN = "pool_name_taken"
"""409: another pool has this name."""

POOL_IN_USE = "pool_in_use"
"""409: the pool holds volumes that are not deleted (delete, or a change that would strand them)."""

POOL_FULL = "pool_full"
"""409: the volume's quota does not fit in the free room of the pool."""

POOL_CAPACITY_UNKNOWN = "pool_capacity_unknown"
"""409: the pool's capacity has no source."""

POOL_CHANGED = "pool_changed"
"""409: another change moved the pool while this one was being checked."""

NO_STORAGE_POOL = "no_storage_pool"
"""409: no storage pool is registered."""

STORAGE_CLASS_MISSING = "storage_class_missing"
"""400: the pool's StorageClass does not exist on the pool's cluster."""

# --------------------------------------------------------------------------- volumes
VOLUME_NOT_FOUND = "volume_not_found"
"""404: no such live volume of the caller's."""

VOLUME_NAME_TAKEN = "volume_name_taken"
"""409: the owner already has a volume of this name."""

VOLUME_IN_USE = "volume_in_use"
"""409: a live session mounts the volume."""

VOLUME_SHRINK_UNSUPPORTED = "volume_shrink_unsupported"
"""409: a quota decrease (PVCs can grow, never shrink)."""

VOLUME_DELETING = "volume_deleting"
"""409: the volume is being deleted."""

VOLUME_DELETE_FAILED = "volume_delete_failed"
"""502: the holding cluster's apiserver refused to delete the volume's PVC."""

VOLUME_QUOTA_EXCEEDED = "volume_quota_exceeded"
"""403: the user's volumes would hold more than their policy's ``max_volume_gb``."""

VOLUME_NOT_MOUNTABLE = "volume_not_mountable"
"""409: the volume's pool is not usable where the volume would be mounted."""

VOLUME_POOL_NOT_SHARED = "volume_pool_not_shared"
"""409: the volume's pool is not shared with the cluster it would be used on."""

# --------------------------------------------------------------------------- moves
VOLUME_MOVING = "volume_moving"
"""409: the volume is being moved to another cluster."""

VOLUME_MOVE_DISABLED = "volume_move_disabled"
"""409: volume moves are off (``GSHARE_VOLUME_MOVE_ENABLED``)."""

VOLUME_NOT_PLACED = "volume_not_placed"
"""409: the volume has no PVC on any cluster yet: nothing to move."""

VOLUME_ALREADY_THERE = "volume_already_there"
"""409: the volume is already on the target cluster."""

VOLUME_NOT_BOUND = "volume_not_bound"
"""409: the volume's PVC is not bound to a PersistentVolume yet."""

VOLUME_SOURCE_UNSUPPORTED = "volume_source_unsupported"
"""409: the bound PersistentVolume is neither CSI nor NFS."""

VOLUME_MOVE_FAILED = "volume_move_failed"
"""502: an apiserver refused a step of the move."""

# --------------------------------------------------------------------------- operator API
INVALID_STORAGE_REPORT = "invalid_storage_report"
"""400: a storage report does not match the contract."""
