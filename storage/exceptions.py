"""The errors of the storage services (``storage.services``, ``storage.move``, ``storage.reports``): each an
``ApplicationError`` with its code and HTTP status (docs/errors.md)."""

from core.exceptions import ApplicationError, Conflict


class PoolNameTaken(Conflict):
    """409: another pool has this name."""

    code = "pool_name_taken"


class PoolInUse(Conflict):
    """409: the pool holds volumes that are not deleted (delete, or a change that would strand them)."""

    code = "pool_in_use"


class PoolFull(Conflict):
    """409: the volume's quota does not fit in the free room of the pool (the largest single pool when none is named)."""

    code = "pool_full"


class PoolCapacityUnknown(Conflict):
    """409: the pool's capacity is unknown (no fresh CSI reading, no stated capacity, no storage node disk)."""

    code = "pool_capacity_unknown"


class NoStoragePool(Conflict):
    """409: no storage pool is registered, so no volume can be created."""

    code = "no_storage_pool"


class VolumeNameTaken(Conflict):
    """409: the owner already has a (non-deleted) volume of this name."""

    code = "volume_name_taken"


class VolumeInUse(Conflict):
    """409: a live session mounts the volume."""

    code = "volume_in_use"


class VolumeShrinkUnsupported(Conflict):
    """409: a quota decrease (PVCs can grow, never shrink)."""

    code = "volume_shrink_unsupported"


class VolumeMoving(Conflict):
    """409: the volume is being moved to another cluster."""

    code = "volume_moving"


class VolumeMoveDisabled(Conflict):
    """409: volume moves are off (``GSHARE_VOLUME_MOVE_ENABLED``)."""

    code = "volume_move_disabled"


class StorageClassMissing(ApplicationError):
    """400: the pool's StorageClass does not exist on the pool's cluster (read through its apiserver)."""

    code = "storage_class_missing"
    status = 400


class PoolChanged(Conflict):
    """409: another change moved the pool to another cluster or StorageClass while this one was being checked."""

    code = "pool_changed"


class VolumeNotMountable(Conflict):
    """409: the volume's pool is not usable where the volume would be mounted (its StorageClass is missing there)."""

    code = "volume_not_mountable"


class VolumeDeleteFailed(ApplicationError):
    """502: the holding cluster's apiserver refused to delete the volume's PVC (other than 404)."""

    code = "volume_delete_failed"
    status = 502


class VolumeDeleting(Conflict):
    """409: the volume is being deleted (its PVC's deletion is in flight)."""

    code = "volume_deleting"


class VolumeQuotaExceeded(ApplicationError):
    """403: the user's volumes would hold more than their policy's ``max_volume_gb`` in all."""

    code = "volume_quota_exceeded"
    status = 403
