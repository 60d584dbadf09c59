"""The cluster page in Chromium shows the operator's ``clock_synced``: unknown before the operator reports an offset,
failing with the offset and the fix (NTP on its node) in the field and the red problems list, then ok once NTP fixed
it. The offsets arrive as an operator sends them: ``PUT /internal/v1/inventory`` with its token, on the live server.
Every request stays on loopback (``tests/console/conftest.py``)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from clusters.operator_token.tokens import operator_token_mint
from tests.console.conftest import login, shot
from tests.factories import ClusterFactory
from tests.helpers import Http

pytestmark = pytest.mark.django_db(transaction=True)

NODES = [{"name": "gpu-c1", "labels": {"gpu": "on"}, "ready": True, "devices": []}]


def test_the_cluster_page_shows_clock_synced_and_its_fix(live_server, console_users, page):
    cluster = ClusterFactory(name="lab-c1", session_domain="lab-c1.gshare.localhost")
    operator = Http(live_server.url, operator_token_mint(cluster_id=cluster.public_id))
    login(page, live_server.url, "admin", console_users["admin"][1])
    url = f"{live_server.url}/clusters/cluster/{cluster.pk}/change/"

    assert operator.put("/internal/v1/inventory", json={"nodes": NODES}).status_code == 200  # an older operator
    page.goto(url)
    field = page.locator(".field-clock_synced")
    expect(field).to_contain_text("unknown: Unknown, not failed")

    assert operator.put("/internal/v1/inventory", json={"nodes": NODES, "clock_offset_seconds": -600.25}).status_code == 200
    page.goto(url)
    expect(field).to_contain_text("⚠ off:")
    expect(field).to_contain_text("600.250 s ahead of the control plane's")
    expect(field).to_contain_text("timedatectl set-ntp true")
    problems = page.get_by_role("alert").filter(has_text="clock_synced")
    expect(problems).to_contain_text("Enable NTP on the node that runs the operator")
    shot(page, "console-cluster-clock-off")

    assert operator.put("/internal/v1/inventory", json={"nodes": NODES, "clock_offset_seconds": 0.012}).status_code == 200
    page.goto(url)
    expect(field).to_contain_text("ok: The operator's clock is 0.012 s behind the control plane's")
    expect(page.get_by_role("alert").filter(has_text="clock_synced")).to_have_count(0)
