"""A researcher in Chromium: logs in with the console's form, sees only My sessions / My volumes / My credits /
My API tokens, creates an API token and sees its text once (a reload shows it no more), creates a volume, and a
staff page or another user's object typed into the address bar answers 403 / 404. Every request stays on loopback
(``tests/console/conftest.py``)."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from billing.services import credit_grant
from identity.tokens import api_token_create
from storage.models import Volume
from tests.console.conftest import login, shot
from tests.factories import ClusterFactory, StoragePoolFactory, UserFactory, VolumeFactory

pytestmark = pytest.mark.django_db(transaction=True)

RESEARCHER_PAGES = ["My sessions", "My volumes", "My credits", "My API tokens"]


@pytest.fixture
def fleet(console_users):
    cluster = ClusterFactory(name="lab-b1")
    pool = StoragePoolFactory(cluster=cluster, name="pool-b1", manual_capacity_gb=1024)
    bob = UserFactory(username="bob")
    VolumeFactory(owner=bob, pool=pool, name="bob-private")
    api_token_create(username="bob", name="bob-laptop")
    credit_grant(user=console_users["alice"][0], amount=Decimal("40"), reason="welcome", idempotency_key="b:alice", created_by="test")
    return {"cluster": cluster, "pool": pool, "bob": bob}


def _nav_names(page) -> list[str]:
    """The page names the navigation offers (the sidebar, or the index's list)."""
    names = page.locator("#nav-sidebar th[scope=row] a, #content-main .module th[scope=row] a").all_inner_texts()
    return sorted({name.strip() for name in names})


def test_a_researcher_from_login_to_token_and_volume(live_server, console_users, fleet, page):
    base = live_server.url
    login(page, base, "alice", console_users["alice"][1])
    assert _nav_names(page) == sorted(RESEARCHER_PAGES)
    page.goto(f"{base}/storage/volume/")
    assert _nav_names(page) == sorted(RESEARCHER_PAGES)
    assert page.locator("h1").first.inner_text() == "My volumes"
    assert "bob-private" not in page.content()

    # An API token, shown once.
    page.goto(f"{base}/gshare/apitoken/")
    assert page.locator("h1").first.inner_text() == "My API tokens" and "bob-laptop" not in page.content()
    page.click("text=Create API token")
    page.fill("#id_name", "my-laptop")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    assert re.search(r"/gshare/apitoken/\d+/created/$", page.url), (page.url, page.content()[:3000])
    text = page.input_value("#api-token-text")
    assert re.fullmatch(r"gsh_[0-9a-f]+_[A-Za-z0-9_-]+", text)
    page.reload()
    assert page.locator("#api-token-gone").is_visible() and text not in page.content()
    page.go_back()
    assert text not in page.content()
    page.goto(f"{base}/gshare/apitoken/")
    assert "my-laptop" in page.content() and text not in page.content()

    # A volume through the form.
    page.goto(f"{base}/storage/volume/add/")
    page.fill("#id_name", "results")
    page.fill("#id_quota_gb", "25")
    # The price per GiB-month and what 25 GiB cost a month (the default 0.05 per GiB-month), while typing.
    help_text = page.locator("#id_quota_gb_helptext").inner_text()
    assert "0.050000 credits per GiB-month (30 days)" in help_text and "25 GiB cost 1.250000 credits a month" in help_text
    page.click("input[name=_save]")
    page.wait_for_url(f"{base}/storage/volume/")
    assert page.locator("#result_list").get_by_text("results", exact=True).count() == 1
    volume = Volume.objects.get(name="results")
    assert volume.owner == console_users["alice"][0] and volume.quota_gb == 25
    shot(page, "console-researcher")

    # My credits.
    page.goto(f"{base}/billing/creditaccount/")
    assert page.locator("#my-balance").inner_text() == "40.00" and "welcome" in page.content()
    assert page.locator("#my-balance").get_attribute("title") == "40.000000"
    assert page.locator("#my-prices").is_visible() and "credits per gpu-hour" in page.locator("#my-prices").inner_text().lower()

    # Staff pages and another user's object, typed directly.
    for path in ("/clusters/cluster/", "/clusters/node/", "/billing/ledgerentry/", "/auth/user/", "/audit/auditrecord/",
                 "/billing/price/add/"):
        response = page.goto(f"{base}{path}")
        assert response.status in (403, 404), f"{path}: {response.status}"
    bobs = Volume.objects.get(name="bob-private")
    assert page.goto(f"{base}/storage/volume/{bobs.pk}/change/").status == 404


def test_a_refused_volume_shows_the_services_words(live_server, console_users, fleet, page):
    login(page, live_server.url, "alice", console_users["alice"][1])
    page.goto(f"{live_server.url}/storage/volume/add/")
    page.fill("#id_name", "too-big")
    page.fill("#id_quota_gb", "5000")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    errors = page.locator(".errorlist").all_inner_texts()
    assert any("pool-b1" in e or "GiB" in e for e in errors), errors
    assert not Volume.objects.filter(name="too-big").exists()
