"""The console's dashboard (``/``): each tile's numbers against a known inventory, the storage tile's sources and
scope, the 24-hour chart, a query count that does not grow with the fleet, and the page in a real browser."""

from __future__ import annotations

import datetime
import re
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.models import CreditAccount, LedgerEntry, Price
from billing.selectors import session_hourly_cost
from clusters.models import Cluster, GpuDevice, Node
from console.charts import nice_ceiling, usage_chart_svg
from console.dashboard import credits_tile, dashboard, gpus_tile, sessions_tile, storage_tile, usage_chart
from sessions.models import Allocation, Session
from tests.console.conftest import login, shot
from tests.factories import (
    ClusterFactory,
    GpuDeviceFactory,
    NodeDiskFactory,
    NodeFactory,
    SessionFactory,
    StorageCapacityReadingFactory,
    StoragePoolFactory,
    UserFactory,
    VolumeFactory,
)

pytestmark = pytest.mark.django_db

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"


def _account(user, balance: str) -> CreditAccount:
    return CreditAccount.objects.create(user=user, balance=Decimal(balance))


@pytest.fixture
def fleet():
    """Two clusters with a known inventory.

    lab-a (connected, reporting, token fine): one node, four H100s: g0 held whole by s_whole, g1 shared by s_mem and
    s_cores, g2 unhealthy, g3 free. Running: s_whole (whole, 4/h), s_cores (50 % cores: 2/h), s_mem (25 % cores:
    1/h). One Failed 2 h ago (counts), one Failed 30 h ago (does not), one Terminated.
    lab-b (degraded, silent for an hour, token expiring in a day): one node, two A100s: a0 shared by s_sched
    (Scheduled), a1 free. s_pending Pending; s_nores Running with no reservation (2 GPUs at the default 1.5/h: 3/h).
    Accounts: alice 5 (live on lab-a), carol 9.99 (live on lab-b), dave -2 (nothing live), bob 50.
    """
    now = timezone.now()
    a = ClusterFactory(name="lab-a", last_heartbeat_at=now, operator_token_expires_at=now + datetime.timedelta(days=20))
    b = ClusterFactory(name="lab-b", status=Cluster.Status.DEGRADED, last_heartbeat_at=now - datetime.timedelta(hours=1),
                       operator_token_expires_at=now + datetime.timedelta(days=1))
    ClusterFactory(name="gone", status=Cluster.Status.DEREGISTERED)
    na, nb = NodeFactory(cluster=a, name="a-node"), NodeFactory(cluster=b, name="b-node")
    g = [GpuDeviceFactory(node=na, index=i, health=i != 2) for i in range(4)]
    a0, _a1 = (GpuDeviceFactory(node=nb, index=i, model=A100, memory_mib=40960) for i in range(2))
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("4"))
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1.5"))
    alice, bob, carol, dave = (UserFactory(username=n) for n in ("alice", "bob", "carol", "dave"))
    for user, balance in ((alice, "5"), (bob, "50"), (carol, "9.99"), (dave, "-2")):
        _account(user, balance)
    s_whole = SessionFactory(owner=alice, cluster=a)
    s_cores = SessionFactory(owner=bob, cluster=a, gpu_cores=50, gpu_memory_mib=4000)
    s_mem = SessionFactory(owner=bob, cluster=a, gpu_cores=25, gpu_memory_mib=8000)
    Allocation.objects.create(session=s_whole, device=g[0], memory_mib=81559, cores=100, exclusive=True)
    Allocation.objects.create(session=s_cores, device=g[1], memory_mib=4000, cores=50)
    Allocation.objects.create(session=s_mem, device=g[1], memory_mib=8000, cores=25)
    s_sched = SessionFactory(owner=carol, cluster=b, phase=Session.Phase.SCHEDULED, gpu_cores=20, gpu_memory_mib=4000)
    Allocation.objects.create(session=s_sched, device=a0, memory_mib=4000, cores=20)
    SessionFactory(owner=carol, cluster=b, phase=Session.Phase.PENDING)
    s_nores = SessionFactory(owner=bob, cluster=b, gpus=2)
    SessionFactory(owner=dave, cluster=a, phase=Session.Phase.FAILED, ended_at=now - datetime.timedelta(hours=2))
    SessionFactory(owner=dave, cluster=a, phase=Session.Phase.FAILED, ended_at=now - datetime.timedelta(hours=30))
    SessionFactory(owner=dave, cluster=b, phase=Session.Phase.TERMINATED, ended_at=now - datetime.timedelta(hours=1))
    return {"a": a, "b": b, "running": [s_whole, s_cores, s_mem, s_nores], "now": now}


