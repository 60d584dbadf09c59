"""Claiming a session's volumes for the cluster it is placed on, under that cluster's lock (``sessions.create`` when a
session is placed, ``sessions.queue.admit`` when a queued one starts)."""

from __future__ import annotations

from clusters.models import Cluster
from core.exceptions import Conflict, NotFound
from sessions.errors import VOLUME_ON_ANOTHER_CLUSTER, VOLUMES_ON_DIFFERENT_CLUSTERS
from sessions.models import Session
from storage.errors import VOLUME_DELETING, VOLUME_MOVING, VOLUME_NOT_FOUND
from storage.models import Volume
from storage.services import volume_claim_name


class PlacementRaced(Exception):
    """The capacity chosen without a lock was gone once the cluster was locked: roll back and choose again."""




#: Volume statuses a new session cannot mount: the control plane is changing the volume's PVC.
BUSY_VOLUME = (Volume.Status.MOVING, Volume.Status.DELETING)


def refuse_moving(moving: list[Volume]) -> None:
    """Refuse volumes being moved (409 ``volume_moving``) or deleted (409 ``volume_deleting``)."""
    deleting = [v for v in moving if v.status == Volume.Status.DELETING]
    if deleting:
        volume = deleting[0]
        raise Conflict(
            f"Volume {volume.name} ({volume.public_id}) is being deleted: leave it out of `volumes`.", code=VOLUME_DELETING,
        )
    if moving:
        volume = moving[0]
        raise Conflict(
            f"Volume {volume.name} ({volume.public_id}) is being moved to another cluster: start the session once the move "
            f"is done (`GET /api/v1/storage/volumes/{volume.public_id}` shows its cluster).",
            code=VOLUME_MOVING,
        )


def volumes_lock(*, volumes: list[Volume], cluster_id: int, pinned: Cluster | None) -> list[Volume]:
    """Lock the volumes' rows (primary-key order, after the chosen cluster's row) and check them again.

    Between the first check (``placement.volume_clusters``, no lock) and this one another session may
    have claimed a new volume for a cluster, or a move may have started: the locked rows decide.

    Returns:
        The volumes to claim for the chosen cluster: unsaved ``Volume`` objects carrying only pk and
        ``claim_name`` (what ``volumes_mount`` writes).

    Raises:
        PlacementRaced: a volume is now held by another cluster than ``cluster_id`` (choose again: the next attempt's
            first check keeps the session on that cluster).
    """
    by_pk = {v.pk: v for v in volumes}
    rows = list(
        Volume.objects.filter(pk__in=sorted(by_pk)).order_by("pk").select_for_update()
        .values_list("pk", "cluster_id", "status", "claim_name", named=True)
    )
    gone = [by_pk[pk] for pk in sorted(set(by_pk) - {r.pk for r in rows})] + [by_pk[r.pk] for r in rows if r.status == Volume.Status.DELETED]
    if gone:
        raise NotFound(f"Volume {gone[0].public_id!r} was deleted: leave it out of `volumes`.", code=VOLUME_NOT_FOUND)
    busy = [r for r in rows if r.status in BUSY_VOLUME]
    for row in busy:
        by_pk[row.pk].status = row.status
    refuse_moving([by_pk[r.pk] for r in busy])
    claims = [Volume(pk=r.pk, claim_name=r.claim_name or volume_claim_name(by_pk[r.pk].public_id)) for r in rows if r.cluster_id is None]
    holders = sorted({r.cluster_id for r in rows if r.cluster_id is not None})
    if not holders or holders == [cluster_id]:
        return claims
    if len(holders) > 1:
        raise Conflict(
            "The volumes were just claimed by sessions on different clusters and a session runs on one: move them onto one "
            "cluster first (`POST /api/v1/storage/volumes/{id}/move`), or mount them in separate sessions.",
            code=VOLUMES_ON_DIFFERENT_CLUSTERS,
        )
    # A volume was claimed by a session on, or moved to, another cluster since the first check.
    (holder,) = holders
    if pinned is None:
        raise PlacementRaced
    held, volume = Cluster.objects.get(pk=holder), next(by_pk[r.pk] for r in rows if r.cluster_id == holder)
    raise Conflict(
        f"Volume {volume.name} ({volume.public_id}) was just mounted by a session on, or moved to, cluster {held.name} "
        f"({held.public_id}), so sessions that mount it run there: pin the session to {held.name} "
        f"(`\"cluster\": \"{held.public_id}\"`) or leave `cluster` out and retry, or move the volume first "
        f"(`POST /api/v1/storage/volumes/{volume.public_id}/move`).",
        code=VOLUME_ON_ANOTHER_CLUSTER,
    )


def volumes_mount(*, session: Session, volumes: list[Volume], claims: list[Volume], cluster_id: int) -> None:
    """Give the new volumes (``claims``) the chosen cluster and record the session's volumes (two queries at most)."""
    if claims:
        for claim in claims:
            claim.cluster_id = cluster_id
        Volume.objects.bulk_update(claims, ["cluster", "claim_name"])
    through = Session.volumes.through
    through.objects.bulk_create([through(session_id=session.pk, volume_id=v.pk) for v in volumes])
