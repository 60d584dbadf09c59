"""Navigation in the guide's words (``ConsoleSite.get_app_list``): sections Resources, Sessions, Credits, Access and
Schedules in the sidebar, on the index and on their own pages; proper names and plurals; app pages redirecting to
their section; a user sees only sections with a page they may view. In Chromium: the top bar's Cluster selector,
found by its label, narrows Volumes and stays chosen across pages and after ``?cluster=<name>`` on another URL."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import RequestFactory

from clusters.models import Cluster
from tests.console.conftest import login, shot
from tests.console_checks import page_text
from tests.factories import ClusterFactory, StoragePoolFactory, VolumeFactory

SECTIONS = ["Resources", "Sessions", "Credits", "Access", "Schedules"]


def _app_list(user):
    request = RequestFactory().get("/")
    request.user = user
    return admin.site.get_app_list(request)


@pytest.mark.django_db
def test_sections_in_the_guides_order_and_words(staff_user):
    apps = _app_list(staff_user)
    assert [a["name"] for a in apps][:5] == SECTIONS
    pages = {a["name"]: [str(m["name"]) for m in a["models"]] for a in apps}
    assert pages["Resources"][:7] == ["Clusters", "Node management", "GPU management", "Volumes", "Storage pools",
                                      "Storage capacity readings", "Node disks"]
    assert pages["Sessions"][:2] == ["Sessions", "GPU reservations"]
    assert pages["Credits"][:4] == ["Credit accounts", "Ledger entries", "GPU prices", "Policies"]
    assert "Usage samples" in pages["Credits"]
    assert pages["Access"][:5] == ["Users", "Groups", "API tokens", "Signing keys", "Audit records"]
    assert pages["Schedules"] == ["Periodic tasks", "Intervals", "Crontabs", "Clocked", "Solar events"]
    every = [str(name) for names in pages.values() for name in names]
    assert not [n for n in every if re.search(r"entrys|Gpu |Api ", n)], every


@pytest.mark.django_db
def test_sidebar_index_and_lists_use_the_names(console):
    html = page_text(console.get("/storage/volume/"))
    sidebar = html[html.index('id="nav-sidebar"'):html.index("</nav>", html.index('id="nav-sidebar"'))]
    for section in SECTIONS:
        assert f'class="section" title="Models in the {section} application">{section}</a>' in sidebar
    assert ">Node management</a>" in sidebar and ">GPU management</a>" in sidebar and ">Ledger entries</a>" in sidebar
    assert '<a href="/resources/">Resources</a>' in html  # the breadcrumb
    nodes = page_text(console.get("/clusters/node/"))
    assert "<h1>Node management</h1>" in nodes and "<title>Node management | gShare console</title>" in nodes
    gpus = page_text(console.get("/clusters/gpudevice/"))
    assert "<h1>GPU management</h1>" in gpus
    assert "<h1>Ledger entries</h1>" in page_text(console.get("/billing/ledgerentry/"))
    assert "<h1>GPU prices</h1>" in page_text(console.get("/billing/price/"))
    for url in ("/", "/clusters/gpudevice/", "/billing/ledgerentry/", "/billing/price/"):
        text = page_text(console.get(url))
        assert "Ledger entrys" not in text and "Gpu devices" not in text and "Gpu prices" not in text, url


@pytest.mark.django_db
@pytest.mark.parametrize(("app", "section"), [
    ("clusters", "resources"), ("storage", "resources"), ("gpu_sessions", "sessions"), ("billing", "credits"),
    ("auth", "access"), ("gshare", "access"), ("audit", "access"), ("django_celery_beat", "schedules"),
])
def test_app_pages_redirect_to_their_section(console, app, section):
    response = console.get(f"/{app}/")
    assert response.status_code == 302 and response["Location"] == f"/{section}/"


@pytest.mark.django_db
def test_section_pages_list_their_pages(console):
    text = page_text(console.get("/resources/"))
    assert "<h1>Resources</h1>" in text
    for link in ("/clusters/cluster/", "/clusters/node/", "/clusters/gpudevice/", "/storage/volume/", "/storage/storagepool/"):
        assert f'href="{link}"' in text
    assert "/billing/" not in text.split('id="content-main"')[1]
    for slug, title in [("sessions", "Sessions"), ("credits", "Credits"), ("access", "Access"), ("schedules", "Schedules")]:
        assert f"<h1>{title}</h1>" in page_text(console.get(f"/{slug}/"))


@pytest.mark.django_db
def test_a_user_sees_only_sections_with_pages_they_may_view(client, django_user_model):
    user = django_user_model.objects.create_user("viewer", password="Pa55word!viewer", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_volume"))
    assert [(a["name"], [m["name"] for m in a["models"]]) for a in _app_list(user)] == [("Resources", ["Volumes"])]
    client.force_login(user)
    assert client.get("/resources/").status_code == 200
    assert client.get("/credits/").status_code == 404
    assert client.get("/billing/ledgerentry/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_browser_cluster_selector_narrows_and_stays_chosen(live_server, console_users, page):
    a = ClusterFactory(name="lab-c1")
    b = ClusterFactory(name="lab-c2", status=Cluster.Status.DEGRADED)
    ClusterFactory(name="old-c0", status=Cluster.Status.DEREGISTERED)
    for cluster, names in ((a, ["alpha-1", "alpha-2"]), (b, ["beta-1"])):
        pool = StoragePoolFactory(cluster=cluster)
        for name in names:
            VolumeFactory(cluster=cluster, pool=pool, name=name)
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}/storage/volume/")
    select = page.get_by_label("Cluster", exact=True)
    options = select.locator("option").all_inner_texts()
    assert options == ["All clusters", "lab-c1: connected", "lab-c2: degraded"]
    assert page.locator("#result_list").get_by_text("beta-1").count() == 1

    with page.expect_navigation():
        select.select_option(label="lab-c1: connected")
    assert page.url.rstrip("/").endswith("/storage/volume")  # ?cluster= stored and dropped from the URL
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2 and page.locator("#result_list").get_by_text("beta-1").count() == 0
    assert page.locator(".console-narrowed").inner_text().startswith("Narrowed to cluster lab-c1")
    shot(page, "console-scope")

    # The choice stays across pages ...
    page.goto(f"{live_server.url}/storage/storagecapacityreading/")
    assert page.get_by_label("Cluster", exact=True).input_value() == a.public_id
    page.goto(f"{live_server.url}/storage/volume/")
    assert page.locator("#result_list tbody tr").count() == 2
    # ... and ?cluster=<name> on another URL changes it.
    page.goto(f"{live_server.url}/storage/storagepool/?cluster=lab-c2")
    assert "cluster=" not in page.url
    assert page.get_by_label("Cluster", exact=True).input_value() == b.public_id
    page.goto(f"{live_server.url}/storage/volume/")
    assert page.locator("#result_list tbody tr").count() == 1
    # One click back to all.
    page.get_by_role("link", name="Show all clusters").click()
    page.wait_for_load_state()
    assert page.locator("#result_list tbody tr").count() == 3
    assert page.get_by_label("Cluster", exact=True).input_value() == "all"
    # Nothing is cut off at 1400 px: the page does not scroll sideways.
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth + 1")


WIDE_LISTS = ["/billing/ledgerentry/", "/billing/usagesample/", "/audit/auditrecord/", "/storage/storagepool/", "/storage/volume/",
              "/storage/storagecapacityreading/"]

#: For a list: whether the page scrolls sideways, the tallest header cell, and whether the last column can be
#: brought into view (it is, or its table scrolls inside the list and then shows it).
_LAYOUT = """() => {
  const doc = document.documentElement;
  const heads = [...document.querySelectorAll('#result_list thead th')];
  const results = document.querySelector('#changelist-form .results');
  const last = heads[heads.length - 1];
  results.scrollLeft = results.scrollWidth;
  const r = last.getBoundingClientRect();
  return {pageOverflow: doc.scrollWidth - doc.clientWidth, tallestHeader: Math.max(...heads.map(h => h.offsetHeight)),
          lastVisible: r.right <= Math.min(window.innerWidth, results.getBoundingClientRect().right) + 1 && r.left >= 0};
}"""


@pytest.mark.django_db(transaction=True)
def test_browser_wide_lists_fit_1400px(live_server, console_users, page):
    from tests.console.test_scope import _rows

    for cluster in (ClusterFactory(name="lab-c1"), ClusterFactory(name="lab-c2")):
        _rows(cluster, 3)
    login(page, live_server.url, "admin", console_users["admin"][1])
    for url in WIDE_LISTS:
        page.goto(f"{live_server.url}{url}")
        layout = page.evaluate(_LAYOUT)
        assert layout["pageOverflow"] <= 1, (url, layout)  # nothing pushes the page past 1400 px
        assert layout["tallestHeader"] < 48, (url, layout)  # headers on one line, never a letter per line
        assert layout["lastVisible"], (url, layout)  # the right-hand column is reachable, not cut off
    page.goto(f"{live_server.url}/billing/ledgerentry/")
    shot(page, "console-ledger")


@pytest.mark.django_db
def test_detail_pages_breadcrumbs_name_the_section_and_list(console, client, plain_user):
    from tests.factories import GpuDeviceFactory

    gpu = GpuDeviceFactory()
    text = page_text(console.get(f"/clusters/gpudevice/{gpu.pk}/change/"))
    crumbs = text[text.index('<div class="breadcrumbs">'):text.index("</div>", text.index('<div class="breadcrumbs">'))]
    assert '<a href="/resources/">Resources</a>' in crumbs
    assert '<a href="/clusters/gpudevice/">GPU management</a>' in crumbs and "Clusters" not in crumbs
    volume = VolumeFactory(owner=plain_user)
    client.force_login(plain_user)
    mine = page_text(client.get("/storage/volume/"))
    crumbs = mine[mine.index('<div class="breadcrumbs">'):mine.index("</div>", mine.index('<div class="breadcrumbs">'))]
    assert '<a href="/">My gShare</a>' in crumbs and "My volumes" in crumbs and "Resources" not in crumbs
    assert "My gShare" in page_text(client.get(f"/storage/volume/{volume.pk}/change/"))
