"""GPU management (``/clusters/gpudevice/``): one card per GPU with memory, cores and HAMi slots reserved against
their totals, the sessions holding it, filters (model, health, free / in use, node), the console's cluster scope,
read-only pages and a query count that does not grow with the fleet; in the browser, a card shows the session on it."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import GpuDevice, Node
from sessions.models import Allocation, Session
from sessions.placement import usage_recompute
from tests.console.conftest import login, shot
from tests.console_checks import assert_read_only, page_text
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory, SessionFactory, UserFactory

URL = "/clusters/gpudevice/"
H100_MIB = 81559


def _hold(owner: str, device: GpuDevice, *, memory_mib: int | None = None, cores: int | None = None) -> Session:
    """A Running session of ``owner`` holding ``device`` (whole when neither memory nor cores is given), as placement
    leaves it: the allocation, then the GPU's and node's counters recounted."""
    whole = memory_mib is None and cores is None
    session = SessionFactory(owner=UserFactory(username=owner), cluster=device.cluster, gpu_memory_mib=memory_mib, gpu_cores=cores,
                             node=device.node.name, devices=[device.uuid], started_at=timezone.now())
    Allocation.objects.create(session=session, device=device, exclusive=whole,
                              memory_mib=device.memory_mib if whole else memory_mib, cores=device.cores if whole else cores)
    usage_recompute(node_ids=[device.node_id])
    return session


@pytest.fixture
def fleet(db):
    """Cluster ``lab-a`` with node ``gpu-a1`` (three H100s, the third unhealthy) and ``lab-b`` with one V100 node;
    on ``gpu-a1``: bob's whole-GPU session on GPU 0, carol's 40,000 MiB / 30 % and dave's 20,000 MiB / 20 % shares
    on GPU 1."""
    a, b = ClusterFactory(name="lab-a"), ClusterFactory(name="lab-b")
    node = NodeFactory(cluster=a, name="gpu-a1", labels={"gshare.io/gpu-mode": "hami-core", "nvidia.com/gpu.product": "H100"})
    gpus = [GpuDeviceFactory(node=node, index=i, uuid=f"GPU-a1{i:06d}-1111-2222-3333-444455556666", health=i < 2) for i in range(3)]
    v100_node = NodeFactory(cluster=b, name="gpu-b1")
    GpuDeviceFactory(node=v100_node, index=0, model="Tesla V100-SXM2-32GB", memory_mib=32768, split_count=4,
                     uuid="GPU-b1000000-1111-2222-3333-444455556666")
    whole = _hold("bob", gpus[0])
    share = _hold("carol", gpus[1], memory_mib=40000, cores=30)
    small = _hold("dave", gpus[1], memory_mib=20000, cores=20)
    return {"a": a, "b": b, "node": node, "gpus": gpus, "whole": whole, "share": share, "small": small,
            "whole_gpu": gpus[0], "shared_gpu": gpus[1]}


def _cards(response) -> dict[str, object]:
    """The page's cards by GPU UUID."""
    assert response.status_code == 200
    return {card.device.uuid: card for card in response.context["cl"].cards}


def _card_html(response, uuid: str) -> str:
    text = page_text(response)
    match = re.search(rf'<article[^>]*data-gpu-uuid="{re.escape(uuid)}".*?</article>', text, re.S)
    assert match, f"no card for {uuid}"
    return match.group(0)


def test_page_is_titled_gpu_management_with_one_card_per_gpu(console, fleet):
    response = console.get(URL)
    assert "<h1>GPU management</h1>" in page_text(response)
    assert len(_cards(response)) == 4
    assert 'id="result_list"' not in page_text(response)  # cards, not the table


def test_shared_gpu_card_counts_memory_cores_and_slots_and_lists_both_sessions(console, fleet):
    response = console.get(URL)
    card = _cards(response)[fleet["shared_gpu"].uuid]
    assert (card.memory.used, card.memory.total) == (60000, H100_MIB)
    assert (card.cores.used, card.cores.total) == (50, 100)
    assert (card.slots.used, card.slots.total) == (2, 10)
    assert card.state == "shared"
    html = _card_html(response, fleet["shared_gpu"].uuid)
    assert f"60,000 / {H100_MIB:,} MiB" in html and "50 / 100 %" in html and "2 / 10" in html
    for session, owner, share in ((fleet["share"], "carol", "40,000 MiB · 30 %"), (fleet["small"], "dave", "20,000 MiB · 20 %")):
        assert f'href="/gpu_sessions/session/{session.pk}/change/"' in html
        assert session.public_id in html and owner in html and share in html
    assert 'style="width: 74%"' in html  # 60,000 of 81,559 MiB


