"""Time budgets bound apiserver calls as a whole, not per socket read, against real loopback servers.

A server that answers its status line and then one byte every 0.2 s never lets a socket read time out; the
probe (registration, connection test, ``PATCH`` of a kubeconfig) and the operator token push must still give
up when their budget (``GSHARE_PROBE_TIMEOUT``, ``GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT``) is spent, cut the
connection, and say that the apiserver did not answer, not that it answered as something else. TLS failures
caused by the kubeconfig are 400 ``kubeconfig_invalid``, not "did not answer".
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time

import kubernetes
import pytest
import yaml

from clusters.models import Cluster
from clusters.operator_token.rotation import OperatorTokenPushFailed, operator_token_push
from clusters.probe import probe_cluster
from demo.emulator import generate_certificates
from kube import Deadline, DeadlineExceeded, api_client_for_kubeconfig
from kube import client as client_module
from tests.factories import ClusterFactory
from tests.helpers import kubeconfig_text, silent_kubeconfig

pytestmark = pytest.mark.django_db

BUDGET = 2.0
VERSION = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.3", "gitCommit": "0" * 40, "gitTreeState": "clean",
    "buildDate": "2025-03-11T19:52:21Z", "goVersion": "go1.23.6", "compiler": "gc", "platform": "linux/amd64",
}


class Trickle:
    """A loopback HTTP server that keeps every socket read of its client busy and never finishes an answer.

    ``mode``: ``headers`` (the status line, then one header byte every ``interval``), or ``body`` (complete
    headers announcing a JSON body, then one body byte every ``interval``). The first ``answered`` requests
    get a complete ``/version`` answer (kept alive) before the trickling starts. ``cut_after`` records, per
    trickled connection, the seconds from its first trickled byte until the client dropped it (``dropped`` is set
    then); ``ran_out`` counts the trickles that went on for all of ``lasts``, a bound far beyond every budget tested
    that only ends a client that never gives up.
    """

    def __init__(self, mode: str = "headers", *, answered: int = 0, interval: float = 0.2, lasts: float = 40.0):
        self.mode, self.answered, self.interval, self.lasts = mode, answered, interval, lasts
        self.requests = 0
        self.cut_after: list[float] = []
        self.dropped = threading.Event()
        self.ran_out = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        self.host_port = f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            rest += chunk
        return True

    def _serve(self, conn: socket.socket) -> None:
        try:
            while self._read_request(conn):
                self.requests += 1
                if self.requests <= self.answered:
                    body = json.dumps(VERSION).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                if self.mode == "headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"a\": \"")
                started = time.monotonic()
                while time.monotonic() < started + self.lasts and not self.stop.is_set():
                    try:
                        conn.sendall(b"a")
                    except OSError:
                        self.cut_after.append(time.monotonic() - started)
                        self.dropped.set()
                        return
                    time.sleep(self.interval)
                if not self.stop.is_set():
                    self.ran_out += 1
                return
        except OSError:
            pass
        finally:
            conn.close()

    def wait_cut(self) -> list[float]:
        """The ``cut_after`` list once the client dropped a trickled connection (empty if none was by ``lasts``)."""
        self.dropped.wait(self.lasts)
        return self.cut_after

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(timeout=2)


@pytest.fixture
def trickle(settings):
    """Factory: start a ``Trickle`` server, allowed on loopback; every one is stopped at teardown."""
    started: list[Trickle] = []

    def start(mode: str = "headers", **options) -> Trickle:
        server = Trickle(mode, **options)
        started.append(server)
        settings.GSHARE_LOOPBACK_ALLOWLIST = [*settings.GSHARE_LOOPBACK_ALLOWLIST, server.host_port]
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def deadline_timers(monkeypatch) -> dict[str, list[float]]:
    """What ``Deadline.call`` armed and fired: ``armed`` the seconds of each call's timer (what was left of the
    budget), ``fired`` one entry per timer that cut its call's sockets."""
    seen: dict[str, list[float]] = {"armed": [], "fired": []}
    real_timer, real_fire = client_module.threading.Timer, client_module._CallGuard.fire

    def timer(interval, function, *args, **kwargs):
        if getattr(function, "__func__", None) is spied_fire:
            seen["armed"].append(interval)
        return real_timer(interval, function, *args, **kwargs)

    def spied_fire(self):
        seen["fired"].append(1)
        return real_fire(self)

    monkeypatch.setattr(client_module._CallGuard, "fire", spied_fire)
    monkeypatch.setattr(client_module.threading, "Timer", timer)
    return seen


