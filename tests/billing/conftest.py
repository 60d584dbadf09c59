"""Fixtures for billing tests: demo-fleet clusters (real GPU models and memory), sessions on them, operator clients.

Usage sample bodies and metered sessions are built by :mod:`tests.helpers` (``T0``, ``sample``, ``metered_session``).
"""

from __future__ import annotations

import pytest

from clusters import services as cluster_services
from clusters.operator_token.tokens import operator_token_mint
from demo import fleet
from tests.factories import ClusterFactory, UserFactory
from tests.helpers import Http, metered_session


def fleet_cluster_row(name: str):
    """A factory cluster named ``name`` holding the demo fleet's real inventory for ``name`` (lab-c1: 8× H100 80GB
    + 2× V100 32GB; lab-c2: 8× H20 + 1× T4), applied through ``inventory_apply``."""
    cluster = ClusterFactory(name=name)
    cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory(name)["snapshot"]["nodes"])
    cluster.refresh_from_db()
    return cluster


@pytest.fixture(autouse=True)
def _billing_clock(controlled_clock):
    """Billing tests read the controlled clock (``GSHARE_TEST_NOW``; tests/clock.py)."""


@pytest.fixture
def lab_c1():
    return fleet_cluster_row("lab-c1")


@pytest.fixture
def lab_c2():
    return fleet_cluster_row("lab-c2")


@pytest.fixture
def owner():
    return UserFactory(username="researcher")


@pytest.fixture
def whole_session(lab_c1, owner):
    """A Running whole-GPU session on lab-c1 (``metered_session``)."""
    return metered_session(lab_c1, owner=owner)


@pytest.fixture
def shared_session(lab_c1, owner):
    """A Running shared session on lab-c1: 20,000 MiB and 10 % cores per GPU (``metered_session``)."""
    return metered_session(lab_c1, owner=owner, gpu_memory_mib=20000, gpu_cores=10)


@pytest.fixture
def operator_c1(http_for, lab_c1) -> Http:
    return http_for(operator_token_mint(cluster_id=lab_c1.public_id))


@pytest.fixture
def operator_c2(http_for, lab_c2) -> Http:
    return http_for(operator_token_mint(cluster_id=lab_c2.public_id))
