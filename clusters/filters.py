"""The API's ``?cluster=`` filter, one rule for every list (django-filter): :class:`ClusterRefFilter` resolves the
value with ``clusters.refs`` (a ``clu_...`` id finds any cluster, deregistered included; a name only a registered
one) and answers 404 ``cluster_not_found`` when it names no cluster, in every list alike (nodes, GPUs, sessions,
volumes, storage pools, the storage summary, the audit trail).

The FilterSets of the cluster app's own lists (nodes, GPUs) live here; the other apps build theirs from
:class:`ClusterRefFilter` next to their views.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import django_filters
from django.db.models import QuerySet
from django_filters.constants import EMPTY_VALUES

from clusters.models import Cluster, GpuDevice, Node
from clusters.refs import cluster_by_ref

HELP = "Cluster id (clu_..., any cluster, deregistered included) or name (registered clusters only); 404 cluster_not_found if none"


class ClusterRefFilter(django_filters.CharFilter):
    """``?cluster=<id or name>``: rows of that cluster; an empty value filters nothing.

    Args:
        field_name: ORM path from the row to its cluster (``"cluster"``, ``"session__cluster"``...).
        to_field: compare ``field_name`` with this attribute of the cluster instead of the row itself (``"public_id"``
            where the row keeps the cluster's id as text, e.g. audit rows).
        narrow: ``narrow(queryset, cluster) -> queryset`` where the rule is not one lookup (the pools a cluster may
            use); replaces the lookup.

    Raises (when the FilterSet's ``qs`` is read):
        NotFound: ``cluster_not_found`` (404) when the value names no cluster (``clusters.refs.cluster_by_ref``).
    """

    def __init__(self, field_name: str = "cluster", *, to_field: str | None = None,
                 narrow: Callable[[QuerySet, Cluster], QuerySet] | None = None, **kwargs):
        kwargs.setdefault("help_text", HELP)
        super().__init__(field_name=field_name, **kwargs)
        self.to_field = to_field
        self.narrow = narrow

    def filter(self, qs: QuerySet, value) -> QuerySet:  # noqa: D102
        if value in EMPTY_VALUES:
            return qs
        cluster = cluster_by_ref(value)
        if self.narrow is not None:
            return self.narrow(qs, cluster)
        return qs.filter(**{self.field_name: getattr(cluster, self.to_field) if self.to_field else cluster})


def cluster_param(params: Mapping[str, str], name: str = "cluster") -> Cluster | None:
    """The cluster a query's ``?cluster=`` names (the same rule and refusal as :class:`ClusterRefFilter`), or None
    when the parameter is absent or empty; for views that hand a cluster, not a queryset, to their selector.

    Raises:
        NotFound: ``cluster_not_found`` (404).
    """
    value = (params.get(name) or "").strip()
    return cluster_by_ref(value) if value else None


class NodeFilter(django_filters.FilterSet):
    """``GET /api/v1/nodes``: ``?cluster=``."""

    cluster = ClusterRefFilter()

    class Meta:
        model = Node
        fields = ["cluster"]


class GpuFilter(django_filters.FilterSet):
    """``GET /api/v1/gpus``: ``?cluster=``."""

    cluster = ClusterRefFilter()

    class Meta:
        model = GpuDevice
        fields = ["cluster"]


class ClusterFilter(django_filters.FilterSet):
    """``GET /api/v1/clusters``: ``?status=`` (an unknown status lists nothing) and ``?name=`` (exact)."""

    status = django_filters.CharFilter(help_text="Only clusters in this status (pending, connected, degraded, unreachable, deregistered)")
    name = django_filters.CharFilter(help_text="Only clusters of this name (exact; a deregistered one may share it)")

    class Meta:
        model = Cluster
        fields = ["status", "name"]
