"""The operator's view of the control plane's time (``operator_agent.clock``), learnt from the ``server_time`` of real
answers of the control plane on a live server: the offset it reports with its inventory, the ``clock_synced`` check
that offset gives, and status reports from a node whose clock is ahead (refused once, logged with the fix, sent again
stamped with the control plane's time) or was corrected (not frozen). The operator's clocks (wall and monotonic) are
controlled by the tests; only the control plane's is real, and every assertion is relative to the times it answered."""

from __future__ import annotations

import datetime
import logging

import kubernetes
import pytest

import contract
from clusters.diagnosis import clock_verdict
from clusters.models import Cluster
from contract import rfc3339
from operator_agent.clock import ClockOffset
from operator_agent.config import OperatorConfig, kubernetes_api_client
from operator_agent.control_plane_client import ControlPlaneClient
from operator_agent.reporters.inventory import InventoryState, report_inventory
from operator_agent.reporters.status import StatusReporter, format_time
from sessions.models import Session
from tests.helpers import registered

UTC = datetime.UTC
T = datetime.datetime(2026, 11, 29, 16, 0, tzinfo=UTC)
DAY = datetime.timedelta(days=1)


class Clocks:
    """A node's wall clock and monotonic clock, moved only by the test."""

    def __init__(self, wall: datetime.datetime, monotonic: float = 1000.0):
        self.wall_time, self.mono = wall, monotonic

    def wall(self) -> datetime.datetime:
        return self.wall_time

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall_time += datetime.timedelta(seconds=seconds)
        self.mono += seconds


# --------------------------------------------------------------------------- the estimate (no network)


def test_the_offset_is_taken_at_the_midpoint_of_the_round_trip_and_carried_on_the_monotonic_clock():
    clocks = Clocks(T)
    offset = ClockOffset(wall=clocks.wall, monotonic=clocks.monotonic)
    assert offset.seconds is None and offset.payload() == {} and offset.control_plane_now() == T
    # Sent at mono 1000, answered at 1002; the control plane stamped T+61 s, so at the midpoint (T+1 s here) it is 60 s ahead.
    assert offset.learn(rfc3339.format_utc(T + datetime.timedelta(seconds=61)), sent=1000.0, received=1002.0)
    clocks.advance(1)
    assert offset.seconds == 60 and offset.payload() == {"clock_offset_seconds": 60.0}
    # NTP steps this node's wall clock back 30 s: the control plane's time is still right, and the offset is now's.
    clocks.wall_time -= datetime.timedelta(seconds=30)
    clocks.advance(4)
    assert offset.control_plane_now() == T + datetime.timedelta(seconds=65)
    assert offset.seconds == 90


@pytest.mark.parametrize("server_time", [None, 12, "", "yesterday", "2026-11-29T16:00:00", "2026-13-01T00:00:00Z", ["x"]])
def test_an_unreadable_server_time_changes_nothing(server_time):
    clocks = Clocks(T)
    offset = ClockOffset(wall=clocks.wall, monotonic=clocks.monotonic)
    assert offset.learn("2026-11-29T16:00:05Z", sent=1000.0, received=1000.0)
    assert not offset.learn(server_time, sent=1000.0, received=1000.0)
    assert offset.seconds == 5


def test_a_huge_offset_is_bounded_and_never_breaks_the_clock():
    clocks = Clocks(T)
    offset = ClockOffset(wall=clocks.wall, monotonic=clocks.monotonic)
    assert offset.learn("9999-12-31T23:59:59.999999Z", sent=1000.0, received=1000.0)
    assert offset.seconds == contract.CLOCK_OFFSET_LIMIT
    clocks.advance(10)  # past year 9999 on the monotonic clock: no estimate, this node's clock instead
    assert offset.control_plane_now() == clocks.wall_time
    assert offset.learn("0001-01-01T00:00:00Z", sent=1000.0, received=1000.0)
    assert offset.seconds == -contract.CLOCK_OFFSET_LIMIT


# --------------------------------------------------------------------------- against the control plane


