"""GPU cards show the SM utilization their sessions report (``console.pages.clusters.selectors.gpu_utilization``): the sum over the
Running sessions holding the GPU of their fresh ``ok`` reading's ``utilization_percent`` for its UUID, capped at 100;
"—" without a fresh known reading; the same number of queries whatever the number of cards and readings. In
Chromium, a card shows it. ``SessionActivity`` rows are made directly (the report path is tested in tests/sessions/)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import GpuDevice, Node
from sessions.models import Allocation, Session, SessionActivity
from sessions.placement import usage_recompute
from tests.console.conftest import login, shot
from tests.console_checks import page_text
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory

URL = "/clusters/gpudevice/"


def hold(owner: str, device: GpuDevice, *, memory_mib: int = 20000, cores: int = 30, phase: str = Session.Phase.RUNNING) -> Session:
    """A session of ``owner`` holding a share of ``device``, as placement leaves it."""
    session = SessionFactory(owner=UserFactory(username=owner), cluster=device.cluster, gpu_memory_mib=memory_mib, gpu_cores=cores,
                             node=device.node.name, devices=[device.uuid], started_at=timezone.now(), phase=phase)
    Allocation.objects.create(session=session, device=device, memory_mib=memory_mib, cores=cores)
    usage_recompute(node_ids=[device.node_id])
    return session


def report(session: Session, readings: dict[str, float | None], *, age_seconds: float = 5, state: str = "ok") -> None:
    """The session's last activity reading: ``utilization_percent`` per GPU UUID."""
    at = timezone.now() - timedelta(seconds=age_seconds)
    gpus = [{"device_uuid": uuid, "last_kernel_seconds": 1, "utilization_percent": value, "memory_used_bytes": 1,
             "memory_limit_bytes": 2, "sampled_at": at.isoformat()} for uuid, value in readings.items()] if state == "ok" else []
    SessionActivity.objects.update_or_create(session=session, defaults={"state": state, "sampled_at": at, "gpus": gpus,
                                                                        "reason": "" if state == "ok" else "monitor unreachable"})


@pytest.fixture
def fleet(db):
    """On node ``gpu-u1``: GPU 0 shared by carol (60 %) and dave (55 %: together capped at 100), GPU 1 held by erin
    (31.6 %; her reading also names the free GPU 5, which is not hers), GPU 2 by frank (stale), GPU 3 by gina (unknown), GPU 4 by
    hank (Stopping, 90 %), GPU 5 free."""
    cluster = ClusterFactory(name="lab-u")
    node = NodeFactory(cluster=cluster, name="gpu-u1")
    gpus = [GpuDeviceFactory(node=node, index=i, uuid=f"GPU-u{i}000000-1111-2222-3333-444455556666") for i in range(6)]
    carol, dave = hold("carol", gpus[0]), hold("dave", gpus[0])
    erin, frank, gina = hold("erin", gpus[1]), hold("frank", gpus[2]), hold("gina", gpus[3])
    hank = hold("hank", gpus[4], phase=Session.Phase.STOPPING)
    report(carol, {gpus[0].uuid: 60})
    report(dave, {gpus[0].uuid: 55})
    report(erin, {gpus[1].uuid: 31.6, gpus[5].uuid: 99})
    return {"gpus": gpus, "sessions": {"carol": carol, "dave": dave, "erin": erin, "frank": frank, "gina": gina, "hank": hank}}


@pytest.fixture
def readings(fleet, settings):
    gpus, s = fleet["gpus"], fleet["sessions"]
    report(s["frank"], {gpus[2].uuid: 70}, age_seconds=settings.GSHARE_ACTIVITY_STALE_SECONDS + 10)
    report(s["gina"], {}, state="unknown")
    report(s["hank"], {gpus[4].uuid: 90})
    return fleet


def _card(text: str, uuid: str) -> str:
    match = re.search(rf'<article[^>]*data-gpu-uuid="{re.escape(uuid)}".*?</article>', text, re.S)
    assert match, f"no card for {uuid}"
    return match.group(0)


