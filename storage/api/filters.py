"""FilterSets of the storage lists: ``?cluster=`` is ``clusters.filters.ClusterRefFilter`` (one rule for every list)."""

from __future__ import annotations

import django_filters

from clusters.filters import ClusterRefFilter
from storage import selectors
from storage.models import StoragePool, Volume


class VolumeFilter(django_filters.FilterSet):
    """``GET /api/v1/storage/volumes``: ``?cluster=`` (the cluster holding the PVC), ``?pool=`` (pool id)."""

    cluster = ClusterRefFilter(help_text="The cluster holding the PVC: id (clu_...) or name; 404 cluster_not_found if none")
    pool = django_filters.CharFilter(field_name="pool__public_id", help_text="Pool id (pool_...)")

    class Meta:
        model = Volume
        fields = ["cluster", "pool"]


class PoolFilter(django_filters.FilterSet):
    """``GET /api/v1/storage/pools``: ``?cluster=``, the pools that cluster may use (``storage.selectors.pools_usable_on``)."""

    cluster = ClusterRefFilter(narrow=selectors.pools_usable_on,
                               help_text="Pools usable by this cluster: id (clu_...) or name; 404 cluster_not_found if none")

    class Meta:
        model = StoragePool
        fields = ["cluster"]
