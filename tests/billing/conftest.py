"""Fixtures for billing tests: demo-fleet clusters (real GPU models and memory), sessions on them, operator clients."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from clusters import services as cluster_services
from clusters.models import GpuDevice
from clusters.operator_token.tokens import operator_token_mint
from demo import fleet
from sessions.models import Session
from tests.conftest import Http
from tests.factories import ClusterFactory, SessionFactory, UserFactory

#: The moment the test samples start at (UTC): ten days ago, on the hour, so every test window lies inside the
#: accepted range (GSHARE_USAGE_MAX_AGE_SECONDS before now .. a few minutes after now) whatever day the suite runs.
T0 = (datetime.now(UTC) - timedelta(days=10)).replace(minute=0, second=0, microsecond=0)
_counter = itertools.count()


def iso(value: datetime) -> str:
    """``2026-11-29T16:00:00Z``."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def fleet_cluster_row(name: str):
    """A factory cluster named ``name`` holding the demo fleet's real inventory for ``name`` (lab-c1: 8× H100 80GB
    + 2× V100 32GB; lab-c2: 8× H20 + 1× T4), applied through ``inventory_apply``."""
    cluster = ClusterFactory(name=name)
    cluster_services.inventory_apply(cluster=cluster, nodes=fleet.expected_inventory(name)["snapshot"]["nodes"])
    cluster.refresh_from_db()
    return cluster


def device(cluster, model_prefix: str) -> GpuDevice:
    """The first GPU of ``cluster`` whose model starts with ``model_prefix``."""
    return GpuDevice.objects.filter(cluster=cluster, model__startswith=model_prefix).order_by("index", "pk").first()


def metered_session(cluster, *, owner=None, gpus=None, **fields) -> Session:
    """A Running session on ``cluster`` (``SessionFactory`` with ``fields``) that usage can be charged to: created a
    day before ``T0`` (a window may not begin before its session) and holding ``gpus`` (``GpuDevice`` rows; all of the
    cluster's by default) as the operator reports them (``Session.devices``)."""
    session = SessionFactory(cluster=cluster, owner=owner or UserFactory(), **fields)
    held = list(GpuDevice.objects.filter(cluster=cluster).order_by("pk")) if gpus is None else gpus
    Session.objects.filter(pk=session.pk).update(created_at=T0 - timedelta(days=1), started_at=T0 - timedelta(days=1),
                                                 devices=[g.uuid for g in held])
    session.refresh_from_db()
    return session


def sample(session, gpu, *, start: datetime = T0, seconds: float = 60, sample_id: str | None = None, **extra) -> dict:
    """One usage sample body of ``session`` on ``gpu`` (a ``GpuDevice`` or a UUID)."""
    uuid = gpu if isinstance(gpu, str) else gpu.uuid
    body = {
        "sample_id": sample_id or f"{session.public_id}:{uuid}:{next(_counter)}",
        "session_id": session.public_id,
        "device_uuid": uuid,
        "start": iso(start),
        "end": iso(start + timedelta(seconds=seconds)),
        "gpu_util_percent": 42.5,
        "memory_used_mib": 1024,
    }
    body.update(extra)
    return body


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
def operator_c1(live_server, lab_c1) -> Http:
    return Http(live_server.url, operator_token_mint(cluster_id=lab_c1.public_id))


@pytest.fixture
def operator_c2(live_server, lab_c2) -> Http:
    return Http(live_server.url, operator_token_mint(cluster_id=lab_c2.public_id))