def test_gpus_tile_counts_whole_and_shares_by_model(fleet):
    tile = gpus_tile()
    by_model = {m.model: (m.total, m.healthy, m.whole, m.shared, m.free) for m in tile.by_model}
    assert by_model == {A100: (2, 2, 0, 1, 1), H100: (4, 3, 1, 1, 1)}
    assert (tile.total.total, tile.total.healthy, tile.total.whole, tile.total.shared, tile.total.free) == (6, 5, 1, 2, 2)
    narrowed = gpus_tile(cluster=fleet["b"])
    assert [(m.model, m.total, m.shared) for m in narrowed.by_model] == [(A100, 2, 1)]


def test_sessions_tile_running_starting_failed_in_24_hours(fleet):
    tile = sessions_tile()
    assert (tile.running, tile.starting, tile.failed_24h) == (4, 2, 1)
    a = sessions_tile(cluster=fleet["a"])
    assert (a.running, a.starting, a.failed_24h) == (3, 0, 1)
    b = sessions_tile(cluster=fleet["b"])
    assert (b.running, b.starting, b.failed_24h) == (1, 2, 0)


def test_credits_tile_burn_is_decimal_and_matches_the_billing_definition(fleet):
    tile = credits_tile()
    assert isinstance(tile.burn_per_hour, Decimal)
    assert tile.burn_per_hour == Decimal("10.000000")  # 4 + 2 + 1 on lab-a, 2 × 1.5 on lab-b
    assert tile.burn_per_hour == sum(session_hourly_cost(s) for s in fleet["running"])
    assert tile.running == 4
    assert credits_tile(cluster=fleet["a"]).burn_per_hour == Decimal(7)
    assert credits_tile(cluster=fleet["b"]).burn_per_hour == Decimal(3)
    # Accounts below 10 credits: dave, alice, carol, lowest first; on lab-a only alice has a live session.
    assert tile.threshold == Decimal(10)
    assert (tile.low_count, [name for name, _ in tile.lowest]) == (3, ["dave", "alice", "carol"])
    assert tile.lowest[2][1] == Decimal("9.99")
    assert [name for name, _ in credits_tile(cluster=fleet["a"]).lowest] == ["alice"]


def test_low_balance_threshold_is_a_setting(fleet, settings):
    settings.GSHARE_CONSOLE_LOW_BALANCE = Decimal("5.5")
    tile = credits_tile()
    assert tile.threshold == Decimal("5.5")
    assert [name for name, _ in tile.lowest] == ["dave", "alice"]


def test_clusters_tile_counts_and_warnings(fleet):
    board = dashboard()
    assert board.clusters.counts == {"connected": 1, "degraded": 1, "unreachable": 0, "pending": 0}
    assert [r.cluster.name for r in board.clusters.rows] == ["lab-a", "lab-b"]  # the deregistered one is left out
    a, b = board.clusters.rows
    assert a.warnings == () and a.reporting
    assert a.cluster.node_count == 1 and a.cluster.gpu_count == 4
    assert not b.reporting and "UTC" in b.heartbeat
    assert any("expires at" in w and "rotate_operator_tokens --cluster " + fleet["b"].public_id in w for w in b.warnings)
    assert any("has not reported" in w for w in b.warnings)
    assert [r.cluster.name for r in dashboard(cluster=fleet["b"]).clusters.rows] == ["lab-b"]


def test_the_page_shows_the_tiles_and_narrows_to_the_chosen_cluster(fleet, admin_client):
    page = admin_client.get("/").content.decode()
    for title in ("Clusters", "GPUs", "Sessions", "Credits", "Storage"):
        assert f'id="tile-{title.lower()}-title"' in page
    assert _stat(page, "total") == "6" and _stat(page, "whole") == "1" and _stat(page, "shared") == "2"
    assert _stat(page, "burn") == "10"
    assert "UTC" in page and "lab-b" in page
    assert f"<code>manage.py rotate_operator_tokens --cluster {fleet['b'].public_id}</code>" in page
    assert "N O D E S" not in page
    response = admin_client.get("/?cluster=lab-a", follow=True)
    assert response.redirect_chain and response.redirect_chain[-1][0] == "/"
    page = response.content.decode()
    assert "Narrowed to cluster" in page and "<strong>lab-a</strong>" in page
    assert _stat(page, "total") == "4" and _stat(page, "running") == "3" and _stat(page, "burn") == "7"
    assert "b-node" not in page and ">lab-b<" not in page


