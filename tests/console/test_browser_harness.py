"""The browser harness itself: Debian's Chromium loads the console from the live server, and a request off loopback
fails the test."""

import pytest

from tests.console.conftest import OffLoopback, is_loopback_host, login, shot


def test_staff_login_renders_the_console(live_server, console_users, page):
    login(page, live_server.url, "admin", console_users["admin"][1])
    assert page.title().endswith("gShare console")
    assert shot(page, "harness-home").stat().st_size > 1000


def test_a_request_off_loopback_fails_the_test(browser):
    from tests.console import conftest

    gen = conftest.context.__wrapped__(browser)
    ctx = next(gen)
    page = ctx.new_page()
    page.set_content('<img src="http://203.0.113.7/x.png">')
    page.wait_for_timeout(300)
    with pytest.raises(OffLoopback, match="203.0.113.7"):
        next(gen)


@pytest.mark.parametrize(("host", "expected"), [
    ("localhost", True), ("lab-c1.localhost", True), ("127.0.0.1", True), ("[::1]", True),
    ("example.com", False), ("localhost.example.com", False), ("10.0.0.1", False),
])
def test_loopback_hosts(host, expected):
    assert is_loopback_host(host) is expected
