"""What "a cluster given by id or name" means, everywhere: the console's Cluster selector, every API ``?cluster=``
filter and every request body that names a cluster resolve it here.

The rule: ``clu_...`` is a public id and finds any cluster, deregistered ones included (their history stays
reachable, their detail pages open); anything else is a name and finds only a cluster that is not deregistered
(a name can be reused once its cluster is deregistered, so an old name must not pick the old row).
"""

from __future__ import annotations

from django.db.models import QuerySet

from clusters.errors import CLUSTER_NOT_FOUND
from clusters.models import Cluster
from core.exceptions import NotFound

ID_PREFIX = "clu_"


def clusters_matching(ref: str) -> QuerySet[Cluster]:
    """The clusters ``ref`` names (zero or one row), as a queryset usable in ``cluster__in=`` without a round trip.

    Args:
        ref: a public id (``clu_...``) or a cluster name; surrounding whitespace is ignored.
    """
    ref = ref.strip()
    if ref.startswith(ID_PREFIX):
        return Cluster.objects.filter(public_id=ref)
    return Cluster.objects.filter(name=ref).exclude(status=Cluster.Status.DEREGISTERED)


def cluster_by_ref(ref: str) -> Cluster:
    """The cluster ``ref`` names (see the module docstring for the rule).

    Raises:
        NotFound: ``cluster_not_found`` (404) when no cluster matches.
    """
    cluster = clusters_matching(ref).first() if ref and ref.strip() else None
    if cluster is None:
        raise NotFound(f"No cluster is named or has the id {ref!r}: list them with `GET /api/v1/clusters`.", code=CLUSTER_NOT_FOUND)
    return cluster


def cluster_public_id(ref: str) -> str:
    """The public id (``clu_...``) of the cluster ``ref`` names (:func:`cluster_by_ref`).

    Raises:
        NotFound: ``cluster_not_found`` (404) when no cluster matches.
    """
    return cluster_by_ref(ref).public_id
