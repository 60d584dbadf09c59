"""The sessions list at 1,400 × 900 px in Chromium: with the names, nodes, shares, activity and costs a busy fleet
shows, every row's Stop button is on screen (not cut off at the right edge, the page not scrolling sideways).
Every request stays on loopback (``tests/console/conftest.py``)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from billing import services as billing
from billing.models import CreditAccount, LedgerEntry
from sessions.models import Session, SessionActivity
from tests.console.conftest import VIEWPORT, login, shot
from tests.factories import ClusterFactory, NodeFactory, SessionFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/gpu_sessions/session/"


def _busy_fleet() -> list[Session]:
    """Sessions as a busy fleet lists them: long owner and node names, HAMi shares, idle warnings, large costs."""
    now = timezone.now()
    rows = []
    for number, name in enumerate(("lab-c1", "lab-c2-gateway-api-h20")):
        cluster = ClusterFactory(name=name, session_domain=f"{name}.gshare.localhost")
        node = NodeFactory(cluster=cluster, name=f"gpu-h20-rack{number:02d}-slot07.compute.internal")
        for index, (gpus, memory, cores) in enumerate(((8, None, None), (2, 40960, 50), (1, 81559, 100))):
            owner = UserFactory(username=f"firstname.lastname-{number}{index}@physics.example.edu")
            session = SessionFactory(owner=owner, cluster=cluster, node=node.name, gpus=gpus, gpu_memory_mib=memory, gpu_cores=cores,
                                     name=f"llama-finetune-{number}{index}", started_at=now - timedelta(hours=30 + index))
            SessionActivity.objects.create(session=session, state="ok", sampled_at=now, last_kernel_at=now - timedelta(minutes=50),
                                           idle_since=now - timedelta(minutes=50), stops_at=now + timedelta(minutes=10))
            account, _ = CreditAccount.objects.get_or_create(user=owner)
            billing.ledger_append(account=account, kind=LedgerEntry.Kind.CHARGE, amount=Decimal("-12345.678901"),
                                  idempotency_key=f"e-{uuid.uuid4()}", session=session, created_by="test")
            rows.append(session)
    return rows


def test_browser_every_rows_stop_button_is_on_screen_at_1400_px(live_server, console_users, page):
    assert VIEWPORT == {"width": 1400, "height": 900}
    sessions = _busy_fleet()
    login(page, live_server.url, "admin", console_users["admin"][1])
    page.goto(f"{live_server.url}{LIST}")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "the sessions list scrolls sideways at 1400 px"
    results = page.locator("#changelist .results")
    assert results.evaluate("e => e.scrollLeft") == 0
    visible = results.bounding_box()
    for session in sessions:
        button = page.get_by_role("button", name=f"Stop {session.public_id}")
        expect(button).to_be_visible()
        # Where the page opens, unscrolled sideways: the button lies inside the table's visible part and the window.
        box = button.bounding_box()
        right_edge = min(VIEWPORT["width"], visible["x"] + visible["width"])
        assert visible["x"] <= box["x"] and box["x"] + box["width"] <= right_edge + 1, (session.public_id, box, visible)
        # Nothing paints over it: the topmost element at its centre is the button itself.
        page.evaluate("y => window.scrollTo(0, y)", max(0, box["y"] + page.evaluate("window.scrollY") - 300))
        box = button.bounding_box()
        assert button.evaluate("(b, p) => document.elementFromPoint(p.x, p.y) === b",
                               {"x": box["x"] + box["width"] / 2, "y": box["y"] + box["height"] / 2}), session.public_id
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "console-sessions-1400")
