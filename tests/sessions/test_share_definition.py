"""One definition of a share: what placement reserves, what it is priced at, what HAMi is asked to enforce and what
the API shows (docs/billing.md, "What a share takes").

The property: over random requests placed on the demo fleet's real GPU rows (H100, V100, H20 registered with HAMi's
memory and core scaling, T4; with random HAMi split counts), the priced fraction of every reserved GPU is at least
the fraction reserved in every dimension: memory, cores and split slots.
"""

from __future__ import annotations

import copy
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from django.contrib import admin
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import pricing
from billing.models import Price
from billing.selectors import session_hourly_cost
from clusters import services as cluster_services
from clusters.models import GpuDevice
from core.exceptions import Conflict
from demo import fleet
from sessions import create, lifecycle, selectors
from sessions.manifests import gshare_session_manifest, share_gpu_limits
from sessions.models import Allocation, Session
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

GSS = ("gsharesessions", "gshare.io", "v1alpha1")
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("researcher")


class _Rollback(Exception):
    """Undo one example's rows (the test's transaction stays open)."""


def _snapshot(name: str, split: int | None) -> list[dict]:
    nodes = copy.deepcopy(fleet.expected_inventory(name)["snapshot"]["nodes"])
    if split is not None:
        for node in nodes:
            for device in node["devices"]:
                device["split_count"] = split
    return nodes


def _six(fraction: Decimal) -> Decimal:
    return fraction.quantize(pricing.SHARE, rounding=ROUND_HALF_EVEN)


def _check_every_reservation() -> int:
    """Assert the property on every live allocation, and on every GPU for its holders together; returns how many
    allocations were checked."""
    checked = 0
    for allocation in Allocation.objects.select_related("session", "device"):
        session, device = allocation.session, allocation.device
        share = pricing.gpu_share(device_memory_mib=device.memory_mib, gpu_memory_mib=session.gpu_memory_mib,
                                  gpu_cores=session.gpu_cores)
        # The share is kept to 6 places (half to even): it covers each reserved fraction at that precision.
        assert share >= _six(Decimal(allocation.memory_mib) / device.memory_mib), (session.gpu_memory_mib, device.memory_mib)
        assert share >= _six(Decimal(allocation.cores) / device.cores), (session.gpu_cores, allocation.cores, device.cores)
        assert share >= _six(Decimal(1) / device.split_count), (session.gpu_cores, device.split_count)
        # What HAMi is asked to enforce is what is reserved (and so priced).
        limits = share_gpu_limits(session)
        if session.whole_gpus:
            assert limits == {} and allocation.exclusive
        else:
            assert limits["gpuCores"] == allocation.cores
            if "gpuMemoryMiB" in limits:
                assert limits["gpuMemoryMiB"] == allocation.memory_mib
            else:  # GPUs of different memory: HAMi's default, each one's whole memory, is what is reserved
                assert session.gpu_memory_mib is None and allocation.memory_mib == device.memory_mib
        checked += 1
    for device in GpuDevice.objects.filter(used_count__gt=0):  # a full GPU is paid for whole by its holders
        holders = Allocation.objects.filter(device=device).select_related("session")
        paid = sum(pricing.gpu_share(device_memory_mib=device.memory_mib, gpu_memory_mib=a.session.gpu_memory_mib,
                                     gpu_cores=a.session.gpu_cores) for a in holders)
        taken = max(Decimal(device.used_memory_mib) / device.memory_mib, Decimal(device.used_cores) / device.cores,
                    Decimal(device.used_count) / device.split_count)
        assert paid >= taken - pricing.SHARE / 2 * device.used_count, (device.pk, paid, taken)  # each share's rounding
    return checked