def assert_cut_off(server: Trickle, timers: dict[str, list[float]]) -> None:
    """The call, already returned, was cut off by its budget: the deadline's timer, armed for no more than ``BUDGET``,
    fired and the client dropped the connection while the server still had bytes to send for ``lasts`` seconds (the
    message naming the budget is ``assert_honest_unreachable``)."""
    assert timers["armed"] and all(0 < armed <= BUDGET for armed in timers["armed"]), timers
    assert timers["fired"], "no deadline timer cut the call"
    assert server.wait_cut(), "the client never dropped the trickling connection"
    assert server.ran_out == 0, "the client read the trickle to its end"


def assert_honest_unreachable(detail: str) -> None:
    assert f"did not answer within {BUDGET:g} s" in detail
    assert "no complete answer" in detail
    assert "answered, but not" not in detail


# --------------------------------------------------------------------------- the probe


@pytest.mark.parametrize(("mode", "answered"), [("headers", 0), ("body", 0), ("headers", 1)])
def test_registration_probe_is_cut_off_within_its_budget(http, trickle, settings, mode, answered, deadline_timers):
    settings.GSHARE_PROBE_TIMEOUT = BUDGET
    server = trickle(mode, answered=answered)
    response = http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": yaml.safe_dump(silent_kubeconfig(server.host_port))})
    assert response.status_code == 504, response.text
    assert response.json()["code"] == "cluster_unreachable"
    assert_honest_unreachable(response.json()["detail"])
    assert_cut_off(server, deadline_timers)
    assert server.requests == answered + 1  # one trickled call; the budget is shared, nothing retried
    assert Cluster.objects.count() == 0


def test_connection_test_is_cut_off_within_its_budget(http, trickle, settings, deadline_timers):
    settings.GSHARE_PROBE_TIMEOUT = BUDGET
    server = trickle("headers")
    cluster = ClusterFactory(kubeconfig=yaml.safe_dump(silent_kubeconfig(server.host_port)), apiserver_url=f"http://{server.host_port}")
    response = http.post(f"/api/v1/clusters/{cluster.public_id}/connection-test")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "unreachable"
    assert_honest_unreachable(response.json()["detail"]["apiserver_reachable"])
    assert_cut_off(server, deadline_timers)


def test_patch_kubeconfig_is_cut_off_within_the_probe_budget(http, fleet_cluster, trickle, settings, deadline_timers):
    emulated = fleet_cluster("lab-c1")
    response = http.post("/api/v1/clusters", json={"name": "lab-c1", "kubeconfig": kubeconfig_text(emulated), "session_domain": "a.example.com"})
    assert response.status_code == 201, response.text
    cluster_id = response.json()["id"]
    before = Cluster.objects.get(public_id=cluster_id)
    settings.GSHARE_PROBE_TIMEOUT = BUDGET
    for seen in deadline_timers.values():  # the registration above ran on the default budget
        seen.clear()
    server = trickle("headers")
    response = http.patch(
        f"/api/v1/clusters/{cluster_id}",
        json={"kubeconfig": yaml.safe_dump(silent_kubeconfig(server.host_port)), "session_domain": "b.example.com"},
        timeout=60,
    )
    assert response.status_code == 504, response.text
    assert response.json()["code"] == "cluster_unreachable"
    assert_honest_unreachable(response.json()["detail"])
    assert_cut_off(server, deadline_timers)
    after = Cluster.objects.get(public_id=cluster_id)
    assert (after.kubeconfig, after.apiserver_url, after.session_domain) == (before.kubeconfig, before.apiserver_url, "a.example.com")


def test_normal_servers_still_answer_every_probe_call(fleet_cluster, settings):
    emulated = fleet_cluster("lab-c1")
    result = probe_cluster(yaml.safe_load(kubeconfig_text(emulated)), server=emulated.url, timeout=settings.GSHARE_PROBE_TIMEOUT)
    assert result.checks == {"apiserver_reachable": True, "runtime_class_nvidia": True, "hami_device_plugin": True, "gpu_nodes": True,
                             "credential_least_privilege": False}  # the emulator's admin token
    assert result.kube_system_uid


# --------------------------------------------------------------------------- the operator token push


