"""The attach's API client against the real control plane (live server): looking a cluster up by name."""

from __future__ import annotations

import pytest

from attach.api_client import ControlPlaneClient
from clusters.models import Cluster
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_registered_cluster_is_found_behind_many_deregistered_ones_of_its_name(live_server, staff_token):
    for number in range(60):  # a name reused after 60 deregistrations: the live one is on the second page
        ClusterFactory(name="gpu-a", status=Cluster.Status.DEREGISTERED, session_domain=f"old-{number}.example.com")
    live = ClusterFactory(name="gpu-a")
    with ControlPlaneClient(live_server.url, staff_token) as api:
        assert api.cluster_named("gpu-a")["id"] == live.public_id
        assert api.cluster_named("gpu-b") is None