@pytest.fixture
def operator(fleet_cluster, live_server, tmp_path):
    """``(cluster, core_v1, client, clocks, answers)``: lab-c1 registered, and its operator's control-plane client on a
    node whose wall clock is one day ahead of the control plane's (``clocks``, moved by the test); ``answers`` are the
    control plane's answers to its inventories."""
    from django.utils import timezone

    cluster, _, kubeconfig_path, token_path = registered(fleet_cluster, tmp_path, "lab-c1")
    config = OperatorConfig(cluster_id=cluster.public_id, control_plane_url=live_server.url, token_file=str(token_path),
                            http_timeout=10.0)
    core_v1 = kubernetes.client.CoreV1Api(kubernetes_api_client({"KUBECONFIG": str(kubeconfig_path)}))
    clocks = Clocks(timezone.now() + DAY)
    answers: list[dict] = []

    class RecordingClient(ControlPlaneClient):
        def put_inventory(self, snapshot: dict) -> dict:
            answers.append(super().put_inventory(snapshot))
            return answers[-1]

    client = RecordingClient(config, max_attempts=1, clock=ClockOffset(wall=clocks.wall, monotonic=clocks.monotonic))
    return cluster, core_v1, client, clocks, answers


@pytest.mark.django_db(transaction=True)
def test_the_operator_reports_its_offset_and_the_cluster_shows_clock_synced(operator, http):
    cluster, core_v1, client, clocks, answers = operator
    state = InventoryState()
    assert report_inventory(core_v1, client, client.config, state=state)
    cluster.refresh_from_db()
    assert cluster.clock_offset_seconds is None and clock_verdict(cluster).ok is None  # nothing learnt before the first answer
    clocks.advance(2)
    assert report_inventory(core_v1, client, client.config, state=state)
    first = rfc3339.parse(answers[0]["server_time"])
    # The node's clock is `clocks`: the first answer came at its monotonic 1000 (no time passed on it during the call),
    # so the offset the second report carried is the control plane's time then minus the node's, to the millisecond.
    expected = round((first - (clocks.wall_time - datetime.timedelta(seconds=2))).total_seconds(), 3)
    cluster.refresh_from_db()
    assert cluster.clock_offset_seconds == expected and expected < -DAY.total_seconds() / 2
    verdict = clock_verdict(cluster)
    assert verdict.ok is False and f"{-expected:.3f} s ahead of the control plane's" in verdict.detail
    assert "NTP" in verdict.detail and "chrony" in verdict.detail
    body = http.get(f"/api/v1/clusters/{cluster.public_id}").json()
    assert any(p["check"] == "clock_synced" for p in body.get("problems", [])), body.get("problems")
    # NTP steps the node's clock to the control plane's time of its last answer (no time passed on the monotonic clock
    # since): the next report carries a zero offset, and the check passes.
    clocks.wall_time = rfc3339.parse(answers[-1]["server_time"])
    assert report_inventory(core_v1, client, client.config, state=state)
    cluster.refresh_from_db()
    assert cluster.clock_offset_seconds == 0 and clock_verdict(cluster).ok is True
    assert Cluster.objects.get(pk=cluster.pk).status == Cluster.Status.CONNECTED


@pytest.mark.django_db(transaction=True)
def test_a_node_clock_ahead_gets_its_status_refused_once_then_applied_and_a_corrected_clock_does_not_freeze(operator, caplog):
    from django.utils import timezone

    from tests.factories import SessionFactory

    cluster, _, client, clocks, _ = operator
    session = SessionFactory(cluster=cluster, phase=Session.Phase.STARTING)
    reporter = StatusReporter(client, clock=clocks.wall)

    def observe(phase: str, message: str) -> None:
        reporter.observe({"session": session.public_id, "phase": phase, "node": None, "devices": [], "message": message,
                          "observed_at": format_time(clocks.wall())})

    observe("Running", "stamped by a clock a day ahead")
    with caplog.at_level(logging.INFO, logger="operator_agent"):
        assert reporter.flush()
    assert "report_from_future" in caplog.text and "NTP" in caplog.text and "dropped" not in caplog.text
    session.refresh_from_db()
    assert session.phase == Session.Phase.RUNNING and session.message == "stamped by a clock a day ahead"
    assert session.last_status_at <= timezone.now()
    # The next change, still stamped a day ahead: stamped with the control plane's time before it goes, never refused.
    clocks.advance(1)
    caplog.clear()
    observe("Running", "still ahead")
    with caplog.at_level(logging.INFO, logger="operator_agent"):
        assert reporter.flush()
    assert "report_from_future" not in caplog.text
    session.refresh_from_db()
    assert session.message == "still ahead"
    # NTP steps the node's clock back to the right time: its honest reports are applied at once.
    clocks.wall_time = timezone.now()
    clocks.advance(1)
    observe("Succeeded", "exit 0")
    assert reporter.flush()
    session.refresh_from_db()
    assert session.phase == Session.Phase.TERMINATED and session.message == "exit 0"
