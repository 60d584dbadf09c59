"""Screenshots of the console for README.md, taken from a running ``make demo``.

Usage (the demo running in another shell)::

    .venv/bin/python hack/screenshots.py [--state .gshare/demo/state.json] [--out docs/images]

Through the demo's API it first creates a volume and starts one GPU session per cluster (the first one mounting the
volume), waits until they are Running, the volume is bound and the ledger holds their first period charges
(five-minute billing periods in the demo: up to about six minutes); then it
logs into the console as ``admin`` with Playwright driving Debian's Chromium (``apt-get install chromium``:
``playwright install`` downloads a browser build of its own, which this project does not rely on) and saves one
1400x900 PNG per page in ``--out``, opens the session of each cluster (its stand-in page, through lab-c1's
ingress-nginx and lab-c2's Envoy Gateway routing), then logs in as the demo's researcher, starts a session from
**Start session** and shows their **My sessions**; at the end it stops the sessions. Every request goes to the demo
on loopback (``*.localhost`` included: the session hosts): the browser is started with its background networking
off and any request to another host is aborted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import requests
from playwright.sync_api import Route, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 900}
LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}

#: (file name, console path, what the page must show): one screenshot each, in README order.
PAGES = [
    ("console-home.png", "/", "#dashboard"),
    ("gpu-management.png", "/clusters/gpudevice/", "#content-main"),
    ("node-management.png", "/clusters/node/", "#result_list"),
    ("clusters.png", "/clusters/cluster/", "#result_list"),
    ("sessions.png", "/gpu_sessions/session/", "#result_list"),
    ("start-session.png", "/gpu_sessions/session/start/", "#gs-start-form"),
    ("storage-pools.png", "/storage/storagepool/", "#result_list"),
    ("ledger.png", "/billing/ledgerentry/", "#result_list"),
    ("audit-trail.png", "/audit/auditrecord/", "#result_list"),
]


def _is_loopback(host: str | None) -> bool:
    # Session pages live at <cluster>.gshare.localhost, which browsers resolve to loopback.
    host = (host or "").lower()
    return host in LOOPBACK or host.endswith(".localhost")


class ScreenshotError(RuntimeError):
    """The demo did not get to the state the screenshots need, or a page is not the one expected."""


def _wait(what: str, probe, timeout: float):
    """Call ``probe()`` every 0.5 s until it returns something truthy; return that. Raises ScreenshotError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise ScreenshotError(f"{what}: not after {timeout:g} s")


def prepare_fleet(state: dict, sessions: list[str]) -> None:
    """Create the ``datasets`` volume and one session per cluster through the API; wait until they are in use and charged.

    Args:
        state: the demo's state.json (``url``, ``api_token``, ``clusters``).
        sessions: the public id of each session started is appended here as soon as it exists (so it can be stopped).

    Raises:
        ScreenshotError: a request was refused, or a session, the volume or a charge did not arrive in time.
    """
    api = f"{state['url']}/api/v1"
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {state['api_token']}"
    response = http.post(f"{api}/storage/volumes", json={"name": "datasets", "quota_gb": 100}, timeout=30)
    if response.status_code == 409 and response.json().get("code") == "volume_name_taken":  # a second run on one demo
        volume = next(v for v in http.get(f"{api}/storage/volumes", timeout=30).json()["results"] if v["name"] == "datasets")
    elif response.status_code != 201:
        raise ScreenshotError(f"POST /storage/volumes answered {response.status_code}: {response.text[:300]}")
    else:
        volume = response.json()
    for index, cluster in enumerate(state["clusters"]):
        body = {"name": f"notebook-{cluster['name']}", "image": "quay.io/jupyter/base-notebook", "gpus": 1,
                "gpu_memory_mib": 4096, "gpu_cores": 25, "cluster": cluster["id"]}
        if index == 0:
            body["volumes"] = [volume["id"]]
        response = http.post(f"{api}/sessions", json=body, timeout=30)
        if response.status_code != 201:
            raise ScreenshotError(f"POST /sessions answered {response.status_code}: {response.text[:300]}")
        sessions.append(response.json()["id"])

    def running(session_id: str):
        body = http.get(f"{api}/sessions/{session_id}", timeout=10).json()
        if body["phase"] == "Failed":
            raise ScreenshotError(f"session {session_id} failed: {body.get('message')}")
        return body["phase"] == "Running"

    for session_id in sessions:
        _wait(f"session {session_id} Running", lambda sid=session_id: running(sid), 90)
    _wait(f"volume {volume['id']} bound", lambda: http.get(f"{api}/storage/volumes/{volume['id']}", timeout=10).json()["status"] == "bound", 60)
    for session_id in sessions:
        _wait(f"a usage charge for {session_id}", lambda sid=session_id: any(
            e["kind"] == "charge" for e in http.get(f"{api}/billing/ledger", params={"session": sid}, timeout=10).json()["results"]
        ), 420)


def stop_sessions(state: dict, sessions: list[str]) -> None:
    """DELETE each session (best effort: the demo's Ctrl-C removes everything anyway)."""
    headers = {"Authorization": f"Bearer {state['api_token']}"}
    for session_id in sessions:
        requests.delete(f"{state['url']}/api/v1/sessions/{session_id}", headers=headers, timeout=30)


def _loopback_only(route: Route) -> None:
    if _is_loopback(urlsplit(route.request.url).hostname):
        route.continue_()
    else:
        route.abort()


