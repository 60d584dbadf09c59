"""FilterSet of the audit trail's ``?cluster=``: the rule every list follows (``clusters.refs``: a ``clu_...`` id finds
any cluster, a name a registered one), matched on the cluster's public id that a row keeps as text (rows outlive
their cluster).

Every app writes audit rows, so audit sits below clusters and cannot import it: the clusters app installs the rule
here when it starts (:func:`set_cluster_resolver`, from ``clusters.apps``).

Audit rows also keep the cluster's name at the time of the row, so a name that no registered cluster carries any
more (its cluster was deregistered, or renamed) still finds the rows written under it: the trail is where one
looks for what happened to a cluster that is gone.
"""

from __future__ import annotations

from collections.abc import Callable

import django_filters
from django.db.models import QuerySet
from django_filters.constants import EMPTY_VALUES

from audit.models import AuditRecord
from core.exceptions import NotFound

#: ``resolve(ref) -> public id``: the cluster ``ref`` (an id or a name) names, raising ``NotFound`` (404
#: ``cluster_not_found``) when none does. Installed by the clusters app (``clusters.refs.cluster_public_id``).
_cluster_resolver: Callable[[str], str] | None = None
_ID_PREFIX = "clu_"


def set_cluster_resolver(resolve: Callable[[str], str]) -> None:
    """Install the rule that turns a ``?cluster=`` value into a cluster's public id (called once, at startup)."""
    global _cluster_resolver
    _cluster_resolver = resolve


class AuditClusterFilter(django_filters.CharFilter):
    """``?cluster=`` on audit rows: the shared rule, then rows written under that cluster name.

    Raises (when the FilterSet's ``qs`` is read):
        NotFound: ``cluster_not_found`` (404) when the value names no cluster and no row carries it as a name.
    """

    def filter(self, qs: QuerySet, value) -> QuerySet:  # noqa: D102
        if value in EMPTY_VALUES:
            return qs
        if _cluster_resolver is None:
            raise RuntimeError("The clusters app did not install the ?cluster= rule (clusters.apps.ClustersConfig.ready).")
        try:
            return qs.filter(cluster=_cluster_resolver(value))
        except NotFound:
            name = str(value).strip()
            if not name or name.startswith(_ID_PREFIX):
                raise
            by_name = qs.filter(cluster_name=name)
            if not by_name.exists():
                raise
            return by_name


class AuditFilter(django_filters.FilterSet):
    """``GET /api/v1/audit``: ``?cluster=`` (id, deregistered clusters included, or a name: of a registered cluster,
    else the name rows were written under)."""

    cluster = AuditClusterFilter(help_text=(
        "Only rows about this cluster: id (clu_..., deregistered clusters included), the name of a registered cluster, "
        "or the name a deregistered or renamed cluster had when the rows were written; 404 cluster_not_found if none"))

    class Meta:
        model = AuditRecord
        fields = ["cluster"]
