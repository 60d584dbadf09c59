"""The browsable API documentation (Swagger UI at ``/api/v1/docs/``, assets from drf-spectacular-sidecar, served by
the project), its link in the console, and the API taking the console's login session with CSRF besides bearer
tokens. Through HTTP on the live server and in Chromium (any request off loopback fails the test)."""

from __future__ import annotations

import json
import re

import pytest
import requests

from storage.models import Volume
from tests.console.conftest import login, shot
from tests.factories import ClusterFactory, StoragePoolFactory
from tests.helpers import Http

pytestmark = pytest.mark.django_db(transaction=True)


def console_session(base_url: str, username: str, password: str) -> requests.Session:
    """A ``requests`` session logged in through the console's login form (the session and CSRF cookies set)."""
    browser = requests.Session()
    form = browser.get(f"{base_url}/login/", timeout=30)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    response = browser.post(f"{base_url}/login/", data={"username": username, "password": password, "next": "/",
                                                        "csrfmiddlewaretoken": token}, allow_redirects=False, timeout=30)
    assert response.status_code == 302, response.text[:2000]
    assert "sessionid" in browser.cookies and "csrftoken" in browser.cookies
    return browser


@pytest.fixture
def pool():
    return StoragePoolFactory(cluster=ClusterFactory(name="lab-d1"), manual_capacity_gb=1024)


