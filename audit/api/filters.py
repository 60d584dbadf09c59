"""FilterSet of the audit trail's ``?cluster=``: ``clusters.filters.ClusterRefFilter`` (one rule for every list),
matched on the cluster's public id that a row keeps as text (rows outlive their cluster).

Audit rows also keep the cluster's name at the time of the row, so a name that no registered cluster carries any
more (its cluster was deregistered, or renamed) still finds the rows written under it: the trail is where one
looks for what happened to a cluster that is gone.
"""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from audit.models import AuditRecord
from clusters.filters import ClusterRefFilter
from clusters.refs import ID_PREFIX
from gshare.exceptions import NotFound


class AuditClusterFilter(ClusterRefFilter):
    """``?cluster=`` on audit rows: the shared rule, then rows written under that cluster name.

    Raises (when the FilterSet's ``qs`` is read):
        NotFound: ``cluster_not_found`` (404) when the value names no cluster and no row carries it as a name.
    """

    def filter(self, qs: QuerySet, value) -> QuerySet:  # noqa: D102
        try:
            return super().filter(qs, value)
        except NotFound:
            name = str(value).strip()
            if not name or name.startswith(ID_PREFIX):
                raise
            by_name = qs.filter(cluster_name=name)
            if not by_name.exists():
                raise
            return by_name


class AuditFilter(django_filters.FilterSet):
    """``GET /api/v1/audit``: ``?cluster=`` (id, deregistered clusters included, or a name: of a registered cluster,
    else the name rows were written under)."""

    cluster = AuditClusterFilter(to_field="public_id", help_text=(
        "Only rows about this cluster: id (clu_..., deregistered clusters included), the name of a registered cluster, "
        "or the name a deregistered or renamed cluster had when the rows were written; 404 cluster_not_found if none"))

    class Meta:
        model = AuditRecord
        fields = ["cluster"]