_memory = st.one_of(st.none(), st.integers(1, 300_000), st.sampled_from([1, 4096, 15360, 32768, 81559, 258787]))
_cores = st.one_of(st.none(), st.integers(1, 100), st.sampled_from([1, 9, 10, 11, 34, 100]))
_step = st.one_of(
    st.tuples(st.just("start"), st.integers(1, 2), _memory, _cores),
    st.tuples(st.just("end"), st.integers(0, 50)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(split=st.one_of(st.none(), st.integers(1, 16)), steps=st.lists(_step, min_size=1, max_size=14))
def test_the_price_of_every_reserved_gpu_covers_what_it_reserves_in_every_dimension(user, split, steps):
    try:
        with transaction.atomic():
            for name in ("lab-c1", "lab-c2"):
                cluster = ClusterFactory(name=name)
                cluster_services.inventory_apply(cluster=cluster, nodes=_snapshot(name, split))
            live: list[Session] = []
            for step in steps:
                if step[0] == "end":
                    if live:
                        lifecycle.session_fail(session=live.pop(step[1] % len(live)), message="test")
                    continue
                _, gpus, memory, cores = step
                try:
                    live.append(create.session_create(owner=user, image="img", gpus=gpus, gpu_memory_mib=memory, gpu_cores=cores))
                except Conflict as exc:
                    assert exc.code == "no_capacity"
                    continue
                assert _check_every_reservation() == Allocation.objects.count() >= gpus
                shown, placed = selectors.session_share(live[-1]), live[-1].allocations.select_related("device")
                assert shown["fraction"] == str(max(pricing.gpu_share(
                    device_memory_mib=a.device.memory_mib, gpu_memory_mib=memory, gpu_cores=live[-1].gpu_cores) for a in placed
                ).quantize(pricing.SHARE))
                assert shown["memory_mib"] == [a.memory_mib for a in placed.order_by("id")]
            raise _Rollback
    except _Rollback:
        pass


def _shares_on_one_gpu_pay_for_it(user, **request) -> tuple[list[Session], GpuDevice]:
    first = create.session_create(owner=user, image="img", gpus=1, **request)
    device = first.allocations.get().device
    sessions = [first]
    while True:
        try:
            session = create.session_create(owner=user, image="img", gpus=1, **request)
        except Conflict:
            break
        if session.allocations.get().device_id != device.pk:
            lifecycle.session_fail(session=session, message="test")
            break
        sessions.append(session)
    device.refresh_from_db()
    return sessions, device


def test_ten_tiny_shares_that_fill_a_gpus_split_slots_pay_for_the_whole_gpu(user):
    cluster = ClusterFactory(name="lab-c1")
    cluster_services.inventory_apply(cluster=cluster, nodes=_snapshot("lab-c1", None))
    sessions, device = _shares_on_one_gpu_pay_for_it(user, gpu_memory_mib=1, gpu_cores=1)
    # Binpack keeps them on one H100 (split 10) until its slots are gone; each takes (and pays) a slot: 10 % of cores.
    assert len(sessions) == 10 and device.used_count == device.split_count == 10
    assert {s.gpu_cores for s in sessions} == {10} and device.used_cores == 100
    paid = sum(pricing.gpu_share(device_memory_mib=device.memory_mib, gpu_memory_mib=1, gpu_cores=s.gpu_cores) for s in sessions)
    assert paid == 1


def test_a_share_keeps_the_cores_it_asked_above_one_slot(user):
    """A share's cores above one slot are kept as asked (the slot floor never shrinks a request)."""
    cluster = ClusterFactory(name="lab-c1")
    cluster_services.inventory_apply(cluster=cluster, nodes=_snapshot("lab-c1", 4))
    session = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=30)
    assert session.gpu_cores == 30 and session.allocations.get().cores == 30  # floor: ceil(100 / 4) = 25
    tiny = create.session_create(owner=user, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=3)
    assert tiny.gpu_cores == 25 and Session.objects.get(pk=tiny.pk).gpu_cores == 25


def _start(http, **body):
    return http.post("/api/v1/sessions", json={"image": "quay.io/jupyter/base-notebook", "gpus": 1, **body})


def test_cores_without_memory_reserves_and_pays_for_the_whole_gpu_memory(http, live_cluster):
    """The issue's case: ``{"gpus": 1, "gpu_cores": 1}`` held the H100's 81,559 MiB for 1 % of its price."""
    cluster, emulated = live_cluster("lab-c1")
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("7.5"))
    response = _start(http, gpu_cores=1, cluster="lab-c1")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["share"] == {"whole": False, "memory_mib": [81559], "cores": 10, "fraction": "1.000000"}
    assert body["gpu_memory_mib"] is None and body["gpu_cores"] == 10
    session = Session.objects.get(public_id=body["id"])
    allocation = session.allocations.select_related("device").get()
    assert allocation.device.model == H100 and allocation.memory_mib == 81559
    assert session_hourly_cost(session) == Decimal("7.500000")  # the whole H100, not 0.075
    (gss,) = emulated.objects_of(*GSS)
    assert gss["spec"]["gpuMemoryMiB"] == 81559 and gss["spec"]["gpuCores"] == 10  # what HAMi enforces
    assert gshare_session_manifest(session)["spec"]["gpuMemoryMiB"] == 81559


