"""Node management (``/clusters/node/``) and the Clusters list: per node GPUs (count, free, open for shares), load,
ready, HAMi mode, labels as chips, last report age and the link to its GPU cards; read-only pages; the console's
cluster scope; query counts that do not grow with the fleet; in the browser, the top bar's Cluster selector narrows
Node management and GPU management and stays chosen across pages and with ``?cluster=``."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from playwright.sync_api import expect

from clusters.models import Cluster, GpuDevice, Node
from sessions.models import Allocation
from sessions.placement import usage_recompute
from tests.console.conftest import login, shot
from tests.console.test_gpu_management import _hold
from tests.console_checks import assert_read_only, page_text
from tests.factories import ClusterFactory, GpuDeviceFactory, NodeFactory

URL = "/clusters/node/"
LABELS = {
    "kubernetes.io/hostname": "gpu-a1", "kubernetes.io/arch": "amd64", "gshare.io/gpu-mode": "hami-core", "gpu": "on",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "topology.kubernetes.io/zone": "rack-3", "node-role.kubernetes.io/gpu": "",
    "feature.node.kubernetes.io/cpu-model.vendor_id": "AMD",
}


@pytest.fixture
def fleet(db):
    """``lab-a``: node ``gpu-a1`` (4 H100s: one whole session, one GPU with two shares, one unhealthy, one free,
    reported 12 s ago) and ``gpu-a2`` (not ready, no GPUs, reported 3 h ago, HAMi mode unset); ``lab-b``: ``gpu-b1``
    with one free V100."""
    a, b = ClusterFactory(name="lab-a"), ClusterFactory(name="lab-b")
    now = timezone.now()
    node = NodeFactory(cluster=a, name="gpu-a1", labels=LABELS, last_seen_at=now - timedelta(seconds=12))
    gpus = [GpuDeviceFactory(node=node, index=i, health=i != 2) for i in range(4)]
    bare = NodeFactory(cluster=a, name="gpu-a2", ready=False, gpu_mode="", labels={}, last_seen_at=now - timedelta(hours=3))
    other = NodeFactory(cluster=b, name="gpu-b1")
    GpuDeviceFactory(node=other, index=0, model="Tesla V100-SXM2-32GB", memory_mib=32768, split_count=4)
    usage_recompute(cluster_ids=[a.pk, b.pk])
    _hold("bob", gpus[0])
    _hold("carol", gpus[1], memory_mib=40000, cores=30)
    _hold("dave", gpus[1], memory_mib=20000, cores=20)
    return {"a": a, "b": b, "node": node, "bare": bare, "other": other, "gpus": gpus}


def _rows(response) -> dict[str, Node]:
    assert response.status_code == 200
    return {node.name: node for node in response.context["cl"].result_list}


def _row_html(response, node: Node) -> str:
    text = page_text(response)
    match = re.search(rf'<tr[^>]*>(?:(?!</tr>).)*?/clusters/node/{node.pk}/change/.*?</tr>', text, re.S)
    assert match, f"no row for {node.name}"
    return match.group(0)


def _cell(row: str, field: str) -> str:
    match = re.search(rf'<t[dh] class="field-{field}[^"]*"[^>]*>(.*?)</t[dh]>', row, re.S)
    assert match, f"no {field} cell in {row[:300]}"
    return re.sub(r"\s+", " ", match.group(1)).strip()


def test_page_is_titled_node_management(console, fleet):
    assert "<h1>Node management</h1>" in page_text(console.get(URL))


def test_node_columns_count_gpus_free_open_and_load(console, fleet):
    response = console.get(URL)
    row = _row_html(response, fleet["node"])
    # 4 GPUs; free: healthy with nothing on it (GPU 3); open for shares: healthy, not whole, a split left (GPUs 1, 3).
    assert re.sub(r"<[^>]+>", "", _cell(row, "gpus")) == "4"
    assert re.sub(r"<[^>]+>", "", _cell(row, "free")) == "1"
    assert re.sub(r"<[^>]+>", "", _cell(row, "open_for_shares")) == "2"
    # Load: memory 81,559 + 60,000 of 4 x 81,559 MiB = 43 %; cores 100 + 50 of 400 % = 38 %: the busier one.
    load = _cell(row, "load_bar")
    assert "43 % memory" in load and 'style="width: 43%"' in load and 'aria-valuenow="141559"' in load
    assert "Ready" in _cell(row, "ready_badge") and '<code class="gs-mode">hami-core</code>' in _cell(row, "ready_badge")
    assert f'href="/clusters/gpudevice/?node={fleet["node"].pk}"' in _cell(row, "cards")
    assert f'href="/clusters/cluster/{fleet["a"].pk}/change/">lab-a</a>' in _cell(row, "node_name")


def test_a_node_without_gpus_or_mode(console, fleet):
    row = _row_html(console.get(URL), fleet["bare"])
    assert "Not ready" in _cell(row, "ready_badge")
    assert "no GPUs" in _cell(row, "load_bar") and "—" in _cell(row, "ready_badge") and "none" in _cell(row, "label_chips")
    seen = _cell(row, "seen")
    assert ">3 h ago<" in seen


def test_labels_are_chips_not_json(console, fleet):
    cell = _cell(_row_html(console.get(URL), fleet["node"]), "label_chips")
    assert "{" not in cell and "&quot;" not in cell
    # What an operator picks a node by first; four chips, then "+4 more" listing the rest on hover.
    keys = re.findall(r'<span class="gs-chip-key">([^<]+)</span>', cell)
    assert keys == ["gshare.io/gpu-mode", "nvidia.com/gpu.product", "topology.kubernetes.io/zone", "gpu"]
    assert "+4 more" in cell and "kubernetes.io/hostname=gpu-a1" in cell
    assert '<span class="gs-chip-value">hami-core</span>' in cell
    # The node's own page shows every label as a chip.
    change = page_text(console.get(f"{URL}{fleet['node'].pk}/change/"))
    assert all(f">{key}<" in change for key in LABELS)


def test_last_report_age_with_utc_time_on_hover(console, fleet):
    seen = _cell(_row_html(console.get(URL), fleet["node"]), "seen")
    match = re.search(r'<time class="gs-age" datetime="[^"]+" title="(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)">(\d+) s ago</time>', seen)
    assert match, seen
    assert 12 <= int(match.group(2)) < 120
    assert match.group(1) == fleet["node"].last_seen_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_gpus_filter(console, fleet):
    assert set(_rows(console.get(URL, {"gpus": "free"}))) == {"gpu-a1", "gpu-b1"}
    assert set(_rows(console.get(URL, {"gpus": "full"}))) == {"gpu-a2"}
    assert set(_rows(console.get(URL, {"ready__exact": "0"}))) == {"gpu-a2"}
    assert set(_rows(console.get(URL, {"mode": "-"}))) == {"gpu-a2"}
    assert set(_rows(console.get(URL, {"mode": "hami-core"}))) == {"gpu-a1", "gpu-b1"}
    assert "unset" in page_text(console.get(URL))


def test_link_to_the_cards_shows_the_node_gpus(console, fleet):
    cards = console.get("/clusters/gpudevice/", {"node": fleet["node"].pk}).context["cl"].cards
    assert sorted(card.device.index for card in cards) == [0, 1, 2, 3]


def test_nodes_are_read_only(console, fleet):
    assert_read_only(console, URL, fleet["node"])
    assert console.post(f"{URL}{fleet['node'].pk}/change/", {"name": "renamed"}).status_code == 403
    assert console.post(f"{URL}{fleet['node'].pk}/delete/", {"post": "yes"}).status_code == 403
    assert Node.objects.filter(pk=fleet["node"].pk, name="gpu-a1").exists() and Allocation.objects.count() == 3


def test_cluster_scope_narrows_nodes_and_the_cluster_list(console, fleet):
    console.get(URL, {"cluster": fleet["b"].public_id})
    assert set(_rows(console.get(URL))) == {"gpu-b1"}
    clusters = console.get("/clusters/cluster/")
    assert [c.name for c in clusters.context["cl"].result_list] == ["lab-b"]
    assert "Narrowed to cluster <strong>lab-b</strong>" in page_text(clusters)
    # Detail pages of any cluster still open.
    assert console.get(f"{URL}{fleet['node'].pk}/change/").status_code == 200
    assert console.get(f"/clusters/cluster/{fleet['a'].pk}/change/").status_code == 200
    console.get(URL, {"cluster": "all"})
    assert set(_rows(console.get(URL))) == {"gpu-a1", "gpu-a2", "gpu-b1"}


def test_cluster_list_has_status_badges_heartbeat_age_and_its_actions(console, fleet):
    Cluster.objects.filter(pk=fleet["b"].pk).update(status=Cluster.Status.DEGRADED, last_heartbeat_at=timezone.now() - timedelta(seconds=30))
    response = console.get("/clusters/cluster/")
    text = page_text(response)
    assert '<span class="gs-badge gs-badge-warn" title="Degraded">degraded</span>' in text
    assert '<span class="gs-badge gs-badge-ok" title="Connected">connected</span>' in text
    assert re.search(r'<time class="gs-age" [^>]*title="[^"]+ UTC">3\d s ago</time>', text)
    for action in ("connection_test", "deregister", "rotate_operator_token", "revoke_operator_tokens"):
        assert f'value="{action}"' in text
    assert f'href="/clusters/node/?cluster={fleet["a"].public_id}">2<' in text


def test_node_page_queries_do_not_grow_with_the_fleet(console, db):
    """10 nodes then 500 nodes (two GPUs each, one held): the same number of queries, on Node management and on
    the Clusters list."""
    cluster = ClusterFactory(name="lab-q")
    counts: dict[str, list[int]] = {URL: [], "/clusters/cluster/": []}
    for total in (10, 500):
        have = Node.objects.count()
        nodes = Node.objects.bulk_create([
            Node(cluster=cluster, cluster_name=cluster.name, name=f"q-{i:04d}", labels=LABELS, gpu_mode="hami-core", ready=True,
                 last_seen_at=timezone.now())
            for i in range(have, total)
        ])
        devices = GpuDevice.objects.bulk_create([
            GpuDevice(node=n, cluster=cluster, uuid=f"GPU-q{n.name[2:]}{k}000-0000-0000-0000-000000000000", index=k, model="NVIDIA H100 80GB HBM3",
                      memory_mib=81559, split_count=10, cores=100, last_seen_at=timezone.now())
            for n in nodes for k in range(2)
        ])
        for device in devices[::2]:
            _hold("erin", device, memory_mib=1000, cores=10)
        for path in counts:
            with CaptureQueriesContext(connection) as queries:
                response = console.get(path)
            assert response.status_code == 200
            counts[path].append(len(queries))
        assert len(_rows(console.get(URL))) == min(total, 50)
    for path, pair in counts.items():
        assert pair[0] == pair[1], (path, pair)


# --- in the browser -------------------------------------------------------------------------------------------------


def _choose(page, label: str) -> None:
    with page.expect_navigation():
        page.get_by_label("Cluster").select_option(label=label)
    page.wait_for_load_state()


def _node_names(page) -> set[str]:
    return {t.strip() for t in page.locator("#result_list .field-node_name a.gs-node").all_inner_texts()}


def _card_nodes(page) -> set[str]:
    return {t.strip() for t in page.locator(".gs-card .gs-node").all_inner_texts()}


def test_browser_cluster_selector_narrows_nodes_and_gpus_and_stays_chosen(live_server, console_users, page, fleet):
    base = live_server.url
    login(page, base, "admin", console_users["admin"][1])
    page.goto(f"{base}{URL}")
    assert _node_names(page) == {"gpu-a1", "gpu-a2", "gpu-b1"}
    shot(page, "console-nodes-scope")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "Node management scrolls sideways at 1400 px"
    results = page.locator("#changelist .results")
    assert results.evaluate("e => e.scrollWidth <= e.clientWidth"), "a Node management column is cut off at 1400 px"

    _choose(page, "lab-b: connected")
    assert _node_names(page) == {"gpu-b1"}
    assert "Narrowed to cluster lab-b" in page.inner_text("#content")
    # The choice stays across pages: GPU management is narrowed too.
    page.goto(f"{base}/clusters/gpudevice/")
    assert _card_nodes(page) == {"gpu-b1"}
    assert page.get_by_label("Cluster").evaluate("s => s.options[s.selectedIndex].text") == "lab-b: connected"

    # ?cluster=<name> on a link sets it (and the URL loses the parameter).
    page.goto(f"{base}/clusters/gpudevice/?cluster=lab-a")
    assert "cluster=" not in page.url
    assert _card_nodes(page) == {"gpu-a1"}
    page.goto(f"{base}{URL}")
    assert _node_names(page) == {"gpu-a1", "gpu-a2"}

    # One click back to all.
    with page.expect_navigation():
        page.get_by_role("link", name="Show all clusters").click()
    page.goto(f"{base}{URL}")
    assert _node_names(page) == {"gpu-a1", "gpu-a2", "gpu-b1"}

    # The node's link opens its cards.
    page.goto(f"{base}{URL}")
    with page.expect_navigation():
        page.locator(f'a[href="/clusters/gpudevice/?node={fleet["node"].pk}"]').click()
    assert len(page.locator(".gs-card").all()) == 4 and _card_nodes(page) == {"gpu-a1"}


def test_browser_cluster_list_fits_and_keeps_its_actions(live_server, console_users, page, fleet):
    Cluster.objects.filter(pk=fleet["b"].pk).update(status=Cluster.Status.DEGRADED, last_heartbeat_at=timezone.now())
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}/clusters/cluster/")
    shot(page, "console-clusters")
    assert page.locator("#changelist .results").evaluate("e => e.scrollWidth <= e.clientWidth"), "a Clusters column is cut off at 1400 px"
    assert page.locator(".gs-badge", has_text="degraded").is_visible()
    assert "Run the connection test" in page.locator("select[name=action]").inner_text()


def test_browser_demo_fleet_fits_1400_px(live_server, console_users, page):
    """The demo's two clusters as their operators report them (real HAMi registrations, GPU feature discovery labels),
    with a whole-GPU session and two shares: every card and every node column fits a 1400 px screen."""
    from clusters import services as cluster_services
    from demo import fleet as demo_fleet

    for name in ("lab-c1", "lab-c2"):
        cluster = ClusterFactory(name=name)
        cluster_services.inventory_apply(cluster=cluster, nodes=demo_fleet.expected_inventory(name)["snapshot"]["nodes"])
    h100 = list(GpuDevice.objects.filter(node__name="gpu-h100-01").order_by("index"))
    _hold("alice-demo", h100[0])
    _hold("bob", h100[1], memory_mib=40000, cores=30)
    _hold("carol", h100[1], memory_mib=20000, cores=25)
    login(page, live_server.url, "admin", console_users["admin"][1])
    for path, name in (("/clusters/gpudevice/", "console-gpus"), (URL, "console-nodes")):
        page.goto(f"{live_server.url}{path}")
        shot(page, name)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), f"{path} scrolls sideways"
        results = page.locator("#changelist .results, #changelist .gs-cards").first
        assert results.evaluate("e => e.scrollWidth <= e.clientWidth"), f"{path}: something is cut off at 1400 px"
    assert page.locator("#result_list .gs-chip-more").count() >= 1
    page.goto(f"{live_server.url}/clusters/gpudevice/")
    uuids = page.locator(".gs-uuid code")
    assert uuids.count() == 19
    truncated = uuids.evaluate_all("codes => codes.filter(c => c.scrollWidth > c.clientWidth).map(c => c.textContent)")
    assert truncated == [], f"short UUIDs cut off: {truncated}"
    # The H20s HAMi registers scaled show the GPU's physical figures and HAMi's, labelled, on screen.
    h20 = page.locator("article.gs-card", has=page.locator("a.gs-node", has_text="gpu-h20-01")).first
    expect(h20.locator(".gs-physical")).to_have_text("Physical: 143,771 MiB · 100 % cores")
    expect(h20.locator(".gs-scaled")).to_have_text("HAMi's scaled figures: 258,787 MiB (memory ×1.8), 500 % cores (×5)")
    expect(h20.get_by_role("meter", name="HAMi memory (scaled)")).to_be_visible()