def test_researchers_get_no_dashboard(fleet, client):
    user = UserFactory(username="rita")
    user.set_password("rita-Pa55word!")
    user.save()
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 200
    assert 'id="dashboard"' not in response.content.decode()


def test_an_empty_fleet(admin_client):
    page = admin_client.get("/").content.decode()
    assert "No cluster is registered yet" in page and "No storage pool is registered yet" in page
    assert _stat(page, "total") == "0" and _stat(page, "burn") == "0" and _stat(page, "capacity") == "unknown"


def _stat(page: str, name: str) -> str:
    match = re.search(rf'data-stat="{name}"[^>]*>([^<]*)<', page)
    assert match, f"no {name} on the page"
    return match.group(1).strip()


# --------------------------------------------------------------------------- storage


def test_storage_tile_csi_is_the_largest_single_pool_never_the_sum(db):
    own = ClusterFactory(name="store")
    pool = StoragePoolFactory(name="nfs-a", cluster=own, storage_class="nfs-a", manual_capacity_gb=1024)
    StoragePoolFactory(name="nfs-b", cluster=own, storage_class="nfs-b", manual_capacity_gb=1536)
    StorageCapacityReadingFactory(cluster=own, storage_class="nfs-a", capacity_bytes=2 * 1024**4)
    VolumeFactory(pool=pool, quota_gb=30)
    tile = storage_tile()
    assert (tile.pool, tile.capacity, tile.source, tile.allocated, tile.pools) == ("nfs-a", "2048 GiB", "csi", "30 GiB", 2)
    assert not tile.fell_back and tile.shared_note == ""


def test_storage_tile_manual(db, settings):
    settings.STORAGE_POOL_CAPACITY_GB = None
    StoragePoolFactory(name="nfs-m", manual_capacity_gb=1024)
    tile = storage_tile()
    assert (tile.capacity, tile.source, tile.fell_back) == ("1024 GiB", "manual", False)
    assert tile.source_label.startswith("manual")


def test_storage_tile_falls_back_to_the_storage_nodes_disk(db, settings, admin_client):
    settings.STORAGE_POOL_CAPACITY_GB = None
    own = ClusterFactory(name="store")
    StoragePoolFactory(name="nfs-d", cluster=own, manual_capacity_gb=None, storage_node="nas-0")
    NodeDiskFactory(cluster=own, node="nas-0", disk_bytes=500 * 1024**3)
    tile = storage_tile()
    assert (tile.capacity, tile.source, tile.fell_back) == ("500 GiB", "node_disk", True)
    assert "stand-in" in tile.source_label
    page = admin_client.get("/").content.decode()
    assert "fell back to the storage node&#x27;s disk" in page or "fell back to the storage node's disk" in page
    assert "stand-in" in page


def test_storage_tile_keeps_the_fleet_figure_and_says_shared_with_a_cluster_chosen(db, admin_client):
    own, other = ClusterFactory(name="store"), ClusterFactory(name="lab-x")
    StoragePoolFactory(name="nfs-a", cluster=own, manual_capacity_gb=4096)
    fleet_wide = storage_tile()
    narrowed = storage_tile(cluster=other)
    assert narrowed.capacity == fleet_wide.capacity == "4096 GiB"
    assert "shared across clusters" in narrowed.shared_note
    page = admin_client.get("/?cluster=lab-x", follow=True).content.decode()
    assert "shared across clusters" in page and _stat(page, "capacity") == "4096 GiB"


# --------------------------------------------------------------------------- the chart