def test_docs_page_and_its_assets_are_served_by_the_project(live_server, console_users):
    browser = console_session(live_server.url, "alice", console_users["alice"][1])  # signed-in users only
    page = browser.get(f"{live_server.url}/api/v1/docs/", timeout=30)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert any("swagger-ui-bundle.js" in a for a in assets), assets
    assert "/api/v1/schema/" in page.text
    for asset in assets:
        assert asset.startswith("/"), f"the docs page loads {asset} from elsewhere"
        assert requests.get(f"{live_server.url}{asset}", timeout=30).status_code == 200, asset
    schema = browser.get(f"{live_server.url}/api/v1/schema/", headers={"Accept": "application/json"}, timeout=30)
    assert schema.status_code == 200
    schemes = schema.json()["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    assert schemes["cookieAuth"]["in"] == "cookie"


def test_the_console_links_to_the_docs(client, console_users):
    for name in ("admin", "alice"):
        client.force_login(console_users[name][0])
        assert 'href="/api/v1/docs/"' in client.get("/").content.decode()


def test_the_session_cookie_reads_the_api_and_writes_need_the_csrf_token(live_server, console_users, pool):
    browser = console_session(live_server.url, "alice", console_users["alice"][1])
    account = browser.get(f"{live_server.url}/api/v1/billing/account", timeout=30)
    assert account.status_code == 200 and account.json()["user"] == "alice"

    body = {"name": "from-browser", "quota_gb": 5}
    refused = browser.post(f"{live_server.url}/api/v1/storage/volumes", json=body, timeout=30)
    assert refused.status_code == 403
    assert refused.json()["code"] == "csrf_failed" and "X-CSRFToken" in refused.json()["detail"]
    wrong = browser.post(f"{live_server.url}/api/v1/storage/volumes", json=body, headers={"X-CSRFToken": "x" * 32}, timeout=30)
    assert wrong.status_code == 403 and wrong.json()["code"] == "csrf_failed"
    assert not Volume.objects.filter(name="from-browser").exists()

    created = browser.post(f"{live_server.url}/api/v1/storage/volumes", json=body,
                           headers={"X-CSRFToken": browser.cookies["csrftoken"]}, timeout=30)
    assert created.status_code == 201, created.text
    assert Volume.objects.get(name="from-browser").owner == console_users["alice"][0]


def test_a_bearer_token_needs_no_csrf_token_even_with_a_session_cookie(live_server, console_users, pool):
    from identity.tokens import api_token_create

    _row, token = api_token_create(username="alice")
    plain = Http(live_server.url, token)
    assert plain.post("/api/v1/storage/volumes", json={"name": "by-token", "quota_gb": 5}).status_code == 201
    # The bearer token wins over a session cookie, so no CSRF check applies (and the token's user acts).
    browser = console_session(live_server.url, "admin", console_users["admin"][1])
    response = browser.post(f"{live_server.url}/api/v1/storage/volumes", json={"name": "by-token-2", "quota_gb": 5},
                            headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert response.status_code == 201, response.text
    assert Volume.objects.get(name="by-token-2").owner.username == "alice"


def test_a_logged_out_or_inactive_session_is_not_accepted(live_server, console_users):
    browser = console_session(live_server.url, "alice", console_users["alice"][1])
    user = console_users["alice"][0]
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    response = browser.get(f"{live_server.url}/api/v1/billing/account", timeout=30)
    assert response.status_code == 401 and response.json()["code"] == "not_authenticated"
    assert requests.get(f"{live_server.url}/api/v1/billing/account", timeout=30).status_code == 401


@pytest.mark.parametrize(("method", "path"), [
    ("PUT", "/internal/v1/inventory"), ("POST", "/internal/v1/status"), ("POST", "/internal/v1/usage"),
    ("POST", "/internal/v1/storage"), ("POST", "/internal/v1/token"),
])
def test_internal_routes_never_take_a_session_cookie(live_server, console_users, method, path):
    browser = console_session(live_server.url, "admin", console_users["admin"][1])
    response = browser.request(method, f"{live_server.url}{path}", json={}, headers={"X-CSRFToken": browser.cookies["csrftoken"]},
                               timeout=30)
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "token_missing"


def test_docs_render_in_the_browser_without_a_cdn(live_server, console_users, page, pool):
    login(page, live_server.url, "alice", console_users["alice"][1])
    page.click("#api-docs-link")
    page.wait_for_url(f"{live_server.url}/api/v1/docs/")
    page.wait_for_selector(".swagger-ui .opblock", timeout=20_000)
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("gShare control plane API")
    assert page.locator(".opblock-summary-path", has_text="/api/v1/sessions").count() > 0
    shot(page, "api-docs")
    # "Try it out" with the login session: a GET answers as alice.
    answer = page.evaluate("""async () => {
        const r = await fetch('/api/v1/billing/account', {credentials: 'same-origin'});
        return [r.status, await r.json()];
    }""")
    assert answer[0] == 200 and answer[1]["user"] == "alice"

    # Try it out on a write: Swagger UI sends the CSRF token with the login session, so the volume is created.
    operation = page.locator(".opblock-post", has=page.locator(".opblock-summary-path", has_text=re.compile(r"^/api/v1/storage/volumes/?$")))
    operation.locator(".opblock-summary").click()
    operation.locator("button.try-out__btn").click()
    operation.locator("textarea.body-param__text").fill('{"name": "from-swagger", "quota_gb": 3}')
    operation.locator("button.execute").click()
    status = operation.locator(".live-responses-table tbody .response-col_status").first
    status.wait_for()
    assert status.inner_text().strip().startswith("201"), operation.locator(".live-responses-table").inner_text()
    assert Volume.objects.get(name="from-swagger").owner == console_users["alice"][0]


STAFF_ONLY = [("post", "/api/v1/clusters/"), ("post", "/api/v1/billing/grants/"), ("get", "/api/v1/audit/"),
              ("post", "/api/v1/clusters/{public_id}/operator-token/push/"), ("post", "/api/v1/storage/pools/"),
              ("post", "/api/v1/sessions/{public_id}/idle-exemption/"), ("delete", "/api/v1/sessions/{public_id}/idle-exemption/")]


def _operations(schema: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, item in schema["paths"].items() for method in item if method != "parameters"}


def test_each_reader_sees_the_operations_they_may_call_tagged_by_resource(live_server, console_users):
    schemas = {}
    for name in ("alice", "admin"):
        browser = console_session(live_server.url, name, console_users[name][1])
        response = browser.get(f"{live_server.url}/api/v1/schema/", headers={"Accept": "application/json"}, timeout=30)
        assert response.status_code == 200
        schemas[name] = response.json()
    researcher, staff = _operations(schemas["alice"]), _operations(schemas["admin"])
    assert not [op for op in researcher | staff if not op[1].startswith("/api/v1/")]  # no /internal/ for anyone
    assert set(STAFF_ONLY) <= staff, sorted(set(STAFF_ONLY) - staff)
    assert not set(STAFF_ONLY) & researcher, sorted(set(STAFF_ONLY) & researcher)
    for op in [("post", "/api/v1/sessions/"), ("get", "/api/v1/gpus/"), ("get", "/api/v1/prices/"), ("post", "/api/v1/storage/volumes/"),
               ("get", "/api/v1/billing/account/"), ("get", "/api/v1/clusters/")]:
        assert op in researcher, op
    assert researcher < staff

    for schema in schemas.values():
        tags = {method_path: schema["paths"][method_path[1]][method_path[0]]["tags"] for method_path in _operations(schema)}
        assert all(len(t) == 1 and t != ["api"] for t in tags.values()), tags
        assert tags[("post", "/api/v1/sessions/")] == ["sessions"]
        assert tags[("get", "/api/v1/prices/")] == ["gpus"]
        assert tags[("get", "/api/v1/billing/ledger/")] == ["billing"]
        assert {t["name"] for t in schema["tags"]} == {t[0] for t in tags.values()}
    text = json.dumps(schemas["admin"])
    assert "``" not in text and ":class:`" not in text and ":func:`" not in text
    assert "`?limit=&offset=`" in text  # the literal is still code, in CommonMark


def test_rst_inline_markup_becomes_commonmark():
    from core.api.schema import rst_to_commonmark

    assert rst_to_commonmark("Change ``session_domain`` and ``routing``.") == "Change `session_domain` and `routing`."
    converted = rst_to_commonmark(":class:`ClusterSerializer` plus :func:`~billing.selectors.price_list`")
    assert converted == "`ClusterSerializer` plus `billing.selectors.price_list`"
    assert rst_to_commonmark("no markup, `one` tick") == "no markup, `one` tick"


def test_docs_group_operations_by_resource_and_render_code(live_server, console_users, page):
    login(page, live_server.url, "alice", console_users["alice"][1])
    page.goto(f"{live_server.url}/api/v1/docs/")
    page.wait_for_selector(".swagger-ui .opblock-tag", timeout=20_000)
    tags = [t.strip() for t in page.locator(".swagger-ui .opblock-tag a span, .swagger-ui .opblock-tag a").all_inner_texts() if t.strip()]
    assert "sessions" in tags and "billing" in tags and "api" not in tags, tags
    assert page.locator(".opblock-summary-path", has_text="/internal/").count() == 0
    assert page.locator(".opblock-summary-path", has_text="/api/v1/audit").count() == 0  # staff only
    ledger = page.locator(".opblock-get", has=page.locator(".opblock-summary-path", has_text=re.compile(r"^/api/v1/billing/ledger/?$")))
    ledger.locator(".opblock-summary").click()
    description = ledger.locator(".opblock-description-wrapper")
    description.wait_for()
    assert "``" not in description.inner_text()
    assert description.locator("code", has_text="?limit=&offset=").count() == 1