def test_memory_without_cores_reserves_and_pays_for_every_sm(http, live_cluster):
    """The mirror case: HAMi-core sets no SM limit without ``gpucores``, so the share has all of them."""
    _, emulated = live_cluster("lab-c1")
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("7.5"))
    body = _start(http, gpu_memory_mib=4096, cluster="lab-c1").json()
    assert body["share"] == {"whole": False, "memory_mib": [4096], "cores": 100, "fraction": "1.000000"}
    assert body["gpu_memory_mib"] == 4096 and body["gpu_cores"] == 100
    session = Session.objects.get(public_id=body["id"])
    allocation = session.allocations.select_related("device").get()
    assert allocation.cores == 100 and allocation.device.used_cores == 100
    assert session_hourly_cost(session) == Decimal("7.500000")  # not 4096 / 81559 of it
    (gss,) = emulated.objects_of(*GSS)
    assert gss["spec"]["gpuCores"] == 100 and gss["spec"]["gpuMemoryMiB"] == 4096
    # Its GPU's SMs are taken: another share goes to another GPU.
    other = Session.objects.get(public_id=_start(http, gpu_memory_mib=4096, gpu_cores=5, cluster="lab-c1").json()["id"])
    assert other.allocations.get().device_id != allocation.device_id


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"gpu_cores": 0}, "gpu_cores"), ({"gpu_cores": -1}, "gpu_cores"), ({"gpu_cores": 101}, "gpu_cores"),
        ({"gpu_cores": 10**30}, "gpu_cores"), ({"gpu_cores": 1.5}, "gpu_cores"), ({"gpu_cores": "10"}, "gpu_cores"),
        ({"gpu_cores": True}, "gpu_cores"), ({"gpu_memory_mib": 0}, "gpu_memory_mib"), ({"gpu_memory_mib": -4096}, "gpu_memory_mib"),
        ({"gpu_memory_mib": 2**31}, "gpu_memory_mib"), ({"gpu_memory_mib": 10**40}, "gpu_memory_mib"),
        ({"gpu_memory_mib": 2**31, "gpu_cores": 5, "cluster": "lab-c1"}, "gpu_memory_mib"),
        ({"gpu_memory_mib": 4096.5}, "gpu_memory_mib"), ({"gpu_memory_mib": "4096"}, "gpu_memory_mib"),
        ({"gpu_memory_mib": [4096]}, "gpu_memory_mib"), ({"gpu_cores": {"v": 1}}, "gpu_cores"),
    ],
)
def test_bad_share_values_are_refused_with_a_code_and_reserve_nothing(http, live_cluster, extra, field):
    live_cluster("lab-c1")
    response = _start(http, **extra)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "invalid_request" and field in body["detail"]
    assert not Session.objects.exists() and not Allocation.objects.exists()


def test_a_share_larger_than_every_gpu_is_refused_with_no_capacity(http, live_cluster):
    live_cluster("lab-c1")
    response = _start(http, gpu_memory_mib=81560, gpu_cores=1)  # one MiB above the H100 (HAMi's registered figure)
    assert response.status_code == 409 and response.json()["code"] == "no_capacity"
    assert not Allocation.objects.exists()


@pytest.mark.parametrize(
    ("memory", "cores", "shown"),
    [(None, None, "2 whole"), (None, 10, "2 × all memory, 10% cores"), (4096, 100, "2 × 4096 MiB, 100% cores"),
     (4096, None, "2 × 4096 MiB, all cores")],
)
def test_the_console_names_what_a_share_holds(memory, cores, shown):
    session = Session(gpus=2, gpu_memory_mib=memory, gpu_cores=cores)
    assert admin.site._registry[Session].gpus_asked(session) == shown