def test_usage_chart_hourly_gpus_reserved_and_credits_burned(db):
    now = datetime.datetime(2026, 12, 1, 12, 30, tzinfo=datetime.UTC)
    cluster = ClusterFactory(name="lab-c")
    owner = UserFactory(username="erin")
    account = _account(owner, "100")
    # 2 GPUs from 09:00 to 11:00, 1 GPU from 10:30 on (still running).
    done = SessionFactory(owner=owner, cluster=cluster, gpus=2, phase=Session.Phase.TERMINATED,
                          ended_at=datetime.datetime(2026, 12, 1, 11, 0, tzinfo=datetime.UTC))
    live = SessionFactory(owner=owner, cluster=cluster, gpus=1)
    Session.objects.filter(pk=done.pk).update(created_at=datetime.datetime(2026, 12, 1, 9, 0, tzinfo=datetime.UTC))
    Session.objects.filter(pk=live.pk).update(created_at=datetime.datetime(2026, 12, 1, 10, 30, tzinfo=datetime.UTC))
    for key, amount, end in (("c1", "-1.25", 10), ("c2", "-0.75", 10), ("c3", "-2", 12)):
        LedgerEntry.objects.create(account=account, kind="charge", amount=Decimal(amount), balance_after=Decimal(0), idempotency_key=key,
                                   session=live, window_end=datetime.datetime(2026, 12, 1, end, 5, tzinfo=datetime.UTC))
    buckets = usage_chart(now=now)
    assert len(buckets) == 24 and buckets[-1].start == datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
    by_hour = {b.start.hour: (b.gpus_reserved, b.credits_burned) for b in buckets}
    assert by_hour[9] == (Decimal("2.00"), Decimal(0))
    assert by_hour[10] == (Decimal("2.50"), Decimal("2.000000"))
    assert by_hour[11] == (Decimal("1.00"), Decimal(0))
    assert by_hour[12] == (Decimal("1.00"), Decimal("2.000000"))
    assert by_hour[8] == (Decimal(0), Decimal(0))
    assert all(isinstance(v, Decimal) for pair in by_hour.values() for v in pair)
    assert usage_chart(now=now, cluster=ClusterFactory(name="lab-empty"))[-2].gpus_reserved == 0

    svg = usage_chart_svg(buckets)
    assert svg.startswith("<svg") and 'role="img"' in svg and "aria-label" not in svg  # named by its <title>
    assert "<title id=\"gs-chart-title\">GPUs reserved and credits burned per hour, last 24 hours" in svg
    assert "GPUs reserved (hourly average)" in svg and "Credits burned" in svg and "hour starting (UTC)" in svg
    assert "10:00 UTC: 2.5 GPUs" in svg and "12:00 UTC: 2 credits" in svg
    assert re.findall(r"https?://", svg) == ["http://"]  # the SVG namespace only, never a URL to load


def test_usage_chart_matches_the_hour_by_hour_overlap(db):
    """The one-pass sum (head, tail, whole hours between) equals each session's overlap with each hour."""
    import random

    rng = random.Random(11)
    now = datetime.datetime(2026, 12, 1, 12, 40, 17, tzinfo=datetime.UTC)
    cluster, owner = ClusterFactory(name="lab-r"), UserFactory(username="rand")
    spans = []
    for _ in range(40):
        created = now - datetime.timedelta(seconds=rng.randint(0, 30 * 3600))
        ended = None if rng.random() < 0.3 else min(now, created + datetime.timedelta(seconds=rng.randint(1, 12 * 3600)))
        gpus = rng.randint(1, 4)
        session = SessionFactory(owner=owner, cluster=cluster, gpus=gpus, phase=Session.Phase.RUNNING if ended is None else Session.Phase.TERMINATED,
                                 ended_at=ended)
        Session.objects.filter(pk=session.pk).update(created_at=created)
        spans.append((created, ended or now, gpus))
    for bucket in usage_chart(now=now):
        stop = min(bucket.start + datetime.timedelta(hours=1), now)
        held = sum(g * max(0.0, (min(stop, e) - max(bucket.start, c)).total_seconds()) for c, e, g in spans)
        expected = Decimal(held) / Decimal((stop - bucket.start).total_seconds())
        assert abs(bucket.gpus_reserved - expected) <= Decimal("0.006"), bucket


def test_nice_ceiling():
    assert [nice_ceiling(Decimal(v)) for v in ("0", "0.3", "1", "2.5", "7", "11", "480")] == [
        Decimal(1), Decimal("0.5"), Decimal(1), Decimal(5), Decimal(10), Decimal(20), Decimal(500)]


# --------------------------------------------------------------------------- bounded queries