def test_operator_token_push_is_cut_off_within_its_budget(trickle, settings, deadline_timers):
    settings.GSHARE_OPERATOR_TOKEN_PUSH_TIMEOUT = BUDGET
    server = trickle("headers")
    cluster = ClusterFactory(kubeconfig=yaml.safe_dump(silent_kubeconfig(server.host_port)), apiserver_url=f"http://{server.host_port}")
    with pytest.raises(OperatorTokenPushFailed) as failed:
        operator_token_push(cluster)
    assert failed.value.code == "token_push_unreachable"
    assert_honest_unreachable(failed.value.detail)
    assert_cut_off(server, deadline_timers)
    cluster.refresh_from_db()
    assert "no complete answer" in cluster.operator_token_rotation_error


# --------------------------------------------------------------------------- Deadline.call itself


def test_a_spent_deadline_dials_nothing(trickle):
    server = trickle("headers")
    deadline = Deadline(0.0)
    with api_client_for_kubeconfig(silent_kubeconfig(server.host_port)) as api, pytest.raises(DeadlineExceeded):
        deadline.call(kubernetes.client.VersionApi(api).get_code)
    assert server.requests == 0


def test_a_finished_call_is_never_cut_later(fleet_cluster):
    """The timer of a call that finished in time is cancelled: its kept-alive connection serves the next call."""
    emulated = fleet_cluster("lab-c1")
    with api_client_for_kubeconfig(emulated.kubeconfig("lab")) as api:
        version = kubernetes.client.VersionApi(api)
        Deadline(5).call(version.get_code)  # warm up the emulator
        assert Deadline(0.5).call(version.get_code).git_version
        time.sleep(0.8)
        assert Deadline(5).call(version.get_code).git_version


# --------------------------------------------------------------------------- TLS failures are the kubeconfig's


def _register(http, config: dict):
    return http.post("/api/v1/clusters", json={"name": "lab", "kubeconfig": yaml.safe_dump(config)})


GARBAGE_PEM = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ("other_ca", "did not verify against the kubeconfig's certificate-authority-data"),
        ("garbage_ca", "certificate data in the kubeconfig could not be used"),
        ("not_pem_ca", "certificate data in the kubeconfig could not be used"),
        ("garbage_client_certificate", "certificate data in the kubeconfig could not be used"),
        ("wrong_tls_server_name", "did not verify against the kubeconfig's certificate-authority-data"),
    ],
)
def test_tls_failures_are_kubeconfig_invalid(http, fleet_cluster, change, fragment):
    emulated = fleet_cluster("lab-c1", tls=True)
    config = emulated.kubeconfig("lab")
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    if change == "other_ca":
        cluster["certificate-authority-data"] = generate_certificates().ca_data
    elif change == "garbage_ca":
        cluster["certificate-authority-data"] = base64.b64encode(GARBAGE_PEM).decode()
    elif change == "not_pem_ca":
        cluster["certificate-authority-data"] = base64.b64encode(b"NOTAPEM").decode()
    elif change == "garbage_client_certificate":
        user["client-certificate-data"] = base64.b64encode(b"x").decode()
        user["client-key-data"] = base64.b64encode(b"SECRETKEYMATERIAL").decode()
    else:
        cluster["tls-server-name"] = "other.example.com"
    response = _register(http, config)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "kubeconfig_invalid"
    assert fragment in response.json()["detail"]
    # refused as the TLS failure it is, at the handshake, not after waiting out the probe's budget
    assert "SECRETKEYMATERIAL" not in response.text and "did not answer" not in response.text
    assert Cluster.objects.count() == 0


def test_https_to_a_plain_http_server_is_kubeconfig_invalid(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1")  # plain http
    config = emulated.kubeconfig("lab")
    config["clusters"][0]["cluster"]["server"] = emulated.url.replace("http://", "https://")
    response = _register(http, config)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "kubeconfig_invalid"
    assert "TLS handshake" in response.json()["detail"]


def test_the_right_ca_still_registers(http, fleet_cluster):
    emulated = fleet_cluster("lab-c1", tls=True)
    response = _register(http, emulated.kubeconfig("lab"))
    assert response.status_code == 201, response.text


def test_operator_token_push_with_a_ca_that_does_not_verify_is_not_unreachable(fleet_cluster):
    emulated = fleet_cluster("lab-c1", tls=True)
    config = emulated.kubeconfig("lab")
    config["clusters"][0]["cluster"]["certificate-authority-data"] = generate_certificates().ca_data
    cluster = ClusterFactory(kubeconfig=yaml.safe_dump(config), apiserver_url=emulated.url)
    with pytest.raises(OperatorTokenPushFailed) as failed:
        operator_token_push(cluster)
    assert failed.value.code == "token_push_failed"
    assert "did not verify against the kubeconfig's certificate-authority-data" in failed.value.detail