def test_whole_gpu_card_is_full_and_says_whole(console, fleet):
    response = console.get(URL)
    card = _cards(response)[fleet["whole_gpu"].uuid]
    assert (card.memory.used, card.memory.total) == (H100_MIB, H100_MIB)
    assert (card.cores.used, card.cores.total) == (100, 100)
    assert (card.slots.used, card.slots.total) == (1, 10)
    assert card.state == "whole"
    html = _card_html(response, fleet["whole_gpu"].uuid)
    assert fleet["whole"].public_id in html and "bob" in html and ">whole<" in html
    assert "carol" not in html


def test_free_and_unhealthy_cards(console, fleet):
    cards = _cards(console.get(URL))
    unhealthy = cards[fleet["gpus"][2].uuid]
    assert unhealthy.state == "unhealthy" and not unhealthy.holders and unhealthy.memory.used == 0
    v100 = cards["GPU-b1000000-1111-2222-3333-444455556666"]
    assert v100.state == "free" and (v100.memory.total, v100.slots.total) == (32768, 4)


def test_card_shows_short_uuid_with_the_whole_one_on_hover_and_copy(console, fleet):
    uuid = fleet["shared_gpu"].uuid
    html = _card_html(console.get(URL), uuid)
    short = uuid.split("-")[0] + "-" + uuid.split("-")[1]
    assert f'<code title="{uuid}">{short}</code>' in html
    assert f'data-copy="{uuid}"' in html
    assert "gpu-a1" in html and "lab-a" in html and "NVIDIA H100 80GB HBM3" in html and f"#{fleet['shared_gpu'].index}" in html


def test_ended_sessions_hold_nothing(console, fleet):
    """Only live allocations count: a session marked Terminated (its allocation not yet released) is not listed."""
    Session.objects.filter(pk=fleet["small"].pk).update(phase=Session.Phase.TERMINATED, ended_at=timezone.now())
    card = _cards(console.get(URL))[fleet["shared_gpu"].uuid]
    assert [h.owner for h in card.holders] == ["carol"]
    assert (card.memory.used, card.cores.used, card.slots.used) == (40000, 30, 1)


def test_free_and_in_use_filter(console, fleet):
    in_use = set(_cards(console.get(URL, {"use": "in_use"})))
    assert in_use == {fleet["whole_gpu"].uuid, fleet["shared_gpu"].uuid}
    free = set(_cards(console.get(URL, {"use": "free"})))
    assert free == {g.uuid for g in GpuDevice.objects.all()} - in_use
    assert "In use" in page_text(console.get(URL))


def test_model_and_health_filters(console, fleet):
    v100 = _cards(console.get(URL, {"model": "Tesla V100-SXM2-32GB"}))
    assert list(v100) == ["GPU-b1000000-1111-2222-3333-444455556666"]
    unhealthy = _cards(console.get(URL, {"health": "unhealthy"}))
    assert list(unhealthy) == [fleet["gpus"][2].uuid]
    healthy = _cards(console.get(URL, {"health": "healthy", "model": "NVIDIA H100 80GB HBM3"}))
    assert set(healthy) == {fleet["gpus"][0].uuid, fleet["gpus"][1].uuid}


def test_node_filter_is_the_link_from_node_management(console, fleet):
    response = console.get(URL, {"node": fleet["node"].pk})
    assert set(_cards(response)) == {g.uuid for g in fleet["gpus"]}
    assert "gpu-a1 (lab-a)" in page_text(response)
    assert _cards(console.get(URL, {"node": "999999"})) == {}
    assert _cards(console.get(URL, {"node": "not-a-number"})) == {}


