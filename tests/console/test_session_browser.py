"""Sessions from the browser, in Debian's Chromium against the real demo (``manage.py demo``: emulated clusters,
their operators and the clusters' ingress on loopback): start a session from the console's form pinned to a
cluster, see it Running, Open it through the demo ingress onto the stand-in page of the session pod, Stop it, and
the old connect link is refused; the demo's researcher goes from login to an open session the same way.

One demo per module (it takes a minute to come up). It runs on the embedded PostgreSQL and Redis under the
module's temporary ``GSHARE_HOME`` (``DATABASE_URL`` and ``REDIS_URL`` are dropped from its environment), so it
never touches another suite's database.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect

from tests.console.conftest import login, shot
from tests.helpers import wait_for

# One worker runs the demo tests (pytest-xdist): each starts the demo, which uses one fixed database name.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("demo")]

ROOT = Path(__file__).resolve().parents[2]
LIST = "/gpu_sessions/session/"
#: How long a new session may take to run in the demo (placement, apply, the emulated pod, the operator's report).
RUNNING_WITHIN_MS = 120_000


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """A running ``manage.py demo`` (on embedded services in its own home); its state file's contents."""
    from tests.e2e.test_demo import start_demo, stop_demo

    tmp_path = tmp_path_factory.mktemp("session-browser-demo")
    saved = {name: os.environ.pop(name) for name in ("DATABASE_URL", "REDIS_URL") if name in os.environ}
    try:
        process, log_path, state = start_demo(tmp_path, tmp_path / "state.json")
    finally:
        os.environ.update(saved)
    if not state.get("ingress"):
        stop_demo(process)
        pytest.fail(f"the demo's state has no ingress: {sorted(state)}", pytrace=False)
    try:
        yield state
    finally:
        stop_demo(process)


def _start_from_form(page: Page, base: str, *, image: str, cluster: str | None, screenshot: str | None = None) -> str:
    """Fill the Start session form (one whole GPU, pinned to the cluster id ``cluster`` or automatic) and submit it;
    returns the new session's id (``ses_...``) once the browser is on its page."""
    page.goto(f"{base}{LIST}")
    page.get_by_role("link", name="Start session").click()
    expect(page.get_by_role("heading", name="Start session")).to_be_visible()
    page.fill("#id_image", image)
    page.fill("#id_gpus", "1")
    page.check("input[name=share][value=whole]")
    if cluster:
        page.select_option("#id_cluster", value=cluster)
    if screenshot:
        shot(page, screenshot)
    page.get_by_role("button", name="Start session").click()
    page.wait_for_url(re.compile(r"/gpu_sessions/session/\d+/change/$"))
    session_id = page.locator(".gs-session-live").get_attribute("aria-label").removeprefix("Session ")
    assert session_id.startswith("ses_"), session_id
    return session_id


def _wait_running(page: Page) -> None:
    """The session page follows the session (it reloads when the phase changes) until Open appears."""
    expect(page.locator(".gs-session-buttons .gs-open")).to_be_visible(timeout=RUNNING_WITHIN_MS)
    expect(page.locator("#gs-phase")).to_have_text("Running")


def _open(page: Page, session_id: str, session_host: str) -> str:
    """Click Open and land on the session pod's stand-in page through the demo ingress; returns the connect link
    the console sent the browser to. The ingress learns a new session's Ingress within a second or so: until then
    it answers the default backend's 404, so Open is tried again (a fresh link each time)."""
    session_page = page.url
    deadline = time.monotonic() + 60
    while True:
        with page.expect_request(lambda r: "token=" in r.url and r.is_navigation_request()) as link:
            page.locator(".gs-session-buttons .gs-open").click()
        page.wait_for_load_state()
        if page.locator("#session-id").count() or time.monotonic() > deadline:
            break
        page.goto(session_page)
    url = link.value.url
    assert url.startswith(f"http://{session_host}/s/{session_id}/?token="), url
    expect(page.locator("#session-id")).to_have_text(session_id)
    assert page.url.split("?")[0].startswith(f"http://{session_host}/s/{session_id}/")
    return url