def _seed_nodes(cluster: Cluster, count: int) -> None:
    now = timezone.now()
    nodes = Node.objects.bulk_create([
        Node(cluster=cluster, cluster_name=cluster.name, name=f"{cluster.name}-n{i:04d}", ready=True, last_seen_at=now) for i in range(count)
    ])
    devices = GpuDevice.objects.bulk_create([
        GpuDevice(node=n, cluster=cluster, uuid=f"GPU-{cluster.pk}-{n.pk}-{j}", index=j, model=H100 if j % 2 else A100,
                  memory_mib=81559, split_count=10, cores=100, last_seen_at=now)
        for n in nodes for j in range(2)
    ])
    owner = UserFactory()
    sessions = Session.objects.bulk_create([
        Session(owner=owner, cluster=cluster, image="img", gpus=1, phase=Session.Phase.RUNNING, gpu_cores=None if i % 2 else 30)
        for i in range(count // 2)
    ])
    Allocation.objects.bulk_create([
        Allocation(session=s, device=devices[i * 2], memory_mib=0, cores=100 if s.gpu_cores is None else 30, exclusive=s.gpu_cores is None)
        for i, s in enumerate(sessions)
    ])


def _dashboard_queries(client) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/")
    assert response.status_code == 200 and 'id="dashboard"' in response.content.decode()
    return len(queries)


def test_query_count_does_not_grow_with_the_nodes(admin_client):
    small, large = ClusterFactory(name="lab-small"), ClusterFactory(name="lab-large")
    StoragePoolFactory(cluster=small)
    _seed_nodes(small, 10)
    admin_client.get("/")  # first request: session and permission caches
    ten = _dashboard_queries(admin_client)
    _seed_nodes(large, 490)
    assert _dashboard_queries(admin_client) == ten
    assert ten <= 30, f"{ten} queries"
    admin_client.get("/?cluster=lab-large")
    assert _dashboard_queries(admin_client) <= ten + 1  # + the chosen cluster's look-up


# --------------------------------------------------------------------------- in a real browser


@pytest.mark.django_db(transaction=True)
def test_browser_cluster_selector_narrows_the_tiles(live_server, console_users, page):
    now = timezone.now()
    a = ClusterFactory(name="lab-c1", last_heartbeat_at=now, operator_token_expires_at=now + datetime.timedelta(days=30))
    b = ClusterFactory(name="lab-c2", last_heartbeat_at=now, operator_token_expires_at=now + datetime.timedelta(days=30))
    for cluster, gpus in ((a, 4), (b, 2)):
        node = NodeFactory(cluster=cluster, name=f"{cluster.name}-gpu-0")
        for i in range(gpus):
            GpuDeviceFactory(node=node, index=i)
    StoragePoolFactory(name="nfs-a", cluster=a, manual_capacity_gb=2048)
    alice = console_users["alice"][0]
    account = _account(alice, "42")
    Price.objects.create(gpu_model=H100, credits_per_gpu_hour=Decimal("4"))
    # A day's history for the chart: sessions begun hours ago (some ended), and their ledger charges.
    for hours_ago, cluster, ended in ((20, a, 14), (12, a, 3), (9, b, None), (5, a, None), (2, a, None)):
        session = SessionFactory(cluster=cluster, owner=alice, phase=Session.Phase.RUNNING if ended is None else Session.Phase.TERMINATED,
                                 ended_at=None if ended is None else now - datetime.timedelta(hours=ended))
        Session.objects.filter(pk=session.pk).update(created_at=now - datetime.timedelta(hours=hours_ago))
        for h in range(hours_ago, ended or 0, -1):
            LedgerEntry.objects.create(account=account, kind="charge", amount=Decimal("-4"), balance_after=Decimal(0), session=session,
                                       idempotency_key=f"{session.public_id}-{h}", window_end=now - datetime.timedelta(hours=h - 1))
        if ended is None:
            device = GpuDevice.objects.filter(cluster=cluster, allocations__isnull=True).order_by("pk").first()
            Allocation.objects.create(session=session, device=device, memory_mib=81559, cores=100, exclusive=True)
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(live_server.url + "/")
    tile = page.locator("#tile-gpus")
    assert tile.locator('[data-stat="total"]').inner_text() == "6"
    assert tile.locator('[data-stat="whole"]').inner_text() == "3"
    assert page.locator('#tile-credits [data-stat="burn"]').inner_text() == "12"  # three H100s held whole, 4 credits/h each
    chart = page.get_by_role("img", name=re.compile("^GPUs reserved and credits burned per hour, last 24 hours, all clusters"))
    assert chart.count() == 1 and chart.bounding_box()["width"] > 400

    selector = page.get_by_label("Cluster", exact=True)
    assert page.get_by_label("Cluster").count() == selector.count(), "nothing on the dashboard may be labelled like the selector"
    if selector.count():
        with page.expect_navigation():
            selector.select_option(label="lab-c2: connected")
    else:  # the top bar's selector is not there: set the scope by URL, as a shared link does
        page.goto(live_server.url + "/?cluster=lab-c2")
    page.wait_for_load_state()
    assert "Narrowed to cluster" in page.locator("#dashboard-scope").inner_text()
    assert tile.locator('[data-stat="total"]').inner_text() == "2"
    assert tile.locator('[data-stat="whole"]').inner_text() == "1"
    assert page.locator('#tile-sessions [data-stat="running"]').inner_text() == "1"
    storage = page.locator("#tile-storage")
    assert "shared across clusters" in storage.inner_text()
    assert storage.locator('[data-stat="capacity"]').inner_text() == "2048 GiB"
    header = page.locator("#fleet thead th").nth(5)
    box = header.bounding_box()
    assert box and box["width"] > box["height"], "the fleet table's headers must not stack letter by letter"
    shot(page, "console-dashboard")


# --------------------------------------------------------------------------- idle GPUs


def _idle_fleet(now):
    """On lab-a: s_whole (alice, whole H100 at 4/h) quiet for an hour, s_mem (bob, 25 % cores of an H100: 1/h) quiet
    for an hour, s_cores (bob, 50 %: 2/h) busy a minute ago, all with fresh readings; on lab-b s_nores (2 GPUs with no
    reservation, 3/h) quiet but its reading is stale, so not idle."""
    from sessions.models import SessionActivity

    def reading(session, *, quiet: datetime.timedelta, age: datetime.timedelta = datetime.timedelta(seconds=5)):
        Session.objects.filter(pk=session.pk).update(started_at=now - datetime.timedelta(hours=3))
        SessionActivity.objects.create(session=session, state="ok", sampled_at=now - age, last_kernel_at=now - quiet, gpus=[])

    return reading


def test_idle_tile_counts_the_gpus_of_idle_sessions_and_what_they_burn(fleet):
    from console.dashboard import idle_tile

    now = fleet["now"]
    s_whole, s_cores, s_mem, s_nores = fleet["running"]
    reading = _idle_fleet(now)
    hour = datetime.timedelta(hours=1)
    reading(s_whole, quiet=hour)
    reading(s_mem, quiet=hour)
    reading(s_cores, quiet=datetime.timedelta(minutes=1))
    reading(s_nores, quiet=hour, age=datetime.timedelta(hours=1))
    tile = idle_tile(now=now)
    assert (tile.gpus, tile.sessions) == (2, 2)  # g0 (whole) and g1 (s_mem's share)
    expected = sum(session_hourly_cost(Session.objects.get(pk=s.pk)) for s in (s_whole, s_mem))
    assert tile.burn_per_hour == expected == Decimal("5") and isinstance(tile.burn_per_hour, Decimal)
    assert tile.burn_text == "5"
    on_b = idle_tile(cluster=fleet["b"], now=now)
    assert (on_b.gpus, on_b.sessions, on_b.burn_per_hour) == (0, 0, Decimal(0))
    with CaptureQueriesContext(connection) as queries:
        idle_tile(now=now)
    assert len(queries) == 3


def test_the_page_shows_the_idle_tile_linking_to_idle_sessions(fleet, admin_client):
    now = timezone.now()
    s_whole = fleet["running"][0]
    _idle_fleet(now)(s_whole, quiet=datetime.timedelta(hours=1))
    text = admin_client.get("/").content.decode()
    tile = re.search(r'<article class="gs-tile" id="tile-idle">.*?</article>', text, re.S).group(0)
    assert 'data-stat="idle_gpus" class="gs-bad">1<' in tile and 'data-stat="idle_sessions">1<' in tile
    assert 'data-stat="idle_burn">4<' in tile
    assert 'href="/gpu_sessions/session/?activity=idle"' in tile
    listed = admin_client.get("/gpu_sessions/session/?activity=idle").content.decode()
    assert s_whole.public_id in listed and fleet["running"][1].public_id not in listed