def test_search_finds_a_gpu_by_uuid_or_node(console, fleet):
    assert list(_cards(console.get(URL, {"q": "GPU-b1000000"}))) == ["GPU-b1000000-1111-2222-3333-444455556666"]
    assert len(_cards(console.get(URL, {"q": "gpu-a1"}))) == 3


def test_cluster_scope_narrows_the_cards_and_says_so(console, fleet):
    response = console.get(URL, {"cluster": "lab-b"})
    assert response.status_code == 302 and response["Location"] == URL
    response = console.get(URL)
    assert list(_cards(response)) == ["GPU-b1000000-1111-2222-3333-444455556666"]
    text = page_text(response)
    assert "Narrowed to cluster <strong>lab-b</strong>" in text and "Show all clusters" in text
    # The change page of a GPU of another cluster still opens.
    assert console.get(f"{URL}{fleet['shared_gpu'].pk}/change/").status_code == 200
    console.get(URL, {"cluster": "all"})
    assert len(_cards(console.get(URL))) == 4


def test_gpus_are_read_only(console, fleet):
    assert_read_only(console, URL, fleet["shared_gpu"])


def test_gpu_page_queries_do_not_grow_with_the_fleet(console, db):
    """10 nodes then 500 nodes (a GPU each, half of them held by a shared session): the same number of queries."""
    cluster = ClusterFactory(name="lab-q")
    owner = UserFactory(username="erin")
    counts = []
    for total in (10, 500):
        have = Node.objects.count()
        nodes = Node.objects.bulk_create([
            Node(cluster=cluster, cluster_name=cluster.name, name=f"q-{i:04d}", labels={"gpu": "on"}, gpu_mode="hami-core",
                 ready=True, last_seen_at=timezone.now())
            for i in range(have, total)
        ])
        devices = GpuDevice.objects.bulk_create([
            GpuDevice(node=n, cluster=cluster, uuid=f"GPU-q{n.name[2:]}0000-0000-0000-0000-000000000000", index=0, model="NVIDIA H100 80GB HBM3",
                      memory_mib=H100_MIB, split_count=10, cores=100, last_seen_at=timezone.now())
            for n in nodes
        ])
        for device in devices[::2]:
            session = Session.objects.create(owner=owner, cluster=cluster, image="img", gpus=1, gpu_memory_mib=1000, gpu_cores=10,
                                             phase=Session.Phase.RUNNING, node=device.node.name)
            Allocation.objects.create(session=session, device=device, memory_mib=1000, cores=10)
        usage_recompute(cluster_ids=[cluster.pk])
        with CaptureQueriesContext(connection) as queries:
            response = console.get(URL)
        cards = _cards(response)
        assert len(cards) == min(total, 48) and any(card.holders for card in cards.values())
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


# --- in the browser -------------------------------------------------------------------------------------------------


def test_browser_card_shows_the_session_on_it(live_server, console_users, page, fleet):
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}{URL}")
    card = page.locator(f'article[data-gpu-uuid="{fleet["shared_gpu"].uuid}"]')
    card.wait_for()
    assert card.get_by_role("link", name=fleet["share"].public_id).is_visible()
    assert "carol" in card.inner_text() and "40,000 MiB · 30 %" in card.inner_text()
    memory = card.get_by_role("meter", name="Memory")
    assert memory.get_attribute("aria-valuenow") == "60000" and memory.get_attribute("aria-valuemax") == str(H100_MIB)
    # The short UUID is one line, and the whole one is on hover.
    code = card.locator(".gs-uuid code")
    assert code.get_attribute("title") == fleet["shared_gpu"].uuid
    box = code.bounding_box()
    assert box and box["height"] < 30, box
    # Nothing cut off at 1400 px: the page does not scroll sideways.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(page, "console-gpus-card")
    card.get_by_role("link", name=fleet["share"].public_id).click()
    page.wait_for_load_state()
    assert f"/gpu_sessions/session/{fleet['share'].pk}/change/" in page.url


def test_browser_copy_button_copies_the_whole_uuid(live_server, console_users, context, fleet):
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = context.new_page()
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}{URL}")
    uuid = fleet["whole_gpu"].uuid
    button = page.locator(f'article[data-gpu-uuid="{uuid}"] .gs-copy')
    button.click()
    page.wait_for_function("document.querySelector('.gs-copied') !== null")
    assert page.evaluate("navigator.clipboard.readText()") == uuid


