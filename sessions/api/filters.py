"""FilterSet of the sessions list: ``?cluster=`` is ``clusters.filters.ClusterRefFilter`` (one rule for every list)."""

from __future__ import annotations

import django_filters

from clusters.filters import ClusterRefFilter
from sessions.models import Session


class SessionFilter(django_filters.FilterSet):
    """``GET /api/v1/sessions``: ``?cluster=`` (id or name), ``?phase=`` (``Running``...)."""

    cluster = ClusterRefFilter()
    phase = django_filters.CharFilter(help_text="Only sessions in this phase (Pending, Starting, Running, Stopping, Terminated, Failed)")

    class Meta:
        model = Session
        fields = ["cluster", "phase"]