def _shown(text: str, uuid: str) -> str:
    card = _card(text, uuid)
    return re.sub(r"<[^>]+>", "", re.search(r'<div class="gs-util[^"]*"[^>]*>(.*?)</div>', card, re.S).group(1)).strip()


@pytest.mark.django_db
def test_cards_sum_their_running_sessions_readings_capped_at_100(console, readings):
    response = console.get(URL)
    cards = {card.device.uuid: card for card in response.context["cl"].cards}
    gpus = readings["gpus"]
    assert [cards[g.uuid].utilization for g in gpus] == [100, 32, None, None, None, None]
    text = page_text(response)
    assert _shown(text, gpus[0].uuid) == "SM utilization 100 %"
    assert _shown(text, gpus[1].uuid) == "SM utilization 32 %"
    for gpu in gpus[2:]:  # stale, unknown, a Stopping session's, free
        assert _shown(text, gpu.uuid) == "SM utilization —", gpu.uuid


@pytest.mark.django_db
def test_the_gpu_page_says_it_too(console, readings):
    text = page_text(console.get(f"{URL}{readings['gpus'][1].pk}/change/"))
    assert re.search(r"SM utilization.*?32 %", text, re.S)
    assert "no fresh reading" in page_text(console.get(f"{URL}{readings['gpus'][5].pk}/change/"))


@pytest.mark.django_db
def test_card_queries_do_not_grow_with_cards_or_readings(console):
    """10 then 200 GPUs, every one shared by two Running sessions with a reading each: the same number of queries."""
    cluster = ClusterFactory(name="lab-q")
    owner = UserFactory(username="erin")
    counts = []
    for total in (10, 200):
        have = Node.objects.count()
        nodes = Node.objects.bulk_create([
            Node(cluster=cluster, cluster_name=cluster.name, name=f"q-{i:04d}", labels={}, gpu_mode="hami-core", ready=True,
                 last_seen_at=timezone.now()) for i in range(have, total)
        ])
        devices = GpuDevice.objects.bulk_create([
            GpuDevice(node=n, cluster=cluster, uuid=f"GPU-q{n.name[2:]}", index=0, model="NVIDIA H100 80GB HBM3", memory_mib=81559,
                      split_count=10, cores=100, last_seen_at=timezone.now()) for n in nodes
        ])
        sessions = Session.objects.bulk_create([
            Session(owner=owner, cluster=cluster, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=10, phase=Session.Phase.RUNNING,
                    node=d.node.name) for d in devices for _ in range(2)
        ])
        Allocation.objects.bulk_create([Allocation(session=s, device=devices[i // 2], memory_mib=1000, cores=10) for i, s in enumerate(sessions)])
        now = timezone.now()
        SessionActivity.objects.bulk_create([
            SessionActivity(session=s, state="ok", sampled_at=now, gpus=[{"device_uuid": devices[i // 2].uuid, "utilization_percent": 20,
                                                                          "last_kernel_seconds": 1, "memory_used_bytes": 1,
                                                                          "memory_limit_bytes": 2, "sampled_at": now.isoformat()}])
            for i, s in enumerate(sessions)
        ])
        usage_recompute(cluster_ids=[cluster.pk])
        with CaptureQueriesContext(connection) as queries:
            response = console.get(URL)
        cards = response.context["cl"].cards
        assert len(cards) == min(total, 48) and {card.utilization for card in cards} == {40}
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


@pytest.mark.django_db(transaction=True)
def test_browser_a_card_shows_the_utilization_of_its_sessions(live_server, console_users, page, readings):
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}{URL}")
    card = page.locator(f'article[data-gpu-uuid="{readings["gpus"][1].uuid}"]')
    card.wait_for()
    util = card.locator(".gs-util")
    assert util.inner_text() == "SM utilization 32 %" and util.get_attribute("data-utilization") == "32"
    assert page.locator(f'article[data-gpu-uuid="{readings["gpus"][5].uuid}"] .gs-util').inner_text() == "SM utilization —"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(page, "console-gpus-utilization")
