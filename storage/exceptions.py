"""The errors of the storage services (``storage.services``, ``storage.move``, ``storage.reports``): each an
``ApplicationError`` with its code and HTTP status (docs/errors.md)."""

from core.exceptions import ApplicationError, Conflict
from storage.errors import (
    NO_STORAGE_POOL,
    POOL_CAPACITY_UNKNOWN,
    POOL_CHANGED,
    POOL_FULL,
    POOL_IN_USE,
    POOL_NAME_TAKEN,
    STORAGE_CLASS_MISSING,
    VOLUME_DELETE_FAILED,
    VOLUME_DELETING,
    VOLUME_IN_USE,
    VOLUME_MOVE_DISABLED,
    VOLUME_MOVING,
    VOLUME_NAME_TAKEN,
    VOLUME_NOT_MOUNTABLE,
    VOLUME_QUOTA_EXCEEDED,
    VOLUME_SHRINK_UNSUPPORTED,
)


class PoolNameTaken(Conflict):
    """409: another pool has this name."""

    code = POOL_NAME_TAKEN


class PoolInUse(Conflict):
    """409: the pool holds volumes that are not deleted (delete, or a change that would strand them)."""

    code = POOL_IN_USE


class PoolFull(Conflict):
    """409: the volume's quota does not fit in the free room of the pool (the largest single pool when none is named)."""

    code = POOL_FULL


class PoolCapacityUnknown(Conflict):
    """409: the pool's capacity is unknown (no fresh CSI reading, no stated capacity, no storage node disk)."""

    code = POOL_CAPACITY_UNKNOWN


class NoStoragePool(Conflict):
    """409: no storage pool is registered, so no volume can be created."""

    code = NO_STORAGE_POOL


class VolumeNameTaken(Conflict):
    """409: the owner already has a (non-deleted) volume of this name."""

    code = VOLUME_NAME_TAKEN


class VolumeInUse(Conflict):
    """409: a live session mounts the volume."""

    code = VOLUME_IN_USE


class VolumeShrinkUnsupported(Conflict):
    """409: a quota decrease (PVCs can grow, never shrink)."""

    code = VOLUME_SHRINK_UNSUPPORTED


class VolumeMoving(Conflict):
    """409: the volume is being moved to another cluster."""

    code = VOLUME_MOVING


class VolumeMoveDisabled(Conflict):
    """409: volume moves are off (``GSHARE_VOLUME_MOVE_ENABLED``)."""

    code = VOLUME_MOVE_DISABLED


class StorageClassMissing(ApplicationError):
    """400: the pool's StorageClass does not exist on the pool's cluster (read through its apiserver)."""

    code = STORAGE_CLASS_MISSING
    status = 400


class PoolChanged(Conflict):
    """409: another change moved the pool to another cluster or StorageClass while this one was being checked."""

    code = POOL_CHANGED


class VolumeNotMountable(Conflict):
    """409: the volume's pool is not usable where the volume would be mounted (its StorageClass is missing there)."""

    code = VOLUME_NOT_MOUNTABLE


class VolumeDeleteFailed(ApplicationError):
    """502: the holding cluster's apiserver refused to delete the volume's PVC (other than 404)."""

    code = VOLUME_DELETE_FAILED
    status = 502


class VolumeDeleting(Conflict):
    """409: the volume is being deleted (its PVC's deletion is in flight)."""

    code = VOLUME_DELETING


class VolumeQuotaExceeded(ApplicationError):
    """403: the user's volumes would hold more than their policy's ``max_volume_gb`` in all."""

    code = VOLUME_QUOTA_EXCEEDED
    status = 403