def test_staff_starts_a_pinned_session_opens_it_through_the_ingress_and_stops_it(demo, page):
    base = demo["url"]
    cluster = demo["clusters"][-1]  # the guide's test: pinned to the new cluster
    login(page, base, demo["admin_user"], demo["admin_password"])
    session_id = _start_from_form(page, base, image="quay.io/jupyter/base-notebook", cluster=cluster["id"],
                                  screenshot="console-start-session")
    _wait_running(page)
    expect(page.locator(".gs-session-buttons .gs-stop")).to_be_visible()
    shot(page, "console-session-page")
    session_page = page.url

    page.goto(f"{base}{LIST}")
    row = page.locator("#result_list tbody tr", has_text=session_id)
    expect(row.locator(".gs-phase")).to_have_text("Running")
    expect(row.locator("td.field-cluster_name")).to_contain_text(cluster["name"])
    expect(row.get_by_role("button", name=f"Open {session_id}")).to_be_visible()

    page.goto(session_page)
    link = _open(page, session_id, cluster["session_host"])
    shot(page, "session-open")

    page.go_back()
    page.wait_for_url(re.compile(r"/gpu_sessions/session/\d+/change/$"))
    page.reload()  # what the browser kept of the page may predate the click
    page.get_by_role("button", name="Stop").click()
    # Stop asks first; the confirmation's button stops it.
    expect(page.locator("#gs-stop-loss")).to_contain_text("is lost")
    page.get_by_role("button", name=f"Yes, stop {session_id}").click()
    expect(page.locator(".messagelist")).to_contain_text(f"Session {session_id} is Stopping.")
    expect(page.locator("#gs-phase")).to_have_text(re.compile("Stopping|Terminated"))
    expect(page.locator("#gs-phase")).to_have_text("Terminated", timeout=RUNNING_WITHIN_MS)
    expect(page.locator(".gs-session-buttons .gs-open")).to_have_count(0)

    # The old connect link is refused: by the verify (401/403) while the Ingress is still there, by the cluster's
    # fallback route for /s/ (gShare's "session ended" page, 404) once the operator deleted it with the session; with
    # the connect cookie or without it. A server process may decide on the session's facts it read before the stop for up
    # to 1 s (docs/connect.md, "Caching"): then the request passes to the Ingress's backend, gone with the pod (Envoy's
    # 503), so the link is asked until that bound has passed, and must be refused by then and from then on.
    def refused_now():
        try:
            answer = page.goto(link)
        except PlaywrightError:  # Chromium fails the navigation itself on Envoy's bodiless 503 (ERR_HTTP_RESPONSE_CODE_FAILURE)
            return None
        return answer if answer is not None and answer.status in (401, 403, 404) else None

    refused = wait_for(refused_now, timeout=60, what="the stopped session's link to be refused", interval=0.5)
    assert refused.status in (401, 403, 404), refused.status
    assert page.goto(link).status in (401, 403, 404)
    assert page.locator("#session-id").count() == 0
    port = cluster["session_host"].rsplit(":", 1)[1]
    bare = requests.get(link.replace(cluster["session_host"], f"127.0.0.1:{port}"), headers={"Host": cluster["session_host"]},
                        timeout=10, allow_redirects=False)
    assert bare.status_code in (401, 403, 404) and 'id="session-id"' not in bare.text, bare.status_code
    if bare.status_code == 404:  # never the ingress's bare default backend
        assert "This session has ended or does not exist" in bare.text, bare.text[:300]

def test_researcher_logs_in_starts_and_opens_their_session(demo, page):
    base = demo["url"]
    login(page, base, demo["researcher_user"], demo["researcher_password"])
    page.goto(f"{base}{LIST}")
    expect(page.get_by_role("heading", name=re.compile("My sessions"))).to_be_visible()
    session_id = _start_from_form(page, base, image="quay.io/jupyter/base-notebook", cluster=None)
    _wait_running(page)
    session_host = urlsplit(page.locator(".field-url_full a").get_attribute("href")).netloc
    assert session_host in {c["session_host"] for c in demo["clusters"]}, session_host
    _open(page, session_id, session_host)
    expect(page.locator("body")).to_contain_text(demo["researcher_user"])


def test_a_refusal_shows_the_apis_code_on_the_form(demo, page):
    base = demo["url"]
    login(page, base, demo["admin_user"], demo["admin_password"])
    page.goto(f"{base}{LIST}start/")
    page.fill("#id_image", "quay.io/jupyter/base-notebook")
    page.check("input[name=share][value=share]")
    page.fill("#id_gpu_cores", "150")
    page.select_option("#id_cluster", value=demo["clusters"][0]["id"])
    page.get_by_role("button", name="Start session").click()
    alert = page.get_by_role("alert")
    expect(alert.locator(".gs-refusal-code")).to_have_text("invalid_request")
    expect(alert).to_contain_text("gpu_cores must be a percentage of one GPU from 1 to 100")
    expect(alert).to_contain_text("Nothing was started.")
    # The form keeps what was asked, with the same idempotency key, to fix and send again.
    expect(page.locator("#id_gpu_cores")).to_have_value("150")
    page.fill("#id_gpu_cores", "200")
    page.get_by_role("button", name="Start session").click()
    expect(page.get_by_role("alert").locator(".gs-refusal-code")).to_have_text("invalid_request")

    # The list, last in the module: by now it holds the sessions of the tests above (one stopped, the researcher's
    # running, with what their usage cost so far).
    page.goto(f"{base}{LIST}")
    expect(page.locator("#result_list tbody tr").first).to_be_visible()
    shot(page, "console-sessions")