def take_screenshots(state: dict, out: Path) -> list[Path]:
    """Log into the console as admin and save one viewport-sized PNG per entry of ``PAGES`` in ``out``.

    Returns:
        The files written.

    Raises:
        ScreenshotError: the login failed, or a page answered an error or lacks the element it must show.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
            context.route("**/*", _loopback_only)
            # The console's navigation sidebar closed (Django admin keeps that choice in localStorage): the tables get its width.
            context.add_init_script("window.localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
            page = _login(context, state["url"], state["admin_user"], state["admin_password"])
            for name, path, selector in PAGES:
                response = page.goto(f"{state['url']}{path}")
                if response is None or response.status != 200 or urlsplit(page.url).path != path:
                    raise ScreenshotError(f"{path} answered {response and response.status} at {page.url}")
                if page.locator(selector).count() == 0:
                    raise ScreenshotError(f"{path} has no {selector}")
                target = out / name
                page.screenshot(path=str(target), full_page=False)
                written.append(target)
                print(f"screenshots: {target}", file=sys.stderr)
            # Open a session of each routing mode: the browser lands on its cluster's own host (the demo's ingress), through
            # ingress-nginx's auth-url, or through Envoy's ext_authz 307 that sets the cookie and drops the link's token.
            for cluster in state["clusters"]:
                name = "session-open.png" if cluster["routing"] == "ingress-nginx" else f"session-open-{cluster['routing']}.png"
                page.goto(f"{state['url']}/gpu_sessions/session/")
                page.locator("#result_list tbody tr", has_text=cluster["name"]).first.locator("button.gs-open").click()
                page.wait_for_load_state()
                landed = urlsplit(page.url)
                if landed.hostname != cluster["session_domain"] or "token=" in (landed.query or "") and cluster["routing"] == "gateway-api":
                    raise ScreenshotError(f"Open of a {cluster['name']} session did not land on its host without the token: {page.url}")
                if page.locator("text=ses_").count() == 0:
                    raise ScreenshotError(f"Open of a {cluster['name']} session shows no session page at {page.url}")
                written.append(_save(page, out / name))
            # The researcher's console: only their own sections.
            if state.get("researcher_user"):
                researcher = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
                researcher.route("**/*", _loopback_only)
                mine = _login(researcher, state["url"], state["researcher_user"], state["researcher_password"])
                _start_from_the_form(mine, state["url"])
                mine.goto(f"{state['url']}/gpu_sessions/session/")
                written.append(_save(mine, out / "researcher-sessions.png"))
                mine.locator("#result_list button.gs-stop").first.click()
                mine.wait_for_load_state()
        finally:
            browser.close()
    return written


def _login(context, url: str, username: str, password: str):
    """A new page of ``context`` logged into the console as ``username``. Raises ScreenshotError if the login fails."""
    page = context.new_page()
    page.goto(f"{url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_load_state()
    if urlsplit(page.url).path.startswith("/login"):
        raise ScreenshotError(f"logging in as {username} failed: still on {page.url}")
    return page


def _start_from_the_form(page, url: str) -> None:
    """Start a session as the logged-in user through **Start session** (a HAMi share of one GPU) and wait until the
    session's page says Running. Raises ScreenshotError if it is refused or does not run in 90 s."""
    page.goto(f"{url}/gpu_sessions/session/start/")
    page.fill("#id_image", "quay.io/jupyter/base-notebook")
    page.fill("#id_gpus", "1")
    page.check("input[name=share][value=share]")
    page.fill("#id_gpu_memory_mib", "8192")
    page.fill("#id_gpu_cores", "50")
    page.click("button.gs-start")
    page.wait_for_load_state()
    if page.locator("#gs-phase").count() == 0:
        raise ScreenshotError(f"Start session was refused: {page.locator('#content-main').inner_text()[:300]}")
    try:
        page.wait_for_selector("#gs-phase[data-phase=Running]", timeout=90_000)
    except Exception as exc:  # Playwright's TimeoutError
        raise ScreenshotError(f"the session started from the form is not Running: {exc}") from exc


def _save(page, target: Path) -> Path:
    page.screenshot(path=str(target), full_page=False)
    print(f"screenshots: {target}", file=sys.stderr)
    return target


def shrink(files: list[Path]) -> None:
    """Quantize the PNGs in place with pngquant (Debian's ``pngquant``) where it is installed; screenshots of tables lose nothing visible."""
    if not shutil.which("pngquant"):
        print("screenshots: pngquant not installed, PNGs left as Chromium wrote them", file=sys.stderr)
        return
    subprocess.run(["pngquant", "--force", "--skip-if-larger", "--quality", "70-95", "--ext", ".png", *map(str, files)], check=False)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, prepare the fleet, take and shrink the screenshots; 0 on success, 1 with a message otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, default=Path(".gshare/demo/state.json"), help="the running demo's state file")
    parser.add_argument("--out", type=Path, default=Path("docs/images"), help="where the PNGs go (default docs/images)")
    args = parser.parse_args(argv)
    state = json.loads(args.state.read_text())
    for key in ("url", "internal_url"):
        if urlsplit(state[key]).hostname not in LOOPBACK:
            print(f"screenshots: {key} {state[key]} is not on loopback; refusing", file=sys.stderr)
            return 1
    sessions = []
    try:
        prepare_fleet(state, sessions)
        shrink(take_screenshots(state, args.out))
    except ScreenshotError as exc:
        print(f"screenshots: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_sessions(state, sessions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
