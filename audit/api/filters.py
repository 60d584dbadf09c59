"""FilterSet of the audit trail's ``?cluster=``: ``clusters.filters.ClusterRefFilter`` (one rule for every list),
matched on the cluster's public id that a row keeps as text (rows outlive their cluster)."""

from __future__ import annotations

import django_filters

from audit.models import AuditRecord
from clusters.filters import ClusterRefFilter


class AuditFilter(django_filters.FilterSet):
    """``GET /api/v1/audit``: ``?cluster=`` (id, deregistered clusters included, or the name of a registered one)."""

    cluster = ClusterRefFilter(to_field="public_id", help_text=(
        "Only rows about this cluster: id (clu_..., deregistered clusters included) or the name of a registered cluster; "
        "404 cluster_not_found if none"))

    class Meta:
        model = AuditRecord
        fields = ["cluster"]
