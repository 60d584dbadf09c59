"""Fixtures for session tests: a registered, inventoried emulated cluster of the demo fleet."""

import pytest

from clusters import services as cluster_services
from demo import fleet
from tests.conftest import kubeconfig_text


@pytest.fixture
def live_cluster(fleet_cluster):
    """Factory: ``start(name) -> (Cluster, EmulatedCluster)``, registered through the service (probe
    included) and with the fleet's real inventory applied, so it is ``connected`` and has GPUs."""

    def start(name: str = "lab-c1", session_domain: str | None = None):
        emulated = fleet_cluster(name)
        cluster = cluster_services.cluster_register(
            name=name, kubeconfig=kubeconfig_text(emulated), session_domain=session_domain or f"{name}.gshare.localhost"
        )
        cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory(name)["snapshot"]["nodes"])
        cluster.refresh_from_db()
        return cluster, emulated

    return start
