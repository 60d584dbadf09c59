"""Fixtures for the console's browser tests: Playwright for Python driving Debian's Chromium (``/usr/bin/chromium``,
installed by ``make test`` through ``hack/test-deps.sh``; ``playwright install`` is never used), headless, against
pytest-django's ``live_server`` or a running ``manage.py demo``.

The browser may only reach loopback: every request to another host is aborted and fails the test
(:func:`_loopback_only`), and Chromium's own background traffic is switched off.

Screenshots: :func:`shot` saves a PNG of the page under ``$GSHARE_SCREENSHOTS`` (default
``.gshare/screenshots/``); ``docs/images/`` holds a few of them, committed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# Playwright's sync API runs an event loop in this thread; Django refuses ORM calls from a thread with a running
# loop unless told that this is a synchronous test process.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import Browser, BrowserContext, Page, Route, sync_playwright  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
]
VIEWPORT = {"width": 1400, "height": 900}
SCREENSHOTS = Path(os.environ.get("GSHARE_SCREENSHOTS", ROOT / ".gshare" / "screenshots"))


def is_loopback_host(host: str) -> bool:
    """Whether a URL's host is loopback: ``localhost``, ``*.localhost`` (browsers resolve it to loopback), 127/8, ::1."""
    host = (host or "").strip("[]").lower()
    return host in ("localhost", "::1") or host.endswith(".localhost") or host.startswith("127.")


class OffLoopback(AssertionError):
    """The page asked for a URL off loopback (an asset from a CDN, a font service, ...)."""


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Headless Debian Chromium, one per test session."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `apt-get install chromium` (make test does it when run as root)", pytrace=False)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """A fresh browser context (own cookies) whose every request must stay on loopback; a request elsewhere is
    aborted and fails the test when the context closes."""
    blocked: list[str] = []

    def _loopback_only(route: Route) -> None:
        url = route.request.url
        if url.startswith(("data:", "blob:", "about:")) or is_loopback_host(urlsplit(url).hostname or ""):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    ctx = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    ctx.set_default_timeout(20_000)
    ctx.route("**/*", _loopback_only)
    yield ctx
    ctx.close()
    if blocked:
        raise OffLoopback(f"the console asked for URLs off loopback: {blocked}")


@pytest.fixture
def page(context: BrowserContext) -> Page:
    """A page in :func:`context`."""
    return context.new_page()


def login(page: Page, base_url: str, username: str, password: str) -> None:
    """Log in through the console's login form; fails the test if the browser is still on the login page."""
    page.goto(f"{base_url.rstrip('/')}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_load_state()
    assert not urlsplit(page.url).path.startswith("/login"), f"logging in as {username} failed: {page.content()[:2000]}"


def shot(page: Page, name: str) -> Path:
    """Save a viewport screenshot of ``page`` as ``<SCREENSHOTS>/<name>.png``; returns the path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


@pytest.fixture
def console_users(db, django_user_model):
    """``{"admin": (user, password), "alice": (user, password)}``: a staff superuser and a researcher (not staff)."""
    users = {}
    for username, staff in (("admin", True), ("alice", False)):
        password = f"{username}-Pa55word!"
        if staff:
            user = django_user_model.objects.create_superuser(username, f"{username}@example.test", password)
        else:
            user = django_user_model.objects.create_user(username, f"{username}@example.test", password)
        users[username] = (user, password)
    return users