def test_browser_gpu_and_node_pages_are_read_only(live_server, console_users, page, fleet):
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}{URL}{fleet['shared_gpu'].pk}/change/")
    shot(page, "console-gpu-detail")
    assert page.locator("input[name=_save]").count() == 0 and page.locator("a.deletelink").count() == 0
    page.goto(f"{live_server.url}/clusters/node/{fleet['node'].pk}/change/")
    shot(page, "console-node-detail")
    assert page.locator(".gs-chips-all .gs-chip").count() == 2
    assert page.locator("input[name=_save]").count() == 0


def test_gpu_page_shows_its_reservations_and_sessions(console, fleet):
    text = page_text(console.get(f"{URL}{fleet['shared_gpu'].pk}/change/"))
    assert f"60,000 / {H100_MIB:,} MiB" in text and "50 / 100 %" in text and "2 / 10" in text
    assert f'href="/gpu_sessions/session/{fleet["share"].pk}/change/"' in text and "carol · Running" in text
    node = page_text(console.get(f"/clusters/node/{fleet['node'].pk}/change/"))
    assert f'href="/clusters/gpudevice/?node={fleet["node"].pk}"' in node and "nvidia.com/gpu.product" in node


def test_cards_show_physical_figures_and_hamis_scaled_ones_labelled(console, db):
    """lab-c2 as its operator reports it: gpu-h20-01's H20-3e registered by HAMi with deviceMemoryScaling 1.8 and
    devcore 500 (real HAMi data, demo/data/README.md), its node labelled by GPU feature discovery with the physical
    143,771 MiB; gpu-l40s-01's L40S unscaled."""
    from clusters import services as cluster_services
    from demo import fleet as demo_fleet

    cluster = ClusterFactory(name="lab-c2")
    cluster_services.inventory_apply(cluster=cluster, nodes=demo_fleet.expected_inventory("lab-c2")["snapshot"]["nodes"])
    h20 = GpuDevice.objects.filter(node__name="gpu-h20-01").order_by("index").first()
    assert (h20.memory_mib, h20.cores) == (258787, 500)  # what HAMi registers
    response = console.get("/clusters/gpudevice/", {"node": h20.node_id})
    card = _card_html(response, h20.uuid)
    assert "Physical: <strong data-physical-memory>143,771 MiB</strong> · <strong data-physical-cores>100 %</strong> cores" in card
    assert "HAMi's scaled figures: <span data-hami-scaled>258,787 MiB (memory ×1.8), 500 % cores (×5)</span>" in card
    assert 'aria-label="HAMi memory (scaled)"' in card and 'aria-label="HAMi cores (scaled)"' in card
    assert "0 / 258,787 MiB" in card  # the bars stay in HAMi's units: what placement reserves
    # An unscaled GPU: the physical line, the plain bars, no scaled line.
    other = GpuDevice.objects.exclude(node__name="gpu-h20-01").filter(cluster=cluster).first()
    card = _card_html(console.get("/clusters/gpudevice/", {"node": other.node_id}), other.uuid)
    assert f"Physical: <strong data-physical-memory>{other.memory_mib:,} MiB</strong>" in card
    assert "data-hami-scaled" not in card and 'aria-label="Memory"' in card and 'aria-label="Cores"' in card
    # The GPU's own page says the same.
    page = page_text(console.get(f"/clusters/gpudevice/{h20.pk}/change/"))
    assert "143,771 MiB" in page and "258,787 MiB (memory ×1.8), 500 % cores (×5)" in page


def test_a_node_without_gfd_memory_or_of_another_product_says_not_reported(console, db):
    node = NodeFactory(labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"})
    gpu = GpuDeviceFactory(node=node, cluster=node.cluster, model="NVIDIA H100 80GB HBM3", memory_mib=81559, cores=100)
    card = _card_html(console.get("/clusters/gpudevice/"), gpu.uuid)
    assert "<strong data-physical-memory>memory not reported</strong>" in card and "data-hami-scaled" not in card
    Node.objects.filter(pk=node.pk).update(labels={})
    card = _card_html(console.get("/clusters/gpudevice/"), gpu.uuid)
    assert "memory not reported" in card
